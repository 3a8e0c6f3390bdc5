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

# transformers' config-class defaults for fields a public config.json may leave out (transformers 5.x
# models/*/configuration_*.py); vLLM reads the config through these classes, so it sees the same values.
TEXT_CONFIG_DEFAULTS = {
    # Gemma3TextConfig: google/gemma-3-27b-it's text_config gives neither vocab_size nor max_position_embeddings.
    "gemma3_text": {
        "vocab_size": 262208, "max_position_embeddings": 131072, "tie_word_embeddings": True, "head_dim": 256,
        "sliding_window": 4096, "num_key_value_heads": 4,
        # __post_init__: every sliding_window_pattern-th layer (default 6) is full, the others slide.
        "layer_types": lambda t: ["sliding_attention" if (i + 1) % t.get("sliding_window_pattern", 6) else
                                  "full_attention" for i in range(t.get("num_hidden_layers") or 0)],
    },
    # Llama4TextConfig: an empty or missing no_rope_layers means a NoPE (global) layer every 4th layer.
    "llama4_text": {
        "intermediate_size_mlp": 16384, "num_local_experts": 16, "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 1, "attention_chunk_size": 8192, "head_dim": 128, "tie_word_embeddings": False,
        "no_rope_layers": lambda t: [int((i + 1) % t.get("no_rope_layer_interval", 4) != 0)
                                     for i in range(t.get("num_hidden_layers") or 0)],
    },
    # Gemma2Config: sliding and full layers alternate.
    "gemma2": {"layer_types": lambda t: ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                         for i in range(t.get("num_hidden_layers") or 0)]},
    # GptOssConfig
    "gpt_oss": {"sliding_window": 128, "head_dim": 64, "num_experts_per_tok": 4, "tie_word_embeddings": False},
}
# Model types whose sliding window transformers drops unless use_sliding_window is true (Qwen2Config and kin).
QWEN_SLIDING_TYPES = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")


def text_config(cfg):
    """The language model's config: ``text_config`` of a multimodal config (with the top level's dtype,
    quantization and tie_word_embeddings), else the config itself; absent fields take the transformers
    class defaults above. Returns a new dict when it changes anything.
    """
    text = cfg
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        text = dict(cfg["text_config"])
        text.setdefault("torch_dtype", cfg.get("torch_dtype", cfg.get("dtype")))
        text.setdefault("quantization_config", cfg.get("quantization_config"))
        if "tie_word_embeddings" in cfg:
            text.setdefault("tie_word_embeddings", cfg["tie_word_embeddings"])
    model_type = text.get("model_type", cfg.get("model_type", ""))
    defaults = TEXT_CONFIG_DEFAULTS.get(model_type.lower(), {}) if isinstance(model_type, str) else {}
    missing = [key for key in defaults if key not in text or (key == "no_rope_layers" and not text[key])]
    if missing:
        text = dict(text)
        for key in missing:
            text[key] = defaults[key](text) if callable(defaults[key]) else defaults[key]
    return text


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

_DEEPSEEK_V3_CONFIG = {
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
}

# openai/gpt-oss-120b and -20b config.json: identical but for num_hidden_layers, num_local_experts and the
# length of layer_types. Copied from the hub file as quoted in public test fixtures (Modular's MAX gpt_oss
# tests for 20b; a test citing huggingface.co/openai/gpt-oss-120b/raw/main/config.json for 120b). The
# checkpoints give no torch_dtype: vLLM's default float32 -> bfloat16 applies to the unquantized parts.
_GPT_OSS_COMMON = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "max_position_embeddings": 131072,
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_key_value_heads": 8,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 201088,
}

# Qwen/Qwen3-* config.json (transformers_version 4.51.0), as collected verbatim in public repositories.
_QWEN3_COMMON = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

