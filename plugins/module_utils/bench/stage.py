"""One benchmark stage record, read: the plan's layout, the result's figures, device use under load.

A stage record is what bench_report.build_stage_record() writes
(results/<deployment>/<stage>.json): the normalized profile, the plan, the raw
`vllm bench serve` result, the samples taken on each node under load. This
module reads them for the verdict (bench/verdict.py) and the report
(bench/report.py): ``stage_layout`` and ``describe_layout`` (TP/PP/DP/EP,
devices, nodes), ``stage_metrics`` (the figures of the saved result), and
``utilization_series`` / ``utilization_summary`` (per device under load: GPUs
from the nvidia-smi samples, vLLM worker processes on the CPU platform, with
gpu_balance's utilization and memory balance). The pass/warn/fail rules are in
bench/verdict.py.

Pure Python, no Ansible import.
"""
from __future__ import annotations

import math
import re
import statistics

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts import nvidia_smi, nvidia_smi_tables
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify import gpu_balance

AXES = ("tp", "pp", "dp")


# ------------------------------------------------------------------ layout and metrics


def _tp_crosses_nodes(plan: dict) -> bool:
    groups: dict = {}
    for rank in (plan.get("expect") or {}).get("rank_assignments") or []:
        groups.setdefault((rank.get("dp"), rank.get("pp")), set()).add(rank.get("node"))
    if groups:
        return any(len(nodes) > 1 for nodes in groups.values())
    gpus_per_node = (plan.get("cluster") or {}).get("gpus_per_node") or 0
    return bool(gpus_per_node) and int(plan.get("tp") or 1) > int(gpus_per_node)


def stage_layout(plan: dict) -> dict:
    """What the comparison needs from a plan."""
    cluster = plan.get("cluster") or {}
    model = plan.get("model") or {}
    memory = plan.get("memory") or {}
    tp, pp, dp = (int(plan.get(axis) or 1) for axis in AXES)
    gpus = tp * pp * dp
    return {
        "strategy": plan.get("strategy"),
        "backend": plan.get("backend"),
        "device": cluster.get("device", "cuda"),
        "gpu_name": cluster.get("gpu_name"),
        "nvlink": cluster.get("nvlink"),
        "tp": tp, "pp": pp, "dp": dp, "ep": int(plan.get("ep") or 1),
        "gpus": gpus,
        "nodes_used": int(plan.get("nodes_used") or 1),
        "enable_expert_parallel": bool(plan.get("enable_expert_parallel")),
        "is_moe": bool(model.get("is_moe")),
        "model": model.get("path") or model.get("name"),
        "tp_crosses_nodes": _tp_crosses_nodes(plan),
        "kv_cache_tokens": memory.get("kv_cache_tokens"),
    }


def describe_layout(layout: dict) -> str:
    parts = [f"TP={layout['tp']}"]
    if layout["pp"] > 1:
        parts.append(f"PP={layout['pp']}")
    if layout["dp"] > 1:
        parts.append(f"DP={layout['dp']}")
    if layout["enable_expert_parallel"]:
        parts.append(f"EP={layout['ep']}")
    unit = "CPU worker" if layout["device"] == "cpu" else "GPU"
    text = " x ".join(parts) + f", {layout['gpus']} {unit}{'s' if layout['gpus'] != 1 else ''}"
    if layout["nodes_used"] > 1:
        text += f" on {layout['nodes_used']} nodes"
    return text + launch.get(layout["backend"] or launch.DEFAULT).layout_words


def _number(value):
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    return None


def _percentile_key(result: dict, metric: str, percentile: int):
    for key in (f"p{percentile}_{metric}_ms", f"median_{metric}_ms" if percentile == 50 else None):
        if key and _number(result.get(key)) is not None:
            return float(result[key])
    return None


