"""The doctor: failure signatures kept as data, matched against what the nodes show.

Symptom -> checks -> cause -> fix lives in a YAML catalog
(``roles/doctor/files/signatures.yml``), never in code branches. This module

- validates that catalog (``load_catalog``);
- turns the gathered evidence of every node, the plan and the GPU/IB facts into
  named *observations* (``OBSERVATIONS``): generic, reusable checks such as
  "a plan port is held by a process outside the deployment's units";
- matches each signature's rules (log patterns and observations) and ranks
  the findings, most likely cause first (``diagnose``);
- renders the report for a terminal and for ``results/<deployment>/doctor.md``.

Pure Python 3.11, no Ansible import. The evidence shape is documented in
``docs/doctor.md``.
"""

from __future__ import annotations

import json
import re
import string

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
    RAY_UNITS,
    VLLM_UNIT,
    Cluster,
    make_hit,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations import OBSERVATIONS
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import history as plan_history

CATALOG_VERSION = 1
FAMILIES = ("startup", "communication", "performance")
SEVERITIES = ("fault", "warning")
LOG_SOURCES = ("vllm", "ray", "any")
MAX_EVIDENCE_PER_FINDING = 8
_ID = re.compile(r"^[a-z][a-z0-9_]{1,63}$")


class CatalogError(ValueError):
    """The signature catalog is malformed; the message names the signature and the field."""


# --------------------------------------------------------------------------- catalog


def _require(condition, where, message):
    if not condition:
        raise CatalogError(f"{where}: {message}")


def _text_field(sig, key, where, required=True):
    value = sig.get(key)
    if value is None and not required:
        return None
    _require(isinstance(value, str) and value.strip(), where, f"'{key}' must be a non-empty string, got {value!r}")
    return value.strip()


def _check_rule(rule, where):
    _require(isinstance(rule, dict), where, f"each rule must be a mapping, got {rule!r}")
    kinds = [key for key in ("log", "observation") if key in rule]
    _require(len(kinds) == 1, where, f"a rule has exactly one of 'log' or 'observation', got {sorted(rule)}")
    unknown = set(rule) - {"log", "observation", "params", "requires"}
    _require(not unknown, where, f"unknown rule keys {sorted(unknown)}")
    checked = {"requires": []}
    requires = rule.get("requires", [])
    _require(
        isinstance(requires, list) and all(isinstance(name, str) for name in requires),
        where,
        f"'requires' must be a list of observation names, got {requires!r}",
    )
    for name in requires:
        _require(name in OBSERVATIONS, where, f"'requires' names the unknown observation {name!r}")
    checked["requires"] = list(requires)
    if "log" in rule:
        log = rule["log"]
        _require(isinstance(log, dict), where, f"'log' must be a mapping with 'pattern', got {log!r}")
        pattern = log.get("pattern")
        _require(isinstance(pattern, str) and pattern, where, "'log.pattern' must be a regular expression")
        try:
            compiled = re.compile(pattern)
        except re.error as error:
            raise CatalogError(f"{where}: 'log.pattern' {pattern!r} is not a valid regular expression: {error}") from None
        sources = log.get("sources", ["any"])
        _require(
            isinstance(sources, list) and sources and all(source in LOG_SOURCES for source in sources),
            where,
            f"'log.sources' must be a list of {list(LOG_SOURCES)}, got {sources!r}",
        )
        after = log.get("after", 0)
        _require(
            isinstance(after, int) and not isinstance(after, bool) and 0 <= after <= 20,
            where,
            f"'log.after' (lines quoted after the match) must be an integer 0-20, got {after!r}",
        )
        unknown = set(log) - {"pattern", "sources", "after"}
        _require(not unknown, where, f"unknown log keys {sorted(unknown)}")
        checked["log"] = {"pattern": pattern, "regex": compiled, "sources": list(sources), "after": after}
    else:
        name = rule["observation"]
        _require(name in OBSERVATIONS, where, f"unknown observation {name!r}; known: {sorted(OBSERVATIONS)}")
        params = rule.get("params", {})
        _require(isinstance(params, dict), where, f"'params' must be a mapping, got {params!r}")
        checked["observation"] = name
        checked["params"] = dict(params)
    return checked