_QWEN3_MOE_COMMON = dict(
    _QWEN3_COMMON,
    architectures=["Qwen3MoeForCausalLM"],
    model_type="qwen3_moe",
    decoder_sparse_step=1,
    mlp_only_layers=[],
    norm_topk_prob=True,
    num_experts=128,
    num_experts_per_tok=8,
    output_router_logits=False,
    router_aux_loss_coef=0.001,
    rope_theta=1000000.0,
)

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
        "config": _DEEPSEEK_V3_CONFIG,
    },
    # DeepSeek-R1 is the V3 architecture (DeepseekV3ForCausalLM, 671B, FP8 128x128 blocks): its config.json
    # carries the same shape fields as V3's (R1-0528 too), so the entry shares V3's config.
    "deepseek-r1": {
        "hf_id": "deepseek-ai/DeepSeek-R1",
        "also": ["deepseek-ai/DeepSeek-R1-0528", "deepseek-ai/DeepSeek-R1-Zero"],
        "config": _DEEPSEEK_V3_CONFIG,
    },
    "gpt-oss-20b": {
        "hf_id": "openai/gpt-oss-20b",
        "config": dict(
            _GPT_OSS_COMMON,
            num_hidden_layers=24,
            num_local_experts=32,
            layer_types=["sliding_attention", "full_attention"] * 12,
        ),
    },
    "gpt-oss-120b": {
        "hf_id": "openai/gpt-oss-120b",
        "config": dict(
            _GPT_OSS_COMMON,
            num_hidden_layers=36,
            num_local_experts=128,
            layer_types=["sliding_attention", "full_attention"] * 18,
        ),
    },
    "qwen3-8b": {
        "hf_id": "Qwen/Qwen3-8B",
        "also": ["Qwen/Qwen3-8B-Base"],
        "config": dict(
            _QWEN3_COMMON,
            architectures=["Qwen3ForCausalLM"],
            model_type="qwen3",
            hidden_size=4096,
            intermediate_size=12288,
            max_window_layers=36,
            num_attention_heads=32,
            num_hidden_layers=36,
            num_key_value_heads=8,
            rope_theta=1000000,
        ),
    },
    "qwen3-32b": {
        "hf_id": "Qwen/Qwen3-32B",
        "config": dict(
            _QWEN3_COMMON,
            architectures=["Qwen3ForCausalLM"],
            model_type="qwen3",
            hidden_size=5120,
            intermediate_size=25600,
            max_window_layers=64,
            num_attention_heads=64,
            num_hidden_layers=64,
            num_key_value_heads=8,
            rope_theta=1000000,
        ),
    },
    "qwen3-30b-a3b": {
        "hf_id": "Qwen/Qwen3-30B-A3B",
        "also": ["Qwen/Qwen3-30B-A3B-Base"],
        "config": dict(
            _QWEN3_MOE_COMMON,
            hidden_size=2048,
            intermediate_size=6144,
            max_window_layers=48,
            moe_intermediate_size=768,
            num_attention_heads=32,
            num_hidden_layers=48,
            num_key_value_heads=4,
        ),
    },
    "qwen3-235b-a22b": {
        "hf_id": "Qwen/Qwen3-235B-A22B",
        # The -2507 re-releases have the same shapes with a 262144-token context and rope_theta 5e6.
        "also": ["Qwen/Qwen3-235B-A22B-Instruct-2507", "Qwen/Qwen3-235B-A22B-Thinking-2507"],
        "config": dict(
            _QWEN3_MOE_COMMON,
            hidden_size=4096,
            intermediate_size=12288,
            max_window_layers=94,
            moe_intermediate_size=1536,
            num_attention_heads=64,
            num_hidden_layers=94,
            num_key_value_heads=4,
        ),
        "variants": {
            "Qwen/Qwen3-235B-A22B-Instruct-2507": {"max_position_embeddings": 262144, "rope_theta": 5000000},
            "Qwen/Qwen3-235B-A22B-Thinking-2507": {"max_position_embeddings": 262144, "rope_theta": 5000000},
        },
    },
    # meta-llama/Llama-4-Scout-17B-16E(-Instruct) config.json (transformers 4.51.0), as quoted with its
    # per-tensor parameter table in a public repository; moe_layers [0..47] (every layer) is written out.
    "llama-4-scout": {
        "hf_id": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        "also": ["meta-llama/Llama-4-Scout-17B-16E"],
        "config": {
            "architectures": ["Llama4ForConditionalGeneration"],
            "boi_token_index": 200080,
            "eoi_token_index": 200081,
            "image_token_index": 200092,
            "model_type": "llama4",
            "text_config": {
                "attention_bias": False,
                "attention_chunk_size": 8192,
                "attention_dropout": 0.0,
                "attn_scale": 0.1,
                "attn_temperature_tuning": 4,
                "bos_token_id": 200000,
                "eos_token_id": [200001, 200007, 200008],
                "floor_scale": 8192,
                "for_llm_compressor": False,
                "head_dim": 128,
                "hidden_act": "silu",
                "hidden_size": 5120,
                "initializer_range": 0.02,
                "interleave_moe_layer_step": 1,
                "intermediate_size": 8192,
                "intermediate_size_mlp": 16384,
                "max_position_embeddings": 262144,
                "model_type": "llama4_text",
                "moe_layers": list(range(48)),
                "no_rope_layers": [1, 1, 1, 0] * 12,
                "num_attention_heads": 40,
                "num_experts_per_tok": 1,
                "num_hidden_layers": 48,
                "num_key_value_heads": 8,
                "num_local_experts": 16,
                "output_router_logits": False,
                "pad_token_id": 200018,
                "rms_norm_eps": 1e-05,
                "rope_scaling": {
                    "factor": 8.0,
                    "high_freq_factor": 4.0,
                    "low_freq_factor": 1.0,
                    "original_max_position_embeddings": 8192,
                    "rope_type": "llama3",
                },
                "rope_theta": 500000.0,
                "router_aux_loss_coef": 0.001,
                "router_jitter_noise": 0.0,
                "torch_dtype": "bfloat16",
                "use_cache": True,
                "use_qk_norm": True,
                "vocab_size": 202048,
            },
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "vision_config": {
                "attention_dropout": 0.0,
                "hidden_act": "gelu",
                "hidden_size": 1408,
                "image_size": 336,
                "initializer_range": 0.02,
                "intermediate_size": 5632,
                "model_type": "llama4_vision_model",
                "multi_modal_projector_bias": False,
                "norm_eps": 1e-05,
                "num_attention_heads": 16,
                "num_channels": 3,
                "num_hidden_layers": 34,
                "patch_size": 14,
                "pixel_shuffle_ratio": 0.5,
                "projector_dropout": 0.0,
                "projector_input_dim": 4096,
                "projector_output_dim": 4096,
                "rope_theta": 10000,
                "vision_feature_layer": -1,
                "vision_feature_select_strategy": "default",
                "vision_output_dim": 4096,
            },
        },
    },
    # google/gemma-3-27b-it config.json (transformers 4.50.0.dev0) as quoted in public test fixtures
    # (TensorRT-LLM's Gemma 3 tests; the 62 layers and 1024 window as in the unsloth mirror's copy). Its
    # text_config gives no vocab_size, max_position_embeddings or tie_word_embeddings: Gemma3TextConfig's
    # defaults apply (262208, 131072, tied), which model_config fills in.
    "gemma-3-27b": {
        "hf_id": "google/gemma-3-27b-it",
        "also": ["google/gemma-3-27b-pt"],
        "config": {
            "architectures": ["Gemma3ForConditionalGeneration"],
            "boi_token_index": 255999,
            "eoi_token_index": 256000,
            "eos_token_id": [1, 106],
            "image_token_index": 262144,
            "initializer_range": 0.02,
            "mm_tokens_per_image": 256,
            "model_type": "gemma3",
            "text_config": {
                "head_dim": 128,
                "hidden_size": 5376,
                "intermediate_size": 21504,
                "model_type": "gemma3_text",
                "num_attention_heads": 32,
                "num_hidden_layers": 62,
                "num_key_value_heads": 16,
                "query_pre_attn_scalar": 168,
                "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                "sliding_window": 1024,
                "sliding_window_pattern": 6,
            },
            "torch_dtype": "bfloat16",
            "vision_config": {
                "hidden_size": 1152,
                "image_size": 896,
                "intermediate_size": 4304,
                "model_type": "siglip_vision_model",
                "num_attention_heads": 16,
                "num_hidden_layers": 27,
                "patch_size": 14,
                "vision_use_head": False,
            },
        },
    },
    # mistralai/Mistral-7B-v0.1 config.json (transformers 4.34.0.dev0), quoted verbatim in several public
    # repositories; the Instruct-v0.1 release has the same shape fields. sliding_window 4096 on every layer.
    "mistral-7b-v0.1": {
        "hf_id": "mistralai/Mistral-7B-Instruct-v0.1",
        "also": ["mistralai/Mistral-7B-v0.1"],
        "config": {
            "architectures": ["MistralForCausalLM"],
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": 4096,
            "initializer_range": 0.02,
            "intermediate_size": 14336,
            "max_position_embeddings": 32768,
            "model_type": "mistral",
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05,
            "rope_theta": 10000.0,
            "sliding_window": 4096,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "vocab_size": 32000,
        },
    },
    # mistralai/Mistral-Small-24B-Instruct-2501 config.json shape fields as quoted in public test fixtures
    # (explicit head_dim 128, no sliding window); Mistral-Small-3.1/3.2's text model has the same shapes.
    "mistral-small-24b": {
        "hf_id": "mistralai/Mistral-Small-24B-Instruct-2501",
        "also": ["mistralai/Mistral-Small-24B-Base-2501"],
        "config": {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "hidden_act": "silu",
            "hidden_size": 5120,
            "intermediate_size": 32768,
            "num_hidden_layers": 40,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "rms_norm_eps": 1e-05,
            "vocab_size": 131072,
            "max_position_embeddings": 32768,
            "rope_theta": 100000000.0,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
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
