"""Peak activation memory of vLLM's profiling forward pass, measured on one GPU.

vLLM sizes its KV cache after one dummy forward pass of max_num_batched_tokens
tokens and keeps the peak torch allocated during it off the KV cache. The planner
estimates that peak (memory.py: forward_activation_bytes, the plan's
memory.inputs.profile_batch.forward_gib). This measures it for the plan's model:

- the decoder as one tensor-parallel rank holds it (vLLM shards the heads, the
  MLP's intermediate and the vocabulary by TP; the hidden size is not sharded),
  built with transformers' LlamaModel, bf16, random weights created on the GPU
  (nothing is downloaded), SDPA attention (causal, no mask: no T x T matrix);
- the tokens as one packed sequence: vLLM flattens the batch into one stream of
  tokens, so every linear layer sees [tokens, hidden] however the tokens are
  split into sequences, and flash attention keeps no T x T matrix either way;
- the LM head on the sampled positions only (vLLM's logits: one per sequence),
  cast to fp32 as vLLM's sampler does;
- the peak of torch's allocated bytes above those allocated with the weights in
  place, after a small warm-up (cuBLAS workspace: the planner's CUDA context);
- a model too big for the GPU is built with a few layers: in inference mode each
  layer's activations are freed before the next, so the peak does not grow with
  depth (the run on the 8B with all and with 4 layers checks it).
"""
from __future__ import annotations

import math

GIB = 1024**3
ATTENTION = "sdpa"
FEW_LAYERS = 4  # layers built when the whole model would not leave room
TOLERANCE = 0.01  # how far a peak may exceed the estimate before it counts as under-reserved
WHOLE_MODEL_SHARE = 0.6  # build every layer only when the weights take under this share of free memory
WARMUP_TOKENS = 16


def rank_shapes(model: dict, tp: int) -> dict:
    """The decoder's shapes as one TP rank holds them."""
    if model.get("is_moe") or model.get("attention") == "mla":
        raise SystemExit(f"activation peak: {model.get('name')} is not a dense Llama-family decoder")
    return {
        "hidden_size": model["hidden_size"],
        "intermediate_size": math.ceil(model["intermediate_size"] / tp),
        "heads": model["heads"] // tp,
        "kv_heads": max(1, model["kv_heads"] // tp),  # vLLM replicates KV heads when tp > kv_heads
        "head_dim": model["head_dim"],
        "vocab_size": math.ceil(model["vocab_size"] / tp),
        "attention_bias": str(model.get("model_type", "")).startswith("qwen2"),  # Qwen2: q/k/v bias
        "dtype_bytes": model["dtype_bytes"],
    }


def build_decoder(shapes: dict, layers: int, max_tokens: int):
    """LlamaModel and LM head in bf16 with random weights, created directly on the GPU."""
    import torch
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        hidden_size=shapes["hidden_size"], intermediate_size=shapes["intermediate_size"],
        num_hidden_layers=layers, num_attention_heads=shapes["heads"], num_key_value_heads=shapes["kv_heads"],
        head_dim=shapes["head_dim"], vocab_size=shapes["vocab_size"], attention_bias=shapes["attention_bias"],
        max_position_embeddings=max_tokens, use_cache=False, attn_implementation=ATTENTION,
    )
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaModel(config).eval()
            lm_head = torch.nn.Linear(shapes["hidden_size"], shapes["vocab_size"], bias=False)
    finally:
        torch.set_default_dtype(default_dtype)
    return model, lm_head


def forward_peak(model, lm_head, tokens: int, sampled_positions: int, vocab_size: int) -> dict:
    """Peak bytes above what is allocated before the pass: the model's part, and with the logits."""
    import torch

    input_ids = torch.randint(0, vocab_size, (1, tokens), device="cuda")
    torch.cuda.synchronize()
    base_allocated, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        hidden = model(input_ids=input_ids, use_cache=False).last_hidden_state
        torch.cuda.synchronize()
        model_peak = torch.cuda.max_memory_allocated() - base_allocated
        logits = lm_head(hidden[0, -sampled_positions:]).float()
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base_allocated
    reserved_peak = torch.cuda.max_memory_reserved() - base_reserved
    del input_ids, hidden, logits
    torch.cuda.empty_cache()
    return {"model_peak_bytes": model_peak, "peak_bytes": peak, "reserved_growth_bytes": reserved_peak}


