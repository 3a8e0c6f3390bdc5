"""model_config / model_catalog: HF configs in, the planner's model description out."""

import json

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_catalog
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc

# Total parameter counts published on each model card (billions); shapes must reproduce them.
PUBLISHED_PARAMS_B = {
    "llama-3.1-8b": 8.03,
    "llama-3.1-70b": 70.6,
    "llama-3.1-405b": 405.9,
    "qwen2.5-7b": 7.61,
    "qwen2.5-72b": 72.7,
    "mixtral-8x7b": 46.7,
    "mixtral-8x22b": 140.6,
    "deepseek-v3": 671.0,  # without the 14B multi-token-prediction module vLLM does not load
    "deepseek-r1": 671.0,  # the V3 architecture, same shapes
    "gpt-oss-120b": 116.83,  # OpenAI's gpt-oss model card: 116.83B total (5.13B active)
    "gpt-oss-20b": 20.91,  # OpenAI's gpt-oss model card: 20.91B total (3.61B active)
    "qwen3-8b": 8.2,  # Qwen3-8B card: 8.2B
    "qwen3-32b": 32.8,  # Qwen3-32B card: 32.8B
    "qwen3-30b-a3b": 30.5,  # Qwen3-30B-A3B card: 30.5B total, 3.3B activated
    "qwen3-235b-a22b": 235.0,  # Qwen3-235B-A22B card: 235B total, 22B activated
    "llama-4-scout": 109.0,  # Meta's Llama 4 card: 109B total, 17B active (text + vision)
    "gemma-3-27b": 27.4,  # the hub's count for google/gemma-3-27b-it: 27.4B, vision tower included
    "mistral-7b-v0.1": 7.24,  # the hub's count for mistralai/Mistral-7B-v0.1: 7.24B
    "mistral-small-24b": 23.6,  # the hub's count for Mistral-Small-24B-Instruct-2501: 23.6B
}
# Cards round; tolerance per model: 0.5% by default, the rounding of the published figure where it is coarser.
PARAMS_TOLERANCE = {"qwen3-8b": 0.01, "qwen3-235b-a22b": 0.005, "llama-4-scout": 0.01, "gemma-3-27b": 0.005}


def tiny_llama(**changes):
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 512,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    config.update(changes)
    return config


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS_B))
def test_catalog_params_match_the_model_cards(name):
    spec = mc.load_model(name)
    assert spec["params"] / 1e9 == pytest.approx(PUBLISHED_PARAMS_B[name], rel=PARAMS_TOLERANCE.get(name, 0.005))
    assert spec["source"] == f"catalog:{name}"


def test_llama_8b_param_count_is_exact():
    # 8,030,261,248: the count transformers reports for meta-llama/Llama-3.1-8B.
    assert mc.load_model("llama-3.1-8b")["params"] == 8_030_261_248


def test_catalog_accepts_short_names_and_hub_ids_case_insensitively():
    for alias in ("llama-3.1-70b", "LLAMA-3.1-70B-Instruct", "meta-llama/llama-3.1-70b-instruct"):
        assert mc.load_model(alias)["name"] == "llama-3.1-70b"
    assert mc.load_model("llama-3.1-70b")["path"] == "meta-llama/Llama-3.1-70B-Instruct"
    # A hub id stays exactly as the operator wrote it: the nodes download that.
    assert mc.load_model("meta-llama/Llama-3.3-70B-Instruct")["path"] == "meta-llama/Llama-3.3-70B-Instruct"
    assert mc.load_model("llama-3.3-70b")["path"] == "meta-llama/Llama-3.3-70B-Instruct"


def test_catalog_variants_override_their_fields():
    assert mc.load_model("Qwen/Qwen2.5-7B")["max_position_embeddings"] == 131072
    assert mc.load_model("Qwen/Qwen2.5-7B-Instruct")["max_position_embeddings"] == 32768
    assert mc.load_model("mistralai/Mixtral-8x22B-v0.1")["vocab_size"] == 32000
    assert mc.load_model("mixtral-8x22b")["vocab_size"] == 32768


def test_lookup_returns_a_copy():
    first = model_catalog.lookup("deepseek-v3")[2]
    first["quantization_config"]["quant_method"] = "changed"
    assert model_catalog.lookup("deepseek-v3")[2]["quantization_config"]["quant_method"] == "fp8"


