"""What the last deploy changed: a node's plan.previous.json against its plan.json, as doctor.yml reports it."""

import base64
import json
import os
import subprocess
import sys

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.filter.deployed_plan import deployed_plan
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.diagnosis import diagnose
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import evidence_from_registered
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.report import render_report
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.history import (
    plan_changes,
    plan_summary,
    readback,
)
from test_doctor_lab_cases import CASES, CATALOG, CATALOG_FILE, CLI, REPO
from test_facts_modules import ANSIBLE, MODULE_PYTHON
from test_topology_check import lab_plan


def test_a_layout_change_names_the_layout_and_each_flag():
    before, after = lab_plan({"tp": 2}), lab_plan({"tp": 1, "pp": 2})
    changes = plan_changes(before, after, "node2")
    assert changes[0] == ("layout: tp (mp) TP=2 PP=1 DP=1 EP=1 world_size=2 -> "
                          "tp_pp (mp) TP=1 PP=2 DP=1 EP=1 world_size=2")
    assert "--tensor-parallel-size: 2 -> 1" in changes
    assert "--pipeline-parallel-size: 1 -> 2" in changes
    assert "--enforce-eager: set -> absent" in changes  # PP on CPU runs without eager (ARCHITECTURE.md)
    # The summary the doctor keeps as evidence compares the same.
    assert plan_changes(plan_summary(before), plan_summary(after), "node2") == changes


def test_the_same_plan_has_no_change_and_secrets_are_never_shown():
    plan = lab_plan({"tp": 2})
    assert plan_changes(plan, json.loads(json.dumps(plan)), "node1") == []
    with_token = json.loads(json.dumps(plan))
    with_token["nodes"][0]["env"]["HF_TOKEN"] = "hf_secret_1"
    rotated = json.loads(json.dumps(with_token))
    rotated["nodes"][0]["env"]["HF_TOKEN"] = "hf_secret_2"
    changes = plan_changes(with_token, rotated, "node1")
    assert changes == ["env HF_TOKEN: <redacted> -> <redacted, changed>"]
    assert "hf_secret" not in json.dumps(plan_summary(rotated))


def test_a_node_that_joins_or_leaves_the_deployment_is_named():
    two_nodes, one_node = lab_plan({"tp": 2}), lab_plan({"tp": 1})
    changes = plan_changes(two_nodes, one_node, "node2")
    assert "nodes: node1, node2 -> node1" in changes
    assert changes[-1] == "node2: removed from the deployment"
    assert plan_changes(one_node, two_nodes, "node2")[-1] == "node2: added to the deployment"


