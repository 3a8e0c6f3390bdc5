"""The planner against public vLLM V1 start-up logs (tests/fixtures/vllm/calibration/public_logs.json).

Each log's weights and KV tokens are compared with what the planner predicts for the same model at the log's TP/PP,
and the ratio must be the one docs/planner.md's calibration table states (the table cannot drift from the planner).
Rows inside the calibration band must stay inside it; rows the fixture marks as missing it ('weights_miss',
'kv_miss') must stay outside it and be explained below the table.
"""

import json
import re
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import kv_cache
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]
LOGS = json.loads((REPO / "tests" / "fixtures" / "vllm" / "calibration" / "public_logs.json").read_text())["logs"]
BLOCK = 16  # vLLM's CUDA block size for these attention backends
WEIGHTS_BAND = 0.05  # the planner's weights within 5% of the log's "Model loading took"
KV_BAND = 0.10  # the planner's KV tokens within 10% of the log's "GPU KV cache size"
# What the reserve (activations, CUDA graphs) needs from a log to be predicted from the GPU's memory.
RESERVE_INPUTS = ("gpu", "tp", "pp", "max_model_len", "gpu_memory_utilization")


def calibration_section():
    text = (REPO / "docs" / "planner.md").read_text()
    start = text.index("## Calibration against vLLM's own logs")
    return text[start:text.index("\n## ", start + 1)]


def table_ratios():
    """{log id: (predicted/reported weights, predicted/reported KV tokens)} from docs/planner.md's table."""
    found = {}
    for row in re.findall(r"^\| `([^`]+)` \|(.*)$", calibration_section(), re.M):
        cells = [cell.strip() for cell in row[1].strip().strip("|").split("|")]
        found[row[0]] = (cells[-2], cells[-1])
    return found


def notes_below_table():
    section = calibration_section()
    return section[section.index("\n", section.rindex("\n| ") + 1):]


def spec_of(log):
    return mc.load_model(log["planner_model"], model_path="/m")


def predicted_weights_gib(log):
    """The planner's weights on one GPU at the log's TP/PP: the largest pipeline stage, each routed expert split
    over TP (plan/memory.py ``evaluate``, without a GPU's MXFP4 kernel padding)."""
    spec, tp, pp = spec_of(log), log["tp"], log["pp"]
    stages, start = [], 0
    for stage, count in enumerate(mc.pp_partition(spec["layers"], pp)):
        total = mc.embedding_bytes(spec, tp, first_stage=stage == 0, last_stage=stage == pp - 1, pp=pp)
        for index in range(start, start + count):
            non_expert, routed = mc.layer_bytes(spec, index, tp)
            total += non_expert + routed / tp
        stages.append(total)
        start += count
    return max(stages) / mc.GIB