def test_unknown_name_lists_the_catalog():
    with pytest.raises(mc.ModelConfigError) as error:
        mc.load_model("gpt-17")
    for name in model_catalog.catalog_names():
        assert name in str(error.value)


def test_missing_path_is_reported():
    with pytest.raises(mc.ModelConfigError, match="does not exist"):
        mc.load_model("/nonexistent/model/config.json")


def test_reads_a_directory_and_a_config_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_llama()))
    from_dir = mc.load_model(str(tmp_path))
    from_file = mc.load_model(str(tmp_path / "config.json"))
    assert from_dir["path"] == from_file["path"] == str(tmp_path)
    assert from_dir["params"] == from_file["params"]
    assert from_dir["source"] == f"file:{tmp_path / 'config.json'}"
    assert mc.load_model(str(tmp_path), model_path="/srv/models/tiny")["path"] == "/srv/models/tiny"


def test_directory_without_config_is_an_error(tmp_path):
    with pytest.raises(mc.ModelConfigError, match="no config.json"):
        mc.load_model(str(tmp_path))


def test_invalid_json_is_an_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(mc.ModelConfigError, match="not valid JSON"):
        mc.load_model(str(tmp_path))


def test_tiny_llama_params_from_shapes():
    spec = mc.load_model({"config": tiny_llama()}, model_path="/m")
    hidden, inter, vocab, layers = 128, 256, 512, 4
    attention = hidden * 4 * 32 + 2 * hidden * 2 * 32 + 4 * 32 * hidden
    per_layer = attention + 3 * hidden * inter + 2 * hidden
    assert spec["params"] == layers * per_layer + 2 * vocab * hidden + hidden


def test_tied_embeddings_are_counted_once():
    untied = mc.load_model({"config": tiny_llama()}, model_path="/m")["params"]
    tied = mc.load_model({"config": tiny_llama(tie_word_embeddings=True)}, model_path="/m")["params"]
    assert untied - tied == 512 * 128


def test_text_config_of_a_multimodal_config_is_used():
    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "torch_dtype": "float16",
        "text_config": tiny_llama(),
    }
    del config["text_config"]["torch_dtype"]
    # Llava's CLIP tower is not counted: refused by its class, planned with both figures given
    with pytest.raises(mc.ModelConfigError, match="architectures\\[0\\] = 'LlavaForConditionalGeneration' is not a class"):
        mc.load_model({"config": config}, model_path="/m")
    spec = mc.load_model({"config": config, "weights_gib": 1, "kv_bytes_per_token": 1024}, model_path="/m")
    assert spec["layers"] == 4 and spec["dtype"] == "float16"


def test_float32_checkpoints_are_served_in_bfloat16():
    spec = mc.load_model({"config": tiny_llama(torch_dtype="float32")}, model_path="/m")
    assert (spec["dtype"], spec["dtype_bytes"]) == ("bfloat16", 2)
    assert mc.load_model({"config": tiny_llama(torch_dtype="float16")}, model_path="/m")["dtype"] == "float16"


def test_the_dtype_key_of_newer_transformers_is_read():
    config = tiny_llama()
    del config["torch_dtype"]
    config["dtype"] = "float16"
    assert mc.load_model({"config": config}, model_path="/m")["dtype"] == "float16"


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 1 + 4 / (128 * 128)),
        ({"quant_method": "fp8"}, 1.0),
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, 0.5 + 2.5 / 128),
        ({"quant_method": "gptq", "bits": 8, "group_size": -1}, 1.0),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, 0.5 + 1 / 16),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 0.5 + 4 / 64),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 4, "group_size": 64}}},
            },
            0.5 + 2 / 64,
        ),
    ],
)
def test_quantized_weight_bytes(quant, expected):
    assert mc.quantized_bytes_per_param(quant)[1] == pytest.approx(expected)


def test_unknown_quantization_asks_for_an_explicit_size_and_plans_with_it():
    config = tiny_llama(quantization_config={"quant_method": "hqq"})
    with pytest.raises(mc.ModelConfigError, match=r"give the checkpoint's size as \{name: ..., weights_gib: N\}"):
        mc.load_model({"config": config}, model_path="/m")
    spec = mc.load_model({"config": config, "weights_gib": 0.5}, model_path="/m")
    assert (spec["weights_gib"], spec["weights_source"]) == (0.5, "given")


