"""Several deployments in one inventory (issue 17): plan/fleet.py, its filters, and plan.yml on a fleet inventory."""

from __future__ import annotations

import collections
import json
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.filter.fleet import (
    fleet_batches,
    fleet_co_resident_problems,
    fleet_deployments,
    fleet_hosts,
    fleet_machine_plans,
    fleet_problems,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import fleet
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan
from test_planner_playbook import COMPUTE, EXAMPLES, SET_ON, check_messages, play, task

FLEET_CHECK = "Check the deployments of vllm_nodes (fleet_problems)"
FLEET_STOP = "Stop when the deployments are refused"

REPO = Path(__file__).resolve().parents[2]
FLEET_EXAMPLE = EXAMPLES / "fleet-two-models"
H100 = {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}


def test_hosts_group_by_their_deployment_in_the_order_of_their_first_host():
    hosts = ["a1", "b1", "a2", "c1", "b2"]
    names = {"a1": "chat", "a2": "chat", "b1": "embed", "b2": "embed"}  # c1 sets none: the default
    selected = fleet.deployments(hosts, names)
    assert selected == [("chat", ["a1", "a2"]), ("embed", ["b1", "b2"]), ("vllm", ["c1"])]
    # Play hosts keep each deployment together, so the serial batches are exactly the deployments.
    assert fleet.play_hosts(selected) == ["a1", "a2", "b1", "b2", "c1"]
    assert fleet.play_batches(selected) == [2, 2, 1]
    # One deployment (today's inventories): one batch of every host, in inventory order.
    assert fleet.play_batches(fleet.deployments(["n1", "n2", "n3"], {})) == [3]
    assert fleet.play_hosts(fleet.deployments([], {})) == [] and fleet.play_batches([]) == []
    # A deployment that rolls behind the router (vllm_service_roll.one_at_a_time): one server per batch.
    assert fleet.play_batches(selected, one_at_a_time=[selected[0][0]]) == [1, 1, 2, 1]


def test_a_selection_keeps_the_named_deployments_and_refuses_unknown_names():
    hosts, names = ["a1", "b1"], {"a1": "chat", "b1": "embed"}
    assert fleet.deployments(hosts, names, "embed") == [("embed", ["b1"])]
    assert fleet.deployments(hosts, names, ["chat", "embed"]) == [("chat", ["a1"]), ("embed", ["b1"])]
    assert fleet.deployments(hosts, names, " embed , chat") == [("chat", ["a1"]), ("embed", ["b1"])]
    with pytest.raises(fleet.FleetError, match=r"names chta, which no host of vllm_nodes has as its "
                                               r"vllm_cluster_deployment; this inventory's deployments: chat, embed"):
        fleet.deployments(hosts, names, "chta")
    with pytest.raises(fleet.FleetError, match="must be a list of deployment names"):
        fleet.deployments(hosts, names, {"chat": True})


def test_a_bad_deployment_name_names_the_host():
    with pytest.raises(fleet.FleetError, match=r"host b1: vllm_cluster_deployment must be a name of letters, "
                                               r"digits, '.', '_' or '-', got 'my model'"):
        fleet.deployments(["a1", "b1"], {"b1": "my model"})


def test_two_inventory_hosts_on_one_machine_need_disjoint_gpu_lists():
    selected = [("chat", ["gpu-a"]), ("embed", ["gpu-a-embed"])]
    one_machine = {"gpu-a": "192.0.2.30", "gpu-a-embed": "192.0.2.30"}
    problems = fleet.shared_machine_problems(selected, one_machine)
    assert problems == ["hosts gpu-a (chat), gpu-a-embed (embed) are one machine (ansible_host 192.0.2.30): "
                        "deployments that share a machine each name their GPUs with vllm_cluster_gpu_ids (disjoint "
                        "lists); gpu-a, gpu-a-embed set none"]
    # Disjoint lists: allowed. Overlapping: the GPU and both hosts are named.
    assert fleet.shared_machine_problems(selected, one_machine, {"gpu-a": [0, 1, 2, 3], "gpu-a-embed": [4, 5]}) == []
    problems = fleet.shared_machine_problems(selected, one_machine, {"gpu-a": [0, 1, 2, 3], "gpu-a-embed": [3, 4]})
    assert problems == ["hosts gpu-a (chat), gpu-a-embed (embed) are one machine (ansible_host 192.0.2.30): GPU 3 is "
                        "in vllm_cluster_gpu_ids of both gpu-a ([0, 1, 2, 3]) and gpu-a-embed ([3, 4]); expected "
                        "disjoint GPU lists"]
    problems = fleet.shared_machine_problems(selected, one_machine, {"gpu-a": [0, 1]})
    assert problems[0].endswith("gpu-a-embed sets none")
    with pytest.raises(fleet.FleetError, match=r"host gpu-a: vllm_cluster_gpu_ids must be a non-empty list of "
                                               r"distinct GPU indices \(0, 1, ...\), got \[1, 1\]"):
        fleet.shared_machine_problems(selected, one_machine, {"gpu-a": [1, 1], "gpu-a-embed": [2]})
    # Two hosts of one deployment on one machine: refused whatever their GPUs.
    same = [("chat", ["gpu-a", "gpu-a-again"])]
    problems = fleet.shared_machine_problems(same, {"gpu-a": "m", "gpu-a-again": "m"},
                                             {"gpu-a": [0], "gpu-a-again": [1]})
    assert problems == ["hosts gpu-a (chat), gpu-a-again (chat) are one machine (ansible_host m): deployment chat "
                        "has two hosts on it; a deployment uses a machine once (give it its GPUs with "
                        "vllm_cluster_gpu_ids on one host)"]
    assert fleet.shared_machine_problems(selected, {"gpu-a": "192.0.2.30", "gpu-a-embed": "192.0.2.31"}) == []
    # Without ansible_host a host is its own machine (local test inventories).
    assert fleet.shared_machine_problems(selected, {}) == []


def test_a_run_of_one_deployment_plans_the_deployments_sharing_its_machines():
    every = [("chat", ["a1", "a2"]), ("embed", ["e1"]), ("batch", ["b1"]), ("other", ["o1"])]
    machine_of = {"a1": "m1", "a2": "m2", "e1": "m2", "b1": "m3", "o1": "m4"}
    # embed shares m2 with chat; chat brings nothing else; batch and other stay out.
    assert fleet.co_residents(every, [("embed", ["e1"])], machine_of) == [("chat", ["a1", "a2"]),
                                                                          ("embed", ["e1"])]
    assert fleet.co_residents(every, [("batch", ["b1"])], machine_of) == [("batch", ["b1"])]
    # Transitively: a deployment that shares with a co-resident is planned too.
    machine_of["b1"] = "m1"
    assert [name for name, _ in fleet.co_residents(every, [("embed", ["e1"])], machine_of)] == [
        "chat", "embed", "batch"]


def test_plans_sharing_a_machine_must_open_distinct_ports_and_run_mp():
    def plan(name, ports, backend="mp"):
        return {"deployment": name, "backend": backend, "ports": ports}

    machine_of = {"a": "m", "b": "m", "c": "n"}
    plans = {"a": plan("chat", {"api": 8000, "master": 29500}), "b": plan("embed", {"api": 8001, "master": 29501}),
             "c": plan("far", {"api": 8000, "master": 29500})}
    assert fleet.co_resident_problems(plans, machine_of) == []  # c repeats a's ports on another machine: fine
    plans["b"] = plan("embed", {"api": 8001, "master": 29500})
    assert fleet.co_resident_problems(plans, machine_of) == [
        "host b (embed) on machine m: port master=29500 is also chat's master; deployments that share a machine "
        "need distinct ports (vllm_cluster_ports)"]
    plans["b"] = plan("embed", {"api": 8001, "master": 29501}, backend="ray")
    assert fleet.co_resident_problems(plans, machine_of)[0].startswith(
        "host b (embed) shares machine m with another deployment and plans backend ray")


def fleet_problems_of(hosts, hostvars, only):
    """The message fleet_deployments fails with."""
    with pytest.raises(AnsibleFilterError) as raised:
        fleet_deployments(hosts, hostvars, only)
    return str(raised.value.message)


def test_the_filters_read_hostvars_and_fail_with_the_message():
    hostvars = {"a1": {"vllm_cluster_deployment": "chat", "ansible_host": "10.0.0.1"},
                "b1": {"vllm_cluster_deployment": "embed", "ansible_host": "10.0.0.2"},
                "a2": {"vllm_cluster_deployment": "chat", "ansible_host": "10.0.0.3"}}
    hosts = ["a1", "b1", "a2"]
    assert fleet_deployments(hosts, hostvars) == [{"name": "chat", "hosts": ["a1", "a2"]},
                                                  {"name": "embed", "hosts": ["b1"]}]
    assert fleet_hosts(hosts, hostvars) == ["a1", "a2", "b1"] and fleet_batches(hosts, hostvars) == [2, 1]
    assert fleet_hosts(hosts, hostvars, "embed") == ["b1"] and fleet_batches(hosts, hostvars, "embed") == [1]
    # Before any play ran (--syntax-check): every host, one batch (no host has a plan then, so nothing runs).
    assert fleet_hosts(hosts, None) == hosts and fleet_batches(hosts, None) == []
    assert fleet_problems(hosts, hostvars) == [] and fleet_problems(hosts, hostvars, "embed") == []
    assert fleet_problems(hosts, hostvars, "code") == [fleet_problems_of(hosts, hostvars, "code")]
    hostvars["b1"]["ansible_host"] = "10.0.0.1"
    with pytest.raises(AnsibleFilterError, match=r"hosts a1 \(chat\), b1 \(embed\) are one machine"):
        fleet_batches(hosts, hostvars)
    # The same refusal as a line (plan.yml prints it once, then stops).
    problems = fleet_problems(hosts, hostvars)
    assert len(problems) == 1 and problems[0].startswith("hosts a1 (chat), b1 (embed) are one machine")
    # With disjoint GPU lists they share it; a run of embed alone plans chat too (with_co_residents), not a2's
    # machine-mates (it has none).
    hostvars["a1"]["vllm_cluster_gpu_ids"], hostvars["b1"]["vllm_cluster_gpu_ids"] = [0, 1], [2, 3]
    assert fleet_batches(hosts, hostvars) == [2, 1]
    assert fleet_deployments(hosts, hostvars, "embed") == [{"name": "embed", "hosts": ["b1"]}]
    assert fleet_deployments(hosts, hostvars, "embed", with_co_residents=True) == [
        {"name": "chat", "hosts": ["a1", "a2"]}, {"name": "embed", "hosts": ["b1"]}]
    # A stage's play: a deployment whose stage converged.yml skipped has no host there (launch: every mode's stage).
    hostvars["a1"]["vllm_cluster_stages_skipped"] = ["preflight", "network", "ray"]
    assert fleet_hosts(hosts, hostvars, stage="network") == ["b1"] and fleet_batches(hosts, hostvars, stage="network") == [1]
    assert fleet_hosts(hosts, hostvars, stage="launch") == ["b1"]
    assert fleet_hosts(hosts, hostvars, stage="vllm") == ["a1", "a2", "b1"]
    assert fleet_batches(hosts, hostvars, rolling=True, stage="vllm") == [2, 1]
    del hostvars["a1"]["vllm_cluster_stages_skipped"]
    hostvars["a1"]["vllm_cluster_plan"] = {"deployment": "chat", "ports": {"api": 8000}}
    hostvars["b1"]["vllm_cluster_plan"] = {"deployment": "embed", "ports": {"api": 8000}}
    # In inventory order whichever host asks: both deployments render the machine's one table alike.
    assert fleet_machine_plans(hosts, hostvars, "b1") == [hostvars["a1"]["vllm_cluster_plan"],
                                                          hostvars["b1"]["vllm_cluster_plan"]]
    assert fleet_machine_plans(hosts, hostvars, "a1") == fleet_machine_plans(hosts, hostvars, "b1")
    assert fleet_machine_plans(hosts, hostvars, "a2") == []  # no plan on a2 in this run
    assert fleet_co_resident_problems(hosts, hostvars) == [
        "host b1 (embed) on machine 10.0.0.1: port api=8000 is also chat's api; deployments that share a machine "
        "need distinct ports (vllm_cluster_ports)"]


def _inventory_request(group_vars, host):
    request_vars = dict(group_vars, **host)
    return {
        "model": request_vars["vllm_cluster_model"], "model_path": request_vars.get("vllm_cluster_model_path"),
        "deployment": request_vars["vllm_cluster_deployment"],
        "targets": {"max_model_len": request_vars["vllm_cluster_max_model_len"],
                    "gpu_memory_utilization": request_vars["vllm_cluster_gpu_memory_utilization"]},
        "serve_args": request_vars.get("vllm_cluster_serve_args"),
    }


def test_plan_yml_plans_each_deployment_of_the_fleet_example_from_its_own_hosts():
    result, report = play(FLEET_EXAMPLE)
    assert result.returncode == 0, result.stdout[-3000:]
    plans = {}  # tasks/plan_deployment.yml is included once per deployment: its tasks appear once each
    for one_play in report["plays"]:
        for entry in one_play["tasks"]:
            if entry["task"]["name"] == COMPUTE:
                plan = entry["hosts"]["localhost"]["ansible_facts"]["__vllm_cluster_plan"]
                plans[plan["deployment"]] = plan
    assert sorted(plans) == ["chat", "small"]
    assert (plans["chat"]["strategy"], plans["chat"]["tp"]) == ("tp", 4)
    assert [n["host"] for n in plans["chat"]["nodes"]] == ["gpu-a"]
    assert (plans["small"]["strategy"], plans["small"]["served_model_name"]) == ("single", "llama-8b")
    assert [n["host"] for n in plans["small"]["nodes"]] == ["gpu-b"]
    assert plans["small"]["serve_args"]["max-num-seqs"] == 128
    # Each plan is the planner's own for that deployment's variables and hosts alone.
    hosts = yaml.safe_load((FLEET_EXAMPLE / "hosts.yml").read_text())["all"]["children"]["vllm_nodes"]["children"]
    shared = yaml.safe_load((FLEET_EXAMPLE / "group_vars" / "vllm_nodes.yml").read_text())
    for name in ("chat", "small"):
        group_vars = dict(shared, **yaml.safe_load((FLEET_EXAMPLE / "group_vars" / f"{name}.yml").read_text()))
        (host, host_vars), = hosts[name]["hosts"].items()
        request = _inventory_request(group_vars, {})
        request["cluster"] = [{"name": host, "address": host_vars["ansible_host"], "fabric_interface": None,
                               "ib_hcas": [], "gpus": host_vars["vllm_cluster_gpus"]}]
        expected = build_plan(**{k: v for k, v in request.items() if v is not None})
        assert plans[name] == json.loads(json.dumps(expected)), name
    # Every host gets its own deployment's plan and host list.
    set_on = [item for one_play in report["plays"] for entry in one_play["tasks"] if entry["task"]["name"] == SET_ON
              for item in entry["hosts"]["localhost"]["results"]]
    assert {item["__vllm_cluster_host"]: (item["ansible_facts"]["vllm_cluster_plan"]["deployment"],
                                          item["ansible_facts"]["vllm_cluster_deployment_hosts"]) for item in set_on} \
        == {"gpu-a": ("chat", ["gpu-a"]), "gpu-b": ("small", ["gpu-b"])}


def test_a_selected_deployment_is_planned_alone():
    result, report = play(FLEET_EXAMPLE, "-e", "vllm_cluster_deployments=small")
    assert result.returncode == 0, result.stdout[-3000:]
    planned = [entry["hosts"]["localhost"]["ansible_facts"]["__vllm_cluster_plan"]["deployment"]
               for one_play in report["plays"] for entry in one_play["tasks"] if entry["task"]["name"] == COMPUTE]
    assert planned == ["small"]
    result, report = play(FLEET_EXAMPLE, "-e", "vllm_cluster_deployments=smal")
    assert result.returncode != 0
    printed = task(report, FLEET_CHECK)["localhost"]["msg"]
    assert len(printed) == 1 and "vllm_cluster_deployments names smal, which no host of vllm_nodes has" in printed[0]
    assert "this inventory's deployments: chat, small" in printed[0]
    assert "Find the deployments of vllm_nodes" not in json.dumps(report)  # stopped before the filter that raises


def _two_group_inventory(tmp_path, chat_hosts, small_hosts, small_vars=None):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"vllm_nodes": {
        "vars": {"vllm_cluster_gpus": H100, "vllm_cluster_max_model_len": 8192},
        "children": {
            "chat": {"hosts": chat_hosts, "vars": {"vllm_cluster_deployment": "chat",
                                                   "vllm_cluster_model": "llama-3.1-70b"}},
            "small": {"hosts": small_hosts, "vars": {"vllm_cluster_deployment": "small",
                                                     "vllm_cluster_model": "llama-3.1-8b", **(small_vars or {})}},
        }}}}}))
    return inventory


