"""playbooks/plan.yml on the seed's example inventories: offline, once, the same plan as the planner."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.summary import layout_table as plan_table

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "inventories" / "examples"
PLAYBOOK = REPO / "playbooks" / "plan.yml"
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
SET_ON = "Set vllm_cluster_plan and the deployment's hosts on each of its nodes"
COMPUTE = "Compute the plan from the head's variables and the nodes (vllm_ops.cluster.plan_from_inventory)"
REFUSAL = "Print the planner's refusal"
STOP = "Stop when the planner refused the deployment"

# What the seed says for each scenario (the acceptance list).
SEED = {
    "single-gpu-8b": {"strategy": "single", "tp": 1, "world_size": 1},
    "tp-70b-4xa100": {"strategy": "tp", "tp": 4, "world_size": 4},
    "tp-pp-405b-2x8xh100": {"strategy": "tp_pp", "tp": 8, "pp": 2, "world_size": 16},
    "ep-dp-deepseek-v3-8xh200": {"strategy": "ep_dp", "ep": 8},
}


def play(inventory, *extra, cwd=REPO):
    env = dict(
        os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"
    )
    result = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), str(PLAYBOOK), "-i", str(inventory), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
        check=False,
    )
    return result, (json.loads(result.stdout) if result.stdout.strip().startswith("{") else None)


def task(report, name):
    for one_play in report["plays"]:
        for entry in one_play["tasks"]:
            if entry["task"]["name"] == name:
                return entry["hosts"]
    raise AssertionError(f"task {name!r} did not run")


def inventory_request(inventory):
    """The plan request, read straight from the inventory files (the example declares everything)."""
    hosts_file = yaml.safe_load((inventory / "hosts.yml").read_text())["all"]["children"]["vllm_nodes"]
    group = dict(hosts_file.get("vars", {}))
    group.update(yaml.safe_load((inventory / "group_vars" / "vllm_nodes.yml").read_text()))
    nodes = []
    for name, host in hosts_file["hosts"].items():
        merged = dict(group, **host)
        node = {
            "name": name,
            "address": merged.get("vllm_cluster_fabric_address", merged["ansible_host"]),
            "gpus": merged["vllm_cluster_gpus"],
        }
        if "vllm_cluster_fabric_interface" in merged:
            node["fabric_interface"] = merged["vllm_cluster_fabric_interface"]
            node["ib_hcas"] = merged.get("vllm_cluster_ib_hcas")
        nodes.append(node)
    return {
        "model": group["vllm_cluster_model"],
        "model_path": group.get("vllm_cluster_model_path"),
        "deployment": group["vllm_cluster_deployment"],
        "cluster": nodes,
        "targets": {
            "max_model_len": group.get("vllm_cluster_max_model_len"),
            "gpu_memory_utilization": group.get("vllm_cluster_gpu_memory_utilization"),
        },
        "overrides": {"backend": group.get("vllm_cluster_backend"), "tp": group.get("vllm_cluster_tp")},
        "enforce_eager": group.get("vllm_cluster_enforce_eager"),
    }


@pytest.mark.parametrize("example", sorted(SEED))
def test_plan_playbook_plans_the_seed_scenario_offline(example):
    inventory = EXAMPLES / example
    result, report = play(inventory)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The example hosts do not exist: no task may have run on them.
    for one_play in report["plays"]:
        for entry in one_play["tasks"]:
            for host, outcome in entry["hosts"].items():
                assert host == "localhost" or outcome.get("skipped"), (entry["task"]["name"], host)

    plan = task(report, COMPUTE)["localhost"][
        "ansible_facts"
    ]["__vllm_cluster_plan"]
    for key, value in SEED[example].items():
        assert plan[key] == value, key
    request = inventory_request(inventory)
    expected = build_plan(**{k: v for k, v in request.items() if v is not None})
    assert plan == json.loads(json.dumps(expected))

    decision = task(report, "Print the decision path through the seed's tree")["localhost"]["msg"]
    assert decision == plan["decision"]
    table = task(report, "Print the layout table")["localhost"]["msg"]
    assert table == plan_table(plan) and table[0].startswith(f"Layout: {plan['strategy']} ({plan['backend']}) TP=")
    assert [line.split()[0] for line in table[2:-1]] == [node["host"] for node in plan["nodes"]]

    set_on = task(report, SET_ON)["localhost"]["results"]
    assert sorted(item["__vllm_cluster_host"] for item in set_on) == sorted(
        n["name"] for n in request["cluster"]
    )
    assert all(item["ansible_facts"]["vllm_cluster_plan"] == plan for item in set_on)
    assert all(item["ansible_facts"]["vllm_cluster_deployment_hosts"] == [n["name"] for n in request["cluster"]]
               for item in set_on)


def test_plan_playbook_writes_plan_json_when_asked():
    deployment = f"pytest-plan-{os.getpid()}"
    results = REPO / "results" / deployment
    try:
        result, _ = play(
            EXAMPLES / "tp-70b-4xa100",
            "-e",
            "vllm_cluster_plan_output=true",
            "-e",
            f"vllm_cluster_deployment={deployment}",
        )
        assert result.returncode == 0, result.stdout[-2000:]
        written = json.loads((results / "plan.json").read_text())
        assert written["deployment"] == deployment and written["tp"] == 4
    finally:
        shutil.rmtree(results, ignore_errors=True)
        if (REPO / "results").is_dir() and not any((REPO / "results").iterdir()):
            (REPO / "results").rmdir()


def test_plan_json_goes_to_the_working_directory_or_vllm_cluster_results_dir(tmp_path):
    """Not beside the playbook: an installed collection is shared code (lookup vllm_ops.cluster.results_dir)."""
    deployment = f"pytest-cwd-{os.getpid()}"
    ask = ["-e", "vllm_cluster_plan_output=true", "-e", f"vllm_cluster_deployment={deployment}"]
    result, _ = play(EXAMPLES / "tp-70b-4xa100", *ask, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:]
    assert json.loads((tmp_path / "results" / deployment / "plan.json").read_text())["deployment"] == deployment
    assert not (REPO / "results" / deployment).exists()
    result, _ = play(EXAMPLES / "tp-70b-4xa100", *ask, "-e", "vllm_cluster_results_dir=out/plans", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:]
    assert (tmp_path / "out" / "plans" / deployment / "plan.json").is_file()
    assert not (REPO / "results" / deployment).exists()


def test_plan_playbook_fails_with_the_planners_message(tmp_path):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "vllm_nodes": {
                            "hosts": {
                                "gpu-a": {
                                    "ansible_host": "192.0.2.99",
                                    "vllm_cluster_gpus": {
                                        "count": 8,
                                        "name": "NVIDIA H100 80GB HBM3",
                                        "memory_total_mib": 81559,
                                        "nvlink": True,
                                    },
                                }
                            },
                            "vars": {"vllm_cluster_model": "llama-3.1-405b"},
                        }
                    }
                }
            }
        )
    )
    result, report = play(inventory)
    assert result.returncode != 0
    refusal = task(report, REFUSAL)["localhost"]["msg"]
    assert refusal.startswith("deployment vllm: no layout fits llama-3.1-405b") and "usable 73.28 GiB per GPU" in refusal
    assert task(report, STOP)["localhost"]["msg"] == "plan.yml: the planner refused deployment vllm (printed above)"
    # In the planner's own words: not wrapped in Ansible's template error (tests/unit/test_plan_validation.py
    # counts what the default output prints).
    assert "filter plugin" not in result.stdout and "Finalization of task args" not in result.stdout


def test_a_bad_planning_variable_is_named_with_its_host(tmp_path):
    inventory = tmp_path / "inventory.yml"
    gpus = {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}
    inventory.write_text(yaml.safe_dump({"all": {"children": {"vllm_nodes": {
        "hosts": {"gpu-a": {"ansible_host": "192.0.2.99", "vllm_cluster_gpus": gpus}},
        "vars": {"vllm_cluster_model": "llama-3.1-8b", "vllm_cluster_tp": 3}}}}}))
    result, report = play(inventory)
    assert result.returncode != 0
    refusal = task(report, REFUSAL)["localhost"]["msg"]
    assert "vllm_cluster_tp=3 on gpu-a is invalid for llama-3.1-8b: Total number of attention heads" in refusal
    # Text from -e is converted; what is not a number is refused by the variable check, before any node is
    # contacted, named with the host and the variable.
    result, report = play(inventory, "-e", "vllm_cluster_tp=two")
    assert result.returncode != 0
    assert check_messages(report)["vllm"] == [
        "host gpu-a: vllm_cluster_tp='two': expected an integer (a planner input, plugins/module_utils/plan/request.py)"]
    result, report = play(inventory, "-e", "vllm_cluster_tp=1")
    assert result.returncode == 0 and task(report, COMPUTE)["localhost"]["ansible_facts"]["__vllm_cluster_plan"]["tp"] == 1


def test_plan_playbook_names_a_host_without_gpu_facts(tmp_path):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        "  children:\n    vllm_nodes:\n      hosts:\n        gpu-z:\n          ansible_host: 192.0.2.9\n"
        "      vars:\n        vllm_cluster_model: llama-3.1-8b\n"
    )
    # gpu-z has no declared facts, so play 1 would gather them; limit the run to the controller play.
    result, report = play(inventory, "--limit", "localhost")
    assert result.returncode != 0
    failed = task(report, "Check that every node has GPU facts, declared or gathered")["localhost"]
    assert "host gpu-z has no GPU facts" in json.dumps(failed)


FLEET = "Find the deployments of vllm_nodes (vllm_cluster_deployments selects some)"
CHECK = "Check the variables of every deployment and host (variable_problems)"
CHECK_STOP = "Stop before any node is contacted when a variable is refused"


def check_messages(report):
    """The variable check's message of each deployment that failed it, by deployment (the task loops over them)."""
    return {item["__vllm_cluster_deployment"]["name"]: item["msg"]
            for item in task(report, CHECK)["localhost"]["results"] if "msg" in item}


