"""The diagnosis: every signature of the catalog matched against the evidence, findings ranked.

``diagnose`` runs each signature's rules (log patterns over the journals since
the last start, and observations), fills the title, cause and fix templates
with the values the hits carry (and the plan's), ranks the findings most likely
cause first (in causal order: ``causality.py``) and adds what the last deploy
changed on each node (``last_change``).

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

import json
import string

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import (
    causality,
    raise_site,
    router_view,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
    RAY_UNITS,
    VLLM_UNIT,
    Cluster,
    make_hit,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations import OBSERVATIONS
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_ray import ray_log_files
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.ray_logs import WORKER_FILE
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.traceback import (
    parse_tracebacks,
    split_line,
    wrapped_messages,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import history as plan_history


def _log_streams(node, sources):
    units = []
    if "any" in sources or "vllm" in sources:
        units.append(VLLM_UNIT)
    if "any" in sources or "ray" in sources:
        units.extend(RAY_UNITS)
    for unit in units:
        yield unit, node.journal(unit)
    if "any" in sources or "ray" in sources:
        # Ray's daemons' logs; its workers' (vLLM's ranks under Ray) reach vLLM's journal through Ray's log
        # forwarding, and an older vLLM start in the same Ray session would speak in them still
        for name, lines in ray_log_files(node).items():
            if not WORKER_FILE.match(name):
                yield f"ray log {name}", lines
    if "any" in sources:
        yield from (node.gather.get("extra_logs") or {}).items()


def _match_log(cluster, log):
    """Hits of a log rule: each journal line, then each message wrapped over several lines, joined.

    A pattern that spans a wrapped message's line break matches the joined message; its evidence quotes the
    original lines (" | " between them). A message whose lines already matched one by one is not quoted twice.
    """
    hits = []
    seen = set()
    for node in cluster.reachable_nodes():
        for stream, lines in _log_streams(node, log["sources"]):
            source = stream if stream.startswith("ray log ") else f"journal {stream}"
            matched_lines = set()
            for index, line in enumerate(lines):
                match = log["regex"].search(line)
                if not match and log.get("after"):
                    # a message wrapped onto the following lines: the rule reads them with it
                    following = [text.strip() for text in lines[index + 1: index + 1 + log["after"]] if text.strip()]
                    match = log["regex"].search(" | ".join([line.strip(), *following]))
                if not match:
                    continue
                matched_lines.add(index)
                key = (node.name, stream, line.strip())
                if key in seen:
                    continue
                seen.add(key)
                quoted = _exception_of_frame(cluster, node.name, stream, lines, index) or line.strip()
                if log.get("after"):
                    following = [text.strip() for text in lines[index + 1: index + 1 + log["after"]] if text.strip()]
                    quoted = " | ".join([quoted, *following])
                    # a pattern may capture what the following lines say (the versions under "Version mismatch")
                    match = log["regex"].search(quoted) or match
                values = {k: v for k, v in match.groupdict().items() if v is not None}
                hits.append(make_hit(node, source, quoted, **values))
            for message in _wrapped(cluster, node.name, stream, lines):
                if matched_lines.intersection(message["lines"]):
                    continue
                match = log["regex"].search(message["text"])
                if not match:
                    continue
                quoted = " | ".join(str(lines[index]).strip() for index in message["lines"])
                key = (node.name, stream, quoted)
                if key in seen:
                    continue
                seen.add(key)
                values = {k: v for k, v in match.groupdict().items() if v is not None}
                hits.append(make_hit(node, source, quoted, **values))
    return hits


def _exception_of_frame(cluster, node, stream, lines, index):
    """The exception line of the traceback whose frame or code line ``index`` is, else None: evidence quotes the
    exception a frame belongs to, never the frame."""
    cache = cluster.__dict__.setdefault("_frame_exceptions", {})
    if (node, stream) not in cache:
        frames = {}
        for record in parse_tracebacks(lines):
            for number in range(record["start"], record["line"]):
                process, _, _, body = split_line(str(lines[number]))
                if process == record["process"] and (body[:1].isspace() or body.lstrip().startswith("File \"")):
                    frames.setdefault(number, record["line"])
        cache[(node, stream)] = frames
    line = cache[(node, stream)].get(index)
    return None if line is None else str(lines[line]).strip()


def _wrapped(cluster, node, stream, lines):
    """wrapped_messages of one journal, read once per diagnosis whatever the number of log rules."""
    cache = cluster.__dict__.setdefault("_wrapped_messages", {})
    if (node, stream) not in cache:
        cache[(node, stream)] = wrapped_messages(lines)
    return cache[(node, stream)]


class _SafeValues(dict):
    def __missing__(self, key):
        return "{" + key + "}"


def _render(template, values):
    return string.Formatter().vformat(template, (), _SafeValues(values))


def _observe(cluster, name, params, cache):
    key = (name, json.dumps(params, sort_keys=True, default=str))
    if key not in cache:
        cache[key] = OBSERVATIONS[name](cluster, params)
    return cache[key]


def _signature_hits(cluster, sig, cache):
    """Hits of every rule of one signature; a rule with 'requires' counts only on nodes where they hold."""
    hits = []
    kinds = set()
    for rule in sig["rules"]:
        if "log" in rule:
            found = _match_log(cluster, rule["log"])
            kind = "log"
        else:
            found = _observe(cluster, rule["observation"], rule["params"], cache)
            kind = rule["observation"]
        for requirement in rule["requires"]:
            allowed = {hit["node"] for hit in _observe(cluster, requirement, {}, cache)}
            found = [hit for hit in found if hit["node"] in allowed or None in allowed]
        if found:
            kinds.add(kind)
            hits.extend({**hit, "kind": kind} for hit in found)
    return hits, kinds


def diagnose(catalog, evidence):
    """Match every signature against the evidence; return the report, most likely cause first.

    Ranking (``causality.causal_order``): findings in causal order, node by node.
    A finding that follows from another (the catalog's 'explains' between
    findings that share a node, or a node-aware relation: the head down
    explains the workers that cannot reach it, a link down the ports it blocks,
    a node unreachable what is on it) comes after its cause, its priority
    lowered below the cause's (``rank_priority``); it lists its direct causes
    (``follows_from``) and every finding lists what follows from it
    (``explains_findings``). Between findings not so linked: faults first, the
    signature's priority (how specific a root cause it names), the number of
    independent kinds of evidence (log and observations), the nodes involved,
    catalog order.
    """
    cluster = Cluster(evidence)
    cache = {}
    matched = []
    for order, sig in enumerate(catalog["signatures"]):
        hits, kinds = _signature_hits(cluster, sig, cache)
        if hits:
            matched.append((order, sig, hits, kinds))
    # Where no signature names the cause: the subsystem that raised the root exception (raise_site.py).
    matched = raise_site.fallback_matches(cluster, matched, catalog.get("subsystems"))
    plan_values = _plan_values(cluster)
    findings = []
    for group in causality.causal_order(cluster, matched, _node_order(cluster)):
        sig, hits, nodes = group["sig"], group["hits"], group["nodes"]
        values = {"nodes": ", ".join(nodes) or "the cluster", "node": nodes[0] if nodes else "the cluster"}
        for hit in hits:
            for key, value in hit["values"].items():
                values.setdefault(key, value)
        for key, value in plan_values.items():
            values.setdefault(key, value)
        _name_the_port(values)
        for key, template in sig["defaults"].items():
            values.setdefault(key, _render(template, values))
        explained_by = []
        for cause in group["follows_from"]:
            if cause["id"] not in explained_by:
                explained_by.append(cause["id"])
        findings.append(
            {
                "id": sig["id"],
                "title": _render(sig["title"], values),
                "family": sig["family"],
                "seed_branch": sig["seed_branch"],
                "severity": sig["severity"],
                "priority": sig["priority"],
                "rank_priority": group["rank_priority"],
                "nodes": nodes,
                "symptom": sig["symptom"],
                "checks": sig["checks"],
                "cause": _render(sig["cause"], values),
                "fix": _render(sig["fix"], values),
                "verify": _render(sig["verify"], values),
                "evidence": [
                    {"node": hit["node"], "source": hit["source"], "line": hit["line"]}
                    for hit in hits
                ],
                "evidence_kinds": sorted(group["kinds"]),
                "explained_by": explained_by,
                "follows_from": group["follows_from"],
                "explains_findings": group["explains_findings"],
                "references": sig["references"],
            }
        )
    _name_the_vllm_unit(findings, (cluster.plan.get("service") or {}).get("unit"))
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.startup import phase_rows

    faults = [f for f in findings if f["severity"] == "fault"]
    return {
        "faults": len(faults),
        "warnings": len(findings) - len(faults),
        "findings": findings,
        "nodes": [node.name for node in cluster.nodes],
        "unreachable": [node.name for node in cluster.nodes if not node.reachable],
        "deployment": cluster.plan.get("deployment"),
        "strategy": cluster.plan.get("strategy"),
        "backend": cluster.plan.get("backend"),
        "signatures_checked": len(catalog["signatures"]),
        "last_change": last_change(cluster),
        "router_view": router_view.planned_rows(cluster.plan, cluster.routers),
        "startup_phases": phase_rows(cluster),
    }


def _name_the_port(values):
    """A port the evidence quotes without a name gets the plan's name for it (29501: master)."""
    port = values.get("port")
    if port is None or "port_name" in values:
        return
    for key, value in values.items():
        if key.startswith("port_") and key != "port_name" and str(value) == str(port):
            values["port_name"] = key[len("port_"):]
            return


