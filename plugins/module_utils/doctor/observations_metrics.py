"""Observations of what Prometheus knows (``evidence["metrics"]``, gathered by ``metrics.gather``): the trend
of each replica and the alerts firing. Without a Prometheus named, they see nothing.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import make_hit


def _pct(value):
    return f"{100 * value:.0f}"


def obs_kv_saturated(cluster, params):
    """Replicas at which requests waited while the KV cache was near full, during the look-back."""
    metrics = cluster.metrics
    if not metrics or metrics.get("error"):
        return []
    minimum = int(params.get("min_moments", 1))
    hits = []
    for row in metrics.get("replicas") or []:
        moments = int(row.get("saturated_moments") or 0)
        if moments < minimum:
            continue
        node = row.get("node") or None
        hits.append(make_hit(
            node, f"Prometheus {metrics.get('url')}",
            f"replica {row.get('replica') or '-'} on {node or '?'}: requests waited at {moments} moment(s) of the "
            f"last {metrics.get('lookback')} while KV usage was at or above {_pct(metrics.get('kv_full', 0.9))}% "
            f"(peak KV {_pct(row.get('kv_usage_max') or 0)}%, up to {row.get('waiting_max', 0):.0f} waiting; now "
            f"{row.get('running_now', 0):.0f} running, {row.get('waiting_now', 0):.0f} waiting)",
            replica=row.get("replica") or "-", moments=moments, kv_pct=_pct(row.get("kv_usage_max") or 0),
            waiting=f"{row.get('waiting_max', 0):.0f}", lookback=metrics.get("lookback"),
            kv_full_pct=_pct(metrics.get("kv_full", 0.9)), url=metrics.get("url")))
    return hits


def obs_alert_firing(cluster, params):
    """Alerts Prometheus fires on the deployment; ``params.ignore`` names alerts another observation covers."""
    metrics = cluster.metrics
    if not metrics or metrics.get("error"):
        return []
    ignore = set(params.get("ignore") or [])
    hits = []
    for alert in metrics.get("alerts") or []:
        if alert.get("alertname") in ignore:
            continue
        line = f"{alert['alertname']} ({alert.get('severity') or 'no severity'}) firing since {alert.get('active_at') or '?'}"
        if alert.get("replica"):
            line += f" on replica {alert['replica']}"
        if alert.get("summary"):
            line += f": {alert['summary']}"
        hits.append(make_hit(alert.get("node") or None, f"Prometheus {metrics.get('url')} /api/v1/alerts", line,
                             alertname=alert["alertname"], severity=alert.get("severity") or "-",
                             summary=alert.get("summary") or "-", url=metrics.get("url")))
    return hits


def obs_metrics_unreadable(cluster, params):
    """A Prometheus was named but could not be read: the doctor says so rather than diagnosing without it."""
    metrics = cluster.metrics
    if not metrics or not metrics.get("error"):
        return []
    return [make_hit(None, "controller", metrics["error"], url=metrics.get("url"), error=metrics["error"])]