# --------------------------------------------------------------------------- what the planner does not model

STATE_SPACE = {
    "jamba": {"architectures": ["JambaForCausalLM"], "model_type": "jamba", "attn_layer_period": 8,
              "mamba_d_state": 16},
    "qwen3-next": {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"},
    "linear layer types": {"architectures": ["MiniMaxM1ForCausalLM"], "model_type": "minimax_m1",
                           "layer_types": ["linear_attention", "full_attention"]},
    "nemotron-h": {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
                   "hybrid_override_pattern": "M-M-M*-"},
}


@pytest.mark.parametrize("changes", list(STATE_SPACE.values()), ids=list(STATE_SPACE))
def test_state_space_and_linear_attention_hybrids_are_refused_by_name(changes):
    with pytest.raises(mc.ModelConfigError) as error:
        mc.load_model({"config": tiny_llama(**changes)}, model_path="/m")
    message = str(error.value)
    assert f"{changes['architectures'][0]} has state-space or linear-attention layers" in message
    assert "state is per sequence" in message and "kv_bytes_per_token: M" in message and "--weights-gib" in message


@pytest.mark.parametrize(("changes", "why"), [
    ({"architectures": None}, "config.json has no 'architectures'"),
    ({"architectures": []}, "config.json has no 'architectures'"),
    ({"architectures": ["BertModel"], "model_type": "bert"}, "BertModel is not a generative decoder"),
    ({"architectures": ["XLMRobertaForSequenceClassification"]}, "is not a generative decoder"),
])
def test_encoders_and_configs_without_architectures_are_refused(changes, why):
    with pytest.raises(mc.ModelConfigError, match=why):
        mc.load_model({"config": tiny_llama(**changes)}, model_path="/m")


def test_sliding_window_layer_types_are_not_state_space():
    spec = mc.load_model({"config": tiny_llama(layer_types=["sliding_attention", "full_attention"] * 2)},
                         model_path="/m")
    assert spec["architecture"] == "LlamaForCausalLM"


def test_both_overrides_plan_an_unmodelled_model_with_the_given_kv_bytes():
    config = tiny_llama(**STATE_SPACE["jamba"])
    with pytest.raises(mc.ModelConfigError, match="state-space"):  # one of the two is not enough
        mc.load_model({"config": config, "weights_gib": 2.0}, model_path="/m")
    spec = mc.load_model({"config": config, "weights_gib": 2.0, "kv_bytes_per_token": 4096}, model_path="/m")
    assert spec["weights_gib"] == 2.0 and spec["kv_bytes_per_token"] == 4096
    # 4096 bytes over 4 layers at TP=1; TP=2 ranks share them
    assert mc.kv_bytes_per_token_per_layer(spec, 1) == 1024 and mc.kv_bytes_per_token_per_layer(spec, 2) == 512
    for bad in (0, 1.5, True, "4096"):
        with pytest.raises(mc.ModelConfigError, match="kv_bytes_per_token must be a positive integer"):
            mc.load_model({"config": config, "weights_gib": 2.0, "kv_bytes_per_token": bad}, model_path="/m")


def test_deepseek_v3_fp8_keeps_embeddings_in_bf16():
    spec = mc.load_model("deepseek-v3")
    assert spec["quantization"] == "fp8"
    assert spec["attention"] == "mla" and spec["kv_heads"] == 1
    assert spec["experts"] == 256 and spec["moe_layers"] == 58  # first_k_dense_replace = 3
    embedding = spec["vocab_size"] * spec["hidden_size"] * 2 * 2  # embedding + LM head, 2 bytes each
    linear = (spec["params"] - 2 * spec["vocab_size"] * spec["hidden_size"]) * spec["weight_bytes_per_param"]
    assert spec["weights_gib"] * mc.GIB == pytest.approx(embedding + linear, rel=0.001)


def test_explicit_weights_size_scales_every_rank():
    spec = mc.load_model({"config": tiny_llama(), "weights_gib": 3.0}, model_path="/m")
    assert spec["weights_gib"] == 3.0 and spec["weights_source"] == "given"
    assert mc.model_bytes(spec) == pytest.approx(3.0 * mc.GIB)


def test_kv_bytes_shard_by_tp_then_replicate():
    spec = mc.load_model("llama-3.1-70b")  # 8 KV heads, head_dim 128, bf16
    assert mc.kv_bytes_per_token_per_layer(spec, 1) == 8 * 256 * 2
    assert mc.kv_bytes_per_token_per_layer(spec, 4) == 2 * 256 * 2
    assert mc.kv_bytes_per_token_per_layer(spec, 8) == mc.kv_bytes_per_token_per_layer(spec, 16) == 256 * 2


def test_mla_kv_is_not_sharded_by_tp():
    spec = mc.load_model("deepseek-v3")
    per_layer = (512 + 64) * 2
    assert [mc.kv_bytes_per_token_per_layer(spec, tp) for tp in (1, 2, 4, 8)] == [per_layer] * 4


def test_tp_shards_weights_but_not_replicated_parts():
    spec = mc.load_model("llama-3.1-70b")
    whole = mc.layer_bytes(spec, 0, 1)[0]
    quarter = mc.layer_bytes(spec, 0, 4)[0]
    norms = 2 * spec["hidden_size"] * 2
    assert quarter == pytest.approx((whole - norms) / 4 + norms)


def test_moe_routed_experts_are_returned_unsharded():
    spec = mc.load_model("mixtral-8x7b")
    _, routed = mc.layer_bytes(spec, 0, 4)
    assert routed == 8 * 3 * 4096 * 14336 * 2


@pytest.mark.parametrize(("layers", "pp"), [(126, 2), (61, 2), (10, 4), (7, 3), (80, 8), (5, 5), (61, 4)])
def test_pp_partition_follows_get_pp_indices(layers, pp):
    parts = mc.pp_partition(layers, pp)
    assert sum(parts) == layers and len(parts) == pp and min(parts) >= 1
    base, extra = divmod(layers, pp)
    # vLLM gives the remainder to the stages before the last, counting back from the second-to-last.
    assert parts[-1] == base
    assert sorted(parts[:-1], reverse=True) == [base + 1] * extra + [base] * (pp - 1 - extra)
    assert parts[pp - 1 - extra : pp - 1] == [base + 1] * extra


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": None}, "lacks 'hidden_size'"),
        ({"num_attention_heads": 5}, "multiple of num_key_value_heads"),
        ({"num_attention_heads": True}, "must be an integer"),
        ({"num_hidden_layers": 0}, "must be >= 1"),
        ({"torch_dtype": "int8"}, "dtype"),
        ({"head_dim": None, "hidden_size": 130}, "not divisible by num_attention_heads"),
        ({"architectures": "Llama"}, "list of strings"),
        ({"num_local_experts": 4, "num_experts_per_tok": 5}, "exceeds the expert count"),
        ({"tie_word_embeddings": "yes"}, "true or false"),
    ],
)
def test_bad_configs_raise_model_config_error(change, message):
    config = tiny_llama(**{k: v for k, v in change.items() if v is not None})
    for key, value in change.items():
        if value is None:
            del config[key]
    with pytest.raises(mc.ModelConfigError, match=message):
        mc.load_model({"config": config}, model_path="/m")


