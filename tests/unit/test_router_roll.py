"""plugins/module_utils/router/roll.py on the planner's own plans: what a change may do to running servers.

The plans are the lab's tiny Llama (test_monitoring_targets.lab_plan): three independent TP=1 replicas (a dense
model's DP, what tests/lab/test_router.py deploys), the lab's 2-node TP=2 (one API server), and a MoE's DP.
"""

from __future__ import annotations

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.roll import (
    RollError,
    layout_changes,
    roll_steps,
    server_changes,
)
from test_monitoring_targets import lab_plan
from test_router_workers import moe_dp_plan

THREE = {"tp": 1, "dp": 3}


def test_nothing_running_yet_starts_every_server():
    steps = roll_steps(None, lab_plan(THREE))
    assert steps["action"] == "first" and steps["servers"] == []


def test_the_same_plan_changes_nothing():
    plan = lab_plan(THREE)
    steps = roll_steps(plan, lab_plan(THREE))
    assert steps["action"] == "none" and steps["unchanged"] == ["node1", "node2", "node3"]


def test_a_serve_arg_rolls_over_the_three_independent_servers_in_plan_order():
    steps = roll_steps(lab_plan(THREE), lab_plan(THREE, serve_args={"max-num-seqs": 64}))
    assert steps["action"] == "roll"
    assert [(s["host"], s["url"]) for s in steps["servers"]] == [
        ("node1", "http://10.77.1.1:8000"), ("node2", "http://10.77.1.2:8000"), ("node3", "http://10.77.1.3:8000")]
    assert steps["servers"][0]["changes"] == ["argv adds --max-num-seqs 64"]
    assert "3 of its 3 independent servers change: one at a time" in steps["why"]


def test_an_environment_change_names_the_variable_not_its_value():
    previous, new = lab_plan(THREE), lab_plan(THREE)
    new["nodes"][1]["env"] = dict(new["nodes"][1]["env"], VLLM_CPU_KVCACHE_SPACE="2")
    steps = roll_steps(previous, new)
    assert [(s["host"], s["changes"]) for s in steps["servers"]] == [("node2", ["env VLLM_CPU_KVCACHE_SPACE"])]
    assert steps["unchanged"] == ["node1", "node3"]


def test_one_api_server_cannot_roll_and_says_it_restarts():
    # The lab's own layout: TP=2 over two nodes, one API server on node1, node2 headless.
    steps = roll_steps(lab_plan({"tp": 2}), lab_plan({"tp": 2}, serve_args={"max-num-seqs": 64}))
    assert steps["action"] == "restart"
    assert [s["host"] for s in steps["servers"]] == ["node1", "node2"]
    assert "no other server to take its requests" in steps["why"]


def test_vllms_own_dp_of_a_moe_has_one_front_end_and_restarts():
    previous = moe_dp_plan()
    new = moe_dp_plan()
    new["nodes"][0]["argv"] = [*new["nodes"][0]["argv"], "--max-num-seqs", "64"]
    steps = roll_steps(previous, new)
    assert steps["action"] == "restart" and "vllm data parallel" in steps["why"]


def test_a_layout_change_cannot_roll_and_names_the_switch():
    with pytest.raises(RollError) as refused:
        roll_steps(lab_plan({"tp": 2}), lab_plan({"tp": 1, "dp": 2}))
    message = str(refused.value)
    assert "deployment lab-tiny-llama: the layout changes (tp 2 -> 1; dp 1 -> 2; data parallel none -> " in message
    assert "-e vllm_cluster_allow_layout_switch=true" in message
    steps = roll_steps(lab_plan({"tp": 2}), lab_plan({"tp": 1, "dp": 2}), allow_layout_switch=True)
    assert steps["action"] == "switch" and "no request is served meanwhile" in steps["why"]


def test_replicas_on_other_nodes_are_a_layout_change():
    previous = lab_plan({"tp": 1, "dp": 2})
    new = lab_plan({"tp": 1, "dp": 2})
    new["nodes"][1] = dict(new["nodes"][1], host="node3")
    assert layout_changes(previous, new) == ["nodes node1, node2 -> node1, node3"]


def test_another_deployments_plan_is_refused():
    with pytest.raises(RollError, match="running plan is of deployment other"):
        roll_steps(lab_plan(THREE, deployment="other"), lab_plan(THREE))


def test_server_changes_say_removed_and_added_words():
    assert server_changes({"argv": ["vllm", "serve", "--a", "1"]}, {"argv": ["vllm", "serve", "--b", "1"]}) == [
        "argv drops --a adds --b"]
    assert server_changes({"argv": ["x", "--port", "8000"]}, {"argv": ["x", "--port", "8001"]}) == [
        "argv drops 8000 adds 8001"]
    assert server_changes({"env": {"X": "1"}}, {"env": {"X": "1"}}) == []


def test_adding_an_independent_server_scales_without_touching_the_others():
    two = lab_plan({"tp": 1, "dp": 2})
    steps = roll_steps(two, lab_plan(THREE))
    assert steps["action"] == "scale" and steps["unchanged"] == ["node1", "node2"]
    assert steps["added"] == [{"host": "node3", "url": "http://10.77.1.3:8000"}] and steps["removed"] == []
    back = roll_steps(lab_plan(THREE), two)
    assert back["action"] == "scale" and [s["host"] for s in back["removed"]] == ["node3"]


def test_a_scale_and_a_change_at_once_is_refused():
    with pytest.raises(RollError, match=r"added \(node3\) .* while the staying ones change \(node1, node2\); "
                                        "expected one change at a time"):
        roll_steps(lab_plan({"tp": 1, "dp": 2}), lab_plan(THREE, serve_args={"max-num-seqs": 64}))
