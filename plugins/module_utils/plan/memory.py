"""The memory model: weights per pipeline stage, the reserve, and the KV capacity vLLM would report.

``evaluate(inputs, cand)`` is the one formula (docs/planner.md, "Memory"): per
GPU, requested memory (total x gpu_memory_utilization on CUDA) minus weights
minus the reserve gives KV bytes; KV blocks of ``block_size`` tokens at the
binding stage's bytes per token give tokens and concurrency at max_model_len.
On CPU the KV space is fixed (VLLM_CPU_KVCACHE_SPACE) and the result is exact.

Pure Python, no Ansible import.
"""

from __future__ import annotations

import math

from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import kv_cache
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import GIB, gib
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.gpu_names import mxfp4_kernel

# KV block size vLLM uses: CUDA attention 16 (MLA backends such as FlashMLA 64);
# CPU attention 128 (CPU MLA 16). Source: platforms/cpu.py, CacheConfig.
BLOCK_SIZE = {("cuda", False): 16, ("cuda", True): 64, ("cpu", False): 128, ("cpu", True): 16}

# CUDA memory vLLM 0.32 keeps off the KV cache, besides the weights (Worker.determine_available_memory:
# requested memory - weights - the profile run's peak - the CUDA-graph estimate - non-torch memory).
CUDA_BASE_RESERVE_GIB = 1.0  # non-torch memory: CUDA context, cuBLAS workspace, allocator slack (estimate)
CUDA_COMM_RESERVE_GIB = 0.5  # NCCL buffers and custom all-reduce when world_size > 1 (estimate)
CUDA_GRAPH_RESERVE_GIB = 0.5  # profile_cudagraph_memory's estimate (measured by vLLM at start); 0 with eager

# vLLM 0.32's serving defaults by GPU (EngineArgs.get_batch_defaults, UsageContext.OPENAI_API_SERVER):
# (min total memory in GiB, excluded names, max_num_batched_tokens, max_num_seqs), first match wins.
SERVING_BATCH_DEFAULTS = (
    (160, (), 16384, 1024),  # B200/B300 and larger
    (70, ("a100",), 8192, 1024),  # H100, H200 (an A100 stays on the small defaults)
    (0, (), 2048, 256),  # every other GPU
)
# Live [tokens, x] tensors at the profile run's peak, from a measured forward pass (docs/hardware-validation.md,
# "Activation peak"): the MLP's three [tokens, intermediate/tp] tensors (vLLM: the merged gate_up output, 2 x I,
# and SiluAndMul's output) beside four [tokens, hidden] copies (layer input, residual, normed input, embedding).
MLP_INTERMEDIATE_COPIES = 3
HIDDEN_COPIES = 4
# The sampler's dummy run on max_num_seqs rows of the whole vocabulary (GPUModelRunner._dummy_sampler_run):
# the logits in the model's dtype, then three float32 copies live at once in its second, native pass
# (Sampler.forward: logits.to(float32); TopKTopPSampler.forward_native: softmax; random_sample: the noise q).
SAMPLER_FLOAT32_COPIES = 3
# The CPU platform's serving default: max_num_batched_tokens = 2048 x world size (EngineArgs.get_batch_defaults).
CPU_BATCHED_TOKENS_PER_RANK = 2048


def serving_batch_defaults(gpu_memory_bytes, gpu_name):
    """(max_num_batched_tokens, max_num_seqs) vLLM 0.32's `vllm serve` picks for this GPU."""
    for min_gib, excluded, tokens, seqs in SERVING_BATCH_DEFAULTS:
        if gpu_memory_bytes >= min_gib * GIB and not any(word in gpu_name.lower() for word in excluded):
            return tokens, seqs
    raise AssertionError("SERVING_BATCH_DEFAULTS ends with a catch-all row")


def forward_activation_bytes(spec, tp, tokens):
    """Peak activations of the profile run's forward pass on one rank: the widest MLP's temporaries."""
    hidden = spec["hidden_size"]
    widest = 0.0
    if len(spec["_moe_layer_set"]) < spec["layers"]:  # dense layers
        widest = MLP_INTERMEDIATE_COPIES * spec["intermediate_size"] / tp
    if spec["is_moe"]:  # fused MoE: [tokens x top-k] rows of the expert MLP, plus its [tokens x top-k, hidden] output
        widest = max(widest, spec["experts_per_token"]
                     * (MLP_INTERMEDIATE_COPIES * spec["moe_intermediate_size"] / tp + hidden))
    return tokens * (widest + HIDDEN_COPIES * hidden) * spec["dtype_bytes"]


