"""Memory and utilization balance on real 2x H200 captures: a balanced load, one GPU busy, idle."""
import csv
import io

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts import nvidia_smi_tables
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.gpu_balance import (
    BalanceError,
    memory_balance,
    utilization_balance,
)

LOOP_FIELDS = ["index", "utilization.gpu", "memory.used", "memory.total"]


def read(fixtures_dir, relative):
    return (fixtures_dir / relative).read_text(encoding="utf-8")


def loop_rows(text):
    """`nvidia-smi --query-gpu=... --format=csv,noheader,nounits -lms 500` rows, read with csv only."""
    reader = csv.reader(io.StringIO(text), skipinitialspace=True)
    return [dict(zip(LOOP_FIELDS, row, strict=True)) for row in reader if len(row) == len(LOOP_FIELDS)]


def header_rows(text):
    """`--format=csv` with a header: field names lose their ' [MiB]' units, values keep theirs."""
    reader = csv.reader(io.StringIO(text), skipinitialspace=True)
    header = [name.split(" [")[0] for name in next(reader)]
    return [dict(zip(header, row, strict=True)) for row in reader if row]


def test_balanced_load_passes(fixtures_dir):
    rows = loop_rows(read(fixtures_dir, "gpu/h200x2-run/query-balanced.csv"))
    utilization = utilization_balance(rows)
    memory = memory_balance(rows)
    assert utilization["status"] == "pass" and utilization["balanced"]
    assert utilization["field"] == "utilization.gpu"
    assert [g["gpu"] for g in utilization["gpus"]] == [0, 1]
    assert all(g["samples"] >= 3 and g["mean"] > 90 for g in utilization["gpus"])
    assert memory["status"] == "pass" and memory["field"] == "memory.used"
    assert all(abs(g["deviation"]) <= 0.10 for g in memory["gpus"])


def test_one_busy_gpu_is_flagged(fixtures_dir):
    rows = loop_rows(read(fixtures_dir, "gpu/h200x2-run/query-unbalanced.csv"))
    utilization = utilization_balance(rows)
    memory = memory_balance(rows)
    assert utilization["status"] == "fail" and not utilization["balanced"]
    busy, idle = utilization["gpus"]
    assert busy["deviation"] > 20 and idle["deviation"] < -20
    assert any("GPU 0 averages" in reason for reason in utilization["reasons"])
    assert memory["status"] == "fail"
    assert any("GPU 1 uses" in reason for reason in memory["reasons"])


def test_tolerance_is_configurable(fixtures_dir):
    rows = loop_rows(read(fixtures_dir, "gpu/h200x2-run/query-unbalanced.csv"))
    assert utilization_balance(rows, tolerance_points=60)["status"] == "pass"
    assert memory_balance(rows, tolerance=1.5)["status"] == "pass"


def test_values_with_units_are_read(fixtures_dir):
    """A header capture keeps 'MiB' and '%' in every cell; both H200 hold 6763 MiB, idle SMs."""
    rows = header_rows(read(fixtures_dir, "gpu/h200x2-load/query-gpu-load.csv"))
    memory = memory_balance(rows)
    assert memory["status"] == "pass"
    assert [g["mean"] for g in memory["gpus"]] == [6763.0, 6763.0]
    utilization = utilization_balance(rows, min_samples=1)
    assert utilization["status"] == "warn"
    assert any("idle" in reason for reason in utilization["reasons"])


def test_idle_memory_is_not_called_balanced(fixtures_dir):
    rows = header_rows(read(fixtures_dir, "gpu/h200x2-load/query-gpu-idle.csv"))
    memory = memory_balance(rows)
    assert memory["status"] == "warn" and "nothing loaded" in memory["reasons"][0]


def test_single_gpu_host_has_nothing_to_compare(fixtures_dir):
    rows = header_rows(read(fixtures_dir, "gpu/public/csv-query-gpu-h100-80gb-hbm3-load.txt"))
    utilization = utilization_balance(rows, min_samples=1)
    assert utilization["status"] == "warn" and "only 1 GPU" in utilization["reasons"][0]
    assert utilization["gpus"][0]["mean"] == 100.0


def test_too_few_samples_warn(fixtures_dir):
    rows = loop_rows(read(fixtures_dir, "gpu/h200x2-run/query-balanced.csv"))[:2]
    result = utilization_balance(rows)
    assert result["status"] == "warn" and "fewer than 3 samples" in result["reasons"][0]


def test_rows_without_the_metric_raise():
    with pytest.raises(BalanceError, match="no rows"):
        utilization_balance([])
    with pytest.raises(BalanceError, match="metric"):
        memory_balance([{"index": 0, "name": "NVIDIA H200"}])


# Integration through the facts parsers (nvidia_smi_tables.parse_query_gpu_csv / parse_dmon).


def test_dmon_balanced_and_unbalanced_through_the_facts_parser(fixtures_dir):
    balanced = nvidia_smi_tables.parse_dmon(read(fixtures_dir, "gpu/h200x2-run/dmon-balanced.txt"))
    unbalanced = nvidia_smi_tables.parse_dmon(read(fixtures_dir, "gpu/h200x2-run/dmon-unbalanced.txt"))
    assert utilization_balance(balanced)["field"] == "sm"
    assert utilization_balance(balanced)["status"] == "pass"
    assert memory_balance(balanced)["field"] == "fb"
    assert memory_balance(balanced)["status"] == "pass"
    assert utilization_balance(unbalanced)["status"] == "fail"
    assert memory_balance(unbalanced)["status"] == "fail"


def test_query_loop_through_the_facts_parser(fixtures_dir):
    text = read(fixtures_dir, "gpu/h200x2-run/query-unbalanced.csv")
    parsed = nvidia_smi_tables.parse_query_gpu_csv(text, fields=LOOP_FIELDS)
    assert utilization_balance(parsed) == utilization_balance(loop_rows(text))
    assert memory_balance(parsed)["status"] == "fail"


def test_idle_dmon_fixture_through_the_facts_parser(fixtures_dir):
    samples = nvidia_smi_tables.parse_dmon(read(fixtures_dir, "gpu/h200x2/dmon.txt"))
    result = utilization_balance(samples, min_samples=2)
    assert result["status"] == "warn" and "idle" in result["reasons"][0]