def test_variables_must_agree_inside_a_deployment_not_between_deployments(tmp_path):
    """Two deployments have different models and lengths (their own group_vars); inside one, a value that differs
    between hosts is an error naming the deployment."""
    inventory = _two_group_inventory(
        tmp_path, {"gpu-a": {"ansible_host": "192.0.2.1"}},
        {"gpu-b": {"ansible_host": "192.0.2.2", "vllm_cluster_max_model_len": 4096},
         "gpu-c": {"ansible_host": "192.0.2.3"}})
    result, report = play(inventory)
    assert result.returncode != 0
    assert check_messages(report) == {"small": [
        "vllm_cluster_max_model_len differs between the hosts of deployment small: gpu-b=4096, gpu-c=8192; "
        "set it for the group (group_vars), not per host (the plan reads the head's value alone)"]}


def test_two_inventory_hosts_of_one_machine_fail_the_plan_before_any_node_is_contacted(tmp_path):
    inventory = _two_group_inventory(tmp_path, {"gpu-a": {"ansible_host": "192.0.2.1"}},
                                     {"gpu-a-small": {"ansible_host": "192.0.2.1"}})
    result, report = play(inventory)
    assert result.returncode != 0
    printed = task(report, FLEET_CHECK)["localhost"]["msg"]
    assert len(printed) == 1 and printed[0].startswith(
        "hosts gpu-a (chat), gpu-a-small (small) are one machine (ansible_host 192.0.2.1): deployments that "
        "share a machine each name their GPUs with vllm_cluster_gpu_ids")
    assert task(report, FLEET_STOP)["localhost"]["msg"] == (
        "plan.yml refused the deployments of vllm_nodes (printed above, one line each); no node was contacted")
    assert len(report["plays"]) == 1


