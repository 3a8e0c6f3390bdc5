"""What Prometheus saw during a benchmark stage: running and waiting requests, KV usage and output
throughput per replica, over the stage's load window.

The stage record keeps them (``timelines``) and the report draws them (timelines.png). Read from a
Prometheus that scrapes the deployment (role vllm_monitoring: targets labelled ``deployment``, ``node``,
and ``replica``, the plan's DP rank of vLLM's ``engine``). A replica is named by its node and its replica
label: vLLM's own DP serves every engine from the head (one node, replicas 0..n-1); independent servers are
one per node, each with its own ranks.

Pure Python (3.11+); imports nothing from Ansible; matplotlib only inside ``plot_timelines``.
"""

from __future__ import annotations

import json
import math
import os
import urllib.error
import urllib.parse
import urllib.request

from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench.plotting import PALETTE, pyplot

# name: (PromQL with {selector} and {rate} to fill in, unit, what it shows)
QUERIES = {
    "running": ("sum by (node, replica) (vllm:num_requests_running{{{selector}}})", "requests",
                "requests running"),
    "waiting": ("sum by (node, replica) (vllm:num_requests_waiting{{{selector}}})", "requests",
                "requests waiting"),
    "kv_cache_usage": ("100 * max by (node, replica) (vllm:kv_cache_usage_perc{{{selector}}})", "%",
                       "KV cache usage"),
    "output_tokens_per_s": ("sum by (node, replica) (rate(vllm:generation_tokens_total{{{selector}}}[{rate}]))",
                            "tok/s", "output throughput"),
}
# Prometheus keeps at most 11,000 points a series per query_range; a stage needs far fewer.
MAX_POINTS = 600


class TimelineError(ValueError):
    """A window or an answer that gives no timeline."""


