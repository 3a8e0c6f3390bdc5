"""The fan-out plan: who copies the model from whom, so the bytes leave the source once.

The source (a node that fetched the model, or the controller that holds it) is the root of a
tree; every other node copies from a node that already holds the model, over the fabric
network. No node sends more than `degree` copies, so no single link carries every copy, and
the copies take about log_degree(nodes) rounds. The controller is not on the fabric: it sends
one copy (over the management network) unless told otherwise, and the nodes take it from there.

Deterministic: the same nodes in the same order give the same plan. Pure Python, no Ansible import.
"""

from __future__ import annotations

from collections import deque

CONTROLLER = "controller"
DEFAULT_DEGREE = 2
ROW = "  {:<6} {:<28} {}"


class FanoutError(ValueError):
    pass


def _nodes(nodes) -> list[tuple[str, str]]:
    """(name, address) pairs from pairs or {name, address} dicts, checked."""
    pairs = []
    for node in nodes:
        name, address = (node.get("name"), node.get("address")) if isinstance(node, dict) else node
        if not name or not isinstance(name, str):
            raise FanoutError(f"a node without a name: {node!r}")
        if not address or not isinstance(address, str):
            raise FanoutError(f"node {name}: no fabric address")
        pairs.append((name, address))
    return pairs


def _duplicates(values) -> list[str]:
    seen, twice = set(), []
    for value in values:
        if value in seen and value not in twice:
            twice.append(value)
        seen.add(value)
    return twice


def plan_fanout(nodes, source: str, degree: int = DEFAULT_DEGREE, source_degree: int | None = None,
                shared=()) -> dict:
    """The copies, in order: {source, degree, source_degree, rounds, edges, shared}. nodes - the nodes that need
    the model, in order ((name, fabric address) pairs or {name, address}); source - one of them, or 'controller'.
    Each edge is {round, from, from_address, to, to_address, network}: the node `to` copies from `from` in
    that round (its depth in the tree). The source's copies come first, then breadth first, each sender
    taking up to `degree` receivers (the source up to source_degree: `degree` for a node, 1 for the
    controller) in the nodes' order. shared - nodes that see the source node's directory itself (one
    filesystem that they mount): they neither receive nor send a copy."""
    pairs = _nodes(nodes)
    shared = [str(name) for name in shared or ()]
    strangers = [name for name in shared if name not in dict(pairs)]
    if strangers:
        raise FanoutError(f"shared names nodes that are not among the nodes: {', '.join(strangers)}")
    if source in shared:
        raise FanoutError(f"the source {source!r} cannot share its own directory")
    if not pairs:
        raise FanoutError("no node needs the model: the fan-out plan needs at least one node")
    for what, values in (("node names", [name for name, _ in pairs]), ("fabric addresses", [a for _, a in pairs])):
        twice = _duplicates(values)
        if twice:
            raise FanoutError(f"{what} given twice: {', '.join(twice)}")
    names = [name for name, _ in pairs]
    if CONTROLLER in names:
        raise FanoutError(f"a node is named {CONTROLLER!r}, the name of the controller as a source")
    if type(degree) is not int or degree < 1:
        raise FanoutError(f"the fan-out degree must be an integer of at least 1, not {degree!r}")
    if source != CONTROLLER and source not in names:
        raise FanoutError(f"the source {source!r} is neither {CONTROLLER!r} nor one of the nodes ({', '.join(names)})")
    if source_degree is None:
        source_degree = 1 if source == CONTROLLER else degree
    if type(source_degree) is not int or source_degree < 1:
        raise FanoutError(f"the source's fan-out degree must be an integer of at least 1, not {source_degree!r}")

    address = dict(pairs)
    depth = {source: 0}
    senders = deque([[source, source_degree]])
    edges = []
    for name in names:
        if name == source or name in shared:
            continue
        sender = senders[0]
        depth[name] = depth[sender[0]] + 1
        edges.append({"round": depth[name], "from": sender[0], "from_address": address.get(sender[0]),
                      "to": name, "to_address": address[name],
                      "network": "management" if sender[0] == CONTROLLER else "fabric"})
        sender[1] -= 1
        if sender[1] == 0:
            senders.popleft()
        senders.append([name, degree])
    return {"source": source, "degree": degree, "source_degree": source_degree,
            "rounds": max(depth.values()), "edges": edges, "shared": [n for n in names if n in shared]}


def sender_of(plan: dict) -> dict[str, dict]:
    """{receiving node: its edge}: what each node copies from (the source is in none)."""
    return {edge["to"]: edge for edge in plan["edges"]}


def out_degrees(plan: dict) -> dict[str, int]:
    """{sender: copies it sends}."""
    counts: dict[str, int] = {}
    for edge in plan["edges"]:
        counts[edge["from"]] = counts.get(edge["from"], 0) + 1
    return counts


def fanout_table(plan: dict) -> list[str]:
    """Lines for the plan's explanation: a headline, then a row per copy (round, from, to)."""
    copies = len(plan["edges"])
    lines = [f"Fan-out: from {plan['source']}, {copies} cop{'y' if copies == 1 else 'ies'} in {plan['rounds']} "
             f"round{'' if plan['rounds'] == 1 else 's'}; each node sends at most {plan['degree']}"
             + (f", {plan['source']} {plan['source_degree']}" if plan["source_degree"] != plan["degree"] else "")]
    if plan.get("shared"):
        lines.append(f"  {', '.join(plan['shared'])} read{'s' if len(plan['shared']) == 1 else ''} "
                     f"{plan['source']}'s copy (the same filesystem): no copy, only the check")
    if not copies:
        return lines
    lines.append(ROW.format("round", "from", "to"))
    for edge in plan["edges"]:
        sender = edge["from"] if edge["from_address"] is None else f"{edge['from']} ({edge['from_address']})"
        lines.append(ROW.format(edge["round"], sender, f"{edge['to']} ({edge['to_address']})"))
    return lines