# Plays whose tasks are per host alone (no run_once, no peers): every host at once, no batches.
PER_HOST_PLAYS = ("deployed_plan.yml: Read the plan each node runs",)
PLANNED_HOSTS_PLAY = "plan.yml: Gather GPU facts on the nodes that do not declare them"
# Not over the nodes: the monitoring host(s), the group vllm_monitor (role vllm_monitoring).
MONITOR_PLAY = "monitoring.yml: Prometheus on the monitoring host, with the fleet's targets and the alert rules"
# The router fronts deployments: it runs on its own group, once, not per deployment.
ROUTER_TEARDOWN_PLAY = "teardown.yml: Stop and remove the router"
# The final vLLM stage: a deployment that rolls behind the router runs one server per batch (rolling=true).
ROLLING_PLAY = "vllm.yml: Final stage: vLLM with the plan's argv"
ROUTER_PLAY = "router.yml: The router on its hosts, in front of the plans' API servers"
MONITORING_TEARDOWN_PLAYS = {"teardown.yml: Stop Prometheus with the last deployment it watches": "vllm_monitor",
                             "teardown.yml: Stop node exporter with the last deployment": "vllm_nodes",
                             "teardown.yml: Say how to drop the removed deployments from Prometheus's targets":
                                 "localhost"}


