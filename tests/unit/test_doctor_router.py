"""The doctor reports the router's view of each worker (issue 18, item 4), on real answers of vllm-router 0.1.17.

tests/fixtures/router/doctor/ holds what a real vllm-router said about two real vLLM replicas on loopback
(capture.py, its docstring says how): healthy, one worker removed with /remove_worker, one worker's vLLM killed,
and the router stopped. The captured worker URLs (127.0.0.1:18101 and :18102) are replaced by the planned workers'
URLs of the plan each test uses (the only change to the captured text); the answers are saved as
roles/doctor/tasks/diagnose.yml saves the router reads, and read back through evidence_from_saved, the one reader.
The node evidence beside them is the lab's real evidence (tests/fixtures/doctor/unseen/).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import diagnosis
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.catalog import load_catalog_file
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
    Cluster,
    evidence_from_saved,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations import OBSERVATIONS
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.report import (
    render_markdown,
    render_report,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.router_view import (
    parse_metrics,
    router_metrics,
)
from test_monitoring_targets import lab_plan

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "fixtures" / "router" / "doctor"
UNSEEN = REPO / "tests" / "fixtures" / "doctor" / "unseen"
CATALOG = load_catalog_file(REPO / "roles" / "doctor" / "files" / "signatures.yml")
CAPTURE = json.loads((CAPTURES / "capture.json").read_text())
CAPTURED_A, CAPTURED_B = CAPTURE["workers"]["a"], CAPTURE["workers"]["b"]
ROUTER = "router1"
ROUTER_URL = "http://127.0.0.1:8080"
READS = (("/list_workers", "list_workers.json"), ("/workers", "workers.json"), ("/readiness", "readiness.json"),
         ("/metrics", "metrics.txt"))


def saved_reads(state, mapping):
    """The router reads of one captured state, as diagnose.yml saves them, the captured URLs mapped to planned ones."""
    statuses = next(step["answers"] for step in CAPTURE["steps"] if step.get("state") == state)
    reads = []
    for path, name in READS:
        text = (CAPTURES / state / name).read_text()
        for captured, planned in mapping.items():
            text = text.replace(captured, planned)
        status = statuses[path]
        if name == "readiness.json":
            answer = json.loads(text)
            status, text = answer["status"], answer["body"]
        url = "http://10.77.1.9:29000/metrics" if path == "/metrics" else ROUTER_URL + path
        reads.append({"host": ROUTER, "what": path, "url": url, "status": status, "msg": f"OK ({len(text)} bytes)",
                      "content": text, "skipped": False, "unreachable": False})
    return reads


def dp2_plan():
    """Two independent DP replicas of the lab's tiny Llama (node1, node2): two workers of the router."""
    return lab_plan({"tp": 1, "dp": 2})


def diagnose(data):
    return diagnosis.diagnose(CATALOG, evidence_from_saved(data))


def only_router(state, plan=None, mapping=None):
    plan = plan or dp2_plan()
    mapping = mapping or {CAPTURED_A: "http://10.77.1.1:8000", CAPTURED_B: "http://10.77.1.2:8000"}
    return {"plan": plan, "hosts": [], "gather": [], "gpu": [], "ib": [], "routers": saved_reads(state, mapping)}


def with_lab_nodes(case, state):
    """A lab case's real node evidence (its plan: node1 is the one API server, http://10.232.1.11:8000) with the
    router's captured state, the killed/removed worker B mapped to node1."""
    data = json.loads((UNSEEN / case / "doctor-evidence.json").read_text())
    node1 = "http://10.232.1.11:8000"
    data["routers"] = saved_reads(state, {CAPTURED_B: node1})
    return data


def router_findings(report):
    return [f for f in report["findings"] if f["id"].startswith("router_")]


# --- the captures themselves: a check on the fixtures, so that a re-capture that lost a state fails here ---------


def test_the_captures_show_the_three_states_the_router_was_put_in():
    def workers(state):
        return {w["url"]: w["is_healthy"] for w in json.loads((CAPTURES / state / "workers.json").read_text())["workers"]}

    assert workers("healthy") == {CAPTURED_A: True, CAPTURED_B: True}
    assert workers("removed") == {CAPTURED_A: True}
    # vllm-router 0.1.17 keeps the removed worker's health gauge at 1: only /list_workers and /workers say it is out.
    assert router_metrics((CAPTURES / "removed" / "metrics.txt").read_text())["health"][CAPTURED_B] == 1.0
    assert workers("killed") == {CAPTURED_A: True, CAPTURED_B: False}
    assert CAPTURE["vllm_router"] == "0.1.17"
    health = router_metrics((CAPTURES / "killed" / "metrics.txt").read_text())["health"]
    assert health == {CAPTURED_A: 1.0, CAPTURED_B: 0.0}