def sampler_bytes(spec, tokens, seqs):
    """The sampler's dummy run: full-vocabulary logits for min(max_num_seqs, tokens) rows, hidden states kept."""
    rows = min(seqs, tokens)
    logits = rows * spec["vocab_size"] * (spec["dtype_bytes"] + SAMPLER_FLOAT32_COPIES * 4)
    return logits + tokens * spec["hidden_size"] * spec["dtype_bytes"]


def batch_sizes(inputs):
    """(max_num_batched_tokens, max_num_seqs) on CUDA: serve_args' values, else vLLM's serving defaults."""
    tokens, seqs = serving_batch_defaults(inputs.gpu_memory_bytes, inputs.gpu_name)
    given_tokens, given_seqs = getattr(inputs, "max_num_batched_tokens", None), getattr(inputs, "max_num_seqs", None)
    return (tokens if given_tokens is None else given_tokens), (seqs if given_seqs is None else given_seqs)


def profile_batch(inputs, tp):
    """What vLLM's profile run holds at its peak: the batch it runs and the larger of its two phases.

    vLLM runs the forward pass on max_num_batched_tokens tokens and the sampler on
    min(max_num_seqs, tokens) rows (serve_args' --max-num-batched-tokens / --max-num-seqs when given).
    """
    tokens, seqs = batch_sizes(inputs)
    forward = forward_activation_bytes(inputs.spec, tp, tokens)
    sampler = sampler_bytes(inputs.spec, tokens, seqs)
    return {"max_num_batched_tokens": tokens, "max_num_seqs": seqs,
            "forward_gib": round(forward / GIB, 3), "sampler_gib": round(sampler / GIB, 3),
            "peak_gib": round(max(forward, sampler) / GIB, 3)}


def _layer_bytes_by_kind(inputs, tp):
    cache = inputs.layer_cache
    if tp not in cache:
        spec = inputs.spec
        moe_layers = spec["_moe_layer_set"]
        dense_index = next((i for i in range(spec["layers"]) if i not in moe_layers), None)
        moe_index = next(iter(sorted(moe_layers)), None)
        dense = mc.layer_bytes(spec, dense_index, tp)[0] if dense_index is not None else 0.0
        moe_non_expert, routed = mc.layer_bytes(spec, moe_index, tp) if moe_index is not None else (0.0, 0.0)
        cache[tp] = (dense, moe_non_expert, routed)
    return cache[tp]


def reserve_gib(inputs, cand):
    """What vLLM keeps off the KV cache per GPU besides the weights (CUDA; none on CPU)."""
    if inputs.device == "cpu":
        return {}
    reserve = {
        "cuda_context_gib": CUDA_BASE_RESERVE_GIB,
        "communication_gib": CUDA_COMM_RESERVE_GIB
        if cand.world * (cand.dp if inputs.moe_shared_dp(cand) else 1) > 1
        else 0.0,
        "cuda_graphs_gib": 0.0 if inputs.enforce_eager else CUDA_GRAPH_RESERVE_GIB,
        "activations_gib": profile_batch(inputs, cand.tp)["peak_gib"],
    }
    reserve["total_gib"] = round(sum(reserve.values()), 3)
    return reserve


def expert_shards(inputs, cand):
    """How many ranks split each routed expert's matrices: 1 with EP (whole experts per rank), else TP (times DP
    where the DP ranks share one MoE, vLLM's TP-over-DP for experts)."""
    return 1 if cand.ep_on else cand.tp * (cand.dp if inputs.moe_shared_dp(cand) else 1)


def mxfp4_padding(inputs, moe_tp):
    """How much larger vLLM's MoE kernel makes MXFP4 experts than the checkpoint, on ``moe_tp`` ranks per expert.

    The kernel rounds each rank's expert width (``moe_intermediate_size / moe_tp``) and the hidden size up to its
    tile (plan/gpu_names.py ``MXFP4_KERNELS``); 1.0 where the weights were given or the kernel is not known.
    """
    spec = inputs.spec
    if spec.get("quantization") != "mxfp4" or spec.get("weights_source") == "given" or inputs.device != "cuda":
        return 1.0
    kernel = mxfp4_kernel(inputs.gpu_name)
    if kernel is None:
        return 1.0
    _name, width_multiple, hidden_multiple = kernel
    hidden, width = spec["hidden_size"], spec["moe_intermediate_size"] // moe_tp
    padded = (math.ceil(hidden / hidden_multiple) * hidden_multiple) * (math.ceil(width / width_multiple) * width_multiple)
    return padded / (hidden * width)


