"""A fixed corpus of plan requests, and their plans as the planner made them when last saved.

`python tests/unit/plan_corpus.py --write` saves every request of `requests()` with its
plan (or its PlanError message) to tests/fixtures/plans/corpus.json.gz; test_plan_corpus.py
plans them again and requires the same result, byte for byte. The requests are drawn from
a seeded random generator (no hypothesis: its draws change between versions) over the
catalog, random dense/MoE/MLA configs, CUDA and CPU clusters, pins, backends, targets and
ports, plus the seed's example inventories. Regenerate only for a change that is meant to
change plans, and say so in the commit. Saved: before the redesign (issue 16, which changed no
plan), then for vLLM 0.32's profile batch in the CUDA reserve (issue 20: numbers of CUDA plans), then
for issue 20's KV cache groups, kv_cache_dtype, the larger catalog (its models are drawn, so the random
requests differ) and the fits-one-GPU rule (DP replicas, TP over PCIe avoided), then for issue 17's
vLLM flags: every argv gains `--served-model-name <deployment>` and every plan the keys
`served_model_name` and `serve_args` (the requests are unchanged), then for issue 17's shared machines:
every plan gains the key `service` (its unit and directories; nothing else changed, the requests neither),
then for issue 24's Ray on the lab: the head of a Ray plan gains RAY_ADDRESS and RAY_DEDUP_LOGS=0 in its env
(71 plans) and backend ray on cpu says what would allow it (17 errors; the requests are unchanged), then for
issue 18's independent DP replicas: every plan gains the key `data_parallel`; a dense model's DP replicas (20
plans) become independent servers (argv without the multi-node and cross-node DP flags, no headless node,
engines numbered per server, the decision's "why" line and wording); MoE DP plans (58) gain the "why" line
in their decision; nothing else changed, the errors neither. Then for NVLink from the facts: every plan gains
`cluster.nvlink_source` and every CUDA plan's "Cluster:" line says where NVLink came from (the corpus declares
it, so "declared"; no layout changed, the requests and errors neither), then for a pinned dp: where it leaves
a throughput need unused (10 plans) the decision's Q2 line checks the need against the pinned replicas and a
warning names both when the pin falls short or the need cannot be checked, and where no need was given (13 plans)
the Q2 line no longer says "one replica is planned" above several (no layout changed), then for RoPE scaling:
every plan's model gains `max_model_len_limit` (no corpus model has a linear or dynamic factor, so no limit,
layout or error changed), then for MXFP4 experts laid out as vLLM 0.32's MoE kernel pads them (plan/memory.py
`mxfp4_padding`): 10 gpt-oss plans changed (the requests did not; positive modelling changed none): on L40S and
A100 (Marlin) the weights per GPU grow 9% and more, on H100/H200 at TP >= 2 (Triton rounds each rank's expert
slice to 64) 2 to 5%; their KV tokens fall accordingly and a warning names the kernel; one L40S plan misses the
default target with TP=4 and so takes the first layout that fits (EP + DP), and one A100 request at utilization
0.8 no longer fits (65.84 GiB of weights, an error, as vLLM's start would be). Then for the API guard: every
plan gains the key `api_guard` (false: no request sets it, so no argv, layout or error changed). Then for the
API guard on by default: every plan's `api_guard` is true and every node's argv gains
`--middleware vllm_cluster_api_guard.ApiGuard` before `--served-model-name` (no layout or error changed).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "fixtures" / "plans" / "corpus.json.gz"
SEED = 20261201
COUNT = 1000

GPU_MEMORY_MIB = [8192, 16384, 24576, 40960, 81559, 81920, 143771]
GPU_NAMES = ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "Acme X1"]


def _divisors(value):
    return [d for d in range(1, value + 1) if value % d == 0]


def _model(rng, catalog):
    kind = rng.choice(["dense", "dense", "moe", "mla", "catalog", "catalog"])
    if kind == "catalog":
        return rng.choice(catalog)
    heads = rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 64, 128])
    head_dim = rng.choice([16, 32, 64, 96, 128])
    hidden = heads * head_dim * rng.choice([1, 1, 2])
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": hidden * rng.randint(1, 4),
        "num_hidden_layers": rng.randint(1, 96),
        "num_attention_heads": heads,
        "num_key_value_heads": rng.choice(_divisors(heads)),
        "head_dim": head_dim,
        "vocab_size": rng.randint(64, 160_000),
        "tie_word_embeddings": rng.random() < 0.5,
        "torch_dtype": rng.choice(["bfloat16", "float16", "float32"]),
    }
    max_positions = rng.choice([None, 2048, 8192, 32768, 131072])
    if max_positions:
        config["max_position_embeddings"] = max_positions
    if kind in ("moe", "mla"):
        experts = rng.choice([2, 4, 6, 8, 16, 64, 256])
        config.update({
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "num_local_experts": experts,
            "num_experts_per_tok": rng.randint(1, min(experts, 8)),
        })
    if kind == "mla":
        del config["num_local_experts"]
        config.update({
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "n_routed_experts": rng.choice([8, 16, 64, 256]),
            "n_shared_experts": rng.randint(0, 2),
            "moe_intermediate_size": rng.choice([256, 1024, 2048]),
            "first_k_dense_replace": rng.randint(0, 3),
            "kv_lora_rank": rng.choice([128, 512]),
            "qk_rope_head_dim": rng.choice([32, 64]),
            "qk_nope_head_dim": rng.choice([64, 128]),
            "v_head_dim": rng.choice([64, 128]),
            "q_lora_rank": rng.choice([None, 1536]),
        })
        config["num_hidden_layers"] = max(config["num_hidden_layers"], config["first_k_dense_replace"] + 1)
        if rng.random() < 0.5:
            config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    return {"config": config}


def _request(rng, catalog):
    device = rng.choice(["cuda", "cuda", "cuda", "cpu"])
    nodes = rng.randint(1, 4)
    gpus = rng.choice([1, 2, 4, 8])
    memory = rng.choice(GPU_MEMORY_MIB)
    name = rng.choice(GPU_NAMES) if device == "cuda" else "cpu"
    interface = rng.choice([None, "eth1"])
    nvlink = rng.random() < 0.6
    cluster = []
    for index in range(nodes):
        node = {
            "name": f"n{index}",
            "address": f"10.1.0.{index + 1}",
            "gpus": {"count": gpus, "name": name, "memory_total_mib": memory, "nvlink": nvlink},
        }
        if interface:
            node["fabric_interface"] = interface
            node["ib_hcas"] = rng.choice([None, ["mlx5_0"], ["mlx5_0", "mlx5_1"]])
        cluster.append(node)
    if nodes > 1 and rng.randint(0, 9) == 0:
        cluster[-1]["gpus"] = dict(cluster[-1]["gpus"], count=max(1, gpus // 2))
    lengths = [128, 512, 1000, 2048, 4096, 8192, 32768]
    model = _model(rng, catalog)
    limit = model["config"].get("max_position_embeddings") if isinstance(model, dict) else None
    if limit and rng.randint(0, 9):
        lengths = [length for length in lengths if length <= limit]
    targets = {
        "max_model_len": rng.choice(lengths),
        "gpu_memory_utilization": rng.choice([0.5, 0.8, 0.9, 0.92, 0.98]),
    }
    if rng.random() < 0.5:
        targets["concurrency_target"] = rng.choice([1, 4, 16, 64])
    if rng.randint(0, 3) == 0:
        targets["kv_tokens_target"] = rng.choice([1000, 100_000, 1_000_000])
    if rng.randint(0, 3) == 0:
        targets["throughput_need_tok_s"] = rng.choice([100.0, 5000.0, 40000.0])
        if rng.random() < 0.5:
            targets["replica_throughput_tok_s"] = rng.choice([1000.0, 5000.0])
    plain = rng.random() < 0.5  # no pins, no EPLB choice: mostly plans rather than refusals
    pinned = [] if plain else rng.sample(["tp", "pp", "dp", "ep"], rng.randint(0, 2))
    overrides = {key: rng.choice([1, 2, 3, 4, 8]) for key in sorted(pinned)}
    backend = rng.choice([None, None, None, "mp", "ray"] if device == "cuda" or not plain else [None, "mp"])
    if backend:
        overrides["backend"] = backend
    request = {
        "model": model,
        "model_path": "/models/m",
        "cluster": cluster,
        "targets": targets,
        "overrides": overrides,
        "device": device,
        "allow_tp_across_nodes": rng.random() < 0.3,
        "enforce_eager": rng.choice([None, None, True, False]),
        "enable_eplb": None if plain else rng.choice([None, None, None, None, True, False]),
    }
    if rng.random() < 0.2:
        request["ports"] = rng.choice([
            {"api": 9000},
            {"master": 29600, "dp_rpc": 29650},
            {"ray_gcs": 6400, "ray_min_worker": 20000, "ray_max_worker": 20999},
            {"api": 8000, "master": 8000},
        ])
    if rng.random() < 0.2:
        request["api_host"] = rng.choice(["0.0.0.0", "127.0.0.1"])
    if rng.random() < 0.15:
        request["load_format"] = rng.choice(["dummy", "safetensors"])
    if rng.random() < 0.1:
        request["deployment"] = rng.choice(["prod-a", "b_2"])
    if device == "cpu":
        request["cpu_kvcache_space_gib"] = rng.randint(1, 4)
        request["cpu_cores_per_node"] = rng.choice([None, 1, 2, 4, 16])
    return {key: value for key, value in request.items() if value is not None}


def _examples():
    """The seed's four example inventories, as test_planner_playbook reads them (not the fleet example)."""
    sys.path.insert(0, str(REPO / "tests" / "unit"))
    from test_planner_playbook import EXAMPLES, SEED, inventory_request  # noqa: PLC0415

    found = []
    for inventory in sorted(EXAMPLES / name for name in SEED):
        request = inventory_request(inventory)
        found.append(("example:" + inventory.name, request))
    return found