def test_the_metrics_parser_reads_labels_and_skips_comments():
    samples = parse_metrics('# HELP x y\n# TYPE x gauge\nx{worker="http://a:1",k="v"} 2\ny 3.5\nbroken line\n')
    assert samples == [("x", {"worker": "http://a:1", "k": "v"}, 2.0), ("y", {}, 3.5)]


# --- the diagnosis on the captures ---------------------------------------------------------------------------------


def test_healthy_router_gives_no_router_finding_and_the_view_lists_both_workers():
    # Fails if a listed, healthy planned worker were reported, or the view lost a worker or its requests.
    report = diagnose(only_router("healthy"))
    assert router_findings(report) == []
    rows = {row["worker"]: row for row in report["router_view"]}
    assert set(rows) == {"http://10.77.1.1:8000", "http://10.77.1.2:8000"}
    assert all(row["listed"] and row["healthy"] for row in rows.values())
    # The four completions capture.py sent all went to worker A (cache_aware, short prompts); B has no series yet.
    assert (rows["http://10.77.1.1:8000"]["processed"], rows["http://10.77.1.2:8000"]["processed"]) == (4, None)
    lines = render_report(report)
    assert "  router1: http://10.77.1.1:8000 (node1): listed yes, healthy yes, processed 4" in lines
    assert "  router1: http://10.77.1.2:8000 (node2): listed yes, healthy yes, processed -" in lines


def test_a_removed_worker_is_router_worker_missing_first_with_the_add_worker_fix():
    # Fails if the missing worker is not the top finding, is placed on the wrong node, or its fix lacks the URL.
    report = diagnose(only_router("removed"))
    top = report["findings"][0]
    assert top["id"] == "router_worker_missing" and top["nodes"] == ["node2"]
    assert "router1" in top["title"] and "node2" in top["title"]
    assert "http://10.77.1.2:8000 (node2) is not listed" in top["evidence"][0]["line"]
    assert "POST 'http://127.0.0.1:8080/add_worker?url=http://10.77.1.2:8000'" in top["fix"]
    assert "playbooks/router.yml" in top["fix"]
    assert [f["id"] for f in router_findings(report)] == ["router_worker_missing"]
    row = next(r for r in report["router_view"] if r["worker"] == "http://10.77.1.2:8000")
    assert (row["listed"], row["healthy"]) == (False, None)


def test_a_killed_worker_is_router_worker_unhealthy_without_node_evidence():
    report = diagnose(only_router("killed"))
    (finding,) = router_findings(report)
    assert finding["id"] == "router_worker_unhealthy" and finding["nodes"] == ["node2"]
    assert "no evidence of node2's own vLLM" in finding["cause"]
    assert "vllm_router_worker_health 0" in finding["evidence"][0]["line"]


def test_a_frozen_vllm_on_the_node_explains_the_router_s_unhealthy_mark_and_ranks_first():
    # The lab's head_api_server_frozen (node1's vLLM stopped with SIGSTOP) with the router's killed state on node1's
    # URL. Fails if the router's mark ranked above the node's own fault or did not say it follows from it.
    report = diagnose(with_lab_nodes("head_api_server_frozen", "killed"))
    ids = [f["id"] for f in report["findings"]]
    assert ids[0] == "vllm_process_stopped"
    unhealthy = next(f for f in report["findings"] if f["id"] == "router_worker_unhealthy")
    assert ids.index("router_worker_unhealthy") > ids.index("vllm_process_stopped")
    assert "vllm_process_stopped" in unhealthy["explained_by"]
    assert "is frozen" in unhealthy["cause"] and "because its vLLM is down" in unhealthy["cause"]


def test_a_healthy_node_behind_an_unhealthy_mark_points_at_the_path_router_to_replica():
    # The lab's healthy evidence (node1's vLLM active, listening on 8000): the router still marks it unhealthy.
    report = diagnose(with_lab_nodes("healthy", "killed"))
    (finding,) = router_findings(report)
    assert finding["id"] == "router_worker_unhealthy" and finding["nodes"] == ["node1"]
    assert finding["explained_by"] == []
    assert "active and listens on port 8000" in finding["cause"] and "suspect the path" in finding["cause"]
    assert report["findings"][0]["id"] == "router_worker_unhealthy"


def test_the_removed_worker_on_the_lab_s_healthy_nodes_is_still_missing():
    report = diagnose(with_lab_nodes("healthy", "removed"))
    assert report["findings"][0]["id"] == "router_worker_missing"
    assert report["findings"][0]["nodes"] == ["node1"]