def test_inline_config_needs_a_model_path():
    with pytest.raises(mc.ModelConfigError, match="model_path"):
        mc.load_model({"config": tiny_llama()})


def test_public_view_drops_internal_keys():
    spec = mc.load_model("deepseek-v3")
    view = mc.public_view(spec)
    assert not [key for key in view if key.startswith("_")]
    json.dumps(view)


# --------------------------------------------------------------------------- per-layer attention kinds

# (full, sliding, chunked) layers of each catalog model, and which vLLM 0.32 code decides it.
LAYER_KINDS = {
    # llama.py LlamaAttention: no layer_types, no sliding_window -> every layer full
    "llama-3.1-8b": (32, 0, 0), "llama-3.1-70b": (80, 0, 0), "llama-3.1-405b": (126, 0, 0),
    # Qwen2Config: use_sliding_window false drops the window -> full
    "qwen2.5-7b": (28, 0, 0), "qwen2.5-72b": (80, 0, 0), "qwen3-8b": (36, 0, 0), "qwen3-32b": (64, 0, 0),
    "qwen3-30b-a3b": (48, 0, 0), "qwen3-235b-a22b": (94, 0, 0),
    # sliding_window null -> full
    "mixtral-8x7b": (32, 0, 0), "mixtral-8x22b": (56, 0, 0), "mistral-small-24b": (40, 0, 0),
    "deepseek-v3": (61, 0, 0), "deepseek-r1": (61, 0, 0),
    # engine/arg_utils.py: no layer_types -> CacheConfig.sliding_window = 4096 for every Attention
    "mistral-7b-v0.1": (0, 32, 0),
    # gpt_oss.py: `config.sliding_window if self.layer_idx % 2 == 0 else None`
    "gpt-oss-20b": (12, 12, 0), "gpt-oss-120b": (18, 18, 0),
    # gemma3.py: layer_types[layer_idx] == "sliding_attention"; Gemma3TextConfig: every 6th layer full
    "gemma-3-27b": (10, 52, 0),
    # llama4.py: ChunkedLocalAttention when `not self.nope and config.attention_chunk_size`; NoPE every 4th
    "llama-4-scout": (12, 0, 36),
}


