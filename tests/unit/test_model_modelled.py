"""Positive modelling: public configs the planner plans only when it models every layer, else refuses by field.

tests/fixtures/models/configs.json holds public configs (or excerpts) with their source: 'refuse' ones must be
refused naming the config field or value and the override, never by a parse accident; 'plan' ones must give the
published total parameter count. A random third ('held_out') was set aside before the rule was scored.
"""

import json
import random
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import modelled
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import PlanError, build_plan

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "models" / "configs.json"
MODELS = json.loads(FIXTURE.read_text())["models"]
BY_ID = {entry["id"]: entry for entry in MODELS}
H100 = ("NVIDIA H100 80GB HBM3", 81559)
# Words of a parse accident: what a refusal must never give as its reason.
PARSE_WORDS = ("lacks", "must be an integer", "must be a list", "must list one entry", "KeyError", "NoneType")


def outcome(entry):
    """(True when the planner does what the fixture expects, what it did)."""
    try:
        spec = mc.load_model({"config": entry["config"]}, model_path="/m")
    except mc.ModelConfigError as exc:
        message = str(exc)
        named = entry.get("refuse_field", "") in message
        clean = not any(word in message for word in PARSE_WORDS)
        hint = "--weights-gib" in message and "kv_bytes_per_token: M" in message
        return entry["expect"] == "refuse" and named and clean and hint, message
    ratio = spec["params"] / 1e9 / entry.get("published_params_b", float("nan"))
    tolerance = entry.get("params_tolerance", 0.005)
    return entry["expect"] == "plan" and abs(ratio - 1) <= tolerance, f"planned, params ratio {ratio:.4f}"


