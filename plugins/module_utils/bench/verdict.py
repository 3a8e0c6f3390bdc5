"""Stage against baseline: expected gains, pass/warn/fail, and where to look when a target is missed.

The seed (section 4): "'it runs' is not success; only the expected gain counts".
With the same load as the single-GPU baseline, TP=4 should bring TTFT and TPOT
close to /4 ("about /3 after communication") and throughput up to x3-x4 when
the concurrency is high enough; across nodes, throughput should grow close to
linearly ("2 nodes -> close to 2x"). When a target is missed, look in this
order: compute (is every GPU near 100%, evenly?), communication (does the TP
all-reduce take the fast path?), load (is the concurrency high enough for the
layout?). For EP, every GPU must be within +-20% utilization (the EPLB check),
and an EP+DP stage is judged against a TP-only stage on throughput and memory
efficiency.

Input: stage records as bench_report.build_stage_record() writes them
(results/<deployment>/<stage>.json): the normalized profile, the plan, the raw
`vllm bench serve` result, the samples taken on each node under load, and an
optional NCCL probe result; bench/stage.py reads a record's layout, figures and
utilization under load, this module judges them. Output: plain dicts
(JSON-serialisable).

Pure Python, no Ansible import.
"""
from __future__ import annotations

import copy
import math
import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import profile as bench_profile
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import stage as bench_stage

# Expected gain along one axis of size ratio k > 1 is max(1, efficiency x k):
# 0.75 per GPU gives the seed's TP=4 targets (TTFT and TPOT /3, throughput x3);
# 0.9 per node gives its "2 nodes -> close to 2x" (x1.8). None means the seed
# sets no target for that metric along that axis (PP and DP do not shorten a
# request): the ratio is reported, not judged.
DEFAULT_EXPECTATIONS = {
    "gain_efficiency": {
        "throughput": {"tp": 0.75, "pp": 0.9, "dp": 0.9},
        "latency": {"tp": 0.75, "pp": None, "dp": None},
    },
    # Reaching this fraction of a target is a warn; less is a fail.
    "warn_fraction": 0.8,
    # P99 of a few hundred requests is noisy: missing a P99 target warns at most.
    "p99_worst_status": "warn",
    # Compute: a device averaging less than this under load is not saturated.
    "compute_busy_pct": 80.0,
    # The seed's EPLB rule, percentage points around the mean of all GPUs.
    "utilization_tolerance_points": 20.0,
    "memory_tolerance": 0.10,
    # Load: fewer requests in flight than this per GPU cannot show TP gains
    # (the seed: "a single request on 4 GPUs may even be slower").
    "load_min_concurrency_per_gpu": 4,
    # A server that completes this fraction of the offered request rate is limited by the load.
    "load_rate_bound_fraction": 0.9,
    # MoE: EP+DP against TP-only on the same model.
    "moe_min_throughput_ratio": 1.0,
    "moe_min_memory_efficiency_ratio": 1.0,
}

STATUS_RANK = {"pass": 0, "warn": 1, "fail": 2}
GAIN_CHECKS = (
    # name, label, metric key, kind, percentile
    ("ttft_p50", "TTFT P50", "ttft_p50_ms", "latency", 50),
    ("ttft_p99", "TTFT P99", "ttft_p99_ms", "latency", 99),
    ("tpot_p50", "TPOT P50", "tpot_p50_ms", "latency", 50),
    ("tpot_p99", "TPOT P99", "tpot_p99_ms", "latency", 99),
    ("output_throughput", "output tok/s", "output_throughput", "throughput", None),
    ("total_token_throughput", "total tok/s", "total_token_throughput", "throughput", None),
)
CPU_NOTE = (
    "CPU platform: the seed's gains are GPU targets; CPU figures are measured and set against them, "
    "but never passed"
)


class VerdictError(ValueError):
    """Inputs the verdict cannot use (no baseline, malformed expectations, ...)."""


def worst(statuses) -> str:
    return max(statuses, key=lambda s: STATUS_RANK[s], default="pass")