# plan.yml's first play: the controller either way; the test loads the collection's filters in the main process.
CONTROLLER_PRELOADING_FILTERS = "{{ 'localhost' if 'vllm_ops.cluster.fleet_hosts' is filter else 'localhost' }}"


def test_every_play_over_the_nodes_runs_one_batch_per_deployment():
    """Suite rule: a play over vllm_nodes without the fleet's hosts and serial would run run_once tasks once for
    all deployments (the first deployment's head would verify, benchmark or diagnose every deployment)."""
    expected_hosts = ("{{ groups | vllm_ops.cluster.fleet_hosts(hostvars | default(none), "
                      "vllm_cluster_deployments | default('')) }}")
    expected_serial = expected_hosts.replace("fleet_hosts", "fleet_batches")
    unbatched = []
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        for one_play in yaml.safe_load(path.read_text()) or []:
            hosts = one_play.get("hosts")
            if isinstance(hosts, str):
                hosts = " ".join(hosts.split())  # a long expression folded over lines
            if isinstance(one_play.get("serial"), str):
                one_play["serial"] = " ".join(one_play["serial"].split())
            if hosts is None or hosts in ("localhost", CONTROLLER_PRELOADING_FILTERS):
                continue
            name = f"{path.name}: {one_play.get('name')}"
            if name == ROUTER_TEARDOWN_PLAY:  # the router's hosts, only when every deployment goes down
                assert "vllm_router" in hosts and "vllm_cluster_deployments" in hosts and "serial" not in one_play
                continue
            if name in MONITORING_TEARDOWN_PLAYS:  # no run_once: only when every deployment goes down
                assert MONITORING_TEARDOWN_PLAYS[name] in hosts and "vllm_cluster_deployments" in hosts, name
                assert "serial" not in one_play, name
                continue
            if path.name == "teardown.yml":  # per host, --limit works; it selects with meta: end_host
                assert hosts == "vllm_nodes", name
                continue
            if name == MONITOR_PLAY:
                assert "vllm_monitor" in hosts and "serial" not in one_play, name
                continue
            if name == ROUTER_PLAY:
                assert "vllm_router" in hosts and "serial" not in one_play, name
                continue
            if name == PLANNED_HOSTS_PLAY:  # read only, per host: the selection and its machine-mates
                planned = one_play["vars"]["__vllm_cluster_planned_hosts"]
                assert "__vllm_cluster_planned_hosts" in hosts and "__vllm_cluster_fleet" in planned, name
                assert "serial" not in one_play, name
                continue
            # A deploy.yml stage's play names its stage: a deployment whose stage is skipped has no host there.
            stage = (one_play.get("vars") or {}).get("deploy_stage_name")
            suffix = "" if stage is None else f", stage='{'launch' if '{{' in str(stage) else stage}'"
            if hosts != expected_hosts.replace(") }}", suffix + ") }}"):
                unbatched.append(f"{name}: hosts {hosts!r}")
            elif name == ROLLING_PLAY:
                if one_play.get("serial") != expected_serial.replace(") }}", ", rolling=true" + suffix + ") }}"):
                    unbatched.append(f"{name}: serial {one_play.get('serial')!r}")
            elif (one_play.get("serial") != expected_serial.replace(") }}", suffix + ") }}")
                  and name not in PER_HOST_PLAYS):
                unbatched.append(f"{name}: serial {one_play.get('serial')!r}")
    assert not unbatched


