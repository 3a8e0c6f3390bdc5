"""The router's view of its workers, read from what roles/doctor/tasks/gather.yml saved.

On each router host that fronts the deployment the doctor GETs, without a key, vllm-router's ``/list_workers``,
``/workers`` and ``/readiness`` on its client port and ``/metrics`` on its metrics port. ``routers_from_saved``
turns the saved answers (``routers`` in doctor-evidence.json, one entry per read) into one view per router host:

    {host, url, error, listed: [url], workers: {url: {healthy, load, ...}}, readiness: {status, body},
     metrics: {url, error, health: {url: 0|1}, processed: {url: n}, cb_state: {url: n}, active_workers: n}}

``error`` is set when the router's client port did not answer (nothing listens, the host is unreachable):
the other fields are then empty. ``planned_rows`` puts the view beside the deployment's planned workers
(``router_workers`` of its plan): one row per planned worker, listed or not, healthy or not, its requests.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

import json
import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.workers import (
    RouterError,
    router_workers,
)

# A sample line of the Prometheus text format: name{labels} value (a timestamp may follow).
_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """``[(name, {label: value}, float)]`` of a Prometheus text exposition; comments and bad lines skipped."""
    samples = []
    for line in (text or "").splitlines():
        match = _SAMPLE.match(line.strip())
        if not match:
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        labels = {m.group("key"): m.group("value") for m in _LABEL.finditer(match.group("labels") or "")}
        samples.append((match.group("name"), labels, value))
    return samples


def router_metrics(text):
    """What the doctor reads of vllm-router's own metrics: per worker health, requests and breaker state."""
    view = {"health": {}, "processed": {}, "cb_state": {}, "active_workers": None}
    for name, labels, value in parse_metrics(text):
        worker = labels.get("worker")
        if name == "vllm_router_worker_health" and worker:
            view["health"][worker] = value
        elif name == "vllm_router_processed_requests_total" and worker:
            view["processed"][worker] = view["processed"].get(worker, 0) + value
        elif name == "vllm_router_cb_state" and worker:
            view["cb_state"][worker] = value
        elif name == "vllm_router_active_workers":
            view["active_workers"] = value
    return view


def _json(content):
    try:
        return json.loads(content) if isinstance(content, str) and content.strip() else None
    except ValueError:
        return None


def _failure(read):
    """Why a read got no answer (None when the router answered, whatever its status)."""
    if read.get("unreachable"):
        return f"{read.get('host')} unreachable: {read.get('msg') or 'no answer over SSH'}"
    if read.get("skipped"):
        return "not read (no address known for the router's metrics)" if read.get("what") == "/metrics" else "skipped"
    status = read.get("status")
    if status is None or int(status) < 0:
        return read.get("msg") or "no answer"
    return None


def routers_from_saved(reads):
    """One view per router host, in the order of the reads; see the module's docstring."""
    views = {}
    for read in reads or []:
        if not isinstance(read, dict) or not read.get("host"):
            continue
        host = read["host"]
        view = views.setdefault(host, {"host": host, "url": None, "error": None, "listed": [], "workers": {},
                                       "readiness": {}, "metrics": {}})
        what, failure = read.get("what"), _failure(read)
        if what == "/metrics":
            parsed = router_metrics(read.get("content")) if not failure and read.get("status") == 200 else {}
            error = failure or (None if read.get("status") == 200 else f"status {read.get('status')}: {read.get('msg')}")
            view["metrics"] = {"url": read.get("url") or None, "error": error, **parsed}
            continue
        if view["url"] is None and read.get("url"):
            view["url"] = read["url"].rsplit("/", 1)[0]
        if failure:
            view["error"] = view["error"] or f"GET {read.get('url') or what}: {failure}"
            continue
        body = _json(read.get("content"))
        if what == "/list_workers" and isinstance(body, dict):
            view["listed"] = [str(u) for u in body.get("urls") or []]
        elif what == "/workers" and isinstance(body, dict):
            view["workers"] = {str(w.get("url")): w for w in body.get("workers") or [] if isinstance(w, dict)}
        elif what == "/readiness":
            view["readiness"] = {"status": read.get("status"), "body": body if body is not None else read.get("content")}
        elif read.get("status") != 200:
            view["error"] = view["error"] or f"GET {read.get('url')}: status {read.get('status')}"
    return list(views.values())


def planned_workers(plan):
    """The deployment's planned workers (``router_workers`` of its plan); [] when the plan has none to give."""
    if not plan or not plan.get("nodes"):
        return []
    try:
        return router_workers([plan])
    except RouterError:
        return []


def worker_state(view, url):
    """``{listed, healthy, processed, cb_state}`` of one worker URL in one router's view (None: unknown)."""
    listed = url in view["listed"] or url in view["workers"]
    healthy = None
    if url in view["workers"] and "is_healthy" in view["workers"][url]:
        healthy = bool(view["workers"][url]["is_healthy"])
    elif url in (view["metrics"].get("health") or {}):
        healthy = view["metrics"]["health"][url] >= 1
    processed = (view["metrics"].get("processed") or {}).get(url)
    return {"listed": listed, "healthy": healthy if listed else None,
            "processed": int(processed) if processed is not None else None,
            "cb_state": (view["metrics"].get("cb_state") or {}).get(url)}


def planned_rows(plan, routers):
    """The report's router view: per router host, per planned worker of the deployment, what the router shows."""
    rows = []
    workers = planned_workers(plan)
    for view in routers or []:
        if view["error"]:
            rows.append({"router": view["host"], "worker": None, "host": None, "error": view["error"]})
            continue
        for worker in workers:
            rows.append({"router": view["host"], "worker": worker["url"], "host": worker["host"], "error": None,
                         **worker_state(view, worker["url"])})
    return rows