def predicted_kv_tokens(log):
    """vLLM's token count from the log's own available KV memory, at the planner's bytes per token on the first
    pipeline stage's rank (the worker whose "Available KV cache memory" the logs print)."""
    spec = spec_of(log)
    first_stage = mc.pp_partition(spec["layers"], log["pp"])[0]
    groups, _size = kv_cache.groups(spec)
    layers_per_block = max(sum(1 for layer in layers if layer < first_stage) for _kind, layers in groups)
    per_token = mc.kv_bytes_per_token_per_layer(spec, log["tp"]) * layers_per_block
    return int(log["available_kv_gib"] * mc.GIB // (BLOCK * per_token)) * BLOCK


def test_every_log_has_its_source_and_the_lines_it_is_read_from():
    assert len(LOGS) >= 10
    assert len({log["id"] for log in LOGS}) == len(LOGS)
    for log in LOGS:
        assert log["source"].startswith("https://github.com/") and log["where"] and log["lines"]
        if log["weights_gib"] is not None:
            assert any(f"Model loading took {log['weights_gib']} GiB" in line for line in log["lines"])
        if log["available_kv_gib"] is not None:
            assert any(f"Available KV cache memory: {log['available_kv_gib']} GiB" in line for line in log["lines"])
        if log["kv_tokens"] is not None:
            assert any(f"GPU KV cache size: {log['kv_tokens']:,} tokens" in line for line in log["lines"])
        if log["max_model_len"] is not None and any("Maximum concurrency" in line for line in log["lines"]):
            assert any(f"Maximum concurrency for {log['max_model_len']:,} tokens" in line for line in log["lines"])


def test_the_table_has_one_row_per_log():
    assert sorted(table_ratios()) == sorted(log["id"] for log in LOGS)


def test_the_docs_count_the_logs_that_state_what_the_reserve_needs():
    complete = [log["id"] for log in LOGS if all(log[key] is not None for key in RESERVE_INPUTS)]
    stated = re.search(r"(\d+) of these logs state the GPU, TP/PP, max-model-len and gpu-memory-utilization",
                       " ".join(calibration_section().split()))
    assert stated and int(stated.group(1)) == len(complete)


@pytest.mark.parametrize("log", [log for log in LOGS if log["weights_gib"]], ids=lambda log: log["id"])
def test_weights_against_the_log_are_what_the_table_says(log):
    ratio = predicted_weights_gib(log) / log["weights_gib"]
    assert table_ratios()[log["id"]][0] == f"{ratio:.3f}"
    if log.get("weights_miss"):
        # MXFP4 experts laid out unpadded (vLLM 0.32's Triton backend on CUDA): the padded Marlin/Triton layouts of
        # the older releases in these logs are 6 to 8% larger, which the notes below the table explain.
        assert abs(ratio - 1) > WEIGHTS_BAND and log["model"] in notes_below_table()
    else:
        assert abs(ratio - 1) <= WEIGHTS_BAND


@pytest.mark.parametrize("log", [log for log in LOGS if log["kv_tokens"]], ids=lambda log: log["id"])
def test_kv_tokens_from_the_logs_own_kv_memory_are_what_the_table_says(log):
    ratio = predicted_kv_tokens(log) / log["kv_tokens"]
    assert table_ratios()[log["id"]][1] == f"{ratio:.3f}"
    if log.get("kv_miss"):
        assert abs(ratio - 1) > KV_BAND and log["model"] in notes_below_table()
    else:
        assert abs(ratio - 1) <= KV_BAND


def gpus(name, mib, count=1):
    return [{"name": "n0", "address": "10.0.0.1", "gpus": {"count": count, "name": name, "memory_total_mib": mib,
                                                          "nvlink": True}}]


def test_mxfp4_experts_are_laid_out_as_the_gpus_moe_kernel_pads_them():
    """Marlin (A100, L40S, ...) pads each rank's expert width to 128 and the hidden size to 256: on one GPU that is
    the 65.97 GiB vLLM's Marlin run reported (vllm23278); Hopper's Triton kernel pads nothing (vLLM 0.32)."""
    marlin = next(log for log in LOGS if log["id"] == "vllm23278-gpt-oss-120b-h100")
    a100 = build_plan("gpt-oss-120b", gpus("NVIDIA A100-SXM4-80GB", 81920), {"max_model_len": 8192})
    assert a100["tp"] == 1 and a100["memory"]["weights_gib_per_gpu"] / marlin["weights_gib"] == pytest.approx(1, abs=0.005)
    assert any("on vLLM's Marlin MoE kernel on NVIDIA A100-SXM4-80GB, which pads them" in w for w in a100["warnings"])
    h100 = build_plan("gpt-oss-120b", gpus("NVIDIA H100 80GB HBM3", 81559), {"max_model_len": 8192})
    assert h100["memory"]["weights_gib_per_gpu"] == pytest.approx(mc.load_model("gpt-oss-120b")["weights_gib"], abs=0.01)
    assert not any("MXFP4" in w for w in h100["warnings"])
    # TP=2: each rank holds a 1,440-wide slice of every expert; Marlin makes it 1,536 wide and the hidden size 3,072,
    # Hopper's Triton kernel rounds the slice to 1,472 (a multiple of 64)
    spec = mc.load_model("gpt-oss-120b")
    routed = spec["params_routed_experts"] * spec["weight_bytes_per_param"] / 2 / mc.GIB
    on = {gpu: build_plan("gpt-oss-120b", gpus(gpu, 81920, 2), {"max_model_len": 8192}, {"tp": 2})
          ["memory"]["weights_gib_per_gpu"] for gpu in ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")}
    unpadded = on["NVIDIA H100 80GB HBM3"] - routed * (1472 / 1440 - 1)
    assert on["NVIDIA A100-SXM4-80GB"] == pytest.approx(unpadded + routed * (1536 * 3072 / (1440 * 2880) - 1), abs=0.02)