def test_a_router_that_refuses_is_router_unreachable_on_the_router_host():
    # The read that uri registers when nothing listens (the captured router stopped: connection refused).
    errors = json.loads((CAPTURES / "unreachable" / "errors.json").read_text())
    assert "Connection refused" in errors["/workers"]["error"]
    msg = f"Status code was -1 and not [200]: Request failed: <urlopen error {errors['/workers']['error']}>"
    reads = [{"host": ROUTER, "what": path, "url": ROUTER_URL + path, "status": -1, "msg": msg, "content": "",
              "skipped": False, "unreachable": False} for path, _ in READS[:3]]
    report = diagnose({"plan": dp2_plan(), "hosts": [], "gather": [], "gpu": [], "ib": [], "routers": reads})
    (finding,) = router_findings(report)
    assert finding["id"] == "router_unreachable" and finding["nodes"] == [ROUTER]
    assert "Connection refused" in finding["cause"] and "systemctl status vllm-router.service" in finding["fix"]
    assert report["router_view"] == [{"router": ROUTER, "worker": None, "host": None,
                                      "error": f"GET {ROUTER_URL}/list_workers: {msg}"}]


def test_without_router_hosts_nothing_changes():
    report = diagnose({"plan": dp2_plan(), "hosts": [], "gather": [], "gpu": [], "ib": []})
    assert router_findings(report) == [] and report["router_view"] == []


def test_the_report_s_markdown_has_the_router_s_view_table():
    markdown = render_markdown(diagnose(only_router("killed")))
    assert "## The router's view" in markdown
    assert "| router1 | http://10.77.1.2:8000 | node2 | yes | no |" in markdown


