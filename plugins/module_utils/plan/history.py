"""What the last deploy changed on a node: its plan.previous.json against its plan.json.

vllm_service keeps the plan that runs (``plan.json``) and, when a deploy changes
it, the one before (``plan.previous.json``) in the node's config directory. The
doctor reads both and says what changed, because "it worked before the last
deploy" is the first lead on a broken cluster. Only what decides what runs is
compared: the layout, the nodes, the ports, the model and this node's argv and
environment. Secret-looking environment values are never shown.
"""

from __future__ import annotations

import re

SECRET = re.compile(r"(?i)(token|secret|password|passwd|key)")
LAYOUT = ("strategy", "backend", "tp", "pp", "dp", "ep", "world_size")


def argv_flags(argv):
    """``--flag value`` / ``--flag=value`` / ``--flag`` pairs and the positional arguments of an argv."""
    flags, positional, index = {}, [], 0
    while index < len(argv):
        arg = argv[index]
        if arg.startswith("--"):
            if "=" in arg:
                key, value = arg.split("=", 1)
                flags[key] = value
            elif index + 1 < len(argv) and not argv[index + 1].startswith("--"):
                flags[arg] = argv[index + 1]
                index += 1
            else:
                flags[arg] = True
        else:
            positional.append(arg)
        index += 1
    return flags, positional


def flag_text(value):
    """An argv flag's or env variable's value as the reports print it."""
    if value is None:
        return "absent"
    return "set" if value is True else str(value)


def layout_text(plan):
    """The plan's layout in one line: strategy (backend) TP PP DP EP world_size."""
    return "{} ({}) TP={} PP={} DP={} EP={} world_size={}".format(*(plan.get(key) for key in LAYOUT))


def _node(plan, host):
    return next((node for node in plan.get("nodes") or [] if node.get("host") == host), None)


def _dict_changes(label, before, after, redact=False):
    changes = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if redact and SECRET.search(key):
            old, new = (None if old is None else "<redacted>"), (None if new is None else "<redacted>")
            if old == new:
                new = "<redacted, changed>"
        changes.append(f"{label}{key}: {flag_text(old)} -> {flag_text(new)}")
    return changes


def plan_changes(previous, current, host):
    """Lines saying what differs from ``previous`` to ``current`` for ``host``; [] when nothing that runs did."""
    previous, current = previous or {}, current or {}
    changes = []
    if layout_text(previous) != layout_text(current):
        changes.append(f"layout: {layout_text(previous)} -> {layout_text(current)}")
    hosts = [[node.get("host") for node in plan.get("nodes") or []] for plan in (previous, current)]
    if hosts[0] != hosts[1]:
        changes.append(f"nodes: {', '.join(hosts[0]) or 'none'} -> {', '.join(hosts[1]) or 'none'}")
    model = [(plan.get("model") or {}).get("path") for plan in (previous, current)]
    if model[0] != model[1]:
        changes.append(f"model: {flag_text(model[0])} -> {flag_text(model[1])}")
    changes += _dict_changes("port ", previous.get("ports") or {}, current.get("ports") or {})
    before, after = _node(previous, host), _node(current, host)
    if before is None or after is None:
        if before is not after:
            changes.append(f"{host}: {'added to' if before is None else 'removed from'} the deployment")
        return changes
    old_flags, old_args = argv_flags(before.get("argv") or [])
    new_flags, new_args = argv_flags(after.get("argv") or [])
    if old_args != new_args:
        changes.append(f"arguments: {' '.join(old_args) or 'none'} -> {' '.join(new_args) or 'none'}")
    changes += _dict_changes("", old_flags, new_flags)
    changes += _dict_changes("env ", before.get("env") or {}, after.get("env") or {}, redact=True)
    return changes


def plan_summary(plan):
    """The part of a plan that plan_changes compares (what the doctor keeps as evidence)."""
    plan = plan if isinstance(plan, dict) else {}
    summary = {key: plan.get(key) for key in ("deployment", *LAYOUT)}
    summary["ports"] = plan.get("ports") or {}
    summary["model"] = {"path": (plan.get("model") or {}).get("path")}
    summary["nodes"] = [
        {"host": node.get("host"), "argv": node.get("argv") or [],
         "env": {key: ("<redacted>" if SECRET.search(key) else value) for key, value in (node.get("env") or {}).items()}}
        for node in plan.get("nodes") or [] if isinstance(node, dict)
    ]
    return summary
