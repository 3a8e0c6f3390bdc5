"""KV cache groups and the capacity vLLM 0.32 reports, the way its KV cache manager sizes them.

vLLM (``v1/core/kv_cache_utils.py``) gives every attention layer a spec and groups
the layers (``get_kv_cache_groups``):

- one kind of attention (every dense Llama, or every layer on one sliding window):
  one group of every layer (``_get_kv_cache_groups_uniform_spec``);
- sliding-window layers beside full-attention ones (gpt-oss, Gemma 3): groups of
  equal size, the smaller kind's layer count (the larger one's when the counts are
  within 1.5x), each kind split into ``cdiv(count, size)`` groups, padded
  (``_get_kv_cache_groups_uniform_page_size``);
- chunked local attention (Llama 4) turns the hybrid manager off by default
  (``VllmConfig``: VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE), so every
  layer keeps every token (``unify_hybrid_kv_cache_specs``).

One block of the shared pool holds ``block_size`` tokens of the largest group's
layers on this worker (``_get_kv_cache_bytes_per_block``, groups projected to the
pipeline stage). A request at max_model_len takes blocks from every group
(``get_max_concurrency_for_kv_cache_config``): full attention
``cdiv(max_model_len, block)``; sliding window ``cdiv(min(window - 1 + in-flight
tokens, max_model_len), block) + 1`` (``SlidingWindowSpec.max_admission_blocks_per_request``),
where the in-flight tokens are ``max_concurrent_batches x max_num_batched_tokens``
(``VllmConfig.max_in_flight_tokens``).

Pure Python, no Ansible import.
"""

from __future__ import annotations

import math

# --kv-cache-dtype values the planner models, with their bytes per value ("auto": the model's dtype).
KV_CACHE_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
KV_CACHE_DTYPES = ("auto", *KV_CACHE_DTYPE_BYTES)
# _get_kv_cache_groups_uniform_page_size: the larger kind's count is the group size below this ratio.
GROUP_SIZE_RATIO = 1.5


def kv_dtype_bytes(spec, kv_cache_dtype):
    """Bytes per cached value: the model's dtype with ``auto``, else the --kv-cache-dtype's."""
    return spec["dtype_bytes"] if kv_cache_dtype == "auto" else KV_CACHE_DTYPE_BYTES[kv_cache_dtype]


def layer_kinds(spec):
    """Each layer's KV kind as vLLM's KV cache manager keeps it: ``full`` or ``sliding``."""
    kinds = spec.get("layer_attention") or ["full"] * spec["layers"]
    if spec.get("kv_bytes_per_token"):  # the operator's figure covers every layer: one full-attention group
        return ["full"] * spec["layers"]
    if "chunked" in kinds:  # the hybrid manager is off by default with chunked local attention
        return ["full"] * spec["layers"]
    return list(kinds)


def groups(spec):
    """vLLM's KV cache groups: [(kind, [layer index, ...]), ...], and the layers per group."""
    buckets = {}
    for index, kind in enumerate(layer_kinds(spec)):
        buckets.setdefault(kind, []).append(index)
    if len(buckets) == 1:
        (kind, layers), = buckets.items()
        return [(kind, layers)], len(layers)
    counts = [len(layers) for layers in buckets.values()]
    size = min(counts)
    if max(counts) < size * GROUP_SIZE_RATIO:
        size = max(counts)
    found = []
    for kind, layers in buckets.items():
        count = math.ceil(len(layers) / size)
        found += [(kind, layers[i::count]) for i in range(count)]  # layers[i::n], as vLLM assigns them
    return found, size


def in_flight_tokens(inputs, cand, max_num_batched_tokens):
    """VllmConfig.max_in_flight_tokens: concurrent batches x max_num_batched_tokens.

    Concurrent batches: PP, plus one with async scheduling (on by default on CUDA with an
    executor that supports it; the CPU platform turns it off).
    """
    batches = cand.pp
    if inputs.device == "cuda" and inputs.mode.async_scheduling:
        batches += 1
    return batches * max_num_batched_tokens


def blocks_per_request(inputs, kind, block, in_flight):
    """Blocks one request at max_model_len takes from a group of this kind."""
    if kind == "sliding":
        window = inputs.spec["sliding_window"]
        return math.ceil(min(window - 1 + in_flight, inputs.max_model_len) / block) + 1
    return math.ceil(inputs.max_model_len / block)


def layout(inputs, cand, stage_bounds, max_num_batched_tokens):
    """The groups, each stage's layers per block, and the blocks one full-length request takes."""
    found, size = groups(inputs.spec)
    in_flight = in_flight_tokens(inputs, cand, max_num_batched_tokens)
    block = inputs.block_size
    slots = [max(sum(1 for layer in layers if start <= layer < end) for _, layers in found)
             for start, end in stage_bounds]
    per_group = [blocks_per_request(inputs, kind, block, in_flight) for kind, _ in found]
    return {
        "groups": [{"kind": kind, "layers": len(layers)} for kind, layers in found],
        "group_size": size,
        "layers_per_block_by_stage": slots,
        "blocks_per_request_by_group": per_group,
        "blocks_per_request": sum(per_group),
        "in_flight_tokens": in_flight,
    }


def summary(kv_layout, spec):
    """The plan's view of the groups: kinds, counts and what one request takes from each."""
    kinds = {}
    for group, blocks in zip(kv_layout["groups"], kv_layout["blocks_per_request_by_group"], strict=True):
        entry = kinds.setdefault(
            group["kind"], {"kind": group["kind"], "groups": 0, "layers": 0, "blocks_per_request": blocks})
        entry["groups"] += 1
        entry["layers"] += group["layers"]
    view = {
        "groups": list(kinds.values()),
        "layers_per_group": kv_layout["group_size"],
        "blocks_per_request": kv_layout["blocks_per_request"],
    }
    if "sliding" in kinds:
        view["sliding_window"] = spec["sliding_window"]
        view["in_flight_tokens"] = kv_layout["in_flight_tokens"]
    return view