def _merge(base: dict, override: dict, path: str = "") -> dict:
    result = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if key not in base:
            raise VerdictError(f"unknown expectation {path + key!r}; known: {', '.join(sorted(base))}")
        if isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise VerdictError(f"expectation {path + key!r} must be a mapping, got {value!r}")
            result[key] = _merge(base[key], value, f"{path}{key}.")
        else:
            result[key] = value
    return result


def expectations(overrides: dict | None = None) -> dict:
    """DEFAULT_EXPECTATIONS with the operator's overrides, validated."""
    merged = _merge(DEFAULT_EXPECTATIONS, overrides or {})
    for kind, axes in merged["gain_efficiency"].items():
        for axis, value in axes.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                raise VerdictError(f"gain_efficiency.{kind}.{axis} must be a positive number or null, got {value!r}")
    if not 0 < float(merged["warn_fraction"]) <= 1:
        raise VerdictError(f"warn_fraction must be in (0, 1], got {merged['warn_fraction']!r}")
    if merged["p99_worst_status"] not in STATUS_RANK:
        raise VerdictError(f"p99_worst_status must be pass, warn or fail, got {merged['p99_worst_status']!r}")
    return merged


# ------------------------------------------------------------------ expected gains


def _axis_gain(efficiency, k: float):
    if math.isclose(k, 1.0):
        return 1.0
    if efficiency is None:
        return None
    if k < 1:
        return k
    return max(1.0, float(efficiency) * k)


def expected_gains(baseline: dict, stage: dict, expect: dict) -> dict:
    """Expected throughput gain and latency gain (baseline / stage) of a stage, with the reasoning."""
    gains: dict = {}
    explain = []
    for kind in ("throughput", "latency"):
        total = 1.0
        for axis in bench_stage.AXES:
            k = stage[axis] / baseline[axis]
            efficiency = expect["gain_efficiency"][kind][axis]
            gain = _axis_gain(efficiency, k)
            if gain is None:
                total = None
                explain.append(f"{kind}: {axis.upper()} {baseline[axis]}->{stage[axis]} has no target "
                               f"(gain_efficiency.{kind}.{axis} is null): reported, not judged")
                break
            total *= gain
            if not math.isclose(k, 1.0):
                word = "x" if kind == "throughput" else "/"
                explain.append(f"{kind}: {axis.upper()} {baseline[axis]}->{stage[axis]} expects {word}{gain:.2f} "
                               f"({efficiency} per unit of {axis.upper()})")
        gains[kind] = total
    gains["explain"] = explain
    return gains


def _gain_status(gain: float, target: float, warn_fraction: float) -> str:
    if gain >= target * (1 - 1e-9):
        return "pass"
    if gain >= target * warn_fraction:
        return "warn"
    return "fail"


# ------------------------------------------------------------------ health of one run


def _layout_proof(stage: dict) -> dict:
    """Do the worker processes seen under load match the plan's ranks per node?"""
    plan = stage.get("plan") or {}
    samples = stage.get("samples") or {}
    mode = launch.of_plan(plan)
    if not mode.worker_processes_named:
        return {"check": "layout", "status": "pass", "proven": False,
                "detail": f"backend {mode.name}: the worker processes carry no rank names, their placement is "
                          "verified by vllm_verify"}
    expected: dict[str, set] = {}
    for rank in (plan.get("expect") or {}).get("rank_assignments") or []:
        expected.setdefault(rank.get("node"), set()).add(rank.get("process"))
    if not expected or not samples:
        return {"check": "layout", "status": "pass", "proven": False,
                "detail": "no plan ranks or no samples: the workers under load were not compared with the plan"}
    problems, unproven = [], []
    for node, processes in sorted(expected.items()):
        titles = {w.get("title") for s in samples.get(node) or [] if isinstance(s, dict)
                  for w in s.get("workers") or []}
        if not any(str(t).startswith("VLLM::") for t in titles):
            unproven.append(node)
            continue
        found = {str(t).split("::", 1)[1] for t in titles if str(t).startswith("VLLM::Worker")}
        # world_size 1 on the uniprocess executor runs the model inside EngineCore.
        if not found and processes == {"Worker"} and "VLLM::EngineCore" in titles:
            found = {"Worker"}
        if found != processes:
            problems.append(f"{node}: expected {', '.join(sorted(processes))}, "
                            f"found {', '.join(sorted(found)) or 'no worker'}")
    if problems:
        return {"check": "layout", "status": "fail", "proven": False,
                "detail": "the server under load is not the planned layout: " + "; ".join(problems)}
    if unproven:
        return {"check": "layout", "status": "pass", "proven": False,
                "detail": f"no VLLM:: process titles on {', '.join(unproven)} (setproctitle missing?): not proven"}
    return {"check": "layout", "status": "pass", "proven": True,
            "detail": "worker processes under load match the plan on every node"}


