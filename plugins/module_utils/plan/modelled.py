"""What the planner models, positively: the model classes it counts and the config values it reads.

A config is planned from its shapes only when its class is in ``MODELLED_ARCHITECTURES`` and no field
selects a layer or attention kind the memory model does not count (``UNMODELLED_FIELDS``, ``layer_types``
values outside ``MODELLED_LAYER_TYPES``, ``moe_layer_freq`` that is not one integer, a vision tower other
than ``MODELLED_VISION_TOWERS``). Anything else is refused by ``unmodelled_reason``, naming the field and
its value, unless the operator gives the checkpoint's size and KV bytes per token (``OVERRIDE_HINT``).
docs/planner.md ("What the planner models") lists the same.

``opaque_spec`` describes a model the planner has no config for (any name, both overrides given).

Pure Python, no Ansible import.
"""

from __future__ import annotations

OVERRIDE_HINT = ("plan it anyway by giving the model as {name: ..., weights_gib: N, kv_bytes_per_token: M} "
                 "(vllm_cluster_model; on the command line --weights-gib and --kv-bytes-per-token), from the "
                 "checkpoint's size and the KV bytes per token vLLM reports")

# The classes whose layers the planner counts tensor by tensor (vLLM's class of the same name), with what they hold.
MODELLED_ARCHITECTURES = {
    "LlamaForCausalLM": "dense, GQA/MHA, full or sliding-window attention",
    "MistralForCausalLM": "dense, GQA, full or sliding-window attention",
    "MixtralForCausalLM": "MoE (every layer), GQA",
    "Qwen2ForCausalLM": "dense, GQA with qkv bias, full or (all-layer) sliding attention",
    "Qwen2MoeForCausalLM": "MoE with a shared expert, GQA with qkv bias",
    "Qwen3ForCausalLM": "dense, GQA with q/k norms",
    "Qwen3MoeForCausalLM": "MoE, GQA with q/k norms",
    "DeepseekV2ForCausalLM": "MLA, MoE with shared experts and leading dense layers",
    "DeepseekV3ForCausalLM": "MLA, MoE with shared experts and leading dense layers (also Kimi K2)",
    "GptOssForCausalLM": "MoE with MXFP4 experts, alternating sliding and full attention with sinks",
    "Llama4ForCausalLM": "MoE with a shared expert, chunked-local and global (NoPE) attention",
    "Llama4ForConditionalGeneration": "Llama 4 text model and its vision encoder",
    "Gemma2ForCausalLM": "dense, alternating sliding and full attention, tied head",
    "Gemma3ForCausalLM": "dense, sliding and full attention, q/k norms, tied head",
    "Gemma3ForConditionalGeneration": "Gemma 3 text model and its SigLIP vision tower",
}
# The classes whose KV is one latent per token (MLA): kv_lora_rank means MLA only here.
MLA_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
# layer_types values the planner models (everything else, e.g. linear_attention or chunked variants, is refused).
MODELLED_LAYER_TYPES = ("full_attention", "sliding_attention")
# vision_config.model_type values whose towers plan/model_config.vision_params counts.
MODELLED_VISION_TOWERS = ("siglip_vision_model", "llama4_vision_model")

# Config fields that select a layer, attention or cache kind the planner does not count, with what it is.
# A field counts when present with a value other than null, false, 0 or an empty list.
UNMODELLED_FIELDS = (
    ("index_topk", "a sparse-attention indexer (DeepSeek Sparse Attention): its own key cache and weights"),
    ("index_n_heads", "a sparse-attention indexer (DeepSeek Sparse Attention): its own key cache and weights"),
    ("sparse_attention_config", "sparse attention with an index cache"),
    ("compress_ratios", "compressed attention layers (a cache per compression ratio)"),
    ("block_configs", "per-block shapes (each layer its own attention and MLP width, some without attention)"),
    ("hybrid_layer_pattern", "layers of two attention shapes (full and sliding with different heads)"),
    ("swa_num_key_value_heads", "sliding-window layers with their own head counts"),
    ("num_kv_shared_layers", "layers that share another layer's KV cache"),
    ("hidden_size_per_layer_input", "per-layer input embeddings"),
    ("attention_k_eq_v", "attention whose keys serve as values"),
    ("global_head_dim", "full-attention layers with their own head size"),
    ("enable_moe_block", "a dense MLP beside a MoE block in the same layer"),
    ("use_double_wide_mlp", "layers with a double-width MLP"),
    ("mlp_layer_types", "per-layer MLP kinds"),
    ("num_hash_layers", "hash-routed MoE layers"),
)
# State-space and linear-attention layers keep a state per sequence, not KV per token.
STATE_SPACE_MODEL_TYPES = ("jamba", "mamba", "mamba2", "falcon_mamba", "falcon_h1", "zamba", "zamba2", "bamba",
                           "nemotron_h", "granitemoehybrid", "qwen3_next", "plamo2", "lfm2", "minimax",
                           "minimax_text_01", "rwkv", "recurrent_gemma")
STATE_SPACE_KEYS = ("attn_layer_period", "layers_block_type", "mamba_d_state", "ssm_state_size", "linear_conv_kernel_dim",
                    "mamba_expand", "hybrid_override_pattern")
GENERATIVE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")


