"""The profile run's peak the planner reserves (plan/memory.py) against peaks measured on a real H200.

tests/fixtures/gpu/activation-peak/ holds bench/gpu/plan_fit.py's captures: the plan's
decoder (one TP rank, bf16, random weights) run on one packed batch of 2048, 8192 and
16384 tokens, the peak allocated above the weights. The planner's forward term must
cover each peak (it may not under-reserve by more than the captures' 0.01 GiB rounding)
and stay within 10% above it (a reserve far too large costs KV the GPU has). The old
estimate, 8192 x 12 x hidden, fails both ways: 1.21x under for Llama-3.1-8B, 1.66x for
Qwen2.5-7B, 0.77x (over) for Llama-3.1-70B at TP=2.
"""

import json
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.memory import (
    forward_activation_bytes,
    sampler_bytes,
    serving_batch_defaults,
)

CAPTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "activation-peak").glob("*.json"))
GIB = 1024**3
ROUNDING_GIB = 0.01


def measured_rows():
    for path in CAPTURES:
        capture = json.loads(path.read_text())
        peak = capture["activation_peak"]
        for row in peak["rows"]:
            yield pytest.param(capture["model"], peak["tp_rank_of"], row["tokens"], row["measured_peak_gib"],
                               id=f"{path.stem}-{row['tokens']}")


def test_the_captures_cover_three_models_two_tp_sizes_and_three_batches():
    rows = [param.values for param in measured_rows()]
    assert {model for model, *_ in rows} == {"llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b"}
    assert {tp for _, tp, *_ in rows} == {1, 2}
    assert {tokens for _, _, tokens, _ in rows} == {2048, 8192, 16384}


@pytest.mark.parametrize(("model", "tp", "tokens", "measured_gib"), list(measured_rows()))
def test_the_forward_term_covers_the_measured_peak(model, tp, tokens, measured_gib):
    estimate_gib = forward_activation_bytes(mc.load_model(model), tp, tokens) / GIB
    assert estimate_gib >= measured_gib - ROUNDING_GIB, f"under-reserved: {estimate_gib:.3f} < {measured_gib}"
    assert estimate_gib <= measured_gib * 1.10, f"over-reserved: {estimate_gib:.3f} > 1.1 x {measured_gib}"


def test_a_moe_layer_reserves_for_its_routed_rows():
    spec = mc.load_model("mixtral-8x7b")
    dense_like = dict(spec, is_moe=False, _moe_layer_set=set())
    # top-2 routing runs every token through two experts: about twice a dense MLP of the expert's width
    assert forward_activation_bytes(spec, 1, 8192) > 1.8 * forward_activation_bytes(dense_like, 1, 8192)
    assert forward_activation_bytes(spec, 2, 8192) < forward_activation_bytes(spec, 1, 8192)


def test_the_sampler_outgrows_the_forward_pass_with_a_large_vocabulary_and_many_sequences():
    spec = mc.load_model("llama-3.1-8b")
    tokens, seqs = serving_batch_defaults(143155 * 2**20, "NVIDIA H200")
    assert (tokens, seqs) == (8192, 1024)
    # 1024 rows x 128,256 logits x (2 + 3 x 4) bytes + the 8192 hidden states
    assert sampler_bytes(spec, tokens, seqs) == 1024 * 128256 * 14 + 8192 * 4096 * 2
    assert sampler_bytes(spec, tokens, seqs) > forward_activation_bytes(spec, 1, tokens)
    assert sampler_bytes(spec, 2048, 256) < sampler_bytes(spec, tokens, seqs) / 3
