"""Other tables' rules that drop the deployment's ports, and when the deployment's table is loaded again
(parsers/nft_ruleset.py). The fixtures are nft 1.0.6's (Debian 12) own output: tests/fixtures/nft."""

import json

from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import nft_ruleset as nr
from test_facts_modules import REPO

FIXTURES = REPO / "tests" / "fixtures" / "nft"
PORTS = ["8000", "29500-29510", "6379-6384", "32768-60999"]


def hits(ports=PORTS):
    return nr.blocking_rules((FIXTURES / "ruleset.json").read_text(), (FIXTURES / "ruleset.txt").read_text(), ports)


def test_the_rules_of_other_tables_that_drop_our_ports_are_found_with_their_text():
    found = [(h["family"], h["table"], h["chain"], h["handle"], h["verdict"], h["port"], h["text"]) for h in hits()]
    assert found == [
        ("inet", "foreign", "in", 2, "drop", 8000, "tcp dport 8000 drop"),
        ("inet", "foreign", "in", 4, "reject", 29501, "tcp dport { 22, 29501-29510 } reject"),
        ("ip", "legacy", "INPUT", 3, "drop", 6379, "ip saddr 10.0.0.5 tcp dport @blocked counter packets 0 bytes 0 drop"),
        ("ip", "legacy", "INPUT", 5, "reject", 8000, "tcp dport != 22 reject with tcp reset"),
    ]
    # Our own table's drop, an accept, udp 53 and a rule with no port are not named.


def test_a_negated_match_covers_every_other_port():
    # "tcp dport != 22 reject" is the only rule that reaches 9000; port 22 is rejected by the set rule only.
    assert [(h["table"], h["handle"]) for h in hits(["9000"])] == [("legacy", 5)]
    assert [(h["table"], h["handle"]) for h in hits(["22"])] == [("foreign", 4)]


def test_the_message_names_host_table_chain_rule_port_and_fix():
    message = nr.blocking_message("node1", hits()[0], {8000: "the API port"})
    assert message == (
        "node1: nftables table inet foreign, chain in: rule 'tcp dport 8000 drop' drops traffic to port 8000 "
        "(the API port); vllm-cluster does not touch other tables: delete it with: "
        "nft delete rule inet foreign in handle 2 (or ask its owner), or accept it with "
        "node_firewall_foreign_rules_ignored")


def test_ignored_accepts_all_a_table_a_chain_or_one_rule():
    hit = hits()[0]
    assert nr.rule_ignored(hit, True) and not nr.rule_ignored(hit, False) and not nr.rule_ignored(hit, [])
    assert nr.rule_ignored(hit, ["inet foreign"]) and nr.rule_ignored(hit, ["inet  foreign in"])
    assert nr.rule_ignored(hit, ["inet foreign in handle 2"]) and not nr.rule_ignored(hit, ["inet foreign in handle 4"])
    assert not nr.rule_ignored(hit, ["ip foreign"])


def test_named_sets_and_port_specs():
    assert nr.port_spec([8000, "29500-29510", "x", ""]) == [(8000, 8000), (29500, 29510)]
    data = json.loads((FIXTURES / "ruleset.json").read_text())
    assert any(item.get("set", {}).get("name") == "blocked" for item in data["nftables"])


def test_the_table_is_loaded_again_only_when_it_drifted():
    listing = nr.normalised_table("table inet vllm_cluster {\n\tchain input {\n\t\ttcp dport 8000 accept\n\t}\n}\n")
    assert listing == "table inet vllm_cluster {\nchain input {\ntcp dport 8000 accept\n}\n}\n"
    record = {"sha256": "abc", "listing": listing}
    assert nr.table_decision(listing, record, "abc", False) == (False, "the live rules are what the file loads")
    assert nr.table_decision(listing.replace("}\n}", "tcp dport 8000 drop\n}\n}"), record, "abc", False) == (
        True, "the live rules differ from what the file loads")
    assert nr.table_decision("", record, "abc", False) == (True, "the table is not loaded")
    assert nr.table_decision(listing, record, "def", False)[0] and nr.table_decision(listing, None, "abc", False)[0]
    assert nr.table_decision(listing, record, "abc", True) == (True, "the file changed")
