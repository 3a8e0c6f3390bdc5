"""The planner's KV tokens and concurrency equal vLLM's own KV sizing, for every catalog model on CUDA clusters.

The oracle (tests/runtime/vllm_kv_oracle.py, run by the runtime venv's Python) builds
each layer's KV spec from the model's config through transformers, and sizes the cache
with vLLM 0.32's ``get_kv_cache_configs`` / ``get_kv_cache_capacity`` for the memory the
plan leaves to the KV cache on each pipeline stage. The planner's own group logic
(plan/kv_cache.py) is not used there, so a wrong group count, window, padding, block
size, KV dtype, in-flight token count or PP split makes the two differ. The available
memory itself is the planner's estimate on CUDA (checked on a real H200 in
docs/hardware-validation.md); this test checks everything after it, exactly.
"""

import json
import subprocess
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_catalog
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import PlanError, build_plan

pytestmark = pytest.mark.runtime

ORACLE = Path(__file__).with_name("vllm_kv_oracle.py")
GPUS = {
    "1x H100 80GB": (1, {"count": 1, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": False}),
    "1x H200": (1, {"count": 1, "name": "NVIDIA H200", "memory_total_mib": 143771, "nvlink": False}),
    "8x H100 80GB": (1, {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}),
    "8x H200": (1, {"count": 8, "name": "NVIDIA H200", "memory_total_mib": 143771, "nvlink": True}),
    "2 x 8x H100 80GB": (2, {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
                             "nvlink": True}),
}
# Besides the defaults: long requests (where sliding windows matter most), FP8 KV, and pinned PP
# (the groups projected onto stages).
VARIANTS = {
    "default": ({}, {}, None),
    "32k": ({"max_model_len": 32768, "concurrency_target": 1}, {}, None),
    "fp8 kv": ({}, {}, "fp8"),
    "pp=2": ({"concurrency_target": 1}, {"pp": 2}, None),
}


def cluster(nodes, gpus):
    return [{"name": f"node{i}", "address": f"10.0.0.{i + 1}", "gpus": dict(gpus)} for i in range(nodes)]


def plans():
    """(label, catalog config, plan) for every catalog model, cluster and variant that the planner can plan."""
    found = []
    for name in model_catalog.catalog_names():
        _, _, config = model_catalog.lookup(name)
        for gpu_label, (nodes, gpus) in GPUS.items():
            for variant, (targets, overrides, kv_dtype) in VARIANTS.items():
                try:
                    planned = build_plan(name, cluster(nodes, gpus), dict(targets), dict(overrides),
                                         kv_cache_dtype=kv_dtype)
                except PlanError:
                    continue  # too large for this cluster, or a longer context than the model takes
                found.append((f"{name} on {gpu_label}, {variant}", config, planned))
    return found


def case(config, planned):
    memory = planned["memory"]["inputs"]
    return {
        "config": {k: v for k, v in config.items() if k != "_name_or_path"},
        "tp": planned["tp"],
        "pp": planned["pp"],
        "block_size": planned["memory"]["block_size"],
        "kv_cache_dtype": planned["kv_cache_dtype"],
        "max_model_len": planned["targets"]["max_model_len"],
        "max_num_batched_tokens": memory["profile_batch"]["max_num_batched_tokens"],
        "async_scheduling": planned["backend"] == "mp",  # vLLM's Ray executor does not support it
        "available_bytes_by_stage": memory["kv_cache_bytes_by_stage"],
    }


@pytest.fixture(scope="module")
def compared(runtime_python):
    found = plans()
    result = subprocess.run([str(runtime_python), str(ORACLE)], input=json.dumps([case(c, p) for _, c, p in found]),
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    return [(label, planned, answer) for (label, _, planned), answer in zip(found, answers, strict=True)]


def test_every_catalog_model_is_compared_on_some_cluster(compared):
    planned_models = {planned["model"]["name"] for _, planned, _ in compared}
    missing = sorted(set(model_catalog.catalog_names()) - planned_models)
    assert not missing, f"no cluster of the test plans {missing}"
    kinds = {kind for _, _, answer in compared for kind in answer.get("layer_kinds", [])}
    # the oracle met sliding-window and MLA layers, so those paths are compared too
    assert {"FullAttentionSpec", "SlidingWindowSpec", "MLAAttentionSpec"} <= kinds, kinds


def test_kv_tokens_and_concurrency_equal_vllms_own_sizing(compared):
    wrong = []
    for label, planned, answer in compared:
        memory = planned["memory"]
        if "error" in answer:
            wrong.append(f"{label}: vLLM refused: {answer['error']}")
            continue
        mine = (memory["inputs"]["num_blocks"], memory["kv_cache_tokens"], round(memory["max_concurrency"], 2))
        theirs = (answer["num_blocks"], answer["tokens"], round(answer["concurrency"], 2))
        if mine != theirs:
            wrong.append(f"{label}: planner blocks/tokens/concurrency {mine}, vLLM {theirs} "
                         f"(vLLM's groups {answer['groups']}, the plan's {memory['inputs']['kv_cache_groups']})")
    assert not wrong, f"{len(wrong)} of {len(compared)} differ:\n" + "\n".join(wrong)