def _health(stage: dict, metrics: dict, usage: dict, expect: dict) -> list[dict]:
    checks = []
    failed = metrics.get("failed") or 0
    completed = metrics.get("completed") or 0
    prompts = metrics.get("num_prompts") or 0
    if failed or completed < prompts:
        checks.append({"check": "requests", "status": "fail",
                       "detail": f"{failed} of {prompts} requests failed, {completed} completed"})
    else:
        checks.append({"check": "requests", "status": "pass", "detail": f"all {prompts} requests completed"})
    disagreements = bench_profile.result_disagreements(stage.get("profile") or {}, stage.get("result") or {})
    if disagreements:
        text = ", ".join(f"{d['field']} (profile {d['profile']}, result {d['result']})" for d in disagreements)
        checks.append({"check": "profile", "status": "fail",
                       "detail": f"the saved result contradicts its recorded profile: {text}"})
    checks.append(_layout_proof(stage))
    balance = usage.get("balance")
    if balance is not None and len(usage["devices"]) > 1:
        detail = "; ".join(balance["reasons"]) or (
            f"every device within +-{balance['tolerance_points']:.0f} points of the mean {balance['mean']:.1f}%")
        if usage["ep"]:
            status = balance["status"]
            name = "ep_balance"
            detail = f"EP (the seed's EPLB check): {detail}"
        else:
            status = "warn" if balance["status"] == "fail" else "pass"
            name = "utilization_balance"
        checks.append({"check": name, "status": status, "detail": detail})
    elif usage["ep"]:
        checks.append({"check": "ep_balance", "status": "warn",
                       "detail": "EP stage without utilization samples: the EPLB balance was not checked"})
    memory = usage.get("memory_balance")
    if memory is not None and memory["status"] == "fail":
        checks.append({"check": "memory_balance", "status": "warn", "detail": "; ".join(memory["reasons"])})
    return checks


# ------------------------------------------------------------------ troubleshooting


def _compute_step(usage: dict, expect: dict) -> dict:
    busy = float(expect["compute_busy_pct"])
    if not usage["measured"]:
        return {"step": "compute", "status": "unknown", "symptom_only": False,
                "evidence": ["no per-device utilization was measured under load"]}
    evidence, fired = [], False
    means = [d for d in usage["devices"] if d["util_mean"] is not None]
    if not means:
        return {"step": "compute", "status": "unknown", "symptom_only": False,
                "evidence": ["no samples fell inside the load window"]}
    low = [d for d in means if d["util_mean"] < busy]
    for device in low:
        fired = True
        evidence.append(f"{device['label']} averaged {device['util_mean']:.0f}% under load "
                        f"(not near 100%: below {busy:.0f}%)")
    balance = usage.get("balance")
    unbalanced = balance is not None and balance["status"] == "fail"
    if unbalanced:
        fired = True
        labels = balance.get("labels", {})
        for reason in balance["reasons"]:
            evidence.append(re.sub(r"GPU (\d+)", lambda m: labels.get(int(m.group(1)), m.group(0)), reason))
    if not fired:
        spread = balance["spread"] if balance else 0.0
        evidence.append(f"every device averaged >= {busy:.0f}% under load (lowest "
                        f"{min(d['util_mean'] for d in means):.0f}%, spread {spread:.0f} points)")
    # Evenly low utilization is a symptom: devices wait on something (the network, too little load).
    return {"step": "compute", "status": "fired" if fired else "clear", "evidence": evidence,
            "symptom_only": fired and not unbalanced}


