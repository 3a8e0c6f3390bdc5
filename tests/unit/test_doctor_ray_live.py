"""The doctor's Ray findings under a live vLLM on Ray (issue 24): a planned case and the lab's captures, offline.

1. The seed's TP=8 x PP=2 Ray plan (two 8 x H100 nodes), healthy as planned, then
   node2's Ray worker restarted through a drop-in with fewer GPUs than the plan
   gives it, and the head's vLLM journal waiting for its placement group (the
   real excerpt of gpustack#5509): the node short of GPUs comes first, on node2,
   before the placement group and the drop-in it explains.
2. Every folder of tests/fixtures/doctor/ray/ (tests/lab/test_doctor_ray.py made
   them on the lab: TP=2 over Ray, a fault injected under the serving vLLM):
   doctor-evidence.json diagnosed again, the top fault, its node and its fix as
   on the lab; and the checklist's Ray items on the healthy capture (Ray's nodes
   and GPUs as planned, vLLM's workers as Ray actors on the planned nodes) and
   on the node short of GPUs.
"""

import copy
import json
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import checklist, diagnosis
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import evidence_from_saved
from test_doctor_public_logs import CATALOG, healthy_cluster, ids, with_log

REPO = Path(__file__).resolve().parents[2]
RAY_CAPTURES = REPO / "tests" / "fixtures" / "doctor" / "ray"
CASES = sorted(path.name for path in RAY_CAPTURES.iterdir() if (path / "expected.json").is_file()
               and path.name != "healthy") if RAY_CAPTURES.is_dir() else []
DROPIN = "/etc/systemd/system/ray-worker.service.d/50-gpus.conf"


def short_of_gpus(evidence, node="node2", gpus=4.0):
    """node's Ray worker restarted with --num-gpus <gpus> by a drop-in; the head lists it ALIVE with those GPUs."""
    evidence = copy.deepcopy(evidence)
    unit = evidence["nodes"][node]["gather"]["units"]["ray-worker.service"]
    unit["ExecStart"] = unit["ExecStart"].replace("--num-gpus 8", f"--num-gpus {gpus:g}")
    unit["DropInPaths"] = DROPIN
    address = next(n["address"] for n in evidence["plan"]["nodes"] if n["host"] == node)
    for entry in evidence["nodes"]["node1"]["gather"]["ray"]["nodes"]:
        if entry["node_ip"] == address:
            entry["resources_total"] = {"GPU": gpus}
    return evidence


def test_the_healthy_ray_plan_has_no_gpu_shortfall():
    report = diagnosis.diagnose(CATALOG, healthy_cluster("ray"))
    assert "ray_gpus_below_plan" not in ids(report)


def test_a_ray_node_with_fewer_gpus_than_planned_comes_before_the_pending_placement_group():
    evidence = with_log(short_of_gpus(healthy_cluster("ray")), "gpustack5509-placement-group-pending.log",
                        node="node1", failing=False)
    report = diagnosis.diagnose(CATALOG, evidence)
    top = report["findings"][0]
    assert top["id"] == "ray_gpus_below_plan", ids(report)
    assert top["nodes"] == ["node2"]
    assert "--num-gpus 8" in top["fix"] and DROPIN in top["fix"] and "ray.yml" in top["fix"], top["fix"]
    assert "registered 4 GPUs; the plan gives it 8 (ray-worker.service runs --num-gpus 4" in top["evidence"][0]["line"]
    pending = next(f for f in report["findings"] if f["id"] == "placement_group_unsatisfiable")
    assert pending["explained_by"] == ["ray_gpus_below_plan"]


def test_a_dead_ray_node_is_missing_not_short_of_gpus():
    evidence = healthy_cluster("ray")
    evidence["nodes"]["node1"]["gather"]["ray"]["nodes"][1].update(state="DEAD", resources_total={})
    assert "ray_gpus_below_plan" not in ids(diagnosis.diagnose(CATALOG, evidence))


def captured(case):
    saved = RAY_CAPTURES / case / "doctor-evidence.json"
    return evidence_from_saved(json.loads(saved.read_text(encoding="utf-8")))


def replay(case):
    return diagnosis.diagnose(CATALOG, captured(case))


def test_the_checklist_s_ray_items_on_the_lab_s_healthy_vllm_on_ray():
    """Ray's nodes and GPUs as the plan's --num-gpus; vLLM's workers as Ray actors (ray list actors) on its nodes."""
    items = {item["id"]: item for item in checklist.evaluate(captured("healthy"))["items"]}
    assert items["ray_cluster"]["status"] == "pass", items["ray_cluster"]
    assert items["ray_cluster"]["evidence"][-1] == ("2 ALIVE node(s), 2 GPU(s); expected 2 node(s), 2 GPU(s) "
                                                    "(the plan's --num-gpus)")
    assert items["rank_layout"]["status"] == "pass", items["rank_layout"]
    layout = items["rank_layout"]["evidence"]
    assert "node1: Ray workers (ranks) expected 0, found 0" in layout and \
        "node2: Ray workers (ranks) expected 1, found 1" in layout, layout


def test_on_the_lab_the_node_short_of_gpus_explains_vllm_s_warning_about_the_placement_group():
    """vLLM's 'required GPUs exceed ... the placement group' (world_size_exceeds_gpus) came first on the lab."""
    report = replay("placement_group_cannot_be_placed")
    explained = {f["id"]: f.get("explained_by") for f in report["findings"]}
    assert explained["world_size_exceeds_gpus"] == ["ray_gpus_below_plan"], explained
    # The chain, reduced: the node short of GPUs -> vLLM's GPU-count warning -> the pending placement group.
    assert explained["placement_group_unsatisfiable"] == ["world_size_exceeds_gpus"], explained
    assert explained["unit_overridden"] == ["ray_gpus_below_plan"], explained


def test_the_checklist_fails_the_ray_cluster_item_when_a_node_has_fewer_gpus_than_planned():
    items = {item["id"]: item for item in checklist.evaluate(captured("placement_group_cannot_be_placed"))["items"]}
    assert items["ray_cluster"]["status"] == "fail", items["ray_cluster"]
    assert items["ray_cluster"]["evidence"][-1] == ("2 ALIVE node(s), 1 GPU(s); expected 2 node(s), 2 GPU(s) "
                                                    "(the plan's --num-gpus)")


def test_the_lab_captured_the_three_ray_faults_and_a_healthy_vllm_on_ray():
    assert set(CASES) >= {"ray_worker_lost_under_vllm", "ray_version_differs_on_one_node",
                          "placement_group_cannot_be_placed"}, CASES
    report = replay("healthy")
    assert report["faults"] == 0, [(f["id"], f["nodes"]) for f in report["findings"]]


@pytest.mark.parametrize("case", CASES)
def test_a_ray_fault_under_a_live_vllm_is_the_top_finding_on_its_node(case):
    expected = json.loads((RAY_CAPTURES / case / "expected.json").read_text(encoding="utf-8"))
    report = replay(case)
    faults = [f for f in report["findings"] if f["severity"] == "fault"]
    summary = [(f["id"], f["severity"], f["nodes"]) for f in report["findings"]]
    assert faults, summary
    top = faults[0]
    assert top["id"] in expected["expect"], summary
    assert top["nodes"] == [expected["node"]], summary
    for word in expected["fix_words"]:
        assert word in top["fix"], top["fix"]
    assert top.get("verify"), f"{top['id']}: a fix says how to check it worked"