def _name_the_vllm_unit(findings, unit):
    """The catalog says vllm.service for the deployment's vLLM unit; a deployment that shares machines runs
    vllm-<deployment>.service (the plan's service.unit), and its report names that unit in every command."""
    if not unit or unit == VLLM_UNIT:
        return
    for finding in findings:
        for key in ("title", "cause", "fix", "verify", "symptom"):
            finding[key] = finding[key].replace(VLLM_UNIT, unit)
        finding["checks"] = [check.replace(VLLM_UNIT, unit) for check in finding["checks"]]


def last_change(cluster):
    """Per node that keeps a plan.previous.json: when its plan last changed and what changed."""
    changes = []
    for node in cluster.nodes:
        plans = node.gather.get("plans") or {}
        previous, current = plans.get("previous"), plans.get("current")
        if not previous:
            continue
        if current:
            lines = plan_history.plan_changes(previous.get("plan"), current.get("plan"), node.name)
        else:
            lines = ["vLLM was torn down (no plan.json); plan.previous.json is the plan that ran last: "
                     + plan_history.layout_text(previous.get("plan") or {})]
        changes.append({
            "node": node.name,
            "previous_modified": previous.get("modified"),
            "current_modified": (current or {}).get("modified"),
            "changes": lines or ["nothing that decides what runs (layout, nodes, ports, model, argv, env)"],
        })
    return changes


def _node_order(cluster):
    order = {node.name: index for index, node in enumerate(cluster.nodes)}
    return lambda name: (order.get(name, len(order)), name)


def _plan_values(cluster):
    plan = cluster.plan
    model = plan.get("model") or {}
    values = {
        "tp": plan.get("tp"), "pp": plan.get("pp"), "dp": plan.get("dp"), "world_size": plan.get("world_size"),
        "model_path": model.get("path"), "heads": model.get("heads"), "backend": plan.get("backend"),
        "head_node": cluster.head.name if cluster.head else None,
        "head_address": cluster.head.plan.get("address") if cluster.head else None,
    }
    ports = plan.get("ports") or {}
    for name, port in ports.items():
        values.setdefault(f"port_{name}", port)
    return {key: value for key, value in values.items() if value is not None}