def _communication_step(stage: dict, layout: dict) -> dict:
    evidence, fired, proven_clear = [], False, False
    if layout["tp"] == 1 and layout["pp"] == 1:
        return {"step": "communication", "status": "clear",
                "evidence": ["TP=1 and PP=1: no collective communication inside a replica"]}
    if layout["tp_crosses_nodes"]:
        fired = True
        backend = ((stage.get("plan") or {}).get("expect") or {}).get("distributed_backend") or "the collective"
        evidence.append(f"TP={layout['tp']} spans nodes: every layer's all-reduce ({backend}) crosses the node "
                        "network instead of staying inside a node (TP belongs inside the NVLink domain)")
    if layout["device"] != "cpu" and layout["tp"] > 1 and layout["nvlink"] is False:
        fired = True
        evidence.append(f"the GPUs ({layout['gpu_name']}) have no NVLink between every pair: TP={layout['tp']} "
                        "all-reduce goes over PCIe")
    network = stage.get("network") or {}
    verdict = network.get("verdict") or {}
    transport = (network.get("transport") or {}).get("transport")
    if verdict.get("status") in ("warn", "fail"):
        fired = True
        reasons = "; ".join(verdict.get("reasons") or []) or "no reason given"
        evidence.append(f"NCCL all-reduce probe: {verdict['status']}: {reasons}")
    elif verdict.get("status") == "pass":
        proven_clear = True
        metric = verdict.get("metric") or {}
        busbw = metric.get("busbw_gbps")
        evidence.append("NCCL all-reduce probe passed" + (f" ({busbw:.1f} GB/s busbw)" if busbw else ""))
    if transport in ("socket", "shm", "pcie") and layout["tp"] > 1 and layout["device"] != "cpu":
        fired = True
        evidence.append(f"NCCL transport is {transport}: TP all-reduce is on a slow path")
    elif transport:
        evidence.append(f"NCCL transport: {transport}")
    if fired:
        return {"step": "communication", "status": "fired", "evidence": evidence}
    if proven_clear:
        return {"step": "communication", "status": "clear", "evidence": evidence}
    evidence.append("no NCCL probe result recorded for this deployment (nccl_network with its probe on): "
                    "the all-reduce path is not proven")
    return {"step": "communication", "status": "unknown", "evidence": evidence}


def _load_step(profile: dict, metrics: dict, layout: dict, expect: dict) -> dict:
    evidence, fired = [], False
    prompts = profile["num_prompts"]
    configured = min(profile["max_concurrency"] or prompts, prompts)
    needed = int(expect["load_min_concurrency_per_gpu"]) * layout["gpus"]
    if configured < needed:
        fired = True
        evidence.append(f"max concurrency {configured} is below {needed} "
                        f"({expect['load_min_concurrency_per_gpu']} per GPU x {layout['gpus']}): at low concurrency "
                        "the distributed gain cannot show (raise --max-concurrency and --max-num-seqs)")
    rate = profile["request_rate"]
    served = metrics.get("request_throughput")
    if rate != "inf" and served is not None and served >= float(expect["load_rate_bound_fraction"]) * rate:
        fired = True
        evidence.append(f"the server kept up with the offered {rate:g} requests/s (served {served:.2f}/s): the load, "
                        "not the server, caps throughput (raise --request-rate, or use inf)")
    achieved = metrics.get("achieved_concurrency")
    if layout["pp"] > 1 and achieved is not None and achieved < 2 * layout["pp"]:
        fired = True
        evidence.append(f"{achieved:.1f} requests in flight on average for PP={layout['pp']}: the pipeline has "
                        "bubbles (PP needs several batches in flight)")
    if not fired:
        text = f"max concurrency {configured} >= {needed} for {layout['gpus']} devices"
        if achieved is not None:
            text += f"; {achieved:.1f} requests in flight on average"
        if rate != "inf" and served is not None:
            text += f"; served {served:.2f} of the offered {rate:g} requests/s"
        evidence.append(text)
    return {"step": "load", "status": "fired" if fired else "clear", "evidence": evidence}


