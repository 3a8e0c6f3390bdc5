"""vLLM 0.32 and 0.33: the release a plan targets, and what an inventory sets that the release dropped or lacks."""

import pytest
from ansible_collections.vllm_ops.cluster.plugins.filter.variable_problems import (
    variable_problems as the_filter,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import vllm_versions as versions
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import (
    PlanError,
    PlanRequest,
    build_plan,
    plan,
)

H100 = {"count": 1, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}
NODES = [{"name": "node1", "address": "10.0.0.1", "gpus": H100}]


@pytest.mark.parametrize(("version", "release"), [("0.32.0", "0.32"), ("0.33.0", "0.33"), ("0.33.1+cpu", "0.33"),
                                                  ("0.32", "0.32"), ("0.31.2", "0.31"), ("latest", None)])
def test_the_release_series_of_a_version(version, release):
    assert versions.series(version) == release


def test_only_032_and_033_releases_are_planned():
    assert versions.version_problem("0.33.0") is None and versions.version_problem("0.32.0") is None
    assert versions.version_problem("0.31.2") == ("vllm_runtime_vllm_version is '0.31.2': the collection plans vLLM "
                                                  "0.32 and 0.33 releases (e.g. 0.32.0)")
    with pytest.raises(PlanError, match=r"vllm_version is '0.34.0': the collection plans vLLM 0.32 and 0.33"):
        build_plan("llama-3.1-8b", NODES, vllm_version="0.34.0")


@pytest.mark.parametrize(("version", "flag", "problem"), [
    ("0.33.0", "mamba-cache-mode", "--mamba-cache-mode: it is deprecated and has no effect in vLLM 0.33: remove it"),
    ("0.32.0", "mamba-cache-mode", None),
    ("0.32.0", "watchdog-config", "--watchdog-config is new in vLLM 0.33 and vLLM 0.32.0 refuses it: remove it or "
                                  "target vLLM 0.33"),
    ("0.33.0", "watchdog-config", None),
    ("0.33.0", "log-config-file", "--log-config-file: vLLM 0.33 reads logging-config.pylogging_config_file instead: "
                                  "set that"),
    ("0.33.0", "max-num-seqs", None),
])
def test_a_flag_the_release_dropped_or_lacks_is_named_with_what_to_do(version, flag, problem):
    assert versions.flag_problem(version, flag) == problem


@pytest.mark.parametrize("name", ["VLLM_USE_RAY_COMPILED_DAG", "VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE",
                                  "VLLM_USE_RAY_COMPILED_DAG_OVERLAP_COMM", "VLLM_USE_RAY_V2_EXECUTOR_BACKEND",
                                  "VLLM_USE_RAY_WRAPPED_PP_COMM"])
def test_the_compiled_graph_ray_variables_are_gone_in_033(name):
    assert versions.env_problem("0.33.0", name).startswith(f"{name} is gone in vLLM 0.33: ")
    assert "RayExecutorV2" in versions.env_problem("0.33.0", name)
    assert versions.env_problem("0.32.0", name) is None
    assert versions.env_problem("0.33.0", "NCCL_DEBUG") is None


def test_the_plan_targets_the_pinned_release_and_refuses_what_it_dropped():
    planned = build_plan("llama-3.1-8b", NODES, vllm_version="0.33.0",
                         serve_args={"watchdog-config": {"timeout": 300, "dump_dir": "/var/tmp/vllm-dumps"}})
    assert planned["vllm_version"] == "0.33.0"
    argv = planned["nodes"][0]["argv"]
    assert argv[argv.index("--watchdog-config") + 1] == '{"dump_dir":"/var/tmp/vllm-dumps","timeout":300}'
    with pytest.raises(PlanError, match=r"^serve_args\.watchdog-config=.*: --watchdog-config is new in vLLM 0.33 and "
                                        r"vLLM 0.32.0 refuses it"):
        build_plan("llama-3.1-8b", NODES, serve_args={"watchdog-config": {"timeout": 300}})
    with pytest.raises(PlanError, match=r"mamba-cache-mode.*: --mamba-cache-mode: it is deprecated and has no effect "
                                        r"in vLLM 0.33: remove it"):
        build_plan("llama-3.1-8b", NODES, vllm_version="0.33.0", serve_args={"mamba-cache-mode": "align"})


def test_the_inventory_release_is_the_plans_and_the_cli_takes_it():
    inventory = {"vllm_cluster_model": "llama-3.1-8b", "vllm_runtime_vllm_version": "0.33.0",
                 "vllm_cluster_serve_args": {"mamba_cache_mode": "align"}}
    with pytest.raises(PlanError, match=r"vllm_cluster_serve_args\.mamba-cache-mode=align.*: --mamba-cache-mode: it "
                                        r"is deprecated"):
        plan(PlanRequest.from_variables(inventory, NODES, "node1"))
    del inventory["vllm_cluster_serve_args"]
    assert plan(PlanRequest.from_variables(inventory, NODES, "node1"))["vllm_version"] == "0.33.0"


def test_the_variable_check_names_each_dropped_setting_once_for_its_hosts():
    env = {"VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE": "nccl", "NCCL_DEBUG": "INFO"}
    host_vars = {
        "node1": {"vllm_runtime_vllm_version": "0.33.0", "nccl_network_extra_env": env,
                  "vllm_cluster_serve_args": {"mamba-cache-mode": "align"}},
        "node2": {"vllm_runtime_vllm_version": "0.33.0", "ray_cluster_environment": {"VLLM_USE_RAY_WRAPPED_PP_COMM": "1"},
                  "nccl_network_extra_env": env},
    }
    found = versions.version_problems(host_vars)
    assert found == [
        "vllm_cluster_serve_args.mamba-cache-mode on node1: --mamba-cache-mode: it is deprecated and has no effect in "
        "vLLM 0.33: remove it",
        "nccl_network_extra_env.VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE on node1, node2: "
        "VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE is gone in vLLM 0.33: " + versions._NO_COMPILED_DAG,
        "ray_cluster_environment.VLLM_USE_RAY_WRAPPED_PP_COMM on node2: VLLM_USE_RAY_WRAPPED_PP_COMM is gone in vLLM "
        "0.33: " + versions._NO_COMPILED_DAG,
    ]
    assert versions.version_problems({"node1": {"nccl_network_extra_env": env}}) == []  # the default is 0.32.0
    assert versions.version_problems({"node1": {"vllm_runtime_vllm_version": "0.31.2"}}) == [
        "vllm_runtime_vllm_version on node1 is '0.31.2': the collection plans vLLM 0.32 and 0.33 releases (e.g. 0.32.0)"]
    assert found[1] in the_filter(host_vars)