def expected_terms(shapes: dict, tokens: int) -> dict:
    """The big tensors of one layer, in GiB, to explain the peak."""
    dtype_bytes = shapes["dtype_bytes"]
    hidden = tokens * shapes["hidden_size"] * dtype_bytes
    return {
        # gate and up outputs, then act(gate) * up: three [tokens, intermediate] live at once (vLLM: gate_up + out)
        "mlp_intermediate_x3_gib": round(3 * tokens * shapes["intermediate_size"] * dtype_bytes / GIB, 3),
        "hidden_copy_gib": round(hidden / GIB, 3),  # one [tokens, hidden]: residual, normed input, layer output
        "qkv_gib": round(tokens * (shapes["heads"] + 2 * shapes["kv_heads"]) * shapes["head_dim"] * dtype_bytes
                         / GIB, 3),
        # what an attention that materialized the scores would need (SDPA's flash kernel does not)
        "attention_matrix_if_materialized_gib": round(shapes["heads"] * tokens * tokens * dtype_bytes / GIB, 3),
    }


def measure(model: dict, tp: int, token_counts: list[int], planner_activations_gib: float, profile_tokens: int,
            layers: int = 0, sampled_positions: int = 1) -> dict:
    """Measure the profiling pass at each token count and compare with the planner's estimate."""
    import torch
    import transformers

    shapes = rank_shapes(model, tp)
    free, _ = torch.cuda.mem_get_info()
    if not layers:
        whole_fits = model["weights_gib"] / tp * GIB < WHOLE_MODEL_SHARE * free
        layers = model["layers"] if whole_fits else FEW_LAYERS
    torch.cuda.empty_cache()
    before_weights = torch.cuda.memory_allocated()
    decoder, lm_head = build_decoder(shapes, layers, max(token_counts))
    torch.cuda.synchronize()
    weights_bytes = torch.cuda.memory_allocated() - before_weights
    forward_peak(decoder, lm_head, WARMUP_TOKENS, 1, shapes["vocab_size"])  # kernels and cuBLAS workspace

    rows = []
    for tokens in sorted(token_counts):
        peak = forward_peak(decoder, lm_head, tokens, min(sampled_positions, tokens), shapes["vocab_size"])
        # the planner's figure is for its profile batch; its formula is linear in the tokens
        estimate_gib = planner_activations_gib * tokens / profile_tokens
        measured_gib = peak["peak_bytes"] / GIB
        rows.append({
            "tokens": tokens,
            "measured_peak_gib": round(measured_gib, 3),
            "model_only_peak_gib": round(peak["model_peak_bytes"] / GIB, 3),
            "reserved_growth_gib": round(peak["reserved_growth_bytes"] / GIB, 3),
            "planner_estimate_gib": round(estimate_gib, 3),
            "estimate_from": "plan" if tokens == profile_tokens else f"plan x {tokens}/{profile_tokens}",
            "ratio_measured_to_estimate": round(measured_gib / estimate_gib, 3) if estimate_gib else None,
            # 1%: the rounding of the plan's GiB and transformers' one extra [tokens, hidden] copy
            "under_reserved": measured_gib > estimate_gib * (1 + TOLERANCE),
            # the peak as a multiple of [tokens, hidden]: compare with 3 x intermediate/tp/hidden + 4
            "values_per_token_x_hidden": round(peak["peak_bytes"] / (tokens * shapes["hidden_size"]
                                                                     * shapes["dtype_bytes"]), 2),
            "expected_terms": expected_terms(shapes, tokens),
        })
    attention = getattr(decoder.config, "_attn_implementation", None)
    del decoder, lm_head
    torch.cuda.empty_cache()
    return {
        "tp_rank_of": tp, "rank_shapes": shapes, "layers_built": layers, "layers_in_model": model["layers"],
        "per_layer": layers < model["layers"], "weights_gib_built": round(weights_bytes / GIB, 3),
        "tokens_layout": "one packed sequence", "sampled_positions": sampled_positions,
        "attention_implementation": attention, "planner_activations_gib": planner_activations_gib,
        "profile_tokens": profile_tokens, "torch": torch.__version__, "transformers": transformers.__version__,
        "rows": rows, "ok": not any(row["under_reserved"] for row in rows),
    }