def stage_metrics(result: dict) -> dict:
    """The figures the verdict and the report use, from a saved `vllm bench serve` result."""
    metrics = {
        "completed": result.get("completed"),
        "failed": result.get("failed"),
        "num_prompts": result.get("num_prompts"),
        "duration_s": _number(result.get("duration")),
        "request_throughput": _number(result.get("request_throughput")),
        "output_throughput": _number(result.get("output_throughput")),
        "total_token_throughput": _number(result.get("total_token_throughput")),
        "mean_e2el_ms": _number(result.get("mean_e2el_ms")),
    }
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for percentile in (50, 90, 99):
            metrics[f"{metric}_p{percentile}_ms"] = _percentile_key(result, metric, percentile)
    # Little's law: requests in flight on average = arrival rate x time in the system.
    if metrics["request_throughput"] is not None and metrics["mean_e2el_ms"] is not None:
        metrics["achieved_concurrency"] = metrics["request_throughput"] * metrics["mean_e2el_ms"] / 1000.0
    else:
        metrics["achieved_concurrency"] = None
    return metrics


# ------------------------------------------------------------------ utilization samples


def _cpu_count(cpus: str | None) -> int | None:
    """Number of CPUs in a Linux CPU list such as '0-3,8'."""
    if not cpus:
        return None
    count = 0
    for part in str(cpus).split(","):
        part = part.strip()
        match = re.match(r"^(\d+)(?:-(\d+))?$", part)
        if not match:
            return None
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        count += high - low + 1
    return count or None


def _node_order(stage: dict) -> list[str]:
    plan_nodes = [n.get("host") for n in (stage.get("plan") or {}).get("nodes") or []]
    sampled = list((stage.get("samples") or {}).keys())
    return [n for n in plan_nodes if n in sampled] + [n for n in sampled if n not in plan_nodes]


def utilization_series(stage: dict) -> dict:
    """Per-device series under load: GPUs from nvidia-smi (cuda), vLLM worker processes (cpu).

    Returns {source, measured, note, window, series: [{node, device, kind, t, util_pct, mem_mib}]},
    t in seconds from the start of the load. On the CPU platform the figures are the
    workers' own CPU time from /proc, normalized by the cores each worker may run on;
    the lab's nvidia-smi double is never read (it replays captures, it measures nothing).
    """
    layout = stage_layout(stage.get("plan") or {})
    window = stage.get("window") or {}
    start = _number(window.get("load_start"))
    end = _number(window.get("load_end"))
    samples = stage.get("samples") or {}
    device = layout["device"]
    series: list[dict] = []
    errors: list[str] = []
    origin = start
    if origin is None:
        times = [s["t"] for node in samples.values() for s in node if isinstance(s, dict) and "t" in s]
        origin = min(times) if times else 0.0
    plan_gpus = {n.get("host"): n.get("local_gpus") for n in (stage.get("plan") or {}).get("nodes") or []}
    for node in _node_order(stage):
        lines = samples.get(node) or []
        # nvidia-smi lists every GPU of the node; judge only those the plan gives this deployment.
        used = {int(g) for g in plan_gpus.get(node) or []}
        header = next((s for s in lines if isinstance(s, dict) and "sampler" in s), {})
        points: dict[str, dict] = {}
        for sample in lines:
            if not isinstance(sample, dict) or "t" not in sample:
                continue
            t = float(sample["t"]) - origin
            if device != "cpu":
                if sample.get("error"):
                    errors.append(f"{node}: {sample['error']}")
                text = sample.get("gpus")
                if not text:
                    continue
                try:
                    rows = nvidia_smi_tables.parse_query_gpu_csv(
                        text, fields=header.get("gpu_fields") or ["index", "utilization.gpu", "memory.used", "memory.total"])
                except nvidia_smi.NvidiaSmiParseError as error:
                    errors.append(f"{node}: {error}")
                    continue
                for row in rows:
                    if used and row.get("index") not in used:
                        continue
                    key = f"GPU{row.get('index')}"
                    entry = points.setdefault(key, {"kind": "gpu", "t": [], "util_pct": [], "mem_mib": []})
                    entry["t"].append(t)
                    entry["util_pct"].append(_number(row.get("utilization.gpu")))
                    entry["mem_mib"].append(_number(row.get("memory.used")))
            else:
                workers = [w for w in sample.get("workers") or [] if str(w.get("title", "")).startswith("VLLM::Worker")]
                if not workers:
                    workers = [w for w in sample.get("workers") or [] if w.get("title") == "VLLM::EngineCore"]
                for worker in workers:
                    key = str(worker["title"]).split("::", 1)[1]
                    entry = points.setdefault(key, {"kind": "cpu_worker", "t": [], "util_pct": [], "mem_mib": [],
                                                    "cores": _cpu_count(worker.get("cpus"))})
                    cores = _cpu_count(worker.get("cpus")) or 1
                    pct = _number(worker.get("cpu_pct"))
                    entry["t"].append(t)
                    entry["util_pct"].append(None if pct is None else min(100.0, pct / cores))
                    entry["mem_mib"].append(_number(worker.get("rss_mib")))
        for key, entry in points.items():
            series.append({"node": node, "device": key, "label": f"{node}/{key}", **entry})
    if device == "cpu":
        source = "/proc: CPU time of the vLLM worker processes"
        note = ("CPU platform: utilization is the measured CPU use of each vLLM worker process (100% = every "
                "core the worker is bound to is busy), memory its resident set; nvidia-smi is not read")
    else:
        source = "nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total"
        note = "utilization.gpu: percent of time a kernel ran; memory.used in MiB"
    return {
        "source": source,
        "device": device,
        "measured": bool(series),
        "note": note,
        "window": {"start": 0.0 if start is not None else None,
                   "end": (end - origin) if end is not None and start is not None else None},
        "series": series,
        "errors": errors,
    }


