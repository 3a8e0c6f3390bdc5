"""The start-up phase of every rank, read from each node's vLLM journal, and a start that stays too long in one.

``node_phases`` reads each reachable node's vLLM journal with
``parsers/vllm_phases.read_phases`` (with each line's journal timestamp where
the gatherer saved them, ``journal_times``); ``phase_rows`` lays the result out
for the report: one row per process and rank, with its node (a Ray worker's
line names its node by address), the phase it reached and since when.
``obs_startup_stalled`` is the observation behind the catalog's
``startup_stalled``: on a node whose vLLM unit keeps running while no node's
API server came up, the least advanced rank has stayed in its phase longer than
that phase's bound, measured against the moment the journal was read
(``gathered_at``); on a log read alone (``log_only``), the log stops in the
middle of the start-up. The hit is placed on the node that rank runs on; a node
whose ranks got further waits for it and is not judged.

The bounds come from the profile the doctor role names (``doctor_startup_profile``:
``gpu`` or ``lab``; empty: ``lab`` for a CPU plan, else ``gpu``) and its
per-phase overrides (``doctor_startup_bounds``), both saved in the node's
``expected``.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import VLLM_UNIT, make_hit
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import vllm_phases

RUNNING_STATES = ("active", "activating", "reloading")


def _times(node, lines):
    times = (node.gather.get("journal_times") or {}).get(VLLM_UNIT)
    return times if isinstance(times, list) and len(times) == len(lines) else None


def _node_of(cluster, node, entry):
    """The node a process runs on: a Ray worker's prefix names its address; else the node whose journal holds it."""
    address = entry.get("ip")
    if address:
        for other in cluster.nodes:
            if address == other.plan.get("address") or address in other.local_addresses():
                return other.name
        return address
    return node.name


def node_phases(cluster):
    """{node name: read_phases report, each process with its node} for every node whose vLLM journal shows a phase;
    read once per diagnosis (the observation and the report's view share it)."""
    cached = getattr(cluster, "_startup_phases", None)
    if cached is not None:
        return cached
    reports = cluster._startup_phases = {}
    for node in cluster.reachable_nodes():
        if not node.installed(VLLM_UNIT):
            continue
        lines = node.journal(VLLM_UNIT)
        report = vllm_phases.read_phases(lines, _times(node, lines))
        if not report["processes"]:
            continue
        for entry in report["processes"]:
            entry["node"] = _node_of(cluster, node, entry)
        reports[node.name] = report
    return reports


def phase_rows(cluster, reports=None):
    """The report's view: {rows: [{node, process, rank, phase, finished, current, since, line}], furthest, least,
    complete}; furthest and least over every node's ranks (described in words)."""
    reports = node_phases(cluster) if reports is None else reports
    rows = []
    every = []
    for report in reports.values():
        for entry in report["processes"]:
            every.append(entry)
            rows.append({
                "node": entry["node"], "process": entry["process"], "rank": entry["rank"], "phase": entry["phase"],
                "finished": entry["finished"], "current": entry["current"], "since": entry["time"],
                "line": entry["line"], "text": vllm_phases.describe(entry),
            })
    if not rows:
        return {}
    overall = vllm_phases.summarize(every)
    overall["complete"] = any(report["complete"] for report in reports.values())
    return {
        "rows": rows,
        "furthest": f"{overall['furthest']['node']}: {vllm_phases.describe(overall['furthest'])}",
        "least": f"{overall['least']['node']}: {vllm_phases.describe(overall['least'])}",
        "complete": overall["complete"],
    }


def profile_of(cluster, node):
    """(profile name, per-phase overrides) for a node: what the doctor role saved, else the plan's device."""
    expected = node.expected
    name = expected.get("startup_profile") or ""
    if name not in vllm_phases.PROFILES:
        device = (cluster.plan.get("cluster") or {}).get("device")
        name = "lab" if device == "cpu" else vllm_phases.DEFAULT_PROFILE
    return name, expected.get("startup_bounds") or {}


def _running(node):
    info = node.unit(VLLM_UNIT)
    return info.get("ActiveState") in RUNNING_STATES and info.get("SubState") != "auto-restart"


def _minutes(seconds):
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds} s"


def obs_startup_stalled(cluster, params):
    reports = node_phases(cluster)
    if any(report["complete"] for report in reports.values()):
        return []
    running = [node for node in cluster.reachable_nodes() if node.name in reports and _running(node)]
    # The start waits for its least advanced rank: a node whose ranks got further waits for that one.
    behind = min((reports[node.name]["current"]["order"] for node in running), default=None)
    hits = []
    for node in running:
        report = reports[node.name]
        if report["current"]["order"] != behind:
            continue
        log_only = bool(node.gather.get("log_only"))
        now = node.gather.get("gathered_at")
        if now is None and not log_only:
            continue  # evidence without the time it was read: how long a phase lasted cannot be told
        profile, overrides = profile_of(cluster, node)
        found = vllm_phases.stall(report, None if log_only else float(now), profile, overrides)
        if not found:
            continue
        entry = found["entry"]
        where = vllm_phases.describe(entry)
        if log_only:
            text = (f"The log stops in phase {found['phase']} ({found['title']}) with no error after it: {where}; "
                    "the start-up neither went on nor failed")
        else:
            text = (f"{where}; it has stayed there {_minutes(found['elapsed_s'])} while the unit keeps running "
                    f"(the bound of {found['phase']} under the {profile} profile: {_minutes(found['bound_s'])})")
        furthest = report["furthest"]
        if furthest is not entry:
            text += f". The furthest process: {vllm_phases.describe(furthest)}"
        # On the node the lagging rank runs on (a Ray worker's line in the head's journal names it by address).
        where_node = entry.get("node") if entry.get("node") in {other.name for other in cluster.nodes} else node.name
        source = f"journal {VLLM_UNIT}" + (f" on {node.name}" if where_node != node.name else "")
        hits.append(make_hit(
            where_node, source, entry["line"],
            phase=found["phase"], phase_title=found["title"], stall=text,
            phase_checks="; ".join(found["checks"]) or "the process's state (`py-spy dump --pid <pid>`)",
            since=entry["time"] or "an unknown time",
        ))
    return hits