def _lab_layouts():
    """The lab's tiny Llama (lab/make_tiny_model.py's config) in the layouts tests/lab runs."""
    sys.path.insert(0, str(REPO / "lab"))
    from make_tiny_model import make_config  # noqa: PLC0415

    gpus = {"count": 1, "name": "cpu", "memory_total_mib": 4096, "nvlink": False}
    cluster = [
        {"name": f"node{k}", "address": f"10.77.1.{k}", "fabric_interface": "eth1", "gpus": dict(gpus)}
        for k in (1, 2, 3)
    ]
    base = {
        "model": {"config": make_config("llama", 4, 4, 2, 32, 0)},
        "model_path": "/srv/models/tiny-llama",
        "deployment": "lab-tiny-llama",
        "device": "cpu",
        "cluster": cluster,
        "targets": {"max_model_len": 512},
        "allow_tp_across_nodes": True,
        "cpu_kvcache_space_gib": 1,
    }
    layouts = {
        "tp2-2nodes": {"overrides": {"tp": 2}},
        "pp2": {"overrides": {"tp": 1, "pp": 2}},
        "dp2": {"overrides": {"tp": 1, "dp": 2}},
        "tp1": {"overrides": {"tp": 1}},
        "tp2-1node": {"overrides": {"tp": 2},
                      "cluster": [dict(cluster[0], gpus=dict(gpus, count=2))]},
    }
    found = [("lab:" + name, dict(base, **layout)) for name, layout in layouts.items()]
    moe = dict(base, model={"config": make_config("mixtral", 4, 4, 2, 32, 4)}, overrides={"tp": 2})
    found.append(("lab:tiny-mixtral-tp2", moe))
    return found


def requests():
    """(label, request) pairs: the examples first, then COUNT seeded random requests."""
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_catalog  # noqa: PLC0415

    catalog = sorted(model_catalog.catalog_names())
    rng = random.Random(SEED)
    found = _examples() + _lab_layouts()
    found += [(f"random:{index}", _request(rng, catalog)) for index in range(COUNT)]
    return found


def outcome(request, plan_from_request, plan_error):
    try:
        return {"plan": plan_from_request(json.loads(json.dumps(request)))}
    except plan_error as exc:
        return {"error": str(exc)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {CORPUS.relative_to(REPO)}")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "collections"))
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import (  # noqa: PLC0415
        PlanError,
        plan_from_request,
    )

    entries = []
    for label, request in requests():
        entries.append({"label": label, "request": request, **outcome(request, plan_from_request, PlanError)})
    plans = sum(1 for entry in entries if "plan" in entry)
    print(f"{len(entries)} requests: {plans} plans, {len(entries) - plans} errors")
    if args.write:
        CORPUS.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()
        with gzip.GzipFile(CORPUS, "wb", mtime=0) as handle:
            handle.write(data)
        print(f"wrote {CORPUS.relative_to(REPO)} ({CORPUS.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