def troubleshoot(stage: dict, layout: dict, metrics: dict, usage: dict, expect: dict) -> dict:
    """The seed's order: compute -> communication -> load; the first step that fires is the likely cause."""
    steps = [
        _compute_step(usage, expect),
        _communication_step(stage, layout),
        _load_step(bench_profile.normalize_profile(stage["profile"]), metrics, layout, expect),
    ]
    fired = [s["step"] for s in steps if s["status"] == "fired"]
    compute = steps[0]
    if not fired:
        return {"order": steps, "likely_cause": None,
                "summary": "no step fired on the recorded evidence: collect what is unknown"}
    if fired[0] == "compute" and compute["symptom_only"] and len(fired) > 1:
        # Every device is evenly under-used: a later step that fired explains why.
        cause = fired[1]
        summary = (f"the devices are evenly under-used, which {cause} explains: look at {cause} first")
    elif fired[0] == "compute" and compute["symptom_only"]:
        cause = "compute"
        summary = ("the devices are evenly under-used and neither communication nor load explains it: "
                   "look at compute first (scheduling, the CPU side, --max-num-seqs)")
    else:
        cause = fired[0]
        summary = f"look at {cause} first"
    return {"order": steps, "likely_cause": cause, "summary": summary}


# ------------------------------------------------------------------ one stage


def judge_stage(name: str, stage: dict, baseline_name: str, baseline: dict, expect: dict) -> dict:
    layout = bench_stage.stage_layout(stage["plan"])
    base_layout = bench_stage.stage_layout(baseline["plan"])
    metrics = bench_stage.stage_metrics(stage["result"])
    base_metrics = bench_stage.stage_metrics(baseline["result"])
    is_baseline = name == baseline_name
    cpu = layout["device"] == "cpu" or base_layout["device"] == "cpu"
    gains = expected_gains(base_layout, layout, expect)
    usage = bench_stage.utilization_summary(stage, expect, layout["enable_expert_parallel"])
    checks = []
    for check, label, key, kind, percentile in GAIN_CHECKS:
        value, reference = metrics.get(key), base_metrics.get(key)
        target = gains[kind]
        row = {"check": check, "label": label, "kind": kind, "stage": value, "baseline": reference,
               "expected_gain": target, "gain": None, "target_met": None}
        if value is None or reference is None or value <= 0 or reference <= 0:
            row.update(status="warn", note="metric missing from the saved result")
        else:
            gain = reference / value if kind == "latency" else value / reference
            row["gain"] = gain
            if is_baseline:
                row.update(status="info", note="the baseline itself")
            elif target is None:
                row.update(status="info", note="no target for this layout change: reported only")
            else:
                status = _gain_status(gain, target, float(expect["warn_fraction"]))
                if percentile == 99 and STATUS_RANK[status] > STATUS_RANK[expect["p99_worst_status"]]:
                    status = expect["p99_worst_status"]
                row["target_met"] = status == "pass"
                row["status"] = "not_comparable" if cpu else status
        checks.append(row)
    health = _health(stage, metrics, usage, expect)
    judged = [c for c in checks if c["status"] in STATUS_RANK]
    missed = [c for c in checks if c["target_met"] is False]
    statuses = [c["status"] for c in judged if not is_baseline] + [h["status"] for h in health]
    if cpu and any(c["status"] == "not_comparable" for c in checks):
        statuses.append("warn")
    status = worst(statuses)
    reasons = []
    if cpu:
        if status == "pass":
            status = "warn"
        reasons.append(CPU_NOTE)
    for check in missed:
        reasons.append(f"{check['label']}: {'/' if check['kind'] == 'latency' else 'x'}{check['gain']:.2f} "
                       f"against the expected {'/' if check['kind'] == 'latency' else 'x'}{check['expected_gain']:.2f}")
    reasons += [f"{h['check']}: {h['detail']}" for h in health if h["status"] != "pass"]
    return {
        "stage": name,
        "is_baseline": is_baseline,
        "baseline": baseline_name,
        "layout": layout,
        "layout_text": bench_stage.describe_layout(layout),
        "metrics": metrics,
        "expected": gains,
        "checks": checks,
        "health": health,
        "utilization": usage,
        "troubleshooting": troubleshoot(stage, layout, metrics, usage, expect) if missed else None,
        "gpu_targets": "not comparable (CPU)" if cpu else "judged",
        "status": status,
        "reasons": reasons,
    }


