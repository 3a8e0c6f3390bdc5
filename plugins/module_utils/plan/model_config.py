"""Read a Hugging Face ``config.json`` (or a catalog entry) into the numbers the planner needs.

Pure Python (3.11+), no Ansible and no third-party imports. Parameters are
counted from tensor shapes the way vLLM shards them, so the same functions give
the whole model (``tp=1``) and what one tensor-parallel rank holds.

Assumptions, all stated in docs/planner.md:
- the model classes and config values of plan/modelled.py, and only those: anything else is refused naming
  the field and value (``modelled.unmodelled_reason``) unless ``weights_gib`` and ``kv_bytes_per_token`` are
  given, which also plan a model the planner has no config for (``modelled.opaque_spec``);
- vLLM's ``--dtype auto``: float32 checkpoints are served in bfloat16, so
  weights and the KV cache use 2 bytes per value unless quantized;
- multi-token-prediction layers (DeepSeek ``num_nextn_predict_layers``) are not
  loaded by ``vllm serve`` without speculative decoding, so they are not counted.
"""

from __future__ import annotations

import json
import math
import os

from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_catalog, modelled
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.modelled import OVERRIDE_HINT  # noqa: F401
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.pipeline import pp_partition  # noqa: F401 (mc.pp_partition)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.rope import RopeScalingError, rope_scaling

GIB = 1024**3
# vLLM pads the vocabulary of VocabParallelEmbedding / ParallelLMHead to this.
VOCAB_PADDING = 64

_DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2}


WEIGHTS_HINT = ("give the checkpoint's size as {name: ..., weights_gib: N} (vllm_cluster_model; on the command "
                "line --weights-gib)")


class ModelConfigError(ValueError):
    """The model description cannot be read or is not a shape the planner understands."""


class UnknownModelName(ModelConfigError):
    """A model name that is neither a catalog name nor an existing path."""


