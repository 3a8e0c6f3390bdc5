"""What Prometheus knows of a deployment, as the doctor's evidence (``evidence["metrics"]``).

``gather`` asks the Prometheus of role vllm_monitoring (targets labelled ``deployment``, ``node``,
``replica``) for the alerts firing on the deployment and, per replica, the recent trend: requests
waiting while the KV cache was near full, and the peaks of waiting requests and KV usage over the
look-back. The observations in ``observations_metrics.py`` read it; the evidence file keeps it, so a
saved diagnosis replays without Prometheus.

Pure Python (3.11+); imports nothing from Ansible.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

# The KV usage (0-1) from which waiting requests mean the replica is out of KV room: the alert
# VllmQueueWithKvCacheFull's threshold (roles/vllm_monitoring/files/rules/vllm-cluster.rules.yml).
KV_FULL = 0.9


class MetricsError(ValueError):
    """An answer of Prometheus the doctor cannot read."""


def _get(url, path, params=None, timeout=10.0, opener=urllib.request.urlopen):
    address = url.rstrip("/") + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with opener(address, timeout=timeout) as response:
        body = json.loads(response.read().decode("utf-8"))
    if body.get("status") != "success":
        raise MetricsError(f"{path}: Prometheus answered {body.get('errorType')}: {body.get('error')}")
    return body.get("data") or {}


def trend_queries(deployment, lookback="5m", resolution="15s", kv_full=KV_FULL):
    """``{name: PromQL}``: per (node, replica), over ``lookback``."""
    if not deployment or not isinstance(deployment, str) or '"' in deployment or "\\" in deployment:
        raise MetricsError(f"deployment {deployment!r}: expected the plan's deployment name")
    selector = f'{{deployment="{deployment}"}}'
    both = (f"(vllm:num_requests_waiting{selector} > 0) and on (node, replica, instance) "
            f"(vllm:kv_cache_usage_perc{selector} >= {kv_full})")
    return {
        # Moments (one per resolution step) at which requests waited while the KV cache was near full.
        "saturated_moments": f"count_over_time(({both})[{lookback}:{resolution}])",
        "waiting_max": f"max_over_time(vllm:num_requests_waiting{selector}[{lookback}])",
        "kv_usage_max": f"max_over_time(vllm:kv_cache_usage_perc{selector}[{lookback}])",
        "running_now": f"vllm:num_requests_running{selector}",
        "waiting_now": f"vllm:num_requests_waiting{selector}",
        "kv_usage_now": f"vllm:kv_cache_usage_perc{selector}",
    }


def firing_alerts(data, deployment):
    """The firing alerts of Prometheus's /api/v1/alerts answer that name the deployment (or no deployment)."""
    alerts = []
    for alert in data.get("alerts") or []:
        labels = alert.get("labels") or {}
        if alert.get("state") != "firing" or labels.get("deployment", deployment) != deployment:
            continue
        annotations = alert.get("annotations") or {}
        alerts.append({"alertname": labels.get("alertname", ""), "severity": labels.get("severity", ""),
                       "node": labels.get("node", ""), "replica": labels.get("replica", ""),
                       "summary": annotations.get("summary") or annotations.get("description") or "",
                       "active_at": alert.get("activeAt", "")})
    return sorted(alerts, key=lambda a: (a["alertname"], a["node"], a["replica"]))


def replica_trends(answers):
    """``[{node, replica, <query>: value}]`` from each query's instant vector, sorted by node and replica."""
    rows = {}
    for name, result in answers.items():
        for series in result:
            labels = series.get("metric") or {}
            key = (labels.get("node", ""), labels.get("replica", ""))
            row = rows.setdefault(key, {"node": key[0], "replica": key[1]})
            row[name] = float(series["value"][1])
    return [rows[key] for key in sorted(rows)]


def gather(url, deployment, lookback="5m", resolution="15s", timeout=10.0, opener=urllib.request.urlopen):
    """``evidence["metrics"]``: firing alerts and per-replica trends; ``error`` says why when Prometheus is away."""
    record = {"url": url, "deployment": deployment, "lookback": lookback, "kv_full": KV_FULL, "alerts": [],
              "replicas": [], "error": None}
    try:
        queries = trend_queries(deployment, lookback, resolution)
        record["alerts"] = firing_alerts(_get(url, "/api/v1/alerts", timeout=timeout, opener=opener), deployment)
        answers = {name: _get(url, "/api/v1/query", {"query": expr}, timeout, opener).get("result") or []
                   for name, expr in queries.items()}
    except (OSError, ValueError, urllib.error.URLError) as exc:
        record["error"] = f"Prometheus at {url}: {exc}"
        return record
    record["replicas"] = replica_trends(answers)
    return record