def _short(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + " ...]"


def _set(value):
    return value not in (None, False, 0, [], {}, "")


def _field_reason(cfg, text):
    """The first field whose value selects a kind the planner does not model: (field, value, what) or None."""
    inner = "" if text is cfg else "text_config."
    for key, what in UNMODELLED_FIELDS:
        for where, config in ((inner, text), ("", cfg)):
            if isinstance(config, dict) and _set(config.get(key)):
                return f"{where}{key}", config[key], what
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list):
        unknown = sorted({str(kind) for kind in layer_types if kind not in MODELLED_LAYER_TYPES})
        if unknown:
            return "layer_types", unknown, f"layer kinds other than {' and '.join(MODELLED_LAYER_TYPES)}"
    frequency = text.get("moe_layer_freq")
    if frequency is not None and (isinstance(frequency, bool) or not isinstance(frequency, int)):
        return "moe_layer_freq", frequency, "a per-layer MoE pattern (the planner reads one integer interval)"
    vision = cfg.get("vision_config")
    if isinstance(vision, dict):
        tower = vision.get("model_type")
        if tower not in MODELLED_VISION_TOWERS:
            return ("vision_config.model_type", tower,
                    f"a vision tower the planner does not count (it counts {', '.join(MODELLED_VISION_TOWERS)})")
    return None


def unmodelled_reason(cfg, text, architectures, model_type):
    """Why the planner cannot count this model's memory, naming the config field and value; None if it can."""
    if not architectures:
        return ("config.json has no 'architectures': the planner cannot tell which model class vLLM would load "
                "(a decoder, an encoder, a hybrid)")
    architecture = architectures[0]
    layer_types = text.get("layer_types") if isinstance(text.get("layer_types"), list) else []
    state_layers = sorted({t for t in layer_types if isinstance(t, str) and ("mamba" in t or "linear" in t)})
    state_keys = [key for key in STATE_SPACE_KEYS if key in text]
    if model_type.lower() in STATE_SPACE_MODEL_TYPES or state_layers or state_keys:
        what = state_layers or state_keys or [f"model_type {model_type}"]
        return (f"{architecture} has state-space or linear-attention layers ({', '.join(what)}): their state is "
                "per sequence, not KV per token, and the planner counts neither their weights nor their state")
    if not architecture.endswith(GENERATIVE_SUFFIXES):
        return (f"{architecture} is not a generative decoder (an encoder or a pooling model?): the planner models "
                f"decoders whose class ends in {', '.join(GENERATIVE_SUFFIXES)}")
    field = _field_reason(cfg, text)
    modelled = architecture in MODELLED_ARCHITECTURES
    if field is not None:
        key, value, what = field
        lead = f"config field {key} = {_short(value)} means {what}, which the planner does not model"
        return lead if modelled else f"{lead} (and architectures[0] = {architecture!r} is not a class it models)"
    if not modelled:
        return (f"architectures[0] = {architecture!r} is not a class the planner models (it models "
                f"{', '.join(sorted(MODELLED_ARCHITECTURES))})")
    if architecture not in MLA_ARCHITECTURES and _set(text.get("kv_lora_rank")):
        return (f"config field kv_lora_rank = {text['kv_lora_rank']!r} on {architecture}: the planner models latent "
                f"(MLA) attention only for {', '.join(MLA_ARCHITECTURES)}")
    return None


def override_problem(weights_gib, kv_bytes_per_token):
    """What is wrong with a given weights_gib or kv_bytes_per_token (None when each is absent or valid)."""
    if kv_bytes_per_token is not None and (
            isinstance(kv_bytes_per_token, bool) or not isinstance(kv_bytes_per_token, int) or kv_bytes_per_token < 1):
        return f"kv_bytes_per_token must be a positive integer, got {kv_bytes_per_token!r}"
    if weights_gib is not None and (
            isinstance(weights_gib, bool) or not isinstance(weights_gib, int | float) or not weights_gib > 0):
        return f"weights_gib must be a positive number, got {weights_gib!r}"
    return None


def opaque_spec(name, path, weights_gib, kv_bytes_per_token, gib, *, layers=1, heads=None):
    """A model whose shapes the planner does not read: its weights and KV bytes as given.

    The weights spread evenly over ``layers`` (1 without a config: no pipeline parallel) and TP shards them;
    vLLM's rule that TP divides the attention heads is checked only when ``heads`` is known; activations are
    not estimated. The plan's warnings say so.
    """
    params = int(weights_gib * gib / 2)
    return {
        "name": name, "architecture": "unknown (no config read)", "model_type": "", "is_moe": False,
        "attention": "given", "layers": layers, "heads": heads, "kv_heads": None, "head_dim": None, "v_head_dim": None,
        "hidden_size": 0, "intermediate_size": 0, "vocab_size": 0, "tie_word_embeddings": True,
        "experts": 0, "experts_per_token": 0, "moe_intermediate_size": 0, "shared_expert_intermediate_size": 0,
        "moe_layers": 0, "kv_lora_rank": None, "qk_rope_head_dim": None, "q_lora_rank": None,
        "dtype": "bfloat16", "dtype_bytes": 2, "quantization": None, "weight_bytes_per_param": 2.0,
        "max_position_embeddings": None, "max_model_len_limit": None, "sliding_window": None,
        "attention_chunk_size": None, "layer_attention": ["full"] * layers, "vision_params": 0, "mtp_layers_not_loaded": 0,
        "source": "given", "path": path, "params": params, "params_routed_experts": 0,
        "kv_bytes_per_token": kv_bytes_per_token, "weights_gib": round(float(weights_gib), 3),
        "weights_source": "given", "opaque": True,
        "_moe_layer_set": frozenset(), "_qkv_bias": False, "_o_bias": False, "_mlp_bias": False, "_q_nope": None,
        "_weights_scale": 1.0, "_rope_scaling": (1.0, None), "_opaque_params": params,
    }
