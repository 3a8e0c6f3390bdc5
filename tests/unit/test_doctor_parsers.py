"""What doctor_gather reads on a node, parsed: real outputs captured on the lab (tests/fixtures/doctor/lab)."""

import json
from pathlib import Path

from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import net, systemd

LAB = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "doctor" / "lab"


def journal(name):
    return [json.loads(line) for line in (LAB / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def test_ss_listening_sockets_with_their_processes():
    sockets = net.parse_ss_listening((LAB / "ss-Hltnp-starting.txt").read_text())
    assert {(s["address"], s["port"]) for s in sockets} == {("0.0.0.0", 22), ("::", 22)}
    assert sockets[0]["processes"] == [{"name": "sshd", "pid": sockets[0]["processes"][0]["pid"]}]
    assert sockets[0]["line"].startswith("LISTEN")


def test_ip_addr_json_gives_each_interface_its_addresses():
    interfaces = net.parse_ip_addr_json((LAB / "ip-j-addr.json").read_text())
    assert {"lo", "eth0", "eth1"} <= set(interfaces)
    assert any(address.startswith("10.232.") for address in interfaces["eth1"]["addresses"])
    assert any(address.startswith("10.231.") for address in interfaces["eth0"]["addresses"])
    assert interfaces["eth1"]["mtu"] == 9000


def test_the_journal_since_the_last_start_is_the_current_invocation():
    entries = journal("journal-crashloop.json")
    invocations = []
    for entry in entries:
        invocation = entry.get("_SYSTEMD_INVOCATION_ID") or entry.get("INVOCATION_ID")
        if invocation and invocation not in invocations:
            invocations.append(invocation)
    assert len(invocations) == 4
    last = systemd.select_invocation(entries, invocations[-1])
    assert last[0].startswith("boom-") or last[0].startswith("Started ")
    assert any("Failed with result 'exit-code'." in line for line in last)
    assert sum("Started " in line for line in last) == 1  # one attempt: it logged its own failure


def test_a_restart_in_progress_reaches_back_to_the_attempt_that_failed():
    entries = journal("journal-crashloop.json")
    # The journal as it stood when the fourth attempt had just begun (a prefix of the real one).
    fourth = entries[-1].get("INVOCATION_ID") or entries[-1].get("_SYSTEMD_INVOCATION_ID")
    first_of_fourth = next(i for i, e in enumerate(entries)
                           if fourth in (e.get("INVOCATION_ID"), e.get("_SYSTEMD_INVOCATION_ID")))
    prefix = entries[: first_of_fourth + 1]
    lines = systemd.select_invocation(prefix, fourth)
    assert any("Scheduled restart job, restart counter is at 3." in line for line in lines)
    assert any("Failed with result 'exit-code'." in line for line in lines)
    assert sum("Main process exited" in line for line in lines) == 1  # only the attempt before it


def test_no_invocation_means_no_lines():
    assert systemd.select_invocation(journal("journal-crashloop.json"), "") == []
    assert systemd.select_invocation(journal("journal-crashloop.json"), "0" * 32) == []


def test_env_file_keeps_the_line_of_each_variable():
    parsed = systemd.parse_env_file("# managed\nVLLM_HOST_IP=10.232.4.11\nexport GLOO_SOCKET_IFNAME='eth1'\n\nbad line\n")
    assert parsed["vars"] == {"VLLM_HOST_IP": "10.232.4.11", "GLOO_SOCKET_IFNAME": "eth1"}
    assert parsed["lines"]["GLOO_SOCKET_IFNAME"] == [3, "export GLOO_SOCKET_IFNAME='eth1'"]


def test_exec_start_argv_from_systemctl_show():
    value = ("{ path=/opt/vllm-cluster/venv/bin/vllm ; argv[]=/opt/vllm-cluster/venv/bin/vllm serve /srv/m --port 8000 "
             "--headless ; ignore_errors=no ; start_time=[Mon 2026-11-30 04:00:26 UTC] ; stop_time=[n/a] ; pid=704 ; "
             "code=(null) ; status=0/0 }")
    assert systemd.parse_exec_start(value) == ["/opt/vllm-cluster/venv/bin/vllm", "serve", "/srv/m", "--port", "8000",
                                               "--headless"]
    assert systemd.parse_exec_start("") == []


def test_firewall_rules_that_drop_name_their_ports():
    ruleset = """table inet fault {
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "eth1" tcp dport 29501 drop
		tcp dport { 6379, 8265 } reject
	}
}"""
    rules = net.firewall_rules(ruleset)
    assert rules == ['iifname "eth1" tcp dport 29501 drop', "tcp dport { 6379, 8265 } reject"]
    assert net.rule_ports(rules[0]) == {29501}
    assert net.rule_ports(rules[1]) == {6379, 8265}
    assert net.rule_ports("-A INPUT -i eth1 -p tcp -m multiport --dports 29500:29502,8000 -j DROP") == {
        29500, 29501, 29502, 8000}