# ------------------------------------------------------------------ MoE: EP+DP against TP-only


def _measured_memory_gib(judged: dict) -> float | None:
    usage = judged["utilization"]
    if usage["device"] == "cpu":
        return None
    means = [d["mem_mean_mib"] for d in usage["devices"] if d["mem_mean_mib"] is not None]
    return sum(means) / 1024.0 if means else None


def compare_moe(judged: list[dict], expect: dict) -> list[dict]:
    """Each EP+DP stage against the TP-only stage of the same model (same device count first)."""
    comparisons = []
    ep_stages = [j for j in judged if j["layout"]["enable_expert_parallel"]]
    tp_only = [j for j in judged if j["layout"]["is_moe"] and not j["layout"]["enable_expert_parallel"]]
    for ep in ep_stages:
        peers = [t for t in tp_only if t["layout"]["model"] == ep["layout"]["model"]]
        if not peers:
            comparisons.append({"ep_stage": ep["stage"], "tp_stage": None, "status": "warn",
                                "reasons": ["no TP-only stage of the same model to compare with (the seed's "
                                            "control: the same model without --enable-expert-parallel)"]})
            continue
        peer = min(peers, key=lambda t: (abs(t["layout"]["gpus"] - ep["layout"]["gpus"]), t["stage"]))
        cpu = "cpu" in (ep["layout"]["device"], peer["layout"]["device"])
        warn_fraction = float(expect["warn_fraction"])
        rows, statuses, reasons = [], [], []
        ep_thr, tp_thr = ep["metrics"]["output_throughput"], peer["metrics"]["output_throughput"]
        if ep_thr and tp_thr:
            ratio = ep_thr / tp_thr
            status = _gain_status(ratio, float(expect["moe_min_throughput_ratio"]), warn_fraction)
            rows.append({"metric": "output tok/s", "ep": ep_thr, "tp_only": tp_thr, "ratio": ratio,
                         "expected": expect["moe_min_throughput_ratio"], "status": status})
            statuses.append(status)
        ep_mem, tp_mem = _measured_memory_gib(ep), _measured_memory_gib(peer)
        if ep_mem and tp_mem and ep_thr and tp_thr:
            ratio = (ep_thr / ep_mem) / (tp_thr / tp_mem)
            status = _gain_status(ratio, float(expect["moe_min_memory_efficiency_ratio"]), warn_fraction)
            rows.append({"metric": "output tok/s per GiB used (measured)", "ep": ep_thr / ep_mem,
                         "tp_only": tp_thr / tp_mem, "ratio": ratio,
                         "expected": expect["moe_min_memory_efficiency_ratio"], "status": status})
            statuses.append(status)
        ep_kv, tp_kv = ep["layout"]["kv_cache_tokens"], peer["layout"]["kv_cache_tokens"]
        if ep_kv and tp_kv:
            ep_per_gpu = ep_kv * ep["layout"]["dp"] / ep["layout"]["gpus"]
            tp_per_gpu = tp_kv * peer["layout"]["dp"] / peer["layout"]["gpus"]
            rows.append({"metric": "KV tokens per device (plan)", "ep": ep_per_gpu, "tp_only": tp_per_gpu,
                         "ratio": ep_per_gpu / tp_per_gpu, "expected": None, "status": "info"})
        if not statuses:
            statuses.append("warn")
            reasons.append("no throughput figures to compare")
        status = worst(statuses)
        if cpu:
            status = "warn" if status == "pass" else status
            reasons.insert(0, CPU_NOTE)
        comparisons.append({"ep_stage": ep["stage"], "tp_stage": peer["stage"], "rows": rows,
                            "status": status, "reasons": reasons})
    return comparisons


