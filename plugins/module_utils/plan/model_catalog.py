"""Built-in catalog of common architectures, for planning without a checkpoint.

Every entry holds the fields the planner reads, copied from the model's public
``config.json`` on its hub page (the file a ``vllm serve <hub id>`` would read).
Variants that differ only in a field or two (base vs instruct, a re-release)
carry those fields in ``variants``.

Look-ups accept the short name (``llama-3.1-70b``), the short name with an
``-instruct`` suffix, and the hub ids listed, all case-insensitively.
"""

from __future__ import annotations

import copy

_LLAMA_31_COMMON = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "max_position_embeddings": 131072,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

_QWEN25_COMMON = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "use_sliding_window": False,
    "sliding_window": 131072,
    "max_position_embeddings": 32768,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

_MIXTRAL_COMMON = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_act": "silu",
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "rms_norm_eps": 1e-05,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

CATALOG = {
    "llama-3.1-8b": {
        "hf_id": "meta-llama/Llama-3.1-8B-Instruct",
        "also": [
            "meta-llama/Llama-3.1-8B",
            "meta-llama/Meta-Llama-3.1-8B-Instruct",
            "meta-llama/Meta-Llama-3.1-8B",
        ],
        "config": dict(
            _LLAMA_31_COMMON,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
        ),
    },
    "llama-3.1-70b": {
        "hf_id": "meta-llama/Llama-3.1-70B-Instruct",
        "also": [
            "meta-llama/Llama-3.1-70B",
            "meta-llama/Meta-Llama-3.1-70B-Instruct",
            "meta-llama/Meta-Llama-3.1-70B",
            "meta-llama/Llama-3.3-70B-Instruct",
        ],
        "short_aliases": {"llama-3.3-70b": "meta-llama/Llama-3.3-70B-Instruct"},
        "config": dict(
            _LLAMA_31_COMMON,
            hidden_size=8192,
            intermediate_size=28672,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
        ),
    },
    "llama-3.1-405b": {
        "hf_id": "meta-llama/Llama-3.1-405B-Instruct",
        "also": [
            "meta-llama/Llama-3.1-405B",
            "meta-llama/Meta-Llama-3.1-405B-Instruct",
            "meta-llama/Meta-Llama-3.1-405B",
        ],
        "config": dict(
            _LLAMA_31_COMMON,
            hidden_size=16384,
            intermediate_size=53248,
            num_hidden_layers=126,
            num_attention_heads=128,
            num_key_value_heads=8,
        ),
    },
    "qwen2.5-7b": {
        "hf_id": "Qwen/Qwen2.5-7B-Instruct",
        "also": ["Qwen/Qwen2.5-7B"],
        "config": dict(
            _QWEN25_COMMON,
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            max_window_layers=28,
        ),
        "variants": {"Qwen/Qwen2.5-7B": {"max_position_embeddings": 131072}},
    },
    "qwen2.5-72b": {
        "hf_id": "Qwen/Qwen2.5-72B-Instruct",
        "also": ["Qwen/Qwen2.5-72B"],
        "config": dict(
            _QWEN25_COMMON,
            hidden_size=8192,
            intermediate_size=29568,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            max_window_layers=80,
        ),
        "variants": {"Qwen/Qwen2.5-72B": {"max_position_embeddings": 131072}},
    },
    "mixtral-8x7b": {
        "hf_id": "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "also": ["mistralai/Mixtral-8x7B-v0.1"],
        "config": dict(
            _MIXTRAL_COMMON,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            vocab_size=32000,
        ),
    },
    "mixtral-8x22b": {
        "hf_id": "mistralai/Mixtral-8x22B-Instruct-v0.1",
        "also": ["mistralai/Mixtral-8x22B-v0.1"],
        "config": dict(
            _MIXTRAL_COMMON,
            hidden_size=6144,
            intermediate_size=16384,
            num_hidden_layers=56,
            num_attention_heads=48,
            num_key_value_heads=8,
            max_position_embeddings=65536,
            rope_theta=1000000.0,
            vocab_size=32768,
        ),
        "variants": {"mistralai/Mixtral-8x22B-v0.1": {"vocab_size": 32000}},
    },
    "deepseek-v3": {
        "hf_id": "deepseek-ai/DeepSeek-V3",
        "also": ["deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-V3-Base"],
        "config": {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "hidden_act": "silu",
            "hidden_size": 7168,
            "intermediate_size": 18432,
            "moe_intermediate_size": 2048,
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "n_routed_experts": 256,
            "n_shared_experts": 1,
            "num_experts_per_tok": 8,
            "first_k_dense_replace": 3,
            "moe_layer_freq": 1,
            "n_group": 8,
            "topk_group": 4,
            "q_lora_rank": 1536,
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "num_nextn_predict_layers": 1,
            "attention_bias": False,
            "max_position_embeddings": 163840,
            "vocab_size": 129280,
            "rms_norm_eps": 1e-06,
            "rope_theta": 10000,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "quantization_config": {
                "activation_scheme": "dynamic",
                "fmt": "e4m3",
                "quant_method": "fp8",
                "weight_block_size": [128, 128],
            },
        },
    },
}


def _index():
    index = {}
    for short, entry in CATALOG.items():
        for name in (short, short + "-instruct"):
            index[name] = (short, entry["hf_id"])
        for hub_id in [entry["hf_id"]] + list(entry.get("also", [])):
            index[hub_id.lower()] = (short, hub_id)
        for alias, hub_id in entry.get("short_aliases", {}).items():
            for name in (alias, alias + "-instruct"):
                index[name] = (short, hub_id)
    return index


_INDEX = _index()


def catalog_names():
    """The short names, sorted: what error messages list."""
    return sorted(CATALOG)


def lookup(name):
    """Return ``(short_name, hub_id, config)`` for a catalog name or hub id, else None.

    ``hub_id`` is the id as the caller spelled it when it is a hub id, so the
    nodes download exactly what the operator asked for; the config is a copy.
    """
    if not isinstance(name, str):
        return None
    hit = _INDEX.get(name.strip().lower())
    if hit is None:
        return None
    short, hub_id = hit
    if "/" in name:
        hub_id = name.strip()
    entry = CATALOG[short]
    config = copy.deepcopy(entry["config"])
    for variant, fields in entry.get("variants", {}).items():
        if variant.lower() == hub_id.lower():
            config.update(copy.deepcopy(fields))
    config["_name_or_path"] = hub_id
    return short, hub_id, config