def test_a_misspelled_variable_fails_the_plan_before_any_node_is_contacted(tmp_path):
    """Issue 17: a misspelled variable was silently ignored. Now the first task, on the controller, names the host,
    the value and the variable meant; no node is contacted (gpu-z declares no GPU facts: play 2 would gather them)."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"vllm_nodes": {
        "hosts": {"gpu-z": {"ansible_host": "192.0.2.9", "vllm_cluster_gpus_typo": {}}},
        "vars": {"vllm_cluster_model": "llama-3.1-8b", "vllm_cluster_tensor_parallel": 2}}}}}))
    result, report = play(inventory)
    assert result.returncode != 0, result.stdout[-2000:]
    assert [entry["task"]["name"] for one_play in report["plays"] for entry in one_play["tasks"]] == [
        "Check the deployments of vllm_nodes (fleet_problems)", "Stop when the deployments are refused", FLEET,
        "Print the deployments this run acts on", CHECK, CHECK_STOP]
    assert check_messages(report)["vllm"] == [
        "host gpu-z: vllm_cluster_gpus_typo={} is not a variable of vllm-cluster; did you mean vllm_cluster_gpus?",
        "host gpu-z: vllm_cluster_tensor_parallel=2 is not a variable of vllm-cluster; did you mean vllm_cluster_tp?"]


def test_a_planning_variable_set_per_host_must_agree_and_per_host_ones_may_differ(tmp_path):
    gpus = {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}
    hosts = {"gpu-a": {"ansible_host": "192.0.2.10", "vllm_cluster_fabric_address": "10.0.0.1",
                       "vllm_cluster_max_model_len": 8192},
             "gpu-b": {"ansible_host": "192.0.2.11", "vllm_cluster_fabric_address": "10.0.0.2",
                       "vllm_cluster_max_model_len": 4096}}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"vllm_nodes": {
        "hosts": hosts, "vars": {"vllm_cluster_model": "llama-3.1-8b", "vllm_cluster_gpus": gpus,
                                 "node_firewall_api_allowed_cidrs": ["10.0.0.0/8"]}}}}}))
    result, report = play(inventory)
    assert result.returncode != 0
    assert check_messages(report)["vllm"] == [
        "vllm_cluster_max_model_len differs between the hosts of deployment vllm: gpu-a=8192, gpu-b=4096; "
        "set it for the group (group_vars), not per host (the plan reads the head's value alone)"]
    # The same value on both (here: an extra var, which every host sees) plans; the addresses differ, as they must.
    result, report = play(inventory, "-e", "vllm_cluster_max_model_len=4096")
    assert result.returncode == 0, result.stdout[-2000:]
    assert not check_messages(report)
    plan = task(report, COMPUTE)["localhost"]["ansible_facts"]["__vllm_cluster_plan"]
    assert [n["address"] for n in plan["cluster"]["nodes"]] == ["10.0.0.1", "10.0.0.2"]


def test_the_plan_never_reads_facts_cached_by_an_earlier_run(tmp_path):
    # A node that declares its GPUs is not contacted: a fact cache holding its active IB ports and its
    # fabric interface (what a preflight run leaves) must not change the plan (it did: a re-run restarted vLLM).
    def node(hcas=None):
        host = {"ansible_host": "192.0.2.10", "vllm_cluster_fabric_interface": "eth1",
                "vllm_cluster_gpus": {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
                                      "nvlink": True}}
        return host if hcas is None else dict(host, vllm_cluster_ib_hcas=hcas)

    def plan_env(hosts, cache):
        inventory = tmp_path / "inventory.yml"
        inventory.write_text(yaml.safe_dump({"all": {"children": {"vllm_nodes": {
            "hosts": hosts, "vars": {"vllm_cluster_model": "llama-3.1-8b"}}}}}))
        env = dict(os.environ, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(cache))
        result = subprocess.run([str(ANSIBLE_PLAYBOOK), str(PLAYBOOK), "-i", str(inventory)], capture_output=True,
                                text=True, timeout=120, cwd=REPO, check=False,
                                env=dict(env, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
                                         ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        plan = task(json.loads(result.stdout), COMPUTE)
        return plan["localhost"]["ansible_facts"]["__vllm_cluster_plan"]["nodes"][0]["env"]

    empty, stale = tmp_path / "empty-cache", tmp_path / "stale-cache"
    empty.mkdir()
    # The stale cache, written by Ansible itself (set_fact cacheable) in the format it reads back.
    seed = tmp_path / "seed.yml"
    seed.write_text(yaml.safe_dump([{"hosts": "gpu-a", "gather_facts": False, "tasks": [{"ansible.builtin.set_fact": {
        "vllm_ib": {"present": True, "infiniband_active": ["mlx5_0/1", "mlx5_1/1"]},
        "eth1": {"device": "eth1", "ipv4": {"address": "10.9.9.9"}},
        "vllm_gpu": {"count": 1, "name": "NVIDIA A10G", "memory_total_mib": 23028, "nvlink": False},
        "cacheable": True}}]}]))
    seeded = subprocess.run([str(ANSIBLE_PLAYBOOK), str(seed), "-i", "gpu-a,", "-c", "local"], capture_output=True,
                            text=True, timeout=120, cwd=REPO, check=False,
                            env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
                                     ANSIBLE_CACHE_PLUGIN_CONNECTION=str(stale)))
    assert seeded.returncode == 0 and any(stale.iterdir()), seeded.stdout[-2000:]
    first = plan_env({"gpu-a": node()}, empty)
    assert first == plan_env({"gpu-a": node()}, stale)
    assert first["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in first
    assert first["VLLM_HOST_IP"] == "192.0.2.10"
    # HCAs come from the one declaration nccl_network writes and checks too.
    declared = plan_env({"gpu-a": node(["mlx5_0:1", "mlx5_1:1"])}, stale)
    assert declared["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1" and "NCCL_IB_DISABLE" not in declared


def test_a_limit_without_localhost_is_named_before_any_node_is_contacted():
    # plan.yml plans on the controller: a --limit of nodes only leaves it out. Would fail if deploy.yml went on to
    # "vllm_cluster_plan is undefined" in the converged check, or contacted the node (192.0.2.0/24 answers nothing).
    inventory = EXAMPLES / "tp-70b-4xa100"
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    result = subprocess.run([str(ANSIBLE_PLAYBOOK), str(REPO / "deploy.yml"), "-i", str(inventory), "--limit", "gpu-a"],
                            capture_output=True, text=True, timeout=120, cwd=REPO, env=env, check=False)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-2000:]
    assert ("hosts gpu-a have no plan: plan.yml computes it on localhost, which --limit gpu-a leaves out: add it, "
            "as in --limit 'gpu-a,localhost'") in result.stdout, result.stdout[-3000:]
    assert "unreachable=0" in result.stdout and "is undefined" not in result.stdout + result.stderr
