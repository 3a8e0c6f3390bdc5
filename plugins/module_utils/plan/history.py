"""What the last deploy changed on a node: its plan.previous.json against its plan.json.

vllm_service keeps the plan that runs (``plan.json``) and, when a deploy changes
it, the one before (``plan.previous.json``) in the node's config directory. The
doctor reads both and says what changed, because "it worked before the last
deploy" is the first lead on a broken cluster. Only what decides what runs is
compared: the layout, the nodes, the ports, the model and this node's argv and
environment. Secret-looking environment values are never shown.
"""

from __future__ import annotations

import json
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


def _deployment_changes(previous, current):
    changes = []
    if layout_text(previous) != layout_text(current):
        changes.append(f"layout: {layout_text(previous)} -> {layout_text(current)}")
    hosts = [[node.get("host") for node in plan.get("nodes") or []] for plan in (previous, current)]
    if hosts[0] != hosts[1]:
        changes.append(f"nodes: {', '.join(hosts[0]) or 'none'} -> {', '.join(hosts[1]) or 'none'}")
    model = [(plan.get("model") or {}).get("path") for plan in (previous, current)]
    if model[0] != model[1]:
        changes.append(f"model: {flag_text(model[0])} -> {flag_text(model[1])}")
    return changes + _dict_changes("port ", previous.get("ports") or {}, current.get("ports") or {})


def _node_changes(previous, current, host):
    before, after = _node(previous, host), _node(current, host)
    if before is None or after is None:
        if before is not after:
            return [f"{host}: {'added to' if before is None else 'removed from'} the deployment"]
        return []
    changes = []
    old_flags, old_args = argv_flags(before.get("argv") or [])
    new_flags, new_args = argv_flags(after.get("argv") or [])
    if old_args != new_args:
        changes.append(f"arguments: {' '.join(old_args) or 'none'} -> {' '.join(new_args) or 'none'}")
    changes += _dict_changes("", old_flags, new_flags)
    return changes + _dict_changes("env ", before.get("env") or {}, after.get("env") or {}, redact=True)


def plan_changes(previous, current, host):
    """Lines saying what differs from ``previous`` to ``current`` for ``host``; [] when nothing that runs did."""
    previous, current = previous or {}, current or {}
    return _deployment_changes(previous, current) + _node_changes(previous, current, host)


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


# --------------------------------------------------------------------------- the deployed plan, read back


def _plan_key(plan):
    return json.dumps(plan, sort_keys=True, default=str)


def _head_of(plan):
    return next((node.get("host") for node in plan.get("nodes") or [] if node.get("node_rank") == 0), None)


def drift(deployed, planned):
    """How the inventory's plan differs from the deployed one, in lines; [] when it does not."""
    if not deployed or not planned:
        return []
    lines = []
    if layout_text(deployed) != layout_text(planned):
        lines.append(f"the inventory now plans {layout_text(planned)}, the nodes run {layout_text(deployed)}")
    lines += [change for change in _deployment_changes(deployed, planned) if not change.startswith("layout: ")]
    hosts = [node.get("host") for node in deployed.get("nodes") or []]
    hosts += [node.get("host") for node in planned.get("nodes") or [] if node.get("host") not in hosts]
    for host in hosts:
        lines += [change if change.startswith(f"{host}: ") else f"{host} {change}"
                  for change in _node_changes(deployed, planned, host)]
    return lines


def readback(readings, inventory_plan):
    """The plan to judge a running deployment by: what its nodes run (their plan.json), not a fresh plan.

    readings: {host: the node's plan.json as a dict, or None where it has none}. Returns
    {"plan", "source" ("deployed" or "inventory"), "from" (the host it was read on), "notes", "drift"}:
    the head's plan when the nodes hold one (nodes that disagree are named), else the inventory's;
    ``drift`` says how the inventory's plan differs from the deployed one.
    """
    found = {host: plan for host, plan in readings.items() if isinstance(plan, dict) and plan.get("nodes")}
    if not found:
        return {"plan": inventory_plan, "source": "inventory", "from": None, "drift": [],
                "notes": ["no node holds /etc/vllm-cluster/plan.json: judged against the inventory's plan"]}
    groups = {}
    for host in sorted(found):
        groups.setdefault(_plan_key(found[host]), []).append(host)
    own_head = [host for host, plan in found.items() if _head_of(plan) == host]
    source = own_head[0] if own_head else sorted(found)[0]
    plan = found[source]
    notes = [f"judged against the plan the nodes run ({layout_text(plan)}, plan.json of {source})"]
    if len(groups) > 1:
        for hosts in groups.values():
            one = found[hosts[0]]
            notes.append(f"{', '.join(hosts)} hold{'s' if len(hosts) == 1 else ''} a plan of {layout_text(one)} "
                         f"on {', '.join(node.get('host') for node in one.get('nodes') or [])}")
        notes.insert(1, f"the nodes hold {len(groups)} different plans: a deploy did not finish on every node")
    missing = [node.get("host") for node in plan.get("nodes") or [] if node.get("host") not in found]
    if missing:
        notes.append(f"no plan.json on {', '.join(missing)}, a node of the deployed plan")
    return {"plan": plan, "source": "deployed", "from": source, "notes": notes,
            "drift": drift(plan, inventory_plan)}