def test_evidence_round_trip_through_the_cli(tmp_path):
    # The file diagnose.yml writes, diagnosed by vllm_doctor.py as doctor.yml runs it: same router finding.
    evidence = tmp_path / "doctor-evidence.json"
    evidence.write_text(json.dumps(only_router("removed")))
    cli = REPO / "collections" / "ansible_collections" / "vllm_ops" / "cluster" / "roles" / "doctor" / "files"
    proc = subprocess.run([sys.executable, str(cli / "vllm_doctor.py"), "diagnose", "--catalog",
                           str(cli / "signatures.yml"), "--evidence", str(evidence), "--json", str(tmp_path / "d.json")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["top"]["id"] == "router_worker_missing"
    assert json.loads((tmp_path / "d.json").read_text())["router_view"][1]["listed"] is False


# --- the playbook bits ------------------------------------------------------------------------------------------------


def test_the_router_reads_send_no_key_and_change_nothing():
    # Fails if a read gained headers (a key), a method other than GET, or lost check_mode: false / failed_when.
    (task,) = yaml.safe_load((REPO / "roles" / "doctor" / "tasks" / "router.yml").read_text())
    uri = task["ansible.builtin.uri"]
    assert set(uri) == {"url", "return_content", "timeout"}
    assert task["check_mode"] is False and task["failed_when"] is False and task["run_once"] is True
    assert task["delegate_to"] == "{{ __doctor_router_read['host'] }}"
    diagnose_yml = (REPO / "roles" / "doctor" / "tasks" / "diagnose.yml").read_text()
    saved = diagnose_yml.split("routers: >-", 1)[1].split("- name:", 1)[0]
    assert "headers" not in saved and "'content': r.content" in saved


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_role_reads_a_router_that_does_not_answer_and_reports_it(tmp_path):
    # Real ansible-playbook, real uri, a router host (this machine, connection local) whose router port has nothing
    # listening; in check mode, as the doctor must give the same answer there. Then diagnose.yml saves the reads and
    # runs vllm_doctor.py: router_unreachable on router1. Fails if the reads are skipped, the router group or its
    # port variable is not followed, the saved evidence loses the reads, or a key travels.
    port, metrics_port = _free_port(), _free_port()
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {
        "vllm_nodes": {"hosts": {"node1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}},
        "routers": {"hosts": {"router1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                          "vllm_router_port": port, "vllm_router_prometheus_address": "127.0.0.1",
                                          "vllm_router_prometheus_port": metrics_port}}}}}}))
    plan = tmp_path / "vars.json"
    plan.write_text(json.dumps({"vllm_cluster_plan": dp2_plan(), "vllm_router_hosts": "routers",
                                "vllm_cluster_api_key": "SECRET-KEY-NOT-TO-TRAVEL",
                                "doctor_results_dir": str(tmp_path / "results"), "doctor_client_check": False,
                                "doctor_fail_on_fault": False}))
    playbook = tmp_path / "doctor.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "node1", "gather_facts": False, "tasks": [
        {"name": "router", "ansible.builtin.include_role": {"name": "vllm_ops.cluster.doctor", "tasks_from": "router"}},
        {"name": "diagnose", "ansible.builtin.include_role": {"name": "vllm_ops.cluster.doctor",
                                                              "tasks_from": "diagnose"}}]}]))
    ansible = Path(sys.executable).with_name("ansible-playbook")
    proc = subprocess.run([str(ansible), "-i", str(inventory), "-e", f"@{plan}", "--check", str(playbook)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    saved_text = (tmp_path / "results" / "lab-tiny-llama" / "doctor-evidence.json").read_text()
    assert "SECRET-KEY-NOT-TO-TRAVEL" not in saved_text
    saved = json.loads(saved_text)
    assert [(r["host"], r["what"], r["url"]) for r in saved["routers"]] == [
        ("router1", "/list_workers", f"http://127.0.0.1:{port}/list_workers"),
        ("router1", "/workers", f"http://127.0.0.1:{port}/workers"),
        ("router1", "/readiness", f"http://127.0.0.1:{port}/readiness"),
        ("router1", "/metrics", f"http://127.0.0.1:{metrics_port}/metrics")]
    assert all(r["status"] == -1 and "Connection refused" in r["msg"] for r in saved["routers"])
    report = json.loads((tmp_path / "results" / "lab-tiny-llama" / "doctor.json").read_text())
    assert [(f["id"], f["nodes"]) for f in report["findings"] if f["id"].startswith("router_")] == [
        ("router_unreachable", ["router1"])]


def test_the_doctor_s_fallbacks_are_the_router_role_s_defaults():
    # router.yml falls back to these where the inventory does not set them (the vllm_router role's defaults are not
    # loaded in the doctor's play). Fails if the router role changes a default and the doctor's read does not follow.
    defaults = yaml.safe_load((REPO / "roles" / "vllm_router" / "defaults" / "main.yml").read_text())
    text = (REPO / "roles" / "doctor" / "tasks" / "router.yml").read_text()
    assert f"groups[vllm_router_hosts | default('{defaults['vllm_router_hosts']}')]" in text
    assert f"hv['vllm_router_port'] | default({defaults['vllm_router_port']})" in text
    assert f"hv['vllm_router_prometheus_port'] | default({defaults['vllm_router_prometheus_port']})" in text
    assert f"hv['vllm_router_listen_address'] | default('{defaults['vllm_router_listen_address']}', true)" in text


def test_the_router_hits_carry_the_values_the_catalog_names():
    # test_doctor_catalog.py lists these values as what the observations give; fails if a hit lost one.
    missing = Cluster(evidence_from_saved(only_router("removed")))
    killed = Cluster(evidence_from_saved(only_router("killed")))
    refused = Cluster({"plan": dp2_plan(), "routers": [{"host": ROUTER, "url": ROUTER_URL, "error": "refused"}]})
    (hit,) = OBSERVATIONS["router_worker_missing"](missing, {})
    assert hit["values"] == {"router": ROUTER, "router_url": ROUTER_URL, "worker_url": "http://10.77.1.2:8000",
                             "worker_host": "node2", "listed": "http://10.77.1.1:8000"}
    (hit,) = OBSERVATIONS["router_worker_unhealthy"](killed, {})
    assert set(hit["values"]) == {"router", "router_url", "worker_url", "worker_host", "vllm_state", "suspect"}
    assert hit["values"]["vllm_state"] == "unknown"
    (hit,) = OBSERVATIONS["router_unreachable"](refused, {})
    assert hit["values"] == {"router": ROUTER, "router_url": ROUTER_URL, "error": "refused"} and hit["node"] == ROUTER


@pytest.mark.parametrize(("case", "cause_id", "follows", "says"), [
    # node1's vLLM active but not listening (weights gone): the node's own fault explains the mark.
    ("weights_missing", "model_weights_missing", True, "nothing listens on port 8000 on node1"),
    # node2, a headless rank of the replica node1 serves, stopped: a rank of another node, ranked first, no link
    # (the catalog's explains join findings of one node); the cause names node2.
    ("worker_unit_stopped", "vllm_unit_stopped", False, "vllm.service on node2 is failed (failed) (a rank of the "
                                                         "replica node1 serves)"),
])
def test_the_lab_s_dead_vllm_ranks_above_the_router_s_mark_and_the_cause_says_why(case, cause_id, follows, says):
    # Fails if the router's mark outranked the node's fault, lost the link where one node holds both, or judged
    # the replica up while one of its ranks is down.
    report = diagnose(with_lab_nodes(case, "killed"))
    ids = [f["id"] for f in report["findings"]]
    assert ids[0] == cause_id and ids.index("router_worker_unhealthy") > 0
    unhealthy = next(f for f in report["findings"] if f["id"] == "router_worker_unhealthy")
    assert (cause_id in unhealthy["explained_by"]) is follows
    assert says in unhealthy["cause"] and "because its vLLM is down" in unhealthy["cause"]