def load_catalog(data):
    """Validate the catalog data (as YAML loads it) and return it with compiled patterns.

    Raises CatalogError naming the signature and field at the first problem.
    """
    _require(isinstance(data, dict), "catalog", f"must be a mapping, got {type(data).__name__}")
    _require(
        data.get("catalog_version") == CATALOG_VERSION,
        "catalog",
        f"catalog_version must be {CATALOG_VERSION}, got {data.get('catalog_version')!r}",
    )
    signatures = data.get("signatures")
    _require(isinstance(signatures, list) and signatures, "catalog", "'signatures' must be a non-empty list")
    checked = []
    seen = set()
    for index, sig in enumerate(signatures):
        where = f"signature #{index + 1}"
        _require(isinstance(sig, dict), where, f"must be a mapping, got {sig!r}")
        sig_id = sig.get("id")
        _require(isinstance(sig_id, str) and _ID.match(sig_id), where, f"'id' must match {_ID.pattern}, got {sig_id!r}")
        where = f"signature {sig_id}"
        _require(sig_id not in seen, where, "the id is used twice")
        seen.add(sig_id)
        allowed = {
            "id", "family", "seed_branch", "severity", "priority", "title", "symptom", "checks",
            "cause", "fix", "match", "explains", "references", "defaults",
        }
        unknown = set(sig) - allowed
        _require(not unknown, where, f"unknown keys {sorted(unknown)}")
        family = sig.get("family")
        _require(family in FAMILIES, where, f"'family' must be one of {list(FAMILIES)}, got {family!r}")
        severity = sig.get("severity", "fault")
        _require(severity in SEVERITIES, where, f"'severity' must be one of {list(SEVERITIES)}, got {severity!r}")
        priority = sig.get("priority")
        _require(
            isinstance(priority, int) and not isinstance(priority, bool) and 1 <= priority <= 100,
            where,
            f"'priority' must be an integer 1-100, got {priority!r}",
        )
        checks = sig.get("checks")
        _require(
            isinstance(checks, list) and checks and all(isinstance(c, str) and c.strip() for c in checks),
            where,
            "'checks' must be a non-empty list of strings",
        )
        match = sig.get("match")
        _require(isinstance(match, dict) and set(match) == {"any"}, where, "'match' must be a mapping with only 'any'")
        rules = match["any"]
        _require(isinstance(rules, list) and rules, where, "'match.any' must be a non-empty list of rules")
        explains = sig.get("explains", [])
        _require(
            isinstance(explains, list) and all(isinstance(name, str) for name in explains),
            where,
            f"'explains' must be a list of signature ids, got {explains!r}",
        )
        defaults = sig.get("defaults", {})
        _require(
            isinstance(defaults, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in defaults.items()),
            where,
            f"'defaults' must map placeholder names to strings, got {defaults!r}",
        )
        references = sig.get("references", [])
        _require(
            isinstance(references, list) and all(isinstance(ref, str) for ref in references),
            where,
            "'references' must be a list of strings",
        )
        checked.append(
            {
                "id": sig_id,
                "family": family,
                "seed_branch": _text_field(sig, "seed_branch", where, required=False),
                "severity": severity,
                "priority": priority,
                "title": _text_field(sig, "title", where),
                "symptom": _text_field(sig, "symptom", where),
                "checks": [c.strip() for c in checks],
                "cause": _text_field(sig, "cause", where),
                "fix": _text_field(sig, "fix", where),
                "rules": [_check_rule(rule, f"{where}, rule #{n + 1}") for n, rule in enumerate(rules)],
                "explains": list(explains),
                "references": list(references),
                "defaults": dict(defaults),
            }
        )
    for sig in checked:
        for name in sig["explains"]:
            _require(name in seen, f"signature {sig['id']}", f"'explains' names the unknown signature {name!r}")
            _require(name != sig["id"], f"signature {sig['id']}", "a signature cannot explain itself")
    return {"catalog_version": CATALOG_VERSION, "signatures": checked}