# --------------------------------------------------------------------------- reading


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise ModelConfigError(f"cannot read model config {path}: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"model config {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"model config {path} must hold a JSON object, got {type(data).__name__}")
    return data


def _resolve_source(name):
    """Return ``(config, source, default_model_path, short_name)`` for a string model input."""
    if not name.strip():
        raise ModelConfigError("model must be a catalog name, a hub id or a path, got an empty string")
    expanded = os.path.expanduser(name)
    if os.path.isdir(expanded):
        config_path = os.path.join(expanded, "config.json")
        if not os.path.isfile(config_path):
            raise ModelConfigError(f"model directory {expanded} has no config.json")
        directory = os.path.abspath(expanded)
        return _read_json(config_path), f"file:{os.path.abspath(config_path)}", directory, None
    if os.path.isfile(expanded):
        directory = os.path.dirname(os.path.abspath(expanded))
        return _read_json(expanded), f"file:{os.path.abspath(expanded)}", directory, None
    hit = model_catalog.lookup(name)
    if hit is not None:
        short, hub_id, config = hit
        return config, f"catalog:{short}", hub_id, short
    if name.startswith(("/", "./", "../", "~")) or name.endswith(".json"):
        raise ModelConfigError(f"model path {name} does not exist")
    raise UnknownModelName(
        f"unknown model {name!r}: not a catalog name or hub id ({', '.join(model_catalog.catalog_names())}) "
        "and not an existing directory or config.json; give the directory holding its config.json, or "
        + OVERRIDE_HINT
    )


# --------------------------------------------------------------------------- field access


def _int_field(cfg, key, *, default=None, minimum=1, required=True):
    value = cfg.get(key, default)
    if value is None:
        if required:
            raise ModelConfigError(f"model config lacks {key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelConfigError(f"model config field {key!r} must be an integer, got {value!r}")
    if value < minimum:
        raise ModelConfigError(f"model config field {key!r} must be >= {minimum}, got {value}")
    return value


def _first_int(cfg, keys):
    for key in keys:
        if cfg.get(key) is not None:
            return _int_field(cfg, key, minimum=0)
    return 0


def _bool_field(cfg, key, default=False):
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelConfigError(f"model config field {key!r} must be true or false, got {value!r}")
    return value


def serving_dtype(cfg):
    """The dtype ``vllm serve --dtype auto`` runs in, and its bytes per value.

    vLLM downcasts float32 checkpoints to the platform's first supported dtype
    (bfloat16 on CUDA >= sm80 and on x86/ARM CPUs); older GPUs fall back to
    float16, which has the same size.
    """
    raw = cfg.get("torch_dtype", cfg.get("dtype", "float32"))
    if raw is None:
        raw = "float32"
    if not isinstance(raw, str) or raw.lower().replace("torch.", "") not in _DTYPE_BYTES:
        raise ModelConfigError(
            f"model config dtype {raw!r} is not one of float32, bfloat16, float16 (what vLLM serves)"
        )
    name = raw.lower().replace("torch.", "")
    if _DTYPE_BYTES[name] == 4:
        return "bfloat16", 2
    return ("float16" if name in ("float16", "half", "fp16") else "bfloat16"), 2


def quantized_bytes_per_param(quant):
    """Bytes per parameter of a quantized linear weight, scales included; ``(method, bytes)``."""
    if quant is None:
        return None, None
    if not isinstance(quant, dict):
        raise ModelConfigError(f"quantization_config must be an object, got {quant!r}")
    method = str(quant.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8", "ptpc_fp8"):
        block = quant.get("weight_block_size")
        scale = 0.0
        if isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block):
            scale = 4.0 / (block[0] * block[1])  # one float32 scale per block
        return method, 1.0 + scale
    if method == "modelopt":
        algo = str(quant.get("quant_algo", quant.get("quantization", {}).get("quant_algo", ""))).upper()
        if algo.startswith("FP8"):
            return method, 1.0
        if algo == "NVFP4":
            return method, 0.5 + 1.0 / 16  # one fp8 scale per 16 values
        raise ModelConfigError(f"modelopt quant_algo {algo!r} is not known to the planner; " + WEIGHTS_HINT)
    if method == "mxfp4":
        return method, 0.5 + 1.0 / 32
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "marlin"):
        bits = quant.get("bits", quant.get("w_bit"))
        group = quant.get("group_size", quant.get("q_group_size", 128))
        if not isinstance(bits, int) or bits not in (2, 3, 4, 8):
            raise ModelConfigError(f"{method} quantization needs bits in 2/3/4/8, got {bits!r}")
        if not isinstance(group, int) or group == 0:
            raise ModelConfigError(f"{method} quantization has an invalid group_size {group!r}")
        per_group = 0.0 if group < 0 else (2.0 + bits / 8.0) / group  # fp16 scale + packed zero
        return method, bits / 8.0 + per_group
    if method == "compressed-tensors":
        groups = quant.get("config_groups")
        if isinstance(groups, dict) and groups:
            first = next(iter(groups.values()))
            weights = first.get("weights") if isinstance(first, dict) else None
            if isinstance(weights, dict) and isinstance(weights.get("num_bits"), int):
                bits = weights["num_bits"]
                group = weights.get("group_size")
                per_group = 2.0 / group if isinstance(group, int) and group > 0 else 0.0
                return method, bits / 8.0 + per_group
        raise ModelConfigError(
            "compressed-tensors config without config_groups.*.weights.num_bits; " + WEIGHTS_HINT
        )
    if method == "bitsandbytes":
        if quant.get("load_in_4bit"):
            return method, 0.5 + 4.0 / 64  # float32 absmax per 64-value block
        if quant.get("load_in_8bit"):
            return method, 1.0 + 4.0 / 64
        raise ModelConfigError(
            "bitsandbytes config with neither load_in_4bit nor load_in_8bit; " + WEIGHTS_HINT
        )
    raise ModelConfigError(
        f"quantization method {method or quant!r} is not known to the planner; " + WEIGHTS_HINT
    )


# --------------------------------------------------------------------------- normalising


def layer_attention_kinds(text, model_type, layers):
    """Per-layer attention as vLLM 0.32 builds it: ``(kinds, sliding_window, attention_chunk_size)``.

    A kind is ``"full"``, ``"sliding"`` (a window of ``sliding_window`` tokens) or ``"chunked"`` (Llama 4's
    local attention in blocks of ``attention_chunk_size`` tokens); window and chunk are None when unused.
    """
    model_type, qwen = model_type.lower(), model_type.lower() in model_catalog.QWEN_SLIDING_TYPES
    window = text.get("sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        window = None  # vLLM's ModelConfig turns a 0 window into None
    if qwen and not text.get("use_sliding_window", False):
        window = None  # Qwen2Config.__post_init__: sliding_window if use_sliding_window else None
    if model_type.startswith("llama4"):
        # llama4.py Llama4Attention: nope = no_rope_layers[layer_idx] == 0; ChunkedLocalAttention when
        # `not self.nope and config.attention_chunk_size`, else full Attention.
        chunk, no_rope = _int_field(text, "attention_chunk_size", required=False), text.get("no_rope_layers")
        if not isinstance(no_rope, list) or len(no_rope) < layers:
            raise ModelConfigError(f"no_rope_layers must list one entry per layer ({layers}), got {no_rope!r}")
        kinds = ["chunked" if chunk and no_rope[i] != 0 else "full" for i in range(layers)]
        return kinds, None, chunk if "chunked" in kinds else None
    if window is None:
        return ["full"] * layers, None, None
    if model_type == "gpt_oss":  # gpt_oss.py: `config.sliding_window if self.layer_idx % 2 == 0 else None`
        return ["sliding" if i % 2 == 0 else "full" for i in range(layers)], window, None
    layer_types = text.get("layer_types")
    if qwen and layer_types is None:  # Qwen2Config.__post_init__: the layers from max_window_layers on slide
        layer_types = ["sliding_attention" if i >= text.get("max_window_layers", 28) else "full_attention"
                       for i in range(layers)]
    if layer_types is None:
        # engine/arg_utils.py: with no layer_types CacheConfig.sliding_window is the model's window, and
        # Attention applies it to every layer (Mistral-7B-v0.1).
        return ["sliding"] * layers, window, None
    if not isinstance(layer_types, list) or len(layer_types) < layers:
        raise ModelConfigError(f"layer_types must list one entry per layer ({layers}), got {layer_types!r}")
    # llama.py / gemma2.py / gemma3.py: per_layer_sliding_window where layer_types[i] == "sliding_attention".
    kinds = ["sliding" if layer_types[i] == "sliding_attention" else "full" for i in range(layers)]
    if qwen and len(set(kinds)) > 1:  # qwen2.py Qwen2Model asserts max_window_layers == num_hidden_layers
        raise ModelConfigError(f"Sliding window for some but all layers is not supported (vLLM's Qwen2 model: "
                               f"max_window_layers {text.get('max_window_layers')} < num_hidden_layers {layers})")
    return kinds, (window if "sliding" in kinds else None), None


def normalize_config(cfg, *, source, path, name=None, weights_gib=None, kv_bytes_per_token=None):
    """Turn a HF config dict into the planner's model description (a plain dict).

    Keys starting with ``_`` are internal (per-layer structure) and are left out
    of the plan.
    """
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"model config must be an object, got {type(cfg).__name__}")
    text = model_catalog.text_config(cfg)

    architectures = cfg.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelConfigError(
            f"model config field 'architectures' must be a list of strings, got {architectures!r}"
        )
    model_type = text.get("model_type", cfg.get("model_type", ""))
    if not isinstance(model_type, str):
        raise ModelConfigError(f"model config field 'model_type' must be a string, got {model_type!r}")
    overridden = weights_gib is not None and kv_bytes_per_token is not None
    unmodelled = modelled.unmodelled_reason(cfg, text, architectures, model_type)
    if unmodelled and not overridden:
        raise ModelConfigError(f"{unmodelled}; {OVERRIDE_HINT}")
    architectures = architectures or ["unknown"]
    try:
        return _from_shapes(cfg, text, architectures, model_type, source=source, path=path, name=name,
                            weights_gib=weights_gib, kv_bytes_per_token=kv_bytes_per_token)
    except ModelConfigError as exc:
        if not overridden:
            raise ModelConfigError(f"{exc}; {OVERRIDE_HINT}") from None
        _check_overrides(weights_gib, kv_bytes_per_token)
        layers, heads = (text.get(key) for key in ("num_hidden_layers", "num_attention_heads"))
        spec = modelled.opaque_spec(name, path, weights_gib, kv_bytes_per_token, GIB,
                                    layers=layers if isinstance(layers, int) and layers > 0 else 1,
                                    heads=heads if isinstance(heads, int) and heads > 0 else None)
        spec["architecture"], spec["model_type"], spec["source"] = architectures[0], model_type, source
        return spec


def _check_overrides(weights_gib, kv_bytes_per_token):
    problem = modelled.override_problem(weights_gib, kv_bytes_per_token)
    if problem:
        raise ModelConfigError(problem)


def _from_shapes(cfg, text, architectures, model_type, *, source, path, name, weights_gib, kv_bytes_per_token):
    """The model description counted from the config's shapes (normalize_config once the config is modelled)."""

    hidden = _int_field(text, "hidden_size")
    layers = _int_field(text, "num_hidden_layers")
    heads = _int_field(text, "num_attention_heads")
    kv_heads = _int_field(text, "num_key_value_heads", default=heads)
    vocab = _int_field(text, "vocab_size")
    intermediate = _int_field(text, "intermediate_size")
    max_positions = _int_field(text, "max_position_embeddings", required=False)
    try:
        rope_factor, rope_type = rope_scaling(text, model_type.lower())
    except RopeScalingError as exc:
        raise ModelConfigError(str(exc)) from None
    tied = _bool_field(text, "tie_word_embeddings", default=False)
    dtype, dtype_bytes = serving_dtype(text)
    try:
        quant_method, quant_bytes = quantized_bytes_per_param(text.get("quantization_config"))
    except ModelConfigError:
        if weights_gib is None:
            raise
        quant_method, quant_bytes = "unknown (weights_gib given)", None
    weight_bytes = quant_bytes if quant_bytes is not None else float(dtype_bytes)

    kv_lora_rank = _int_field(text, "kv_lora_rank", required=False)
    is_mla = kv_lora_rank is not None
    if is_mla:
        rope = _int_field(text, "qk_rope_head_dim")
        nope = _int_field(text, "qk_nope_head_dim")
        v_head = _int_field(text, "v_head_dim")
        q_lora = _int_field(text, "q_lora_rank", required=False)
        head_dim = nope + rope
        attention = "mla"
    else:
        rope = nope = q_lora = None
        if kv_heads > heads or heads % kv_heads:
            raise ModelConfigError(
                f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
            )
        head_dim = _int_field(text, "head_dim", required=False)
        if head_dim is None:
            if hidden % heads:
                raise ModelConfigError(
                    f"hidden_size ({hidden}) is not divisible by num_attention_heads ({heads}) and no head_dim is given"
                )
            head_dim = hidden // heads
        v_head = head_dim
        attention = "mha" if kv_heads == heads else "gqa"

    model_type_l = model_type.lower()
    is_llama4 = model_type_l.startswith("llama4")
    experts = _first_int(text, ("num_local_experts", "n_routed_experts", "num_experts"))
    is_moe = experts > 1
    if is_moe:
        # gpt-oss's config.json carries both num_experts_per_tok and its original name experts_per_token.
        per_token_key = "num_experts_per_tok" if text.get("num_experts_per_tok") is not None else "experts_per_token"
        per_token = _int_field(text, per_token_key, required=False)
        if per_token is None:
            raise ModelConfigError("model config lacks 'num_experts_per_tok'")
        if per_token > experts:
            raise ModelConfigError(f"num_experts_per_tok ({per_token}) exceeds the expert count ({experts})")
        moe_intermediate = _int_field(text, "moe_intermediate_size", default=intermediate)
        shared_intermediate = 0
        if is_llama4:
            # llama4.py Llama4MoE: experts and the one shared expert are intermediate_size wide; the dense
            # layers (Llama4DecoderLayer's LlamaMLP) intermediate_size_mlp.
            shared_intermediate = intermediate
            intermediate = _int_field(text, "intermediate_size_mlp", default=intermediate)
        elif text.get("n_shared_experts") is not None:
            shared_intermediate = _int_field(text, "n_shared_experts", minimum=0) * moe_intermediate
        elif text.get("shared_expert_intermediate_size") is not None:
            shared_intermediate = _int_field(text, "shared_expert_intermediate_size", minimum=0)
        first_dense = _int_field(text, "first_k_dense_replace", default=0, minimum=0)
        frequency = _int_field(text, "moe_layer_freq", default=1)
        sparse_step = _int_field(text, "decoder_sparse_step", default=1)
        mlp_only = text.get("mlp_only_layers") or []
        if not isinstance(mlp_only, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in mlp_only
        ):
            raise ModelConfigError(f"mlp_only_layers must be a list of layer indices, got {mlp_only!r}")
        if is_llama4:
            # llama4.py Llama4DecoderLayer: `interleave_moe_layer_step > 0 and (layer_idx + 1) % step == 0`.
            step = _int_field(text, "interleave_moe_layer_step", default=1, minimum=0)
            moe_layers = [i for i in range(layers) if step > 0 and (i + 1) % step == 0]
        else:
            moe_layers = [
                i
                for i in range(layers)
                if i >= first_dense and i % frequency == 0 and (i + 1) % sparse_step == 0 and i not in mlp_only
            ]
        if not moe_layers:
            raise ModelConfigError(f"the config declares {experts} experts but no layer is a MoE layer")
    else:
        experts = per_token = moe_intermediate = shared_intermediate = 0
        moe_layers = []

    kinds, sliding_window, chunk_size = layer_attention_kinds(text, model_type, layers)

    is_gpt_oss = model_type_l == "gpt_oss"
    # gpt_oss.py builds qkv_proj and o_proj with bias=True whatever attention_bias says.
    attention_bias = is_gpt_oss or _bool_field(text, "attention_bias", default=False)
    # MXFP4 (vLLM's Mxfp4Config) quantizes only the routed experts: every linear layer falls back to
    # UnquantizedLinearMethod, and gpt-oss lists attention, router, embedding and head in modules_to_not_convert.
    experts_only = quant_method == "mxfp4"
    # Per-layer norms: Gemma 3 has four (input, post-attention, pre- and post-feedforward), the others two;
    # Qwen3 and Gemma 3 add a q and a k RMSNorm of head_dim each (Llama 4's qk norm has no weights).
    norms = 4 if model_type_l.startswith(("gemma2", "gemma3")) else 2
    qk_norm = head_dim if model_type_l.startswith(("qwen3", "gemma3")) else 0
    if model_type_l.startswith(("gemma2", "gemma3")):
        tied = True  # vLLM's Gemma2/Gemma3ForCausalLM compute logits with embed_tokens: no separate head
    vision = vision_params(cfg)
    spec = {
        "name": name,
        "architecture": architectures[0],
        "model_type": model_type,
        "is_moe": is_moe,
        "attention": attention,
        "layers": layers,
        "heads": heads,
        "kv_heads": 1 if is_mla else kv_heads,
        "head_dim": head_dim,
        "v_head_dim": v_head,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "experts": experts,
        "experts_per_token": per_token,
        "moe_intermediate_size": moe_intermediate,
        "shared_expert_intermediate_size": shared_intermediate,
        "moe_layers": len(moe_layers),
        "kv_lora_rank": kv_lora_rank,
        "qk_rope_head_dim": rope,
        "q_lora_rank": q_lora,
        "dtype": dtype,
        "dtype_bytes": dtype_bytes,
        "quantization": quant_method,
        "weight_bytes_per_param": round(weight_bytes, 6),
        "max_position_embeddings": max_positions,
        # the longest --max-model-len vLLM accepts without VLLM_ALLOW_LONG_MAX_MODEL_LEN (rope_scaling above)
        "max_model_len_limit": None if max_positions is None else math.floor(max_positions * rope_factor),
        "sliding_window": sliding_window,
        "attention_chunk_size": chunk_size,
        "layer_attention": kinds,
        "vision_params": vision["total"],
        "mtp_layers_not_loaded": _int_field(text, "num_nextn_predict_layers", default=0, minimum=0),
        "source": source,
        "path": path,
        "_moe_layer_set": frozenset(moe_layers),
        "_qkv_bias": attention_bias or model_type_l.startswith("qwen2"),
        "_o_bias": attention_bias,
        "_mlp_bias": _bool_field(text, "mlp_bias", default=False),
        "_q_nope": nope,
        "_weights_scale": 1.0,
        "_sinks": is_gpt_oss,  # one attention-sink logit per head (gpt_oss.py OAIAttention.sinks)
        "_rope_scaling": (rope_factor, rope_type),
        "_router_bias": is_gpt_oss,
        "_expert_bias": is_gpt_oss,  # gate_up_proj_bias and down_proj_bias per expert
        "_experts_only_quantized": experts_only,
        "_norms_per_layer": norms,
        "_qk_norm": qk_norm,
        "_vision_linear": vision["linear"],
        "_vision_plain": vision["plain"],
    }
    params = param_count(spec)
    spec["params"] = params["total"]
    spec["params_routed_experts"] = params["routed_experts"]
    computed_bytes = model_bytes(spec)
    _check_overrides(weights_gib, kv_bytes_per_token)
    if kv_bytes_per_token is not None:
        spec["kv_bytes_per_token"] = kv_bytes_per_token  # shown in the plan only when given
    if weights_gib is not None:
        spec["_weights_scale"] = weights_gib * GIB / computed_bytes
        spec["weights_gib"] = round(float(weights_gib), 3)
        spec["weights_source"] = "given"
    else:
        spec["weights_gib"] = round(computed_bytes / GIB, 3)
        spec["weights_source"] = "shapes"
    return spec


def load_model(model, model_path=None):
    """Describe ``model``: a catalog name or hub id, a model directory or config.json, or a dict.

    A dict may hold ``name`` (any of the above) or ``config`` (an inline HF
    config), plus ``weights_gib`` to state the checkpoint size explicitly and ``kv_bytes_per_token`` the KV
    cache bytes of one token over every layer at TP=1 (both together plan a model the planner does not model).
    ``model_path`` is the model argument on the nodes; it defaults to the hub id
    of a catalog model and to the directory of a local config.
    """
    weights_gib = kv_bytes_per_token = None
    if isinstance(model, dict):
        unknown = sorted(set(model) - {"name", "config", "weights_gib", "kv_bytes_per_token"})
        if unknown:
            raise ModelConfigError(
                f"unknown model keys {unknown}: expected name, config, weights_gib, kv_bytes_per_token")
        weights_gib, kv_bytes_per_token = model.get("weights_gib"), model.get("kv_bytes_per_token")
        if "config" in model:
            if "name" in model and not isinstance(model["name"], str):
                raise ModelConfigError(f"model name must be a string, got {model['name']!r}")
            config, source, default_path, short = model["config"], "inline", None, model.get("name")
        elif isinstance(model.get("name"), str):
            try:
                config, source, default_path, short = _resolve_source(model["name"])
            except UnknownModelName:
                if weights_gib is None or kv_bytes_per_token is None:
                    raise
                _check_overrides(weights_gib, kv_bytes_per_token)
                path = model_path if model_path is not None else model["name"]
                return modelled.opaque_spec(model["name"], path, weights_gib, kv_bytes_per_token, GIB)
        else:
            raise ModelConfigError("a model dict needs 'name' (catalog name, hub id or path) or 'config'")
    elif isinstance(model, str):
        config, source, default_path, short = _resolve_source(model)
    else:
        raise ModelConfigError(f"model must be a name, a path or a dict, got {type(model).__name__}")
    path = model_path if model_path is not None else default_path
    if path is None:
        raise ModelConfigError("an inline model config needs model_path (the model argument on the nodes)")
    if not isinstance(path, str) or not path.strip():
        raise ModelConfigError(f"model_path must be a non-empty string, got {path!r}")
    if short is None:
        short = os.path.basename(path.rstrip("/")) or path
    return normalize_config(config, source=source, path=path, name=short, weights_gib=weights_gib,
                            kv_bytes_per_token=kv_bytes_per_token)


# --------------------------------------------------------------------------- shapes


def kv_heads_per_rank(spec, tp):
    """KV heads one TP rank holds: sharded down to one, then replicated (vLLM's rule); None when not read."""
    if spec["attention"] == "mla" or spec["kv_heads"] is None:
        return 1 if spec["attention"] == "mla" else None
    return max(1, spec["kv_heads"] // tp)


def kv_bytes_per_token_per_layer(spec, tp):
    """KV cache bytes one rank stores per token and layer.

    MHA/GQA: K and V, ``kv_heads/TP`` heads of ``head_dim``. MLA: one latent
    of ``kv_lora_rank + qk_rope_head_dim`` values that TP does not shard.
    """
    if spec.get("kv_bytes_per_token"):  # the operator's figure, over every layer at TP=1: shared by TP
        return spec["kv_bytes_per_token"] / spec["layers"] / tp
    if spec["attention"] == "mla":
        return (spec["kv_lora_rank"] + spec["qk_rope_head_dim"]) * spec["dtype_bytes"]
    return kv_heads_per_rank(spec, tp) * (spec["head_dim"] + spec["v_head_dim"]) * spec["dtype_bytes"]


def _attention_counts(spec, tp):
    """(quantizable linear params, plain params) of one layer's attention on one TP rank."""
    hidden = spec["hidden_size"]
    heads_rank = math.ceil(spec["heads"] / tp)
    if spec["attention"] == "mla":
        rope, nope, v_head = spec["qk_rope_head_dim"], spec["_q_nope"], spec["v_head_dim"]
        kv_lora, q_lora = spec["kv_lora_rank"], spec["q_lora_rank"]
        q_head = nope + rope
        if q_lora:
            linear = hidden * q_lora + q_lora * heads_rank * q_head  # q_a replicated, q_b sharded
            plain = q_lora  # q_a_layernorm
        else:
            linear = hidden * heads_rank * q_head
            plain = 0
        linear += hidden * (kv_lora + rope)  # kv_a_proj_with_mqa, replicated
        linear += kv_lora * heads_rank * (nope + v_head)  # kv_b_proj
        linear += heads_rank * v_head * hidden  # o_proj
        plain += kv_lora  # kv_a_layernorm
        return linear, plain
    head_dim = spec["head_dim"]
    q_out = heads_rank * head_dim
    kv_out = kv_heads_per_rank(spec, tp) * head_dim
    linear = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
    plain = (q_out + 2 * kv_out) if spec["_qkv_bias"] else 0
    if spec["_o_bias"]:
        plain += hidden
    if spec.get("_sinks"):
        plain += heads_rank
    plain += 2 * spec.get("_qk_norm", 0)
    return linear, plain


def _layer_counts(spec, index, tp):
    """Params of decoder layer ``index`` on one TP rank: (linear, plain, routed experts in total).

    ``linear`` and ``plain`` are the parts stored at the quantized and at the model dtype; with
    ``_experts_only_quantized`` (MXFP4) the attention and dense MLP move to ``plain``.
    """
    if spec.get("_opaque_params"):  # no config: the given weights, spread over the layers, sharded by TP
        return spec["_opaque_params"] / spec["layers"] / tp, 0, 0
    hidden = spec["hidden_size"]
    linear, plain = _attention_counts(spec, tp)
    plain += spec.get("_norms_per_layer", 2) * hidden  # RMSNorms (input, post-attention, ...)
    routed = 0
    if index in spec["_moe_layer_set"]:
        plain += hidden * spec["experts"]  # router, replicated
        if spec.get("_router_bias"):
            plain += spec["experts"]
        shared = spec["shared_expert_intermediate_size"]
        if shared:
            linear += 3 * hidden * math.ceil(shared / tp)
        per_expert = 3 * hidden * spec["moe_intermediate_size"]
        if spec.get("_expert_bias"):
            per_expert += 2 * spec["moe_intermediate_size"] + hidden
        routed = spec["experts"] * per_expert
    else:
        inter_rank = math.ceil(spec["intermediate_size"] / tp)
        linear += 3 * hidden * inter_rank
        if spec["_mlp_bias"]:
            plain += 2 * inter_rank + hidden
    if spec.get("_experts_only_quantized"):
        linear, plain = 0, linear + plain
    return linear, plain, routed


def vision_params(cfg):
    """Vision tower + projector weights of a multimodal config: ``{"total", "linear", "plain"}``.

    ``linear`` is what TP shards, ``plain`` what every rank holds. Gemma 3's SigLIP tower and projector
    (vLLM's SiglipVisionModel, Gemma3MultiModalProjector) and Llama 4's encoder, pixel-shuffle adapter and
    projector (mllama4.py) are counted tensor by tensor from ``vision_config``: exact for those classes (it
    reproduces Llama-4-Scout's published per-tensor counts). Other towers count as zero (give weights_gib).
    """
    vision, text = cfg.get("vision_config"), cfg.get("text_config")
    kind = str(vision.get("model_type", "")).lower() if isinstance(vision, dict) else ""
    if kind not in ("siglip_vision_model", "llama4_vision_model") or not isinstance(text, dict):
        return {"total": 0, "linear": 0, "plain": 0}
    llama4 = kind.startswith("llama4")
    hidden = _int_field(vision, "hidden_size", default=1408 if llama4 else 768)
    inter = _int_field(vision, "intermediate_size", default=5632 if llama4 else 3072)
    layers = _int_field(vision, "num_hidden_layers", default=34 if llama4 else 12)
    patch = _int_field(vision, "patch_size", default=14 if llama4 else 16)
    image = _int_field(vision, "image_size", default=448 if llama4 else 224)
    channels = _int_field(vision, "num_channels", default=3)
    text_hidden = _int_field(text, "hidden_size")
    linear = layers * (4 * hidden * hidden + 2 * hidden * inter)  # q, k, v, o, fc1, fc2
    plain = layers * (4 * hidden + inter + hidden + 4 * hidden)  # their biases, two LayerNorms (weight + bias)
    if llama4:
        linear += channels * patch * patch * hidden  # patch_embedding: unfold + linear without bias
        plain += hidden + ((image // patch) ** 2 + 1) * hidden + 4 * hidden  # class, positions, pre/post norm
        proj_in = _int_field(vision, "projector_input_dim", default=4096)
        proj_out = _int_field(vision, "projector_output_dim", default=4096)
        linear += inter * proj_in + proj_in * proj_out  # vision_adapter (pixel-shuffle MLP)
        if _bool_field(vision, "multi_modal_projector_bias", default=False):
            plain += proj_in + proj_out
        linear += _int_field(vision, "vision_output_dim", default=7680) * text_hidden  # multi_modal_projector
    else:
        plain += channels * patch * patch * hidden + hidden  # patch_embedding Conv2d, replicated
        plain += (image // patch) ** 2 * hidden + 2 * hidden  # position_embedding, post_layernorm
        if _bool_field(vision, "vision_use_head", default=True):  # attention-pooling head (not in Gemma 3)
            linear += 4 * hidden * hidden + 2 * hidden * inter
            plain += 9 * hidden + inter
        plain += hidden * text_hidden + hidden  # mm_input_projection_weight, mm_soft_emb_norm
    return {"total": linear + plain, "linear": linear, "plain": plain}


def param_count(spec):
    """Whole-model parameter counts from shapes: ``total`` and ``routed_experts``."""
    total = routed_total = 0
    for index in range(spec["layers"]):
        linear, plain, routed = _layer_counts(spec, index, 1)
        total += linear + plain + routed
        routed_total += routed
    embedding = spec["vocab_size"] * spec["hidden_size"]
    total += embedding + spec["hidden_size"]  # embedding + final norm
    if not spec["tie_word_embeddings"]:
        total += embedding
    total += spec.get("_vision_linear", 0) + spec.get("_vision_plain", 0)
    return {"total": total, "routed_experts": routed_total}


def layer_bytes(spec, index, tp):
    """Bytes of decoder layer ``index`` on one TP rank: ``(non_expert, all_routed_experts)``.

    Routed experts are returned unsharded: with expert parallel one rank holds
    ``experts/EP`` of them, without it vLLM shards each expert over TP x DP.
    """
    linear, plain, routed = _layer_counts(spec, index, tp)
    weight, plain_bytes, scale = spec["weight_bytes_per_param"], spec["dtype_bytes"], spec["_weights_scale"]
    return (linear * weight + plain * plain_bytes) * scale, routed * weight * scale


def embedding_bytes(spec, tp, *, first_stage, last_stage, pp):
    """Bytes of the vocabulary-parallel embedding / LM head (and final norm) on one rank of a stage."""
    padded = math.ceil(spec["vocab_size"] / VOCAB_PADDING) * VOCAB_PADDING
    table = math.ceil(padded / tp) * spec["hidden_size"] * spec["dtype_bytes"]
    # The vision tower and projector of a multimodal model: vLLM builds them outside the decoder-layer stack,
    # so every pipeline stage holds them; TP shards their linear layers; they stay in the model dtype
    # (mllama4.py passes quant_config=None).
    total = (spec.get("_vision_linear", 0) / tp + spec.get("_vision_plain", 0)) * spec["dtype_bytes"]
    if first_stage:
        total += table
    if last_stage:
        total += spec["hidden_size"] * spec["dtype_bytes"]
        # A tied head shares the embedding only when one stage holds both.
        if not spec["tie_word_embeddings"] or pp > 1:
            total += table
    return total * spec["_weights_scale"]


def model_bytes(spec):
    """Whole-model weight bytes (one copy, unsharded)."""
    total = embedding_bytes(spec, 1, first_stage=True, last_stage=True, pp=1)
    for index in range(spec["layers"]):
        non_expert, routed = layer_bytes(spec, index, 1)
        total += non_expert + routed
    return total


def public_view(spec):
    """The model description without internal keys (what goes into the plan)."""
    return {key: value for key, value in spec.items() if not key.startswith("_")}