def test_no_task_ends_the_whole_play():
    """meta: end_play in a fleet play ends every later deployment's batch too: the stage skip of a converged
    deployment A skipped deployment B's changed stage (found by tests/lab/test_fleet.py). end_batch ends one."""
    users = [str(path.relative_to(REPO)) for path in [*REPO.glob("playbooks/**/*.yml"), *REPO.glob("roles/*/tasks/*.yml")]
             if re.search(r"meta: +end_play", path.read_text())]
    assert users == []


SHARED_EXAMPLE = EXAMPLES / "fleet-shared-node"


def _plans_of(report):
    plans = {}
    for one_play in report["plays"]:
        for entry in one_play["tasks"]:
            if entry["task"]["name"] == COMPUTE:
                plan = entry["hosts"]["localhost"]["ansible_facts"]["__vllm_cluster_plan"]
                plans[plan["deployment"]] = plan
    return plans


def test_two_deployments_share_one_machine_on_disjoint_gpus():
    """The shared-node example: one 8-GPU machine, chat on GPUs 0-3 and coder on 4-7. Each plan counts its own
    GPUs, sets CUDA_VISIBLE_DEVICES to them, names them in local_gpus as nvidia-smi does, and runs as its own
    unit with its own files; the ports differ. Fails if a deployment saw all 8 GPUs, or both used vllm.service."""
    result, report = play(SHARED_EXAMPLE)
    assert result.returncode == 0, result.stdout[-3000:]
    plans = _plans_of(report)
    chat, coder = plans["chat"], plans["coder"]
    assert chat["cluster"]["gpus_per_node"] == 4 and coder["cluster"]["gpus_per_node"] == 4
    (chat_node,), (coder_node,) = chat["nodes"], coder["nodes"]
    assert chat_node["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and chat_node["gpu_ids"] == [0, 1, 2, 3]
    assert coder_node["env"]["CUDA_VISIBLE_DEVICES"] == "4,5,6,7" and coder_node["local_gpus"] == [4, 5, 6, 7]
    assert coder["tp"] == 4
    assert chat["service"] == {"unit": "vllm-chat.service", "config_dir": "/etc/vllm-cluster/deployments/chat",
                               "stage_dir": "/etc/vllm-cluster/deployments/chat/stages", "shares_machines": True}
    assert coder["service"]["unit"] == "vllm-coder.service"
    assert chat["ports"]["api"] != coder["ports"]["api"]


@pytest.mark.parametrize(("coder_ids", "expected"), [
    ([3, 4, 5, 6], "GPU 3 is in vllm_cluster_gpu_ids of both h200-1-chat ([0, 1, 2, 3]) and h200-1-coder "
                   "([3, 4, 5, 6]); expected disjoint GPU lists"),
    (None, "deployments that share a machine each name their GPUs with vllm_cluster_gpu_ids (disjoint lists); "
           "h200-1-coder sets none"),
])
def test_overlapping_or_missing_gpu_lists_fail_before_any_node_is_contacted(tmp_path, coder_ids, expected):
    inventory = tmp_path / "inventory"
    shutil.copytree(SHARED_EXAMPLE, inventory)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    coder = hosts["all"]["children"]["vllm_nodes"]["children"]["coder"]["hosts"]["h200-1-coder"]
    if coder_ids is None:
        del coder["vllm_cluster_gpu_ids"]
    else:
        coder["vllm_cluster_gpu_ids"] = coder_ids
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    result, report = play(inventory)
    assert result.returncode != 0
    printed = task(report, FLEET_CHECK)["localhost"]["msg"]
    assert "hosts h200-1-chat (chat), h200-1-coder (coder) are one machine (ansible_host 192.0.2.40): " + expected \
        in printed[0]
    assert len(report["plays"]) == 1  # nothing after the controller's first play


def test_a_port_two_deployments_of_one_machine_open_fails_the_plan(tmp_path):
    inventory = tmp_path / "inventory"
    shutil.copytree(SHARED_EXAMPLE, inventory)
    coder_vars = yaml.safe_load((inventory / "group_vars" / "coder.yml").read_text())
    coder_vars["vllm_cluster_ports"]["master"] = 29501  # chat's master port (the default)
    (inventory / "group_vars" / "coder.yml").write_text(yaml.safe_dump(coder_vars))
    result, report = play(inventory)
    assert result.returncode != 0
    failed = task(report, "Check that the deployments sharing a machine open distinct ports "
                          "(fleet_co_resident_problems)")["localhost"]
    assert failed["msg"] == ["host h200-1-coder (coder) on machine 192.0.2.40: port master=29501 is also chat's "
                             "master; deployments that share a machine need distinct ports (vllm_cluster_ports)"]
    assert task(report, "Stop when deployments sharing a machine collide")["localhost"]["failed"]


def test_a_run_of_one_deployment_plans_its_machine_mate_and_no_other(tmp_path):
    """-e vllm_cluster_deployments=coder plans chat too (the machine's firewall covers both), and nothing else."""
    inventory = tmp_path / "inventory"
    shutil.copytree(SHARED_EXAMPLE, inventory)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["vllm_nodes"]["children"]["far"] = {
        "hosts": {"h200-2": {"ansible_host": "192.0.2.41"}},
        "vars": {"vllm_cluster_deployment": "far", "vllm_cluster_model": "llama-3.1-8b"}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    result, report = play(inventory, "-e", "vllm_cluster_deployments=coder")
    assert result.returncode == 0, result.stdout[-3000:]
    assert sorted(_plans_of(report)) == ["chat", "coder"]


def test_the_planner_counts_a_nodes_gpu_ids_and_refuses_ones_it_lacks():
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import PlanError
    node = {"name": "gpu-a", "address": "192.0.2.30", "gpus": H100, "gpu_ids": [6, 7]}
    plan = build_plan("llama-3.1-8b", [node], {"max_model_len": 8192}, {"tp": 2}, deployment="small")
    (entry,) = plan["nodes"]
    assert (entry["local_gpus"], entry["env"]["CUDA_VISIBLE_DEVICES"], plan["cluster"]["gpus_per_node"]) == (
        [6, 7], "6,7", 2)
    assert plan["service"]["unit"] == "vllm-small.service"
    # Without gpu_ids: the machine's own names, no CUDA_VISIBLE_DEVICES (every GPU).
    whole = build_plan("llama-3.1-8b", [dict(node, gpu_ids=None)], {"max_model_len": 8192}, deployment="small")
    assert whole["service"]["unit"] == "vllm.service" and "CUDA_VISIBLE_DEVICES" not in whole["nodes"][0]["env"]
    with pytest.raises(PlanError, match=r"node gpu-a: vllm_cluster_gpu_ids \[7, 8\] names GPU 8, but the node has "
                                        r"8 GPU\(s\) \(indices 0-7\)"):
        build_plan("llama-3.1-8b", [dict(node, gpu_ids=[7, 8])], {"max_model_len": 8192})
    # On the CPU platform (the lab) lab GPU i is core i: two deployments on one node bind apart.
    cpu = {"name": "node3", "address": "10.232.2.13", "gpu_ids": [1],
           "gpus": {"count": 2, "name": "cpu", "memory_total_mib": 4096, "nvlink": False}}
    sys.path.insert(0, str(REPO / "lab"))
    from make_tiny_model import make_config  # noqa: PLC0415

    lab = build_plan({"config": make_config("llama", 4, 4, 2, 32, 0)}, [cpu], {"max_model_len": 512},
                     device="cpu", deployment="lab-c", model_path="/srv/models/tiny-llama")
    assert lab["nodes"][0]["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "1"


class CountingHostVars(Mapping):
    """Ansible's hostvars stand-in: each host's variables computed on access, and the accesses counted."""

    def __init__(self, variables):
        self.variables, self.reads = variables, collections.Counter()

    def __getitem__(self, host):
        self.reads[host] += 1
        return dict(self.variables[host])

    def __contains__(self, host):  # as Ansible's: without computing the host's variables
        return host in self.variables

    def __iter__(self):
        return iter(self.variables)

    def __len__(self):
        return len(self.variables)


def test_a_run_reads_the_deployments_once_and_each_stage_skip_from_one_host_per_deployment():
    variables = {"a1": {"vllm_cluster_deployment": "chat", "ansible_host": "10.0.0.1"},
                 "a2": {"vllm_cluster_deployment": "chat", "ansible_host": "10.0.0.2"},
                 "b1": {"vllm_cluster_deployment": "embed", "ansible_host": "10.0.0.3"}}
    hosts = ["a1", "a2", "b1"]
    hostvars = CountingHostVars(variables)
    assert fleet_hosts(hosts, hostvars) == ["a1", "a2", "b1"] and hostvars.reads == {"a1": 1, "a2": 1, "b1": 1}
    assert fleet_batches(hosts, hostvars) == [2, 1] and hostvars.reads == {"a1": 1, "a2": 1, "b1": 1}
    # A stage's play reads the skip list (set by converged.yml during the run) again, from one host per deployment.
    variables["a1"]["vllm_cluster_stages_skipped"] = ["preflight"]
    assert fleet_hosts(hosts, hostvars, stage="preflight") == ["b1"]
    assert hostvars.reads == {"a1": 2, "a2": 1, "b1": 2}
    # Another run (another hostvars object) reads the inventory again; so does a plain dict every time.
    variables["b1"]["vllm_cluster_deployment"] = "chat"
    assert fleet_batches(hosts, hostvars) == [2, 1]
    other_run = CountingHostVars(variables)
    assert fleet_batches(hosts, other_run) == [3] and other_run.reads == {"a1": 1, "a2": 1, "b1": 1}
    assert fleet_batches(hosts, dict(variables)) == [3]