# ------------------------------------------------------------------ all stages


def resolve_baseline(stages: dict, requested: str | None = None) -> str:
    """The baseline stage: the one asked for, else the one marked, else the only single-device stage."""
    if requested:
        if requested not in stages:
            raise VerdictError(f"baseline stage {requested!r} has no result; recorded stages: "
                               f"{', '.join(sorted(stages)) or 'none'}")
        return requested
    marked = sorted(name for name, stage in stages.items() if stage.get("baseline"))
    if len(marked) > 1:
        raise VerdictError(f"stages {', '.join(marked)} are all marked as the baseline: keep one (delete the "
                           "others' results or re-run them with vllm_benchmark_baseline: false)")
    if marked:
        return marked[0]
    singles = sorted(name for name, stage in stages.items()
                     if bench_stage.stage_layout(stage.get("plan") or {})["gpus"] == 1)
    if len(singles) == 1:
        return singles[0]
    raise VerdictError("no baseline: run the single-GPU anchor with vllm_benchmark_baseline: true "
                       f"(recorded stages: {', '.join(sorted(stages)) or 'none'})")


def comparability(baseline_name: str, baseline: dict, name: str, stage: dict) -> dict | None:
    """Why a stage cannot be compared with the baseline, or None when it can."""
    try:
        bench_profile.require_same_profile(baseline.get("profile") or {}, stage.get("profile") or {},
                                           baseline_name, name)
    except bench_profile.ProfileMismatchError as error:
        return {"stage": name, "reason": str(error), "differences": error.differences}
    except bench_profile.ProfileError as error:
        return {"stage": name, "reason": f"stage {name!r}: {error}", "differences": []}
    base_model = bench_stage.stage_layout(baseline.get("plan") or {})["model"]
    model = bench_stage.stage_layout(stage.get("plan") or {})["model"]
    if base_model != model:
        return {"stage": name, "differences": [{"field": "model", "reference": base_model, "candidate": model}],
                "reason": f"stage {name!r} serves {model!r}, the baseline {baseline_name!r} serves {base_model!r}: "
                          "gains are only defined for one model"}
    return None


def evaluate(stages: dict, baseline: str | None = None, overrides: dict | None = None) -> dict:
    """Judge every stage against the baseline; refuse stages measured under another load."""
    expect = expectations(overrides)
    if not stages:
        raise VerdictError("no stage results to judge")
    baseline_name = resolve_baseline(stages, baseline)
    base = stages[baseline_name]
    judged, refused = [], []
    for name in sorted(stages,
                       key=lambda n: (n != baseline_name, bench_stage.stage_layout(stages[n]["plan"])["gpus"], n)):
        refusal = None if name == baseline_name else comparability(baseline_name, base, name, stages[name])
        if refusal:
            refused.append(refusal)
            continue
        judged.append(judge_stage(name, stages[name], baseline_name, base, expect))
    statuses = [j["status"] for j in judged] + (["warn"] if refused else [])
    moe = compare_moe(judged, expect)
    statuses += [m["status"] for m in moe]
    return {
        "baseline": baseline_name,
        "profile": base["profile"],
        "profile_fingerprint": bench_profile.fingerprint(base["profile"]),
        "expectations": expect,
        "stages": judged,
        "refused": refused,
        "moe": moe,
        "status": worst(statuses),
    }
