"""Property tests: every plan over random models and clusters obeys the rules; the rest is a PlanError."""

import json
import math

from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_catalog
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import (
    PlanError,
    build_plan,
    plan_from_request,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.memory import BLOCK_SIZE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

GPU_MEMORY_MIB = [8192, 16384, 24576, 40960, 81559, 81920, 143771]
GPU_NAMES = ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "Acme X1"]
PROPERTY_SETTINGS = settings(
    max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def divisors(value):
    return [d for d in range(1, value + 1) if value % d == 0]


@st.composite
def model_configs(draw):
    kind = draw(st.sampled_from(["dense", "dense", "moe", "mla", "catalog"]))
    if kind == "catalog":
        return draw(st.sampled_from(model_catalog.catalog_names()))
    heads = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 64, 128]))
    head_dim = draw(st.sampled_from([16, 32, 64, 96, 128]))
    hidden = heads * head_dim * draw(st.sampled_from([1, 1, 2]))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": hidden * draw(st.integers(1, 4)),
        "num_hidden_layers": draw(st.integers(1, 96)),
        "num_attention_heads": heads,
        "num_key_value_heads": draw(st.sampled_from(divisors(heads))),
        "head_dim": head_dim,
        "vocab_size": draw(st.integers(64, 160_000)),
        "tie_word_embeddings": draw(st.booleans()),
        "torch_dtype": draw(st.sampled_from(["bfloat16", "float16", "float32"])),
    }
    max_positions = draw(st.sampled_from([None, 2048, 8192, 32768, 131072]))
    if max_positions:
        config["max_position_embeddings"] = max_positions
    if kind in ("moe", "mla"):
        experts = draw(st.sampled_from([2, 4, 6, 8, 16, 64, 256]))
        config.update(
            {
                "architectures": ["MixtralForCausalLM"],
                "model_type": "mixtral",
                "num_local_experts": experts,
                "num_experts_per_tok": draw(st.integers(1, min(experts, 8))),
            }
        )
    if kind == "mla":
        del config["num_local_experts"]
        config.update(
            {
                "architectures": ["DeepseekV3ForCausalLM"],
                "model_type": "deepseek_v3",
                "n_routed_experts": draw(st.sampled_from([8, 16, 64, 256])),
                "n_shared_experts": draw(st.integers(0, 2)),
                "moe_intermediate_size": draw(st.sampled_from([256, 1024, 2048])),
                "first_k_dense_replace": draw(st.integers(0, 3)),
                "kv_lora_rank": draw(st.sampled_from([128, 512])),
                "qk_rope_head_dim": draw(st.sampled_from([32, 64])),
                "qk_nope_head_dim": draw(st.sampled_from([64, 128])),
                "v_head_dim": draw(st.sampled_from([64, 128])),
                "q_lora_rank": draw(st.sampled_from([None, 1536])),
            }
        )
        config["num_hidden_layers"] = max(config["num_hidden_layers"], config["first_k_dense_replace"] + 1)
        if draw(st.booleans()):
            config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    return {"config": config}