def test_every_catalog_model_has_its_layer_kinds_tested():
    assert sorted(LAYER_KINDS) == model_catalog.catalog_names()


@pytest.mark.parametrize("name", sorted(LAYER_KINDS))
def test_catalog_layer_attention_kinds_follow_vllm(name):
    spec = mc.load_model(name)
    kinds = spec["layer_attention"]
    assert len(kinds) == spec["layers"]
    assert tuple(kinds.count(kind) for kind in ("full", "sliding", "chunked")) == LAYER_KINDS[name]
    assert (spec["sliding_window"] is None) == ("sliding" not in kinds)
    assert (spec["attention_chunk_size"] is None) == ("chunked" not in kinds)


def test_layer_kind_patterns_and_sizes():
    gpt = mc.load_model("gpt-oss-120b")
    assert gpt["layer_attention"][:4] == ["sliding", "full", "sliding", "full"] and gpt["sliding_window"] == 128
    gemma = mc.load_model("gemma-3-27b")
    assert [i for i, kind in enumerate(gemma["layer_attention"]) if kind == "full"] == list(range(5, 62, 6))
    assert gemma["sliding_window"] == 1024
    scout = mc.load_model("llama-4-scout")
    assert scout["layer_attention"][:4] == ["chunked", "chunked", "chunked", "full"]
    assert (scout["attention_chunk_size"], scout["sliding_window"]) == (8192, None)
    assert mc.load_model("mistral-7b-v0.1")["sliding_window"] == 4096


@pytest.mark.parametrize(("changes", "kinds", "window"), [
    ({"sliding_window": 8}, ["sliding"] * 4, 8),  # no layer_types: CacheConfig's window on every layer
    ({"sliding_window": 0}, ["full"] * 4, None),  # vLLM turns a 0 window into None
    ({"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"] * 2},
     ["sliding", "full"] * 2, 8),
    ({"layer_types": ["sliding_attention"] * 4}, ["full"] * 4, None),  # no window: nothing slides
    ({"model_type": "qwen2", "sliding_window": 8, "use_sliding_window": False}, ["full"] * 4, None),
    ({"model_type": "qwen2", "sliding_window": 8, "use_sliding_window": True, "max_window_layers": 0},
     ["sliding"] * 4, 8),
    ({"model_type": "qwen3", "sliding_window": 8, "use_sliding_window": True, "max_window_layers": 4},
     ["full"] * 4, None),
    ({"model_type": "gemma2", "sliding_window": 8}, ["sliding", "full"] * 2, 8),  # Gemma2Config alternates
])
def test_layer_kinds_of_inline_configs(changes, kinds, window):
    spec = mc.load_model({"config": tiny_llama(**changes)}, model_path="/m")
    assert (spec["layer_attention"], spec["sliding_window"], spec["attention_chunk_size"]) == (kinds, window, None)


def test_qwen_with_some_sliding_layers_is_refused_as_vllm_does():
    config = tiny_llama(model_type="qwen2", sliding_window=8, use_sliding_window=True, max_window_layers=2)
    with pytest.raises(mc.ModelConfigError, match="Sliding window for some but all layers is not supported"):
        mc.load_model({"config": config}, model_path="/m")