def load_catalog_file(path):
    import yaml  # the controller has PyYAML (Ansible needs it); only this loader uses it

    with open(path, encoding="utf-8") as handle:
        return load_catalog(yaml.safe_load(handle))


# --------------------------------------------------------------------------- matching and ranking


def _log_streams(node, sources):
    units = []
    if "any" in sources or "vllm" in sources:
        units.append(VLLM_UNIT)
    if "any" in sources or "ray" in sources:
        units.extend(RAY_UNITS)
    for unit in units:
        yield unit, node.journal(unit)
    if "any" in sources:
        yield from (node.gather.get("extra_logs") or {}).items()


def _match_log(cluster, log):
    hits = []
    seen = set()
    for node in cluster.reachable_nodes():
        for stream, lines in _log_streams(node, log["sources"]):
            for index, line in enumerate(lines):
                match = log["regex"].search(line)
                if not match:
                    continue
                key = (node.name, stream, line.strip())
                if key in seen:
                    continue
                seen.add(key)
                quoted = line.strip()
                if log.get("after"):
                    following = [text.strip() for text in lines[index + 1: index + 1 + log["after"]] if text.strip()]
                    quoted = " | ".join([quoted, *following])
                values = {k: v for k, v in match.groupdict().items() if v is not None}
                hits.append(make_hit(node, f"journal {stream}", quoted, **values))
    return hits


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
            hits.extend(found)
    return hits, kinds


def diagnose(catalog, evidence):
    """Match every signature against the evidence; return the report, most likely cause first.

    Ranking: the signature's priority (how specific a root cause it names),
    lowered below any matched signature that 'explains' it (a consequence
    comes after its cause), then the number of independent kinds of evidence
    (log and observations), then the nodes involved, then catalog order.
    """
    cluster = Cluster(evidence)
    cache = {}
    matched = []
    for order, sig in enumerate(catalog["signatures"]):
        hits, kinds = _signature_hits(cluster, sig, cache)
        if hits:
            matched.append((order, sig, hits, kinds))
    ids = {sig["id"] for _, sig, _, _ in matched}
    explained_by = {}
    for _, sig, _, _ in matched:
        for name in sig["explains"]:
            if name in ids:
                explained_by.setdefault(name, []).append(sig)
    findings = []
    for order, sig, hits, kinds in matched:
        causes = explained_by.get(sig["id"], [])
        effective = sig["priority"]
        if causes:
            effective = min(effective, min(cause["priority"] for cause in causes) - 1)
        nodes = sorted({hit["node"] for hit in hits if hit["node"]}, key=_node_order(cluster))
        values = {"nodes": ", ".join(nodes) or "the cluster", "node": nodes[0] if nodes else "the cluster"}
        for hit in hits:
            for key, value in hit["values"].items():
                values.setdefault(key, value)
        for key, value in _plan_values(cluster).items():
            values.setdefault(key, value)
        for key, template in sig["defaults"].items():
            values.setdefault(key, _render(template, values))
        findings.append(
            {
                "id": sig["id"],
                "title": _render(sig["title"], values),
                "family": sig["family"],
                "seed_branch": sig["seed_branch"],
                "severity": sig["severity"],
                "priority": sig["priority"],
                "rank_priority": effective,
                "nodes": nodes,
                "symptom": sig["symptom"],
                "checks": sig["checks"],
                "cause": _render(sig["cause"], values),
                "fix": _render(sig["fix"], values),
                "evidence": [
                    {"node": hit["node"], "source": hit["source"], "line": hit["line"]}
                    for hit in hits
                ],
                "evidence_kinds": sorted(kinds),
                "explained_by": [cause["id"] for cause in causes],
                "references": sig["references"],
                "_order": order,
            }
        )
    findings.sort(
        key=lambda f: (
            0 if f["severity"] == "fault" else 1,
            -f["rank_priority"],
            -len(f["evidence_kinds"]),
            -len(f["nodes"]),
            f["_order"],
        )
    )
    for finding in findings:
        del finding["_order"]
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
    }


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


def _change_lines(report):
    lines = []
    for entry in report.get("last_change") or []:
        when = entry.get("current_modified") or "none"
        lines.append(f"{entry['node']}: plan.previous.json ({entry.get('previous_modified')}) -> plan.json ({when})")
        lines += [f"  {change}" for change in entry["changes"]]
    return lines


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