def seconds(duration) -> float:
    """Seconds of a Prometheus duration (``15s``, ``1m``, ``500ms``) or a number."""
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        return float(duration)
    text = str(duration).strip()
    for suffix, factor in (("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)):
        if text.endswith(suffix) and text[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(text[: -len(suffix)]) * factor
    raise TimelineError(f"{duration!r} is not a duration; expected seconds or a Prometheus duration such as 15s")


def queries(deployment, scrape_interval="15s"):
    """``{name: PromQL}`` for one deployment; the rate window is four scrapes (rate needs two samples)."""
    if not deployment or not isinstance(deployment, str) or '"' in deployment or "\\" in deployment:
        raise TimelineError(f"deployment {deployment!r}: expected the plan's deployment name")
    rate = f"{max(1, math.ceil(4 * seconds(scrape_interval)))}s"
    selector = f'deployment="{deployment}"'
    return {name: expr.format(selector=selector, rate=rate) for name, (expr, _, _) in QUERIES.items()}


def window_range(window, scrape_interval="15s", margin_s=None):
    """``(start, end, step)`` of a stage's load window with a margin of two scrapes each side."""
    if not isinstance(window, dict) or "load_start" not in window or "load_end" not in window:
        raise TimelineError("the stage has no load window (load_start, load_end); expected a recorded result "
                            "with its duration and end time")
    scrape = seconds(scrape_interval)
    margin = 2 * scrape if margin_s is None else float(margin_s)
    start, end = float(window["load_start"]) - margin, float(window["load_end"]) + margin
    if end <= start:
        raise TimelineError(f"load window {window['load_start']}..{window['load_end']} is empty")
    step = max(scrape / 2, (end - start) / MAX_POINTS, 1.0)
    return start, end, step


def query_range(url, expr, start, end, step, timeout=10.0, opener=urllib.request.urlopen):
    """Prometheus's matrix for ``expr`` (its /api/v1/query_range)."""
    address = url.rstrip("/") + "/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    with opener(address, timeout=timeout) as response:
        body = json.loads(response.read().decode("utf-8"))
    if body.get("status") != "success":
        raise TimelineError(f"{expr}: Prometheus answered {body.get('errorType')}: {body.get('error')}")
    data = body.get("data") or {}
    if data.get("resultType") != "matrix":
        raise TimelineError(f"{expr}: expected a matrix from query_range, got {data.get('resultType')!r}")
    return data.get("result") or []


def series_points(matrix):
    """``[{replica, node, points: [[t, value], ...]}]`` sorted by node and replica; NaN points dropped."""
    out = []
    for series in matrix:
        labels = series.get("metric") or {}
        points = []
        for stamp, value in series.get("values") or []:
            number = float(value)
            if not math.isnan(number):
                points.append([float(stamp), number])
        out.append({"node": labels.get("node", ""), "replica": labels.get("replica", ""), "points": points})
    return sorted(out, key=lambda s: (s["node"], s["replica"]))


def stage_timelines(url, deployment, window, scrape_interval="15s", timeout=10.0, opener=urllib.request.urlopen):
    """The ``timelines`` of a stage record: every query's series over the load window.

    Never raises for Prometheus being away: the stage is recorded anyway, with ``error`` saying why there is
    no timeline (the benchmark's figures come from `vllm bench serve`, not from Prometheus).
    """
    record = {"source": url, "deployment": deployment, "scrape_interval": str(scrape_interval), "series": {},
              "empty": [], "error": None}
    try:
        start, end, step = window_range(window, scrape_interval)
        exprs = queries(deployment, scrape_interval)
    except TimelineError as exc:
        record["error"] = str(exc)
        return record
    record.update(start=start, end=end, step=step, load_start=float(window["load_start"]),
                  load_end=float(window["load_end"]), queries=exprs)
    for name, expr in exprs.items():
        try:
            series = series_points(query_range(url, expr, start, end, step, timeout, opener))
        except (OSError, ValueError, urllib.error.URLError) as exc:
            record["error"] = f"Prometheus at {url}: {exc}"
            record["series"] = {}
            return record
        record["series"][name] = series
        if not any(s["points"] for s in series):
            record["empty"].append(name)
    return record


def summary(timelines):
    """One line per timeline: the peak of each replica during the load (for the report's text)."""
    if not timelines or timelines.get("error"):
        return []
    lines = []
    start, end = timelines["load_start"], timelines["load_end"]
    for name, (_, unit, words) in QUERIES.items():
        peaks = []
        for series in timelines["series"].get(name, []):
            inside = [v for t, v in series["points"] if start <= t <= end]
            if inside:
                peaks.append(f"{series['node'] or '?'}/{series['replica'] or '-'} {max(inside):.3g}")
        lines.append(f"{words} ({unit}), peak per replica during the load: " + (", ".join(peaks) or "no series"))
    return lines


def plot_timelines(stages, path):
    """timelines.png: one row per stage with timelines, one column per query, one line per replica.

    ``stages``: ``[(stage name, stage record)]`` in the report's order. None, and no file (a stale one of an
    earlier report is removed), when no stage has any (no Prometheus named, or it answered nothing).
    """
    rows = []
    for stage, record in stages:
        timelines = record.get("timelines") or {}
        series_lists = (timelines.get("series") or {}).values()
        if not timelines.get("error") and any(one["points"] for series in series_lists for one in series):
            rows.append((stage, timelines))
    if not rows:
        if os.path.exists(path):
            os.remove(path)  # a stale plot of an earlier report would be read as this one's
        return None
    plt = pyplot()
    names = list(QUERIES)
    fig, axes = plt.subplots(len(rows), len(names), figsize=(3.4 * len(names), 2.6 * len(rows)), squeeze=False)
    for row, (stage, timelines) in enumerate(rows):
        origin = timelines["load_start"]
        for column, name in enumerate(names):
            axis = axes[row][column]
            _, unit, words = QUERIES[name]
            series = timelines["series"].get(name) or []
            for index, one in enumerate(series):
                if one["points"]:
                    axis.plot([t - origin for t, _ in one["points"]], [v for _, v in one["points"]],
                              color=PALETTE[index % len(PALETTE)], linewidth=1.2,
                              label=f"{one['node'] or '?'} / replica {one['replica'] or '-'}")
            axis.axvspan(0, timelines["load_end"] - origin, color="#999999", alpha=0.12, linewidth=0)
            axis.set_title(f"{stage}: {words}" if column == 0 else words, loc="left", fontsize=8)
            axis.set_ylabel(unit)
            axis.set_xlabel("s from the load's start (shaded: the load)")
            if not series:
                axis.text(0.5, 0.5, "no series", transform=axis.transAxes, ha="center", va="center")
        axes[row][0].legend(loc="upper left", fontsize=6, frameon=False)
    fig.suptitle("What Prometheus saw per replica during each stage's load", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
