"""The doctor's report, rendered: text lines for the terminal and ``results/<deployment>/doctor.md``.

Both take the report ``diagnosis.diagnose`` returns; the findings come most
likely cause first (in causal order: a root cause says "this explains: ...",
a consequence "follows from: ..."), with their evidence quoted, then what the
last deploy changed on each node.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

MAX_EVIDENCE_PER_FINDING = 8


def _change_lines(report):
    lines = []
    for entry in report.get("last_change") or []:
        when = entry.get("current_modified") or "none"
        lines.append(f"{entry['node']}: plan.previous.json ({entry.get('previous_modified')}) -> plan.json ({when})")
        lines += [f"  {change}" for change in entry["changes"]]
    return lines


def _yes_no(value):
    return "-" if value is None else ("yes" if value else "no")


def router_view_rows(report):
    """The router's view, one row per router host and planned worker: [router, worker, node, listed, healthy,
    requests processed]; a router that did not answer is one row with its error."""
    rows = []
    for row in report.get("router_view") or []:
        if row.get("error"):
            rows.append([row["router"], "-", "-", "no answer", "-", row["error"]])
            continue
        processed = "-" if row.get("processed") is None else str(row["processed"])
        rows.append([row["router"], row["worker"], row["host"], _yes_no(row["listed"]), _yes_no(row["healthy"]),
                     processed])
    return rows


ROUTER_VIEW_HEADER = ["router", "worker", "node", "listed", "healthy", "requests processed"]


def _router_lines(report):
    rows = router_view_rows(report)
    if not rows:
        return []
    return ["", "The router's view of the planned workers (router, worker, node: listed, healthy, requests processed):"] + [
        f"  {r[0]}: {r[1]} ({r[2]}): listed {r[3]}, healthy {r[4]}, processed {r[5]}" if r[3] != "no answer"
        else f"  {r[0]}: no answer: {r[5]}" for r in rows]


def startup_lines(report):
    """Each rank's start-up phase (node, process: phase since when), then the furthest and the least advanced."""
    phases = report.get("startup_phases") or {}
    if not phases.get("rows"):
        return []
    state = "the API server came up" if phases.get("complete") else "the API server has not come up"
    lines = [f"Start-up phases ({state}; node, process: the phase reached and since when):"]
    lines += [f"  {row['node']}: {row['text']}" for row in phases["rows"]]
    lines.append(f"  furthest: {phases['furthest']}")
    lines.append(f"  least advanced: {phases['least']}")
    return lines


def _plan_lines(report):
    """Where the plan came from (the nodes' plan.json or the inventory) and how the inventory's differs."""
    source = report.get("plan_source") or {}
    lines = list(source.get("notes") or [])
    drift = source.get("drift") or []
    if drift:
        lines.append("the inventory's plan differs from the deployed one (deploy.yml would apply it):")
        lines += [f"  {line}" for line in drift]
    return lines


def _refs_text(report, refs, why=False):
    """Findings referred to by {id, node, rank}, one per finding: "#1 <title> (<id> on node1, node2)"."""
    by_rank = {}
    for ref in refs:
        by_rank.setdefault(ref["rank"], []).append(ref)
    parts = []
    for rank, same in sorted(by_rank.items()):
        finding = report["findings"][rank - 1]
        nodes = ", ".join(dict.fromkeys(ref["node"] for ref in same if ref["node"])) or "the cluster"
        text = f"#{rank} {finding['title']} ({same[0]['id']} on {nodes})"
        reasons = [ref["why"] for ref in same if why and ref.get("relation") != "catalog" and ref.get("why")]
        if reasons:
            text += f": {'; '.join(dict.fromkeys(reasons))}"
        parts.append(text)
    return "; ".join(parts)


