"""vLLM's own KV cache sizing for given layer shapes and available memory: the planner's oracle.

Run by the runtime venv's Python (vLLM 0.32 and transformers installed); reads a JSON
list of cases on stdin, writes one JSON result per case on stdout. Nothing here comes
from the planner: each layer's attention kind and shape is read from the model's
config through transformers' own config class (``layer_types``, ``sliding_window``,
``num_key_value_heads``, ``head_dim``), the pipeline split is vLLM's
``get_pp_indices``, and the groups, blocks and capacity are vLLM's
``get_kv_cache_configs`` and ``get_kv_cache_capacity`` (what the engine core runs
before it prints ``GPU KV cache size: N tokens``).

A case: {config, tp, pp, block_size, kv_cache_dtype, max_model_len,
max_num_batched_tokens, async_scheduling, available_bytes_by_stage}.
"""

import contextlib
import json
import sys

from transformers import AutoConfig
from vllm.config import CacheConfig, ParallelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.utils import get_pp_indices
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.v1.core import kv_cache_utils
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

LAYER_NAME = "model.layers.{}.self_attn.attn"


class _ModelConfig:
    """The two fields the KV sizing reads from vLLM's ModelConfig (building a real one needs the checkpoint)."""

    def __init__(self, max_model_len):
        self.max_model_len = max_model_len
        self.original_max_model_len = max_model_len


def _strict(fields):
    """Llama 4's public configs write ``attn_temperature_tuning: 4``; transformers 5 declares a bool (truthy both)."""
    if isinstance(fields.get("attn_temperature_tuning"), int):
        fields["attn_temperature_tuning"] = bool(fields["attn_temperature_tuning"])
    for nested in ("text_config", "vision_config"):
        if isinstance(fields.get(nested), dict):
            fields[nested] = _strict(dict(fields[nested]))
    return fields


def text_config(raw):
    fields = _strict({k: v for k, v in raw.items() if k != "model_type"})
    config = AutoConfig.for_model(raw["model_type"], **fields)
    return config.get_text_config()


def layer_specs(text, case):
    """Each layer's KVCacheSpec, as vLLM's attention layers would report them on one TP rank."""
    dtype_name = case["kv_cache_dtype"]
    model_dtype = STR_DTYPE_TO_TORCH_DTYPE[str(getattr(text, "torch_dtype", None) or getattr(text, "dtype", None)
                                               or "bfloat16").replace("torch.", "")]
    dtype = model_dtype if dtype_name == "auto" else STR_DTYPE_TO_TORCH_DTYPE[dtype_name]
    block, tp = case["block_size"], case["tp"]
    layers = text.num_hidden_layers
    if getattr(text, "kv_lora_rank", None):  # MLA: one latent per token, not sharded by TP
        spec = MLAAttentionSpec(block_size=block, num_kv_heads=1,
                                head_size=text.kv_lora_rank + text.qk_rope_head_dim, dtype=dtype)
        return [spec] * layers
    kv_heads = max(1, text.num_key_value_heads // tp)
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    window = getattr(text, "sliding_window", None)
    types = getattr(text, "layer_types", None) or (["sliding_attention"] * layers if window else None)
    specs = []
    for index in range(layers):
        kind = types[index] if types else "full_attention"
        shape = {"block_size": block, "num_kv_heads": kv_heads, "head_size": head, "dtype": dtype}
        if kind == "sliding_attention":
            specs.append(SlidingWindowSpec(sliding_window=window, **shape))
        elif kind == "chunked_attention":
            specs.append(ChunkedLocalAttentionSpec(attention_chunk_size=text.attention_chunk_size, **shape))
        else:
            specs.append(FullAttentionSpec(**shape))
    return specs


def vllm_config(case, chunked):
    scheduler = SchedulerConfig(max_num_batched_tokens=case["max_num_batched_tokens"], max_num_seqs=256,
                                max_model_len=case["max_model_len"], is_encoder_decoder=False)
    config = VllmConfig(scheduler_config=scheduler, cache_config=CacheConfig(block_size=case["block_size"]),
                        parallel_config=ParallelConfig(tensor_parallel_size=case["tp"],
                                                       pipeline_parallel_size=case["pp"]))
    # What VllmConfig decides on CUDA, set by hand on this CPU-only host (see vllm/config/vllm.py):
    config.scheduler_config.async_scheduling = case["async_scheduling"]
    # chunked local attention turns the hybrid KV cache manager off unless an env var allows it
    config.scheduler_config.disable_hybrid_kv_cache_manager = chunked
    config.cache_config.kv_cache_layout = "LBNHC"  # FlashAttention's NHD; page sizes are equal, so no padding
    config.model_config = _ModelConfig(case["max_model_len"])
    return config


@contextlib.contextmanager
def cuda_model_runner():
    """CUDA's default model runner is V2 (vllm/config/vllm.py, use_v2_model_runner: on wherever Triton is);
    this host has no Triton, so while vLLM sizes the cache the property answers as on CUDA (it decides
    the batches in flight with PP). Set only after the config is built: its validation refuses V2 here."""
    original = VllmConfig.use_v2_model_runner
    VllmConfig.use_v2_model_runner = property(lambda self: True)
    try:
        yield
    finally:
        VllmConfig.use_v2_model_runner = original


def size(case):
    text = text_config(case["config"])
    specs = layer_specs(text, case)
    chunked = any(isinstance(spec, ChunkedLocalAttentionSpec) for spec in specs)
    config = vllm_config(case, chunked)
    workers = []
    for rank in range(case["pp"]):
        start, end = get_pp_indices(len(specs), rank, case["pp"])
        workers.append({LAYER_NAME.format(i): specs[i] for i in range(start, end)})
    with cuda_model_runner():
        configs = kv_cache_utils.get_kv_cache_configs(config, workers, case["available_bytes_by_stage"])
        scheduler = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
        tokens, concurrency = kv_cache_utils.get_kv_cache_capacity(config, scheduler)
    return {
        "tokens": tokens,
        "concurrency": concurrency,
        "num_blocks": scheduler.num_blocks,
        "groups": [[type(group.kv_cache_spec).__name__, len(group.layer_names)]
                   for group in scheduler.kv_cache_groups],
        "layer_kinds": sorted({type(spec).__name__ for spec in specs}),
    }


def main():
    results = []
    for case in json.load(sys.stdin):
        try:
            results.append(size(case))
        except Exception as exc:  # reported per case; the test shows it
            results.append({"error": f"{type(exc).__name__}: {exc}"})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
