"""A hardened node's firewall is not a blocked rendezvous; a rule that does block one is quoted.

The ruleset is the real `nft list ruleset` of a lab node after deploy.yml's
node_firewall role (tests/fixtures/doctor/lab/nft-list-ruleset-hardened-node1.source.txt):
it drops the internal ports (29501, Ray, ...) for sources outside the cluster,
after accepting the cluster's fabric addresses. The cases are the real evidence
of tests/fixtures/doctor/lab/cases, with that ruleset added to what each node
showed.
"""

import copy
import json
from pathlib import Path

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.catalog import load_catalog_file
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.diagnosis import diagnose
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import evidence_from_registered
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import net

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "tests" / "fixtures" / "doctor" / "lab"
CATALOG = load_catalog_file(REPO / "roles" / "doctor" / "files" / "signatures.yml")
HARDENED = (LAB / "nft-list-ruleset-hardened-node1.txt").read_text(encoding="utf-8")
HARDENED_DROP = 'tcp dport { 6379-6384, 8265, 10001-10999, 29501, 29550, 32768-60999 } counter packets 0 bytes 0 drop'


def case_with_hardened_firewall(case):
    data = json.loads((LAB / "cases" / f"{case}.json").read_text(encoding="utf-8"))
    hosts = [{"host": h, "gather": copy.deepcopy(g), "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    # The captured lab used 10.232.3.0/24 for its fabric; the cases' lab used 10.232.4.0/24.
    ruleset = HARDENED.replace("10.232.3.", "10.232.4.")
    for host in hosts:
        firewall = host["gather"]["evidence"]["firewall"]
        firewall["rules"] = net.firewall_rules(ruleset) + firewall["rules"]
        firewall["accepted_sources"] = net.firewall_accepted_sources(ruleset)
    return diagnose(CATALOG, evidence_from_registered(data["plan"], hosts))


def test_the_hardened_ruleset_accepts_the_cluster_before_it_drops_the_internal_ports():
    accepted = net.firewall_accepted_sources(HARDENED)
    drop = next(rule for rule in net.firewall_rules(HARDENED) if "29501" in rule)
    assert drop.startswith(HARDENED_DROP)
    assert accepted[drop] == ["10.232.3.11", "10.232.3.12", "10.232.3.13"]
    # The API port's drop comes before the cluster is accepted for every port: only its own accepts count.
    api_drop = next(rule for rule in net.firewall_rules(HARDENED) if "dport 8000" in rule)
    assert "10.232.3.12" not in accepted.get(api_drop, [])
    assert net.source_accepted("10.232.3.12", accepted[drop])
    assert not net.source_accepted("10.231.3.12", accepted[drop])  # a management address stays outside


def test_a_healthy_hardened_deployment_has_no_fault():
    report = case_with_hardened_firewall("healthy")
    assert report["faults"] == 0, [(f["id"], f["evidence"]) for f in report["findings"]]
    assert [f["id"] for f in report["findings"]] == ["tp_across_nodes"]


def test_the_rule_that_blocks_the_rendezvous_is_quoted_not_the_hardened_one():
    report = case_with_hardened_firewall("rendezvous-port-blocked")
    top = [f for f in report["findings"] if f["severity"] == "fault"][0]
    assert top["id"] == "rendezvous_port_blocked"
    lines = [item["line"] for item in top["evidence"]]
    assert any('iifname "eth1" tcp dport 29501 drop' in line for line in lines), lines
    assert not any(HARDENED_DROP in line for line in lines), lines