@st.composite
def requests(draw):
    device = draw(st.sampled_from(["cuda", "cuda", "cuda", "cpu"]))
    nodes = draw(st.integers(1, 4))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    memory = draw(st.sampled_from(GPU_MEMORY_MIB))
    name = draw(st.sampled_from(GPU_NAMES)) if device == "cuda" else "cpu"
    interface = draw(st.sampled_from([None, "eth1"]))
    cluster = []
    for index in range(nodes):
        node = {
            "name": f"n{index}",
            "address": f"10.1.0.{index + 1}",
            "gpus": {"count": gpus, "name": name, "memory_total_mib": memory, "nvlink": draw(st.booleans())},
        }
        if interface:
            node["fabric_interface"] = interface
            node["ib_hcas"] = draw(st.sampled_from([None, ["mlx5_0"], ["mlx5_0", "mlx5_1"]]))
        cluster.append(node)
    if nodes > 1 and draw(st.integers(0, 9)) == 0:
        cluster[-1]["gpus"] = dict(cluster[-1]["gpus"], count=max(1, gpus // 2))
    lengths = [128, 512, 1000, 2048, 4096, 8192, 32768]
    model = draw(model_configs())
    limit = model["config"].get("max_position_embeddings") if isinstance(model, dict) else None
    if limit and draw(st.integers(0, 9)):
        lengths = [length for length in lengths if length <= limit]
    targets = {
        "max_model_len": draw(st.sampled_from(lengths)),
        "gpu_memory_utilization": draw(st.sampled_from([0.5, 0.8, 0.9, 0.92, 0.98])),
    }
    if draw(st.booleans()):
        targets["concurrency_target"] = draw(st.sampled_from([1, 4, 16, 64]))
    if draw(st.integers(0, 3)) == 0:
        targets["kv_tokens_target"] = draw(st.sampled_from([1000, 100_000, 1_000_000]))
    if draw(st.integers(0, 3)) == 0:
        targets["throughput_need_tok_s"] = draw(st.sampled_from([100.0, 5000.0, 40000.0]))
        if draw(st.booleans()):
            targets["replica_throughput_tok_s"] = draw(st.sampled_from([1000.0, 5000.0]))
    pinned = draw(st.sets(st.sampled_from(["tp", "pp", "dp", "ep"]), max_size=2))
    overrides = {key: draw(st.sampled_from([1, 2, 3, 4, 8])) for key in pinned}
    overrides["backend"] = draw(st.sampled_from([None, None, None, "mp", "ray"]))
    request = {
        "model": model,
        "model_path": "/models/m",
        "cluster": cluster,
        "targets": targets,
        "overrides": overrides,
        "device": device,
        "allow_tp_across_nodes": draw(st.booleans()),
        "enforce_eager": draw(st.sampled_from([None, None, True, False])),
        "enable_eplb": draw(st.sampled_from([None, None, None, None, True, False])),
    }
    if device == "cpu":
        request["cpu_kvcache_space_gib"] = draw(st.integers(1, 4))
        request["cpu_cores_per_node"] = draw(st.sampled_from([None, 1, 2, 4, 16]))
    return request


def spec_of(request):
    return mc.load_model(request["model"], request["model_path"])


def check_plan(plan, request):
    """Every rule of ARCHITECTURE.md and vLLM's validation, checked on one plan."""
    spec = spec_of(request)
    tp, pp, dp, ep = plan["tp"], plan["pp"], plan["dp"], plan["ep"]
    gpus_per_node = request["cluster"][0]["gpus"]["count"]

    # TP divides the attention heads; the KV-head rule.
    assert spec["heads"] % tp == 0
    if spec["attention"] != "mla":
        kv = spec["kv_heads"]
        assert kv % tp == 0 if kv >= tp else tp % kv == 0
    # world_size = TP x PP; EP = TP x DP when on, else 1; PP within the layers.
    assert plan["world_size"] == tp * pp
    assert pp <= spec["layers"]
    if plan["enable_expert_parallel"]:
        assert spec["is_moe"] and ep == tp * dp and ep <= spec["experts"]
        assert "--enable-expert-parallel" in plan["nodes"][0]["argv"]
    else:
        assert ep == 1
    # Experts split evenly across EP ranks when EPLB is on.
    if plan["enable_eplb"]:
        assert plan["enable_expert_parallel"] and spec["experts"] % ep == 0
    # MLA KV is not sharded by TP.
    inputs = plan["memory"]["inputs"]
    if spec["attention"] == "mla":
        assert inputs["kv_bytes_per_token_per_layer"] == (spec["kv_lora_rank"] + spec["qk_rope_head_dim"]) * 2
    else:
        assert (
            inputs["kv_bytes_per_token_per_layer"]
            == max(1, spec["kv_heads"] // tp) * 2 * spec["head_dim"] * 2
        )

    # Every rank exists once, on one node; the layout formula holds.
    rows = plan["expect"]["rank_assignments"]
    assert sorted(row["rank"] for row in rows) == list(range(tp * pp * dp))
    for row in rows:
        assert row["rank"] == row["dp"] * tp * pp + row["pp"] * tp + row["tp"]
    node_ranks = [rank for node in plan["nodes"] for rank in node["ranks"]]
    assert sorted(node_ranks) == list(range(tp * pp * dp))
    assert plan["nodes_used"] == len(plan["nodes"]) <= len(request["cluster"])
    by_rank = {row["rank"]: row for row in rows}
    for node in plan["nodes"]:
        assert len(node["ranks"]) <= gpus_per_node and len(node["local_gpus"]) == len(node["ranks"])
        assert all(by_rank[rank]["node"] == node["host"] for rank in node["ranks"])
    # TP stays inside a node unless allow_tp_across_nodes.
    groups = {}
    for row in rows:
        groups.setdefault((row["dp"], row["pp"]), set()).add(row["node"])
    if any(len(nodes) > 1 for nodes in groups.values()):
        assert request["allow_tp_across_nodes"] and plan["allow_tp_across_nodes"]
        assert any("crosses nodes" in warning for warning in plan["warnings"])
    else:
        assert tp <= gpus_per_node
    # mp: node k of a replica holds [k * local_world, (k + 1) * local_world).
    if plan["backend"] == "mp" and plan["nodes_used"] > 1 and len(plan["nodes"]) > 1:
        local = len(plan["nodes"][0]["ranks"])
        assert all(len(node["ranks"]) == local for node in plan["nodes"])
        flat = [rank for node in plan["nodes"] for rank in node["ranks"]]
        assert flat == list(range(tp * pp * dp))

    # vLLM's launch arithmetic (arg_utils.create_engine_config) agrees with the plan's placement.
    if plan["backend"] == "mp" and plan["nodes_used"] > 1 and plan["data_parallel"]["mode"] != "independent":
        nnodes, world = plan["nodes_used"], tp * pp
        total = dp * world
        assert total % nnodes == 0  # "--nnodes N must evenly divide the total world size"
        local_world = total // nnodes
        if dp > 1:
            dp_local = max(local_world // world, 1)
            assert (
                nnodes % (dp // dp_local) == 0
            )  # "nnodes must be divisible by the number of DP node groups"
        for node in plan["nodes"]:
            inferred_dp_rank = node["node_rank"] * local_world // world  # "Inferred data_parallel_rank"
            assert inferred_dp_rank == node["dp_ranks"][0]

    # argv and env per node.
    for node in plan["nodes"]:
        argv = node["argv"]
        if not node["runs_vllm"]:
            assert plan["backend"] == "ray" and node["node_rank"] > 0 and argv == []
            continue
        assert argv[:3] == ["vllm", "serve", spec["path"]]
        assert all(isinstance(item, str) for item in argv)
        assert argv[argv.index("--tensor-parallel-size") + 1] == str(tp)
        # A dense model's DP replicas are independent servers: no flag joins the nodes, every node serves the API
        # and runs only its own replicas (vLLM's DP inside the node when it holds several).
        independent = plan["data_parallel"]["mode"] == "independent"
        assert independent == (dp > 1 and not plan["model"]["is_moe"] and not plan["enable_expert_parallel"]
                               and len({row["node"] for row in rows if row["dp"] == 0}) == 1)
        multi_node = plan["backend"] == "mp" and plan["nodes_used"] > 1 and not independent
        assert ("--nnodes" in argv) == multi_node
        assert ("--master-addr" in argv) == multi_node
        assert ("--headless" in argv) == (multi_node and node["node_rank"] > 0) == node["headless"]
        if multi_node:
            assert argv[argv.index("--node-rank") + 1] == str(node["node_rank"])
        local_dp = len(node["dp_ranks"]) if independent else dp
        assert ("--data-parallel-size" in argv) == (local_dp > 1)
        if local_dp > 1:
            assert argv[argv.index("--data-parallel-size") + 1] == str(local_dp)
        assert not independent or not any(word.startswith("--data-parallel-") and word != "--data-parallel-size"
                                           for word in argv)
        assert all(isinstance(value, str) for value in node["env"].values())
    if plan["backend"] == "ray":
        assert request["device"] == "cuda" and dp == 1

    # Memory: what is planned fits.
    memory = plan["memory"]
    assert memory["max_concurrency"] * 1 >= 1 - 1e-9
    assert memory["kv_cache_tokens"] >= 1
    if request["device"] == "cuda":
        assert memory["weights_gib_per_gpu"] < inputs["usable_gib_per_gpu"]
        assert memory["block_size"] == BLOCK_SIZE[("cuda", spec["attention"] == "mla")]
    else:
        # CPU: the exact vLLM formula, recomputed from the plan's own inputs.
        block = memory["block_size"]
        blocks = min(
            request.get("cpu_kvcache_space_gib", 1) * 2**30 // (block * per_token)
            for per_token in inputs["kv_bytes_per_token_by_stage"]
        )
        length = plan["targets"]["max_model_len"]
        per_request = inputs["kv_cache_groups"]["blocks_per_request"]
        if all(group["kind"] == "full" for group in inputs["kv_cache_groups"]["groups"]):
            assert per_request == math.ceil(length / block)
        else:  # sliding groups take at most the window plus the tokens in flight, and never more than full ones
            assert per_request <= sum(group["groups"] for group in inputs["kv_cache_groups"]["groups"]) * (
                math.ceil(length / block) + 1)
        assert memory["kv_cache_tokens"] == int(blocks / per_request * length)
        assert not plan["enable_expert_parallel"] and plan["backend"] == "mp"
        if pp > 1:
            assert all("--enforce-eager" not in node["argv"] for node in plan["nodes"])
    assert json.loads(json.dumps(plan)) == plan


@PROPERTY_SETTINGS
@given(request=requests())
def test_every_plan_obeys_the_rules_and_everything_else_is_a_plan_error(request):
    try:
        plan = build_plan(**request)
    except PlanError as error:
        assert str(error)
        return
    check_plan(plan, request)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)


@PROPERTY_SETTINGS
@given(
    key=st.sampled_from(
        [
            "model",
            "cluster",
            "targets",
            "overrides",
            "device",
            "ports",
            "deployment",
            "model_path",
            "allow_tp_across_nodes",
            "cpu_kvcache_space_gib",
            "cpu_cores_per_node",
            "enforce_eager",
            "load_format",
            "enable_eplb",
            "api_host",
            "vllm_version",
        ]
    ),
    value=JSONISH,
)
def test_garbage_in_any_field_is_a_plan_error(key, value):
    request = {
        "model": "llama-3.1-8b",
        "cluster": [
            {
                "name": "n0",
                "address": "10.1.0.1",
                "gpus": {
                    "count": 1,
                    "name": "NVIDIA H100 80GB HBM3",
                    "memory_total_mib": 81559,
                    "nvlink": False,
                },
            }
        ],
    }
    request[key] = value
    try:
        plan = plan_from_request(request)
    except PlanError as error:
        assert str(error)
        return
    defaults = {"model_path": None, "allow_tp_across_nodes": False, "device": "cuda"}
    check_plan(plan, defaults | {k: v for k, v in request.items() if v is not None})


@PROPERTY_SETTINGS
@given(
    node=st.dictionaries(
        st.sampled_from(["name", "address", "fabric_interface", "ib_hcas", "gpus", "x"]), JSONISH
    )
)
def test_garbage_nodes_are_a_plan_error(node):
    try:
        build_plan("llama-3.1-8b", [node])
    except PlanError as error:
        assert str(error)