def _under_load(entry: dict, window: dict) -> tuple[list, list]:
    start, end = window.get("start"), window.get("end")
    util, mem = [], []
    for t, u, m in zip(entry["t"], entry["util_pct"], entry["mem_mib"], strict=True):
        if start is not None and end is not None and not (start <= t <= end + 1.0):
            continue
        util.append(u)
        mem.append(m)
    return util, mem


def utilization_summary(stage: dict, expect: dict, is_ep: bool) -> dict:
    """Mean per device under load, and gpu_balance's utilization and memory verdicts."""
    usage = utilization_series(stage)
    devices, util_rows, mem_rows = [], [], []
    for index, entry in enumerate(usage["series"]):
        util, mem = _under_load(entry, usage["window"])
        util_values = [u for u in util if u is not None]
        mem_values = [m for m in mem if m is not None]
        devices.append({
            "label": entry["label"], "index": index, "samples": len(util_values),
            "util_mean": statistics.fmean(util_values) if util_values else None,
            "util_max": max(util_values) if util_values else None,
            "mem_mean_mib": statistics.fmean(mem_values) if mem_values else None,
        })
        util_rows += [{"gpu": index, "utilization": u} for u in util_values]
        mem_rows += [{"gpu": index, "memory_used_mib": m} for m in mem_values]
    balance = memory = None
    if util_rows:
        balance = gpu_balance.utilization_balance(
            util_rows, tolerance_points=float(expect["utilization_tolerance_points"]), field="utilization")
        balance["labels"] = {d["index"]: d["label"] for d in devices}
    if mem_rows and usage["device"] != "cpu":
        memory = gpu_balance.memory_balance(mem_rows, tolerance=float(expect["memory_tolerance"]),
                                            field="memory_used_mib")
    return {"source": usage["source"], "measured": usage["measured"], "note": usage["note"],
            "device": usage["device"], "devices": devices, "balance": balance, "memory_balance": memory,
            "errors": usage["errors"], "ep": is_ep, "window": usage["window"], "series": usage["series"]}