def causal_lines(report, finding):
    """The causal order around a finding: what it follows from, or (a root cause) what follows from it."""
    if finding.get("follows_from"):
        return [f"follows from: {_refs_text(report, finding['follows_from'], why=True)}"]
    if finding.get("explains_findings"):
        return [f"this explains: {_refs_text(report, finding['explains_findings'])}"]
    return []


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
    lines += [f"plan: {line}" for line in _plan_lines(report)]
    changed = _change_lines(report)
    if changed:
        changed = ["", "What the last deploy changed (each node's plan.previous.json against its plan.json):"] + [
            "  " + line for line in changed]
    changed = _router_lines(report) + changed
    started = startup_lines(report)
    if started:
        changed = ["", *started] + changed
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
        lines += [f"   {line}" for line in causal_lines(report, finding)]
        lines.append(f"   cause: {finding['cause']}")
        lines.append("   evidence:")
        shown = finding["evidence"][:evidence_lines]
        for item in shown:
            node = f"{item['node']} " if item["node"] else ""
            lines.append(f"     {node}[{item['source']}] {item['line']}")
        if len(finding["evidence"]) > len(shown):
            lines.append(f"     ... {len(finding['evidence']) - len(shown)} more line(s) in doctor.json")
        lines.append(f"   fix: {finding['fix']}")
        if finding.get("verify"):
            lines.append(f"   check it worked: {finding['verify']}")
    return lines + changed


def render_markdown(report):
    """results/<deployment>/doctor.md."""
    out = [f"# Doctor report: {report.get('deployment') or 'deployment'}", ""]
    out.append(
        f"{report['faults']} fault(s), {report['warnings']} warning(s), "
        f"{report['signatures_checked']} signatures checked on {', '.join(report.get('nodes') or []) or 'no node'}."
    )
    planned = _plan_lines(report)
    if planned:
        out += ["", "## The plan", "", "```", *planned, "```"]
    changed = _change_lines(report)
    if changed:
        changed = ["", "## What the last deploy changed", "",
                   "Each node's `plan.previous.json` against its `plan.json` (kept by vllm_service):", "", "```",
                   *changed, "```"]
    started = startup_lines(report)
    if started:
        changed = ["", "## Start-up phases", "", "```", *started, "```"] + changed
    routed = router_view_rows(report)
    if routed:
        changed = ["", "## The router's view", "", "Each router host's `/list_workers`, `/workers` and metrics, read on "
                   "that host, for every planned worker of the deployment:", "",
                   "| " + " | ".join(ROUTER_VIEW_HEADER) + " |", "|" + " --- |" * len(ROUTER_VIEW_HEADER),
                   *["| " + " | ".join(row) + " |" for row in routed]] + changed
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
        causal = causal_lines(report, finding)
        if causal:
            out += [f"{line[0].upper()}{line[1:]}." for line in causal] + [""]
        out += [f"**Symptom.** {finding['symptom']}", "", f"**Cause.** {finding['cause']}", ""]
        out += ["**Checks.**", ""] + [f"- {check}" for check in finding["checks"]] + [""]
        out += ["**Evidence.**", "", "```"]
        for item in finding["evidence"][: MAX_EVIDENCE_PER_FINDING * 2]:
            node = f"{item['node']} " if item["node"] else ""
            out.append(f"{node}[{item['source']}] {item['line']}")
        out += ["```", "", f"**Fix.** {finding['fix']}"]
        if finding.get("verify"):
            out += ["", f"**Check it worked.** {finding['verify']}"]
        if finding["references"]:
            out += ["", "References: " + "; ".join(finding["references"])]
    return "\n".join(out + changed) + "\n"


def _one_line(text, limit=400):
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_finding(report, markdown_path=None):
    """The report's first finding in one line, for a run that fails with it (the deploy's vllm and ray stages).

    The first fault (the report's most likely cause), else the first warning; None without findings. Returns
    {id, severity, host (its first node, else 'the cluster'), title, evidence (the first evidence line on that
    node, else the first), fix, report (markdown_path), text: "<title> — <evidence> — fix: <fix> (doctor:
    <report>)"}.
    """
    findings = report.get("findings") or []
    chosen = next((f for f in findings if f["severity"] == "fault"), findings[0] if findings else None)
    if chosen is None:
        return None
    host = chosen["nodes"][0] if chosen["nodes"] else "the cluster"
    evidence = chosen.get("evidence") or []
    item = next((e for e in evidence if e.get("node") == host), evidence[0] if evidence else None)
    line = _one_line(f"[{item['source']}] {item['line']}") if item else _one_line(chosen["cause"])
    title, fix = _one_line(chosen["title"]), _one_line(chosen["fix"])
    text = f"{title} — {line} — fix: {fix}"
    if markdown_path:
        text += f" (doctor: {markdown_path})"
    return {"id": chosen["id"], "severity": chosen["severity"], "host": host, "title": title, "evidence": line,
            "fix": fix, "report": markdown_path, "text": text}
