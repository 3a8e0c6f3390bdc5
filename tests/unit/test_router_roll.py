"""plugins/module_utils/router/roll.py on the planner's own plans: what a change may do to running servers.

The plans are the lab's tiny Llama (test_monitoring_targets.lab_plan): three independent TP=1 replicas (a dense
model's DP, what tests/lab/test_router.py deploys), the lab's 2-node TP=2 (one API server), and a MoE's DP.
"""

from __future__ import annotations

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.roll import (
    RollError,
    layout_changes,
    listed_workers,
    roll_plan,
    roll_steps,
    router_admin_url,
    running_argv_problem,
    server_changes,
    shutdown_timeout_s,
    stop_timeout_problem,
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


@pytest.mark.parametrize(("given", "switches"), [("true", True), ("false", False), (False, False), ("yes", True)])
def test_the_filter_reads_the_switch_as_ansible_reads_a_boolean(given, switches):
    """`-e vllm_cluster_allow_layout_switch=false` arrives as the string "false": it must not switch."""
    from ansible.errors import AnsibleFilterError
    from ansible_collections.vllm_ops.cluster.plugins.filter.router_roll import router_roll

    previous = running(lab_plan({"tp": 2}), ("node1", "node2"))
    if switches:
        assert router_roll(lab_plan(THREE), previous, [ROUTER], given)["action"] == "switch"
    else:
        with pytest.raises(AnsibleFilterError, match="the layout changes"):
            router_roll(lab_plan(THREE), previous, [ROUTER], given)
    with pytest.raises(AnsibleFilterError, match="must be true or false"):
        router_roll(lab_plan(THREE), previous, [ROUTER], "maybe")


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


# --- roll_plan: how playbooks/vllm.yml runs the change, and the checks of one rolled server ---

ROUTER_UNIT = ("{ path=/opt/vllm-router/venv/bin/vllm-router-launch ; argv[]=/opt/vllm-router/venv/bin/"
               "vllm-router-launch --host 0.0.0.0 --port 8080 --policy round_robin --worker-urls "
               "http://10.77.1.1:8000 http://10.77.1.2:8000 http://10.77.1.3:8000 ; ignore_errors=no ; start_time=[n/a] }")
ROUTER = {"host": "node1", "deployments": [], "exec_start": ROUTER_UNIT}


def running(plan, hosts=("node1", "node2", "node3")):
    return {host: plan for host in hosts}


def test_a_serve_arg_behind_the_router_rolls_one_server_at_a_time_in_plan_order():
    steps = roll_plan(lab_plan(THREE, serve_args={"max-num-seqs": 32}), running(lab_plan(THREE)), [ROUTER])
    assert steps["action"] == "roll" and steps["one_at_a_time"] is True
    assert steps["order"] == ["node1", "node2", "node3"]
    assert steps["workers"] == {"node1": "http://10.77.1.1:8000", "node2": "http://10.77.1.2:8000",
                                "node3": "http://10.77.1.3:8000"}
    assert steps["routers"] == [{"host": "node1", "admin_url": "http://127.0.0.1:8080"}]
    assert steps["servers"][0]["changes"] == ["argv adds --max-num-seqs 32"]


def test_without_a_router_or_for_another_deployment_the_servers_restart_together():
    change = lab_plan(THREE, serve_args={"max-num-seqs": 32})
    assert roll_plan(change, running(lab_plan(THREE)), [])["one_at_a_time"] is False
    other = dict(ROUTER, deployments=["chat"])
    steps = roll_plan(change, running(lab_plan(THREE)), [other])
    assert steps["action"] == "roll" and steps["one_at_a_time"] is False and steps["routers"] == []
    assert roll_plan(change, running(lab_plan(THREE)), [dict(ROUTER, deployments="chat,lab-tiny-llama")])[
        "one_at_a_time"]


def test_one_api_server_and_a_first_deploy_keep_todays_restart():
    tp2 = roll_plan(lab_plan({"tp": 2}, serve_args={"max-num-seqs": 32}), running(lab_plan({"tp": 2}),
                                                                                     ("node1", "node2")), [ROUTER])
    assert tp2["action"] == "restart" and tp2["one_at_a_time"] is False
    first = roll_plan(lab_plan(THREE), {"node1": None, "node2": None, "node3": None}, [ROUTER])
    assert first["action"] == "first" and first["one_at_a_time"] is False


def test_nothing_planned_changes_still_goes_one_at_a_time_behind_the_router():
    # A role setting (TimeoutStopSec, the network environment) may still restart the servers: one at a time.
    steps = roll_plan(lab_plan(THREE), running(lab_plan(THREE)), [ROUTER])
    assert steps["action"] == "none" and steps["one_at_a_time"] is True


def test_a_layout_change_behind_the_router_is_refused_and_without_one_restarts_together():
    with pytest.raises(RollError, match="the layout changes"):
        roll_plan(lab_plan(THREE), running(lab_plan({"tp": 2}), ("node1", "node2")), [ROUTER])
    steps = roll_plan(lab_plan(THREE), running(lab_plan({"tp": 2}), ("node1", "node2")), [])
    assert steps["action"] == "switch" and steps["one_at_a_time"] is False and "no router fronts it" in steps["why"]


def test_a_roll_behind_a_router_host_without_its_unit_is_refused():
    with pytest.raises(RollError, match=r"router host\(s\) node1 front it .* run no vllm-router.service"):
        roll_plan(lab_plan(THREE, serve_args={"max-num-seqs": 32}), running(lab_plan(THREE)),
                  [dict(ROUTER, exec_start="")])
    assert roll_plan(lab_plan(THREE), running(lab_plan(THREE)), [dict(ROUTER, exec_start="")])[
        "one_at_a_time"] is False


def test_an_interrupted_roll_compares_each_server_with_its_own_plan():
    old, new = lab_plan(THREE), lab_plan(THREE, serve_args={"max-num-seqs": 32})
    steps = roll_plan(new, {"node1": new, "node2": old, "node3": old}, [ROUTER])
    assert steps["action"] == "roll" and steps["one_at_a_time"]
    assert [(s["host"], s["changes"]) for s in steps["servers"]] == [
        ("node2", ["argv adds --max-num-seqs 32"]), ("node3", ["argv adds --max-num-seqs 32"])]
    assert steps["unchanged"] == ["node1"]


def test_the_router_admin_url_is_its_own_address_or_loopback():
    assert router_admin_url("r", ROUTER_UNIT) == "http://127.0.0.1:8080"
    assert router_admin_url("r", ["launch", "--host", "10.0.0.20", "--port", "9000"]) == "http://10.0.0.20:9000"
    assert router_admin_url("r", ["launch", "--host", "::"]) == "http://[::1]:30000"
    with pytest.raises(RollError, match="router host r: vllm-router.service has no command line"):
        router_admin_url("r", "")


def test_list_workers_answers_are_read():
    assert listed_workers({"urls": ["http://10.77.1.1:8000/", "http://10.77.1.2:8000"]}) == [
        "http://10.77.1.1:8000", "http://10.77.1.2:8000"]
    assert listed_workers([{"url": "http://a:1"}]) == ["http://a:1"]
    with pytest.raises(RollError, match="expected a JSON object with the worker URLs"):
        listed_workers({"status": "ok"})


def test_the_planner_gives_independent_servers_a_shutdown_timeout_that_systemd_must_cover():
    node = lab_plan(THREE)["nodes"][0]
    assert shutdown_timeout_s(node["argv"]) == 30
    assert shutdown_timeout_s(lab_plan({"tp": 2})["nodes"][0]["argv"]) == 0  # one API server: unchanged
    assert shutdown_timeout_s(lab_plan(THREE, serve_args={"shutdown-timeout": 50})["nodes"][0]["argv"]) == 50
    assert stop_timeout_problem("node1", node["argv"], 90) == ""
    assert stop_timeout_problem("node1", node["argv"], 40) == (
        "host node1: vllm_service_stop_timeout_s is 40 but vLLM's --shutdown-timeout is 30 s: systemd would kill "
        "vLLM before its requests finish; expected at least 30 + 30 = 60 s")


def test_the_running_argv_must_end_with_the_planned_one():
    argv = ["vllm", "serve", "/srv/models/tiny-llama", "--port", "8000", "--max-num-seqs", "32"]
    cmdline = "\0".join(["/opt/vllm-cluster/venv/bin/python", "/opt/vllm-cluster/venv/bin/vllm", *argv[1:]]) + "\0"
    assert running_argv_problem("node1", cmdline, argv) == ""
    stale = cmdline.replace("32", "16")
    assert running_argv_problem("node1", stale, argv).startswith(
        "host node1: the running vLLM was started with '/opt/vllm-cluster/venv/bin/python ")
    assert "expected its arguments to end with the plan's 'serve /srv/models/tiny-llama" in running_argv_problem(
        "node1", stale, argv)
    assert "no process" in running_argv_problem("node1", "", argv)
