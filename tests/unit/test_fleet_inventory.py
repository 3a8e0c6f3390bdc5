"""Several deployments in one inventory (issue 17): plan/fleet.py, its filters, and plan.yml on a fleet inventory."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.filter.fleet import (
    fleet_batches,
    fleet_deployments,
    fleet_hosts,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import fleet
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan
from test_planner_playbook import COMPUTE, EXAMPLES, SET_ON, check_messages, play, task

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


def test_two_inventory_hosts_on_one_machine_are_refused():
    selected = [("chat", ["gpu-a"]), ("embed", ["gpu-a-embed"])]
    problems = fleet.shared_machine_problems(selected, {"gpu-a": "192.0.2.30", "gpu-a-embed": "192.0.2.30"})
    assert problems == ["hosts gpu-a (chat), gpu-a-embed (embed) are one machine (ansible_host 192.0.2.30), in "
                        "deployments chat, embed: each machine may hold one host of one deployment (its vLLM unit, "
                        "plan, firewall table and stage stamps are the machine's own); give the deployments "
                        "disjoint machines"]
    assert fleet.shared_machine_problems(selected, {"gpu-a": "192.0.2.30", "gpu-a-embed": "192.0.2.31"}) == []
    # Without ansible_host a host is its own machine (local test inventories).
    assert fleet.shared_machine_problems(selected, {}) == []


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
    hostvars["b1"]["ansible_host"] = "10.0.0.1"
    with pytest.raises(AnsibleFilterError, match=r"hosts a1 \(chat\), b1 \(embed\) are one machine"):
        fleet_batches(hosts, hostvars)


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
    failed = task(report, "Find the deployments of vllm_nodes (vllm_cluster_deployments selects some)")["localhost"]
    assert "vllm_cluster_deployments names smal, which no host of vllm_nodes has" in failed["msg"]
    assert "this inventory's deployments: chat, small" in failed["msg"]


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
    assert check_messages(report) == {"small": (
        "vllm_cluster_max_model_len differs between the hosts of deployment small: gpu-b=4096, gpu-c=8192; "
        "set it for the group (group_vars), not per host (the plan reads the head's value alone)")}


def test_two_inventory_hosts_of_one_machine_fail_the_plan_before_any_node_is_contacted(tmp_path):
    inventory = _two_group_inventory(tmp_path, {"gpu-a": {"ansible_host": "192.0.2.1"}},
                                     {"gpu-a-small": {"ansible_host": "192.0.2.1"}})
    result, report = play(inventory)
    assert result.returncode != 0
    failed = task(report, "Find the deployments of vllm_nodes (vllm_cluster_deployments selects some)")["localhost"]
    assert "hosts gpu-a (chat), gpu-a-small (small) are one machine (ansible_host 192.0.2.1)" in failed["msg"]
    assert len(report["plays"]) == 1


# Plays whose tasks are per host alone (no run_once, no peers): every host at once, no batches.
PER_HOST_PLAYS = ("plan.yml: Gather GPU facts on the nodes that do not declare them",
                  "deployed_plan.yml: Read the plan each node runs")


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
            if hosts is None or hosts == "localhost":
                continue
            name = f"{path.name}: {one_play.get('name')}"
            if path.name == "teardown.yml":  # per host, --limit works; it selects with meta: end_host
                assert hosts == "vllm_nodes", name
                continue
            if hosts != expected_hosts:
                unbatched.append(f"{name}: hosts {hosts!r}")
            elif one_play.get("serial") != expected_serial and name not in PER_HOST_PLAYS:
                unbatched.append(f"{name}: serial {one_play.get('serial')!r}")
    assert not unbatched


def test_no_task_ends_the_whole_play():
    """meta: end_play in a fleet play ends every later deployment's batch too: the stage skip of a converged
    deployment A skipped deployment B's changed stage (found by tests/lab/test_fleet.py). end_batch ends one."""
    users = [str(path.relative_to(REPO)) for path in [*REPO.glob("playbooks/**/*.yml"), *REPO.glob("roles/*/tasks/*.yml")]
             if re.search(r"meta: +end_play", path.read_text())]
    assert users == []