# --------------------------------------------------------------------------- report


def render_report(report, evidence_lines=MAX_EVIDENCE_PER_FINDING):
    """The report as text lines, most likely cause first, evidence quoted."""
    lines = []
    where = f"deployment {report.get('deployment') or '?'}"
    if report.get("strategy"):
        where += f" ({report['strategy']}, backend {report.get('backend')})"
    lines.append(
        f"vllm-cluster doctor: {where}, nodes {', '.join(report.get('nodes') or []) or 'none'}; "
        f"{report['signatures_checked']} signatures checked"
    )
    changed = _change_lines(report)
    if changed:
        changed = ["", "What the last deploy changed (each node's plan.previous.json against its plan.json):"] + [
            "  " + line for line in changed]
    if not report["findings"]:
        lines.append("No fault found: every signature was checked against every node's units, journals, ports, "
                     "env files, NICs, Ray state and facts.")
        return lines + changed
    lines.append(f"{report['faults']} fault(s), {report['warnings']} warning(s); most likely cause first.")
    for number, finding in enumerate(report["findings"], start=1):
        lines.append("")
        tag = finding["severity"].upper()
        nodes = ", ".join(finding["nodes"]) or "cluster"
        lines.append(f"{number}. [{tag}] {finding['title']}  ({finding['id']}; {finding['family']}; {nodes})")
        if finding["explained_by"]:
            lines.append(f"   consequence of: {', '.join(finding['explained_by'])}")
        lines.append(f"   cause: {finding['cause']}")
        lines.append("   evidence:")
        shown = finding["evidence"][:evidence_lines]
        for item in shown:
            node = f"{item['node']} " if item["node"] else ""
            lines.append(f"     {node}[{item['source']}] {item['line']}")
        if len(finding["evidence"]) > len(shown):
            lines.append(f"     ... {len(finding['evidence']) - len(shown)} more line(s) in doctor.json")
        lines.append(f"   fix: {finding['fix']}")
    return lines + changed


def render_markdown(report):
    """results/<deployment>/doctor.md."""
    out = [f"# Doctor report: {report.get('deployment') or 'deployment'}", ""]
    out.append(
        f"{report['faults']} fault(s), {report['warnings']} warning(s), "
        f"{report['signatures_checked']} signatures checked on {', '.join(report.get('nodes') or []) or 'no node'}."
    )
    changed = _change_lines(report)
    if changed:
        changed = ["", "## What the last deploy changed", "",
                   "Each node's `plan.previous.json` against its `plan.json` (kept by vllm_service):", "", "```",
                   *changed, "```"]
    if not report["findings"]:
        out += ["", "No fault found."]
        return "\n".join(out + changed) + "\n"
    out += ["", "| # | severity | finding | nodes | family |", "| --- | --- | --- | --- | --- |"]
    for number, finding in enumerate(report["findings"], start=1):
        out.append(
            f"| {number} | {finding['severity']} | {finding['title']} (`{finding['id']}`) | "
            f"{', '.join(finding['nodes']) or 'cluster'} | {finding['family']} |"
        )
    for number, finding in enumerate(report["findings"], start=1):
        out += ["", f"## {number}. {finding['title']}", ""]
        if finding["explained_by"]:
            out += [f"Consequence of: {', '.join(finding['explained_by'])}.", ""]
        out += [f"**Symptom.** {finding['symptom']}", "", f"**Cause.** {finding['cause']}", ""]
        out += ["**Checks.**", ""] + [f"- {check}" for check in finding["checks"]] + [""]
        out += ["**Evidence.**", "", "```"]
        for item in finding["evidence"][: MAX_EVIDENCE_PER_FINDING * 2]:
            node = f"{item['node']} " if item["node"] else ""
            out.append(f"{node}[{item['source']}] {item['line']}")
        out += ["```", "", f"**Fix.** {finding['fix']}"]
        if finding["references"]:
            out += ["", "References: " + "; ".join(finding["references"])]
    return "\n".join(out + changed) + "\n"