def test_llama4_empty_no_rope_layers_take_the_interval_default():
    config = mc.model_catalog.lookup("llama-4-scout")[2]
    config["text_config"]["no_rope_layers"] = []
    config["text_config"]["attention_chunk_size"] = 1024
    spec = mc.load_model({"config": config}, model_path="/m")
    assert spec["layer_attention"].count("full") == 12 and spec["attention_chunk_size"] == 1024
    config["text_config"]["attention_chunk_size"] = None  # an explicit null: no chunked layer
    assert set(mc.load_model({"config": config}, model_path="/m")["layer_attention"]) == {"full"}


# --------------------------------------------------------------------------- new architectures' shapes


def test_gpt_oss_mxfp4_quantizes_only_the_experts():
    spec = mc.load_model("gpt-oss-120b")
    assert (spec["quantization"], spec["experts"], spec["experts_per_token"]) == ("mxfp4", 128, 4)
    # 4-bit values plus one 8-bit scale per 32: 0.5 + 1/32 bytes per expert weight
    assert spec["weight_bytes_per_param"] == pytest.approx(0.5 + 1 / 32)
    non_expert, routed = mc.layer_bytes(spec, 0, 1)
    assert routed == spec["params_routed_experts"] / 36 * (0.5 + 1 / 32)
    # attention (with biases and sinks), router and norms stay bf16
    hidden, q, kv = 2880, 64 * 64, 8 * 64
    attention = hidden * q * 2 + 2 * hidden * kv + (q + 2 * kv + hidden) + 64
    assert non_expert == 2 * (attention + hidden * 128 + 128 + 2 * hidden)
    # the checkpoint is about 65 GB (60.8 GiB) on the hub
    assert spec["weights_gib"] == pytest.approx(60.8, rel=0.01)
    assert mc.load_model("gpt-oss-20b")["weights_gib"] == pytest.approx(12.8, rel=0.01)


def test_experts_per_token_is_read_when_num_experts_per_tok_is_absent():
    config = dict(model_catalog.lookup("gpt-oss-20b")[2])
    del config["num_experts_per_tok"]
    assert mc.load_model({"config": config}, model_path="/m")["experts_per_token"] == 4


def test_llama4_moe_has_a_shared_expert_and_dense_layers_use_intermediate_size_mlp():
    spec = mc.load_model("llama-4-scout")
    assert (spec["experts"], spec["experts_per_token"], spec["moe_layers"]) == (16, 1, 48)
    assert (spec["moe_intermediate_size"], spec["shared_expert_intermediate_size"]) == (8192, 8192)
    assert spec["intermediate_size"] == 16384  # intermediate_size_mlp: the dense layers' width
    config = model_catalog.lookup("llama-4-scout")[2]
    config["text_config"]["interleave_moe_layer_step"] = 2  # Maverick's layout: every second layer MoE
    spec = mc.load_model({"config": config}, model_path="/m")
    assert spec["moe_layers"] == 24 and min(spec["_moe_layer_set"]) == 1


def test_vision_towers_are_counted_from_vision_config():
    # Llama-4-Scout's published per-tensor table: vision_model + multi_modal_projector = 871,932,416
    assert mc.load_model("llama-4-scout")["vision_params"] == 871_932_416
    gemma = mc.load_model("gemma-3-27b")
    assert gemma["vision_params"] == pytest.approx(0.42e9, rel=0.02)  # SigLIP-So400m (~417M) + projector
    assert gemma["tie_word_embeddings"] and gemma["vocab_size"] == 262208 and gemma["head_dim"] == 128
    # the tower sits on every pipeline stage, TP shards its linear layers
    first = mc.embedding_bytes(gemma, 1, first_stage=True, last_stage=False, pp=2)
    middle = mc.embedding_bytes(gemma, 1, first_stage=False, last_stage=False, pp=3)
    assert middle == pytest.approx(gemma["vision_params"] * 2) and first > middle
    assert mc.embedding_bytes(gemma, 4, first_stage=False, last_stage=False, pp=3) < middle / 2
    assert mc.load_model("llama-3.1-8b")["vision_params"] == 0


def test_qwen3_and_gemma3_count_their_q_and_k_norms():
    plain = mc.load_model({"config": tiny_llama()}, model_path="/m")["params"]
    qwen3 = mc.load_model({"config": tiny_llama(model_type="qwen3")}, model_path="/m")["params"]
    assert qwen3 - plain == 4 * 2 * 32  # q_norm + k_norm of head_dim per layer