def test_the_doctor_reports_the_last_change_and_the_cli_writes_it(tmp_path):
    # The real healthy-lab evidence, with the plans vllm_service keeps on node1: a max_model_len change.
    data = json.loads((CASES / "healthy.json").read_text(encoding="utf-8"))
    current = plan_summary(data["plan"])
    previous = json.loads(json.dumps(current))
    head = previous["nodes"][0]["argv"]
    head[head.index("--max-model-len") + 1] = "256"
    data["gather"][0]["evidence"]["plans"] = {
        "previous": {"path": "/etc/vllm-cluster/plan.previous.json", "modified": "2026-11-30 10:00:00 UTC",
                     "plan": previous},
        "current": {"path": "/etc/vllm-cluster/plan.json", "modified": "2026-11-30 11:00:00 UTC", "plan": current},
    }
    hosts = [{"host": h, "gather": g, "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    report = diagnose(CATALOG, evidence_from_registered(data["plan"], hosts))
    assert report["faults"] == 0
    assert report["last_change"] == [{
        "node": "node1", "previous_modified": "2026-11-30 10:00:00 UTC",
        "current_modified": "2026-11-30 11:00:00 UTC", "changes": ["--max-model-len: 256 -> 512"]}]
    lines = render_report(report)
    assert lines[-2:] == ["  node1: plan.previous.json (2026-11-30 10:00:00 UTC) -> plan.json (2026-11-30 11:00:00 UTC)",
                          "    --max-model-len: 256 -> 512"]
    evidence = tmp_path / "doctor-evidence.json"
    evidence.write_text(json.dumps(data), encoding="utf-8")
    markdown = tmp_path / "doctor.md"
    proc = subprocess.run([sys.executable, str(CLI), "diagnose", "--catalog", str(CATALOG_FILE), "--evidence",
                           str(evidence), "--markdown", str(markdown)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    text = markdown.read_text(encoding="utf-8")
    assert "## What the last deploy changed" in text and "--max-model-len: 256 -> 512" in text
    # Without plan.previous.json (a first deploy) there is no section.
    assert "last deploy" not in "\n".join(render_report(diagnose(
        CATALOG, evidence_from_registered(data["plan"], [dict(hosts[0], gather={})]))))


def test_doctor_gather_reads_both_plans_of_the_node(tmp_path):
    # The module itself, through Ansible, on this machine: plan.json and plan.previous.json as
    # vllm_service writes them (to_nice_json), reduced to what the report compares.
    before, after = lab_plan({"tp": 2}), lab_plan({"tp": 1, "pp": 2})
    (tmp_path / "plan.previous.json").write_text(json.dumps(before, indent=4, sort_keys=True) + "\n")
    (tmp_path / "plan.json").write_text(json.dumps(after, indent=4, sort_keys=True) + "\n")
    playbook = tmp_path / "gather.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "gather", "vllm_ops.cluster.doctor_gather": {
            "units": [], "env_files": [], "venv": str(tmp_path / "no-venv"), "plan_dir": str(tmp_path)}},
        {"name": "gather without plans", "vllm_ops.cluster.doctor_gather": {
            "units": [], "env_files": [], "venv": str(tmp_path / "no-venv"), "plan_dir": str(tmp_path / "none")}},
    ]}]))
    proc = subprocess.run(
        [str(ANSIBLE.with_name("ansible-playbook")), "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={MODULE_PYTHON}",
         str(playbook)], cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    tasks = {t["task"]["name"]: t["hosts"]["localhost"] for t in json.loads(proc.stdout)["plays"][0]["tasks"]}
    plans = tasks["gather"]["evidence"]["plans"]
    assert plans["previous"]["plan"] == plan_summary(before) and plans["current"]["plan"] == plan_summary(after)
    assert plans["current"]["modified"].endswith(" UTC")
    assert plan_changes(plans["previous"]["plan"], plans["current"]["plan"], "node1")[0].startswith("layout: tp ")
    assert tasks["gather without plans"]["evidence"]["plans"] == {"current": None, "previous": None}


def test_after_a_teardown_the_report_names_the_plan_that_ran_last():
    data = json.loads((CASES / "healthy.json").read_text(encoding="utf-8"))
    data["gather"][0]["evidence"]["plans"] = {"current": None, "previous": {
        "path": "/etc/vllm-cluster/plan.previous.json", "modified": "2026-11-30 12:00:00 UTC",
        "plan": plan_summary(data["plan"])}}
    hosts = [{"host": h, "gather": g, "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    report = diagnose(CATALOG, evidence_from_registered(data["plan"], hosts))
    assert report["last_change"][0]["changes"] == [
        "vLLM was torn down (no plan.json); plan.previous.json is the plan that ran last: "
        "tp (mp) TP=2 PP=1 DP=1 EP=1 world_size=2"]
    assert "  node1: plan.previous.json (2026-11-30 12:00:00 UTC) -> plan.json (none)" in render_report(report)


# --------------------------------------------------------------------------- the deployed plan, read back


def test_the_deployed_plan_is_read_back_and_the_inventory_s_drift_named():
    deployed, inventory = lab_plan({"tp": 2}), lab_plan({"tp": 1, "pp": 2})
    result = readback({"node1": deployed, "node2": deployed, "node3": None}, inventory)
    assert (result["source"], result["from"], result["plan"]) == ("deployed", "node1", deployed)
    assert result["notes"] == ["judged against the plan the nodes run (tp (mp) TP=2 PP=1 DP=1 EP=1 world_size=2, "
                               "plan.json of node1)"]
    assert result["drift"][0] == ("the inventory now plans tp_pp (mp) TP=1 PP=2 DP=1 EP=1 world_size=2, "
                                  "the nodes run tp (mp) TP=2 PP=1 DP=1 EP=1 world_size=2")
    assert "node2 --tensor-parallel-size: 2 -> 1" in result["drift"]
    # The inventory still plans what runs: no drift.
    assert readback({"node1": deployed, "node2": deployed}, lab_plan({"tp": 2}))["drift"] == []


def test_nodes_that_disagree_or_hold_no_plan_are_named_and_without_any_the_inventory_is_used():
    tp2, pp2 = lab_plan({"tp": 2}), lab_plan({"tp": 1, "pp": 2})
    split = readback({"node1": tp2, "node2": pp2}, tp2)
    assert split["from"] == "node1" and split["plan"] == tp2  # node1 is the head of its own plan.json
    assert split["notes"][1] == "the nodes hold 2 different plans: a deploy did not finish on every node"
    assert any(note.startswith("node2 holds a plan of tp_pp (mp)") for note in split["notes"])
    half = readback({"node1": tp2, "node2": None}, tp2)
    assert half["notes"][-1] == "no plan.json on node2, a node of the deployed plan"
    none = readback({"node1": None, "node2": {"not": "a plan"}}, tp2)
    assert (none["source"], none["plan"], none["drift"]) == ("inventory", tp2, [])


def test_the_filter_decodes_what_slurp_read_and_the_doctor_reports_it():
    plan = lab_plan({"tp": 2})
    content = base64.b64encode(json.dumps(plan).encode()).decode()
    result = deployed_plan({"node1": content, "node2": content, "node3": None}, lab_plan({"tp": 1, "pp": 2}))
    assert result["source"] == "deployed" and result["plan"] == plan
    with pytest.raises(AnsibleFilterError, match="node2: /etc/vllm-cluster/plan.json is not a JSON plan"):
        deployed_plan({"node2": base64.b64encode(b"{half").decode()}, plan)
    report = diagnose(CATALOG, evidence_from_registered(plan, []))
    report["plan_source"] = {key: value for key, value in result.items() if key != "plan"}
    lines = render_report(report)
    assert lines[1].startswith("plan: judged against the plan the nodes run")
    assert "plan:   the inventory now plans tp_pp (mp)" in "\n".join(lines)


def test_deployed_plan_yml_reads_back_when_a_node_holds_no_plan_json(tmp_path):
    """The read and judge plays of playbooks/deployed_plan.yml, run by Ansible on two local hosts: node1 holds the
    deployed plan.json, node2 none (a node outside a TP=1 plan). A slurp that found no file has no `content`;
    the benchmark's first stage failed on it (`object of type 'dict' has no attribute 'content'`)."""
    import yaml  # noqa: PLC0415

    plays = yaml.safe_load((REPO / "playbooks" / "deployed_plan.yml").read_text())
    read_play, judge_play = (play for play in plays if "ansible.builtin.import_playbook" not in play)
    # plan.yml's first play finds the deployments the judge play loops over (one here: vllm).
    fleet_task = next(task for task in yaml.safe_load((REPO / "playbooks" / "plan.yml").read_text())[0]["tasks"]
                      if task["name"].startswith("Find the deployments of vllm_nodes"))
    fleet_play = {"name": "fleet", "hosts": "localhost", "connection": "local", "gather_facts": False,
                  "tasks": [fleet_task]}
    (tmp_path / "tasks").symlink_to(REPO / "playbooks" / "tasks")  # the judge play's include_tasks
    deployed, inventory = lab_plan({"tp": 2}), lab_plan({"tp": 1, "pp": 2})
    (tmp_path / "node1").mkdir()
    (tmp_path / "node1" / "plan.json").write_text(json.dumps(deployed))
    hosts = {node: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "vllm_service_config_dir": str(tmp_path / node)} for node in ("node1", "node2")}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(
        {"all": {"children": {"vllm_nodes": {"hosts": hosts}}, "vars": {"vllm_cluster_plan": inventory}}}))
    (tmp_path / "playbook.yml").write_text(yaml.safe_dump([fleet_play, read_play, judge_play]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    proc = subprocess.run([str(ANSIBLE.parent / "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"),
                           str(tmp_path / "playbook.yml")], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    tasks = [task for play in json.loads(proc.stdout)["plays"] for task in play["tasks"]]
    printed = next(t for t in tasks if t["task"]["name"].startswith("Print where the plan"))["hosts"]["localhost"]
    assert printed["msg"][0].startswith("judged against the plan the nodes run (tp (mp) TP=2")
    assert "no plan.json on node2, a node of the deployed plan" in printed["msg"]
    assert any(line.startswith("the inventory now plans tp_pp (mp) TP=1 PP=2") for line in printed["msg"])