def kv_bytes_per_layer(inputs, tp):
    """KV bytes one rank stores per token and layer, in the --kv-cache-dtype (an operator's figure as given)."""
    spec = inputs.spec
    per_layer = mc.kv_bytes_per_token_per_layer(spec, tp)
    if spec.get("kv_bytes_per_token"):
        return per_layer
    return per_layer // spec["dtype_bytes"] * kv_cache.kv_dtype_bytes(spec, inputs.kv_cache_dtype)


def scheduled_tokens(inputs, cand):
    """max_num_batched_tokens: serve_args' value, else vLLM's serving default (CPU: 2048 per rank,
    EngineArgs.get_batch_defaults)."""
    given = getattr(inputs, "max_num_batched_tokens", None)
    if given is not None:
        return given
    if inputs.device == "cpu":
        return CPU_BATCHED_TOKENS_PER_RANK * cand.world
    return serving_batch_defaults(inputs.gpu_memory_bytes, inputs.gpu_name)[0]


def evaluate(inputs, cand):
    """Memory of every pipeline stage of one replica, and the KV capacity vLLM would report."""
    spec = inputs.spec
    dense, moe_non_expert, routed = _layer_bytes_by_kind(inputs, cand.tp)
    if cand.ep_on:
        ep = cand.tp * cand.dp
        routed_share = routed * math.ceil(spec["experts"] / ep) / spec["experts"] if spec["experts"] else 0.0
    else:
        routed_share = routed / expert_shards(inputs, cand)
    routed_share *= mxfp4_padding(inputs, expert_shards(inputs, cand))
    partition = mc.pp_partition(spec["layers"], cand.pp)
    bounds = [(sum(partition[:stage]), sum(partition[: stage + 1])) for stage in range(cand.pp)]
    kv_layout = kv_cache.layout(inputs, cand, bounds, scheduled_tokens(inputs, cand))
    kv_per_layer = kv_bytes_per_layer(inputs, cand.tp)
    block = inputs.block_size
    reserve = reserve_gib(inputs, cand)
    stages = []
    for stage, (start, end) in enumerate(bounds):
        count = end - start
        moe_count = inputs.moe_prefix[end] - inputs.moe_prefix[start]
        weights = (count - moe_count) * dense + moe_count * (moe_non_expert + routed_share)
        weights += mc.embedding_bytes(spec, cand.tp, first_stage=stage == 0, last_stage=stage == cand.pp - 1,
                                      pp=cand.pp)
        # --cpu-offload-gb: vLLM keeps up to that many GiB of each GPU's weights in CPU memory (UVA).
        weights = max(0.0, weights - getattr(inputs, "cpu_offload_bytes", 0))
        per_token = kv_layout["layers_per_block_by_stage"][stage] * kv_per_layer  # one token row of a block
        if inputs.device == "cpu":
            kv_bytes = inputs.cpu_kvcache_space_gib * GIB
        else:
            requested = math.ceil(inputs.gpu_memory_bytes * inputs.gpu_memory_utilization)
            kv_bytes = requested - weights - reserve["total_gib"] * GIB
        blocks = int(kv_bytes // (block * per_token)) if kv_bytes > 0 and per_token else 0
        stages.append({"stage": stage, "layers": count, "weights": weights, "kv_bytes": kv_bytes,
                       "per_token": per_token, "blocks": blocks})
    binding = min(stages, key=lambda s: s["blocks"])
    num_blocks = binding["blocks"]
    blocks_per_request = kv_layout["blocks_per_request"]
    concurrency = num_blocks / blocks_per_request
    tokens = int(concurrency * inputs.max_model_len)
    weights_max = max(s["weights"] for s in stages)
    result = {
        "stages": stages,
        "weights_max": weights_max,
        "kv_bytes_min": min(s["kv_bytes"] for s in stages),
        "per_token_binding": binding["per_token"],
        "num_blocks": num_blocks,
        "blocks_per_request": blocks_per_request,
        "kv_layout": kv_layout,
        "concurrency": concurrency,
        "tokens": tokens,
        "reserve": reserve,
        "routed_share": routed_share,
    }
    _judge_fit(inputs, result, block)
    result["meets_target"] = result["fits"] and meets_target(inputs, result)
    return result


def _judge_fit(inputs, result, block):
    num_blocks, blocks_per_request = result["num_blocks"], result["blocks_per_request"]
    weights_max, reserve = result["weights_max"], result["reserve"]
    if inputs.device == "cpu":
        worker_memory = inputs.gpu_memory_bytes
        need = weights_max + inputs.cpu_kvcache_space_gib * GIB
        result["fits"] = need <= worker_memory and num_blocks - 1 >= blocks_per_request
        if need > worker_memory:
            result["why"] = (
                f"{gib(weights_max)} GiB of weights + {inputs.cpu_kvcache_space_gib} GiB KV per worker "
                f"> {gib(worker_memory)} GiB per worker"
            )
    else:
        usable = inputs.gpu_memory_bytes * inputs.gpu_memory_utilization
        result["fits"] = result["kv_bytes_min"] > 0 and num_blocks - 1 >= blocks_per_request
        if result["kv_bytes_min"] <= 0:
            result["why"] = (
                f"{gib(weights_max)} GiB of weights + {reserve['total_gib']} GiB reserve per GPU "
                f"> {gib(usable)} GiB usable"
            )
    if "why" not in result and not result["fits"]:
        result["why"] = (
            f"the KV cache holds {num_blocks} blocks of {block} tokens; one request of {inputs.max_model_len} "
            f"tokens needs {blocks_per_request} (+1 reserved block)"
        )


def meets_target(inputs, ev):
    if ev["concurrency"] < inputs.concurrency_target:
        return False
    return inputs.kv_tokens_target is None or ev["tokens"] >= inputs.kv_tokens_target


def summary(inputs, ev):
    """One evaluation in a few words (the decision path lists them)."""
    if not ev["fits"]:
        return ev["why"]
    return (
        f"{gib(ev['weights_max'])} GiB weights/GPU, {ev['tokens']:,} KV tokens = "
        f"{ev['concurrency']:.1f} concurrent at {inputs.max_model_len:,}"
    )


def kv_tolerance(ev):
    """How far vLLM's measured KV tokens may fall from the CUDA estimate (the reserve over the KV GiB)."""
    kv_gib = ev["kv_bytes_min"] / GIB
    return round(min(1.0, max(0.05, ev["reserve"]["total_gib"] / kv_gib)), 3) if kv_gib > 0 else 1.0


def memory_section(inputs, cand, ev):
    """The plan's ``memory`` key: per-GPU figures and every number the formulas used."""
    spec = inputs.spec
    per_gpu_usable = inputs.gpu_memory_bytes * (inputs.gpu_memory_utilization if inputs.device == "cuda" else 1)
    memory_inputs = {
        "device_memory_gib": gib(inputs.gpu_memory_bytes),
        "gpu_memory_utilization": inputs.gpu_memory_utilization,
        "usable_gib_per_gpu": gib(per_gpu_usable),
        "weights_gib_by_stage": [gib(stage["weights"]) for stage in ev["stages"]],
        "layers_by_stage": [stage["layers"] for stage in ev["stages"]],
        "kv_cache_gib_by_stage": [gib(stage["kv_bytes"]) for stage in ev["stages"]],
        "kv_cache_bytes_by_stage": [int(stage["kv_bytes"]) for stage in ev["stages"]],
        "kv_bytes_per_token_by_stage": [stage["per_token"] for stage in ev["stages"]],
        "num_blocks_by_stage": [stage["blocks"] for stage in ev["stages"]],
        "kv_heads_per_rank": mc.kv_heads_per_rank(spec, cand.tp),
        "kv_bytes_per_token_per_layer": kv_bytes_per_layer(inputs, cand.tp),
        "kv_cache_dtype": inputs.kv_cache_dtype,
        "kv_dtype_bytes": kv_cache.kv_dtype_bytes(spec, inputs.kv_cache_dtype),
        "kv_cache_groups": kv_cache.summary(ev["kv_layout"], spec),
        "weight_bytes_per_param": spec["weight_bytes_per_param"],
        "routed_expert_gib_per_gpu_per_layer": gib(ev["routed_share"]),
        "num_blocks": ev["num_blocks"],
        "blocks_per_request": ev["blocks_per_request"],
        "max_model_len": inputs.max_model_len,
    }
    if getattr(inputs, "cpu_offload_bytes", 0):
        memory_inputs["cpu_offload_gib_per_gpu"] = gib(inputs.cpu_offload_bytes)
    if inputs.device == "cpu":
        memory_inputs["cpu_kvcache_space_gib"] = inputs.cpu_kvcache_space_gib
    else:
        memory_inputs["reserve_gib"] = ev["reserve"]
        memory_inputs["profile_batch"] = profile_batch(inputs, cand.tp)
    return {
        "weights_gib_per_gpu": gib(ev["weights_max"]),
        "kv_cache_gib_per_gpu": gib(ev["kv_bytes_min"]),
        "kv_bytes_per_token_per_gpu": ev["per_token_binding"],
        "kv_cache_tokens": ev["tokens"],
        "max_concurrency": round(ev["concurrency"], 2),
        "block_size": inputs.block_size,
        "inputs": memory_inputs,
    }