def test_the_held_out_third_is_the_recorded_random_sample():
    ids = sorted(BY_ID)
    held = set(random.Random(43).sample(ids, len(ids) // 3))
    assert {entry["id"] for entry in MODELS if entry["split"] == "held_out"} == held
    assert all(entry["source"].startswith("https://huggingface.co/") and entry["retrieved"] for entry in MODELS)


@pytest.mark.parametrize("split", ["rule", "held_out"])
def test_every_public_config_is_planned_right_or_refused_by_field(split):
    results = {entry["id"]: outcome(entry) for entry in MODELS if entry["split"] == split}
    wrong = {name: what for name, (right, what) in results.items() if not right}
    assert len(results) >= 8 and not wrong


@pytest.mark.parametrize(("name", "field", "value"), [
    ("deepseek-v3.2", "index_topk", "2048"),
    ("glm-5", "index_topk", "2048"),
    ("nemotron-super-49b", "block_configs", "n_heads_in_group"),
    ("mimo-v2-flash", "hybrid_layer_pattern", "[0, 1, 1"),
    ("gemma-4-26b-a4b", "text_config.global_head_dim", "512"),
])
def test_the_issue_cases_name_the_field_and_value_they_do_not_model(name, field, value):
    with pytest.raises(mc.ModelConfigError) as error:
        mc.load_model({"config": BY_ID[name]["config"]}, model_path="/m")
    message = str(error.value)
    assert message.startswith(f"config field {field} = ") and value in message.split(" means ")[0]
    assert "which the planner does not model" in message and "is not a class it models" in message
    assert "{name: ..., weights_gib: N, kv_bytes_per_token: M}" in message


def test_moe_layer_freq_as_a_list_is_a_refusal_not_a_parse_error():
    config = dict(BY_ID["mimo-v2-flash"]["config"])
    for key in ("hybrid_layer_pattern", "swa_num_key_value_heads"):
        del config[key]
    with pytest.raises(mc.ModelConfigError, match=r"^config field moe_layer_freq = \[0, 1, 1"):
        mc.load_model({"config": config}, model_path="/m")


@pytest.mark.parametrize("name", [entry["id"] for entry in MODELS if entry["expect"] == "refuse"])
def test_every_refused_config_plans_with_both_figures_given(name):
    spec = mc.load_model({"config": BY_ID[name]["config"], "weights_gib": 100, "kv_bytes_per_token": 70_000},
                         model_path="/m")
    assert spec["weights_gib"] == 100 and mc.model_bytes(spec) == pytest.approx(100 * mc.GIB)
    assert mc.kv_bytes_per_token_per_layer(spec, 1) * spec["layers"] == pytest.approx(70_000)


def test_a_config_whose_shapes_cannot_be_read_plans_by_layers_and_heads_when_overridden():
    spec = mc.load_model({"config": BY_ID["nemotron-super-49b"]["config"], "weights_gib": 92.9,
                          "kv_bytes_per_token": 147_456}, model_path="/m")
    assert spec["opaque"] and (spec["layers"], spec["heads"], spec["kv_heads"]) == (80, 64, None)
    assert spec["architecture"] == "DeciLMForCausalLM"
    plan = build_plan({"config": BY_ID["nemotron-super-49b"]["config"], "weights_gib": 92.9,
                       "kv_bytes_per_token": 147_456},
                      [{"name": "n0", "address": "10.0.0.1",
                        "gpus": {"count": 2, "name": H100[0], "memory_total_mib": H100[1], "nvlink": True}}],
                      {"max_model_len": 8192}, None, model_path="/models/nemotron")
    assert (plan["strategy"], plan["tp"], plan["pp"]) == ("tp", 2, 1)
    assert any("not from its shapes" in warning and "pipeline parallel" not in warning
               for warning in plan["warnings"])


def test_the_override_works_for_any_name():
    spec = mc.load_model({"name": "someorg/new-model-9000", "weights_gib": 42.5, "kv_bytes_per_token": 131_072})
    assert (spec["name"], spec["path"], spec["weights_gib"]) == ("someorg/new-model-9000", "someorg/new-model-9000", 42.5)
    assert spec["heads"] is None and mc.kv_bytes_per_token_per_layer(spec, 2) == 65_536
    with pytest.raises(mc.ModelConfigError, match="unknown model 'someorg/new-model-9000'.*--kv-bytes-per-token"):
        mc.load_model({"name": "someorg/new-model-9000", "weights_gib": 42.5})
    with pytest.raises(mc.ModelConfigError, match="kv_bytes_per_token must be a positive integer, got 0"):
        mc.load_model({"name": "someorg/new-model-9000", "weights_gib": 42.5, "kv_bytes_per_token": 0})
    plan = build_plan({"name": "someorg/new-model-9000", "weights_gib": 42.5, "kv_bytes_per_token": 131_072},
                      [{"name": "n0", "address": "10.0.0.1",
                        "gpus": {"count": 2, "name": H100[0], "memory_total_mib": H100[1], "nvlink": True}}],
                      {"max_model_len": 8192}, None)
    assert (plan["strategy"], plan["tp"], plan["pp"]) == ("single", 1, 1)
    assert any("its attention heads are unknown (only power-of-two TP sizes are planned), pipeline parallel is "
               "not planned" in warning for warning in plan["warnings"])
    nodes = [{"name": "n0", "address": "10.0.0.1",
              "gpus": {"count": 8, "name": H100[0], "memory_total_mib": H100[1], "nvlink": True}}]
    big = {"name": "someorg/new-model-9000", "weights_gib": 300, "kv_bytes_per_token": 131_072}
    assert build_plan(big, nodes, {"max_model_len": 8192}, None)["tp"] == 8  # not 5 or 6: the heads are unknown
    with pytest.raises(PlanError, match=r"^tp=6 is invalid for someorg/new-model-9000: its attention heads "
                                        r"are unknown, so only power-of-two TP sizes are planned"):
        build_plan(big, nodes, {"max_model_len": 8192}, {"tp": 6})
    with pytest.raises(PlanError, match=r"^pp=2 needs the model's layers, which someorg/new-model-9000 was "
                                        r"planned without: give its config.json"):
        build_plan(big, nodes + [dict(nodes[0], name="n1", address="10.0.0.2")], {"max_model_len": 8192}, {"pp": 2})


@pytest.mark.parametrize(("changes", "message"), [
    ({"layer_types": ["full_attention", "chunked_attention"] * 2}, "config field layer_types = ['chunked_attention']"),
    ({"kv_lora_rank": 512}, "config field kv_lora_rank = 512 on LlamaForCausalLM"),
    ({"index_topk": 2048}, "config field index_topk = 2048 means a sparse-attention indexer"),
    ({"architectures": ["CohereForCausalLM"]}, "architectures[0] = 'CohereForCausalLM' is not a class"),
])
def test_a_modelled_class_with_a_kind_it_does_not_count_is_refused(changes, message):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
              "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 512, "torch_dtype": "bfloat16", **changes}
    with pytest.raises(mc.ModelConfigError) as error:
        mc.load_model({"config": config}, model_path="/m")
    assert str(error.value).startswith(message) and modelled.OVERRIDE_HINT in str(error.value)


def test_a_vision_tower_it_does_not_count_is_refused():
    config = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
              "vision_config": {"model_type": "clip_vision_model"}, "text_config": dict(BY_ID["gemma-3-1b"]["config"])}
    with pytest.raises(mc.ModelConfigError, match="^config field vision_config.model_type = 'clip_vision_model'"):
        mc.load_model({"config": config}, model_path="/m")


def test_a_shape_error_on_a_modelled_class_names_the_field_and_the_override():
    config = dict(BY_ID["llama-3.2-1b"]["config"], num_key_value_heads="eight")
    with pytest.raises(mc.ModelConfigError) as error:
        mc.load_model({"config": config}, model_path="/m")
    assert str(error.value).startswith("model config field 'num_key_value_heads' must be an integer, got 'eight'")
    assert "--weights-gib and --kv-bytes-per-token" in str(error.value)


def test_gemma2_has_no_separate_head():
    spec = mc.load_model({"config": BY_ID["gemma-2-9b"]["config"]}, model_path="/m")
    assert spec["tie_word_embeddings"] and spec["layer_attention"][:2] == ["sliding", "full"]
