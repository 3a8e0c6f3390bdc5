"""Is the load spread evenly over a node's GPUs? Memory and utilization balance.

The seed's checks: after a TP start "the cards' memory should be close"; under an
EP load `nvidia-smi dmon -s u` should show every card within +-20% ("one card at
90%+ while the others sit at 40% is a routing hot spot: check EPLB").

Inputs are already-parsed rows, as nvidia_smi_tables.parse_query_gpu_csv() and
nvidia_smi_tables.parse_dmon() return them: one dict per GPU (or per sample), with the
GPU index under "index" (query) or "gpu" (dmon), and the metric under its
nvidia-smi name ("memory.used", "utilization.gpu") or dmon column ("fb", "sm").
Numbers may be ints, floats or strings such as "81234 MiB" or "45 %"; "-",
"N/A" and empty cells are skipped.

Pure Python, no Ansible import.
"""
from __future__ import annotations

import re
import statistics

# The seed's EPLB rule, in percentage points of utilization around the mean.
DEFAULT_UTILIZATION_TOLERANCE_POINTS = 20.0
# TP ranks hold equal weight shards and vLLM reserves the same fraction of each
# card, so used memory should agree closely; 10% of the mean leaves room for
# rank 0's extras (sampler, CUDA graphs) without hiding a lopsided placement.
DEFAULT_MEMORY_TOLERANCE = 0.10
# Below these the GPUs are idle and a balance verdict would mean nothing.
DEFAULT_IDLE_UTILIZATION = 5.0
DEFAULT_IDLE_MEMORY_MIB = 1024.0

MEMORY_FIELDS = ("memory.used", "fb", "memory_used_mib", "used")
UTILIZATION_FIELDS = ("utilization.gpu", "sm", "gpu_util", "utilization")
GPU_KEYS = ("index", "gpu", "gpu_index", "minor_number")

_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:%|MiB|MB|B)?\s*$", re.IGNORECASE)


class BalanceError(ValueError):
    """Rows that hold no usable GPU index or metric."""


def _number(value):
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    match = _NUMBER.match(str(value))
    return float(match.group(1)) if match else None


def _pick(row: dict, names, wanted: str | None):
    if wanted is not None:
        return wanted if wanted in row else None
    for name in names:
        if name in row:
            return name
    return None


def _group(rows, field: str | None, names) -> tuple[dict, str]:
    """{gpu: [values]} from rows; returns the field that was used."""
    if not rows:
        raise BalanceError("no rows: nothing to compare")
    groups: dict = {}
    used_field = None
    for row in rows:
        gpu_key = _pick(row, GPU_KEYS, None)
        metric = _pick(row, names, field)
        if gpu_key is None or metric is None:
            continue
        gpu = _number(row[gpu_key])
        if gpu is None:
            continue
        used_field = used_field or metric
        value = _number(row[metric])
        groups.setdefault(int(gpu), [])
        if value is not None:
            groups[int(gpu)].append(value)
    if not groups or used_field is None:
        wanted = field or " / ".join(names)
        raise BalanceError(f"no row holds a GPU index ({', '.join(GPU_KEYS)}) and the metric {wanted}")
    return groups, used_field


def _table(groups: dict, reference: float, relative: bool) -> list[dict]:
    table = []
    for gpu in sorted(groups):
        values = groups[gpu]
        mean = statistics.fmean(values) if values else None
        if mean is None:
            deviation = None
        elif relative:
            deviation = (mean - reference) / reference if reference else 0.0
        else:
            deviation = mean - reference
        table.append({
            "gpu": gpu,
            "samples": len(values),
            "mean": mean,
            "min": min(values) if values else None,
            "max": max(values) if values else None,
            "deviation": deviation,
        })
    return table


def utilization_balance(samples: list[dict], tolerance_points: float = DEFAULT_UTILIZATION_TOLERANCE_POINTS,
                        field: str | None = None, min_samples: int = 3,
                        idle_below: float = DEFAULT_IDLE_UTILIZATION) -> dict:
    """Mean utilization per GPU against the mean of all GPUs, in percentage points.

    pass: every GPU within +-tolerance_points of the mean; fail: one or more outside
    (the seed's routing hot spot); warn: too few samples, or all GPUs idle.
    """
    groups, used_field = _group(samples, field, UTILIZATION_FIELDS)
    per_gpu_means = [statistics.fmean(v) for v in groups.values() if v]
    overall = statistics.fmean(per_gpu_means) if per_gpu_means else 0.0
    table = _table(groups, overall, relative=False)
    reasons = []
    status = "pass"
    short = [row["gpu"] for row in table if row["samples"] < min_samples]
    outside = [row for row in table if row["deviation"] is not None and abs(row["deviation"]) > tolerance_points]
    if len(groups) < 2:
        status = "warn"
        reasons.append(f"only {len(groups)} GPU in the samples: nothing to compare")
    elif short:
        status = "warn"
        reasons.append(f"GPU(s) {short} have fewer than {min_samples} samples")
    elif overall < idle_below:
        status = "warn"
        reasons.append(f"mean utilization {overall:.1f}% is under {idle_below:.0f}%: GPUs idle, no load to judge")
    elif outside:
        status = "fail"
        for row in outside:
            reasons.append(
                f"GPU {row['gpu']} averages {row['mean']:.1f}% against a mean of {overall:.1f}% "
                f"({row['deviation']:+.1f} points, allowed +-{tolerance_points:.0f})"
            )
    return {
        "check": "utilization_balance",
        "status": status,
        "balanced": status == "pass",
        "field": used_field,
        "mean": overall,
        "spread": (max(per_gpu_means) - min(per_gpu_means)) if per_gpu_means else None,
        "tolerance_points": tolerance_points,
        "gpus": table,
        "reasons": reasons,
    }


def memory_balance(rows: list[dict], tolerance: float = DEFAULT_MEMORY_TOLERANCE, field: str | None = None,
                   idle_below_mib: float = DEFAULT_IDLE_MEMORY_MIB) -> dict:
    """Used memory per GPU against the mean, as a fraction of the mean (0.10 = +-10%).

    Several rows per GPU (repeated samples) are averaged.
    """
    groups, used_field = _group(rows, field, MEMORY_FIELDS)
    per_gpu_means = [statistics.fmean(v) for v in groups.values() if v]
    overall = statistics.fmean(per_gpu_means) if per_gpu_means else 0.0
    table = _table(groups, overall, relative=True)
    reasons = []
    status = "pass"
    outside = [row for row in table if row["deviation"] is not None and abs(row["deviation"]) > tolerance]
    if len(groups) < 2:
        status = "warn"
        reasons.append(f"only {len(groups)} GPU in the rows: nothing to compare")
    elif not per_gpu_means or max(per_gpu_means) < idle_below_mib:
        status = "warn"
        reasons.append(f"no GPU uses more than {idle_below_mib:.0f} MiB: nothing loaded to compare")
    elif outside:
        status = "fail"
        for row in outside:
            reasons.append(
                f"GPU {row['gpu']} uses {row['mean']:.0f} MiB against a mean of {overall:.0f} MiB "
                f"({row['deviation']:+.1%}, allowed +-{tolerance:.0%})"
            )
    return {
        "check": "memory_balance",
        "status": status,
        "balanced": status == "pass",
        "field": used_field,
        "mean_mib": overall,
        "tolerance": tolerance,
        "gpus": table,
        "reasons": reasons,
    }
