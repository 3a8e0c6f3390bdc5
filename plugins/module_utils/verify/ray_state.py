"""Ray cluster state: parse `ray status` and `ray list ... --format json`, compare with what the plan expects.

The ray_cluster role waits until Ray reports the expected ALIVE nodes and GPUs,
and its failure must say which nodes are missing (by inventory name and
address) and what Ray did report; the doctor and the vLLM verification read
actors and placement groups from the same state API. Everything here is pure
parsing and comparison of Ray's own outputs:

* `ray list nodes --format json` (state API, served by the head's dashboard):
  one object per node with `node_id`, `node_ip`, `is_head_node`, `state`
  (ALIVE/DEAD), `state_message`, `node_name`, `resources_total`. Ray 2.60
  prints memory resources as text ("16.010 GiB") and counts as numbers.
  `ray get nodes <id>` prints the same fields as YAML; a parsed mapping of it
  is accepted too.
* `ray list actors --format json` and `ray list placement-groups --format json`.
* `ray status` text (GCS, no dashboard needed): node ids under Active/Idle (or
  Healthy: per node type, autoscaler v1), resource usage `used/total name`,
  pending nodes, recent failures, and with `-v` per-node blocks.

Pure Python (3.11+); imports nothing from Ansible.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

ALIVE = "ALIVE"


class RayStateError(ValueError):
    """Ray's output cannot be read."""


# --------------------------------------------------------------------------- state API (JSON)


def _json_records(data, what: str) -> list[dict]:
    """Accept the CLI's JSON text, an already parsed list, or a single record (`ray get` YAML)."""
    if isinstance(data, str):
        start = data.find("[")
        brace = data.find("{")
        if start == -1 or (brace != -1 and brace < start):
            start = brace
        if start == -1:
            raise RayStateError(f"`ray list {what}` printed no JSON: {data.strip()[:200]!r}")
        try:
            data = json.loads(data[start:])
        except json.JSONDecodeError as error:
            raise RayStateError(f"`ray list {what}` printed invalid JSON ({error}): {data[start:start + 200]!r}") from None
    if isinstance(data, Mapping):
        data = [data]
    if not isinstance(data, Sequence) or isinstance(data, str | bytes):
        raise RayStateError(f"`ray list {what}` must be a JSON list, got {type(data).__name__}")
    for index, record in enumerate(data):
        if not isinstance(record, Mapping):
            raise RayStateError(f"`ray list {what}` entry {index} is not an object: {record!r}")
    return [dict(record) for record in data]


def _number(value, field: str) -> float:
    if isinstance(value, bool):
        raise RayStateError(f"{field} is not a number: {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise RayStateError(f"{field} is not a number: {value!r}")


def parse_nodes(data) -> list[dict]:
    """Nodes from `ray list nodes --format json` (or `ray get nodes` parsed), in Ray's order.

    Each: node_id, address (node_ip), name (node_name), is_head, state,
    state_message, gpus, cpus (0.0 when the resource is absent) and the raw
    resources_total.
    """
    nodes = []
    for index, record in enumerate(_json_records(data, "nodes")):
        missing = [key for key in ("node_id", "node_ip", "state") if not record.get(key)]
        if missing:
            raise RayStateError(f"node entry {index} lacks {', '.join(missing)}: {record!r}")
        resources = record.get("resources_total") or {}
        if not isinstance(resources, Mapping):
            raise RayStateError(f"node {record['node_ip']}: resources_total is not an object: {resources!r}")
        nodes.append(
            {
                "node_id": str(record["node_id"]),
                "address": str(record["node_ip"]),
                "name": str(record.get("node_name") or record["node_ip"]),
                "is_head": bool(record.get("is_head_node", False)),
                "state": str(record["state"]).upper(),
                "state_message": record.get("state_message"),
                "gpus": _number(resources.get("GPU", 0), f"node {record['node_ip']} GPU"),
                "cpus": _number(resources.get("CPU", 0), f"node {record['node_ip']} CPU"),
                "resources": dict(resources),
            }
        )
    return nodes


def parse_actors(data) -> list[dict]:
    """Actors from `ray list actors --format json [--detail]`: id, class, state, name, node_id, pid, placement group."""
    actors = []
    for index, record in enumerate(_json_records(data, "actors")):
        if not record.get("actor_id"):
            raise RayStateError(f"actor entry {index} lacks actor_id: {record!r}")
        actors.append(
            {
                "actor_id": str(record["actor_id"]),
                "class_name": record.get("class_name"),
                "state": str(record.get("state") or "").upper(),
                "name": record.get("name") or "",
                "node_id": record.get("node_id"),
                "pid": record.get("pid"),
                "placement_group_id": record.get("placement_group_id"),
            }
        )
    return actors


def parse_placement_groups(data) -> list[dict]:
    """Placement groups from `ray list placement-groups --detail --format json`.

    Each: id, name, state, strategy, bundles (index, resources, node_id). Without
    --detail Ray prints no bundles; they are then an empty list.
    """
    groups = []
    for index, record in enumerate(_json_records(data, "placement-groups")):
        if not record.get("placement_group_id"):
            raise RayStateError(f"placement group entry {index} lacks placement_group_id: {record!r}")
        bundles = []
        for position, bundle in enumerate(record.get("bundles") or []):
            bundle_id = bundle.get("bundle_id") or {}
            bundles.append(
                {
                    "index": bundle_id.get("bundle_index", position),
                    "resources": dict(bundle.get("unit_resources") or {}),
                    "node_id": bundle.get("node_id"),
                }
            )
        groups.append(
            {
                "placement_group_id": str(record["placement_group_id"]),
                "name": record.get("name") or "",
                "state": str(record.get("state") or "").upper(),
                "strategy": record.get("strategy"),
                "bundles": bundles,
            }
        )
    return groups


_WORKER_NAME = re.compile(r"_TP(?P<tp>\d+)(?:_PP(?P<pp>\d+))?")


def worker_layout(actors: list[dict], nodes: list[dict], class_name: str = "RayWorkerProc") -> dict:
    """vLLM's Ray workers per node address: {address: [{"tp", "pp", "pid", "name"}]}, ALIVE actors only.

    vLLM names its workers `vllm_Worker_<id>_TP<r>_PP<s>`; actors carry a node
    id, joined here with the node list to get the address.
    """
    address_of = {node["node_id"]: node["address"] for node in nodes}
    layout: dict[str, list[dict]] = {}
    for actor in actors:
        if actor["class_name"] != class_name or actor["state"] != ALIVE:
            continue
        match = _WORKER_NAME.search(actor["name"])
        address = address_of.get(actor["node_id"], f"unknown node {actor['node_id']}")
        layout.setdefault(address, []).append(
            {
                "tp": int(match["tp"]) if match else None,
                "pp": int(match["pp"]) if match and match["pp"] is not None else (0 if match else None),
                "pid": actor["pid"],
                "name": actor["name"],
            }
        )
    for workers in layout.values():
        workers.sort(key=lambda w: (w["pp"] if w["pp"] is not None else -1, w["tp"] if w["tp"] is not None else -1))
    return layout


# --------------------------------------------------------------------------- `ray status` (text)

_SECTION_KEYS = {
    "active": "active",
    "idle": "idle",
    "healthy": "healthy",
    "pending": "pending",
    "recent failures": "failures",
    "usage": "usage",
    "total usage": "usage",
    "demands": "demands",
    "total demands": "demands",
    "pending demands": "demands",
    "from request_resources": "requested",
    "total constraints": "requested",
}
_COUNT_LINE = re.compile(r"^\s*(?P<count>\d+)\s+(?P<name>\S.*?)\s*$")
_USAGE_LINE = re.compile(r"^\s*(?P<used>[0-9.]+\s*[A-Za-z]*)/(?P<total>[0-9.]+\s*[A-Za-z]*)\s+(?P<name>\S+)")
_NODE_HEADER = re.compile(r"^Node:\s*(?P<node>\S+)(?:\s+\((?P<type>[^)]*)\))?\s*$")
_TIMESTAMP = re.compile(r"=+\s*Autoscaler status:\s*(?P<ts>.+?)\s*=+")
_SIZE = re.compile(r"^(?P<value>[0-9.]+)\s*(?P<unit>[KMGTP]?i?B)$")
_UNITS = {"B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4, "PB": 1000**5,
          "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4, "PIB": 1024**5}


def _quantity(text: str) -> float:
    """'0.0' -> 0.0; '3.88TiB' -> bytes; '16.010 GiB' -> bytes."""
    text = text.strip()
    match = _SIZE.match(text)
    if match:
        return float(match["value"]) * _UNITS[match["unit"].upper()]
    return float(text)


def parse_status(text: str) -> dict:
    """`ray status [-v]` text: nodes, pending, failures, resource usage, demands, per-node blocks (-v).

    Returns timestamp, nodes (ids or node types from Active/Idle/Healthy with
    their counts), node_count, pending, failures, usage ({resource: {used,
    total}}, bytes for memory), demands, and per_node ([{node, type, usage,
    idle}], only with -v).
    """
    if not isinstance(text, str) or not text.strip():
        raise RayStateError("`ray status` printed nothing")
    if "No cluster status" in text:
        raise RayStateError("`ray status` says: No cluster status (the head's GCS is still starting)")
    result: dict = {
        "timestamp": None,
        "nodes": [],
        "node_count": 0,
        "pending": [],
        "failures": [],
        "usage": {},
        "demands": [],
        "per_node": [],
    }
    section = None
    current_node = None
    node_field = None
    seen_section = False
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or set(line.strip()) <= {"-"}:
            continue
        stamp = _TIMESTAMP.search(line)
        if stamp:
            result["timestamp"] = stamp["ts"]
            continue
        header = _NODE_HEADER.match(line)
        if header:
            current_node = {"node": header["node"], "type": header["type"], "usage": {}, "idle": None}
            result["per_node"].append(current_node)
            section, node_field = None, None
            continue
        stripped = line.strip()
        if not line[0].isspace() and not stripped.endswith(":"):
            section, current_node, node_field = None, None, None  # "Node status", "Resources", a prompt
            continue
        if stripped.endswith(":") and not _USAGE_LINE.match(stripped):
            key = stripped[:-1].strip().lower()
            if current_node is not None and key in ("usage", "is idle", "activity"):
                node_field = key
                continue
            if key in _SECTION_KEYS:
                section, current_node, node_field = _SECTION_KEYS[key], None, None
                seen_section = True
            else:
                section = None  # "Node status", "Resources" and other headings
            continue
        if current_node is not None:
            usage = _USAGE_LINE.match(stripped)
            if node_field == "usage" and usage:
                current_node["usage"][usage["name"]] = {"used": _quantity(usage["used"]),
                                                        "total": _quantity(usage["total"])}
            elif node_field == "is idle":
                current_node["idle"] = stripped.lower() == "true"
            continue
        if stripped.startswith("(") and stripped.endswith(")"):
            continue  # "(no pending nodes)", "(no failures)", "(no resource demands)"
        if section in ("active", "idle", "healthy"):
            count = _COUNT_LINE.match(stripped)
            if not count:
                raise RayStateError(f"`ray status`: cannot read node line {stripped!r}")
            result["nodes"].append({"name": count["name"], "count": int(count["count"]), "status": section})
            result["node_count"] += int(count["count"])
        elif section == "pending":
            result["pending"].append(stripped)
        elif section == "failures":
            result["failures"].append(stripped)
        elif section == "usage":
            usage = _USAGE_LINE.match(stripped)
            if not usage:
                raise RayStateError(f"`ray status`: cannot read usage line {stripped!r}")
            result["usage"][usage["name"]] = {"used": _quantity(usage["used"]), "total": _quantity(usage["total"])}
        elif section in ("demands", "requested"):
            if section == "demands":
                result["demands"].append(stripped)
    if not seen_section:
        raise RayStateError(f"`ray status` printed no node or resource section: {text.strip()[:200]!r}")
    return result


# --------------------------------------------------------------------------- expectations


def _gpu_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _describe(node: dict, name: str | None) -> str:
    parts = [node["address"]]
    if node["is_head"]:
        parts.append("head")
    parts.append(f"{_gpu_text(node['gpus'])} GPUs")
    return f"{name} ({', '.join(parts)})" if name else f"{node['address']} ({', '.join(parts[1:])})"


def compare_nodes(expected: Sequence[Mapping], found: Sequence[Mapping], expected_gpus: float | None = None,
                  cluster: str = "the Ray cluster") -> dict:
    """Compare the ALIVE nodes Ray reports with the nodes the deployment expects.

    expected: [{"name", "address", optional "gpus"}]; found: parse_nodes().
    expected_gpus: total GPUs over the ALIVE nodes (default: the sum of the
    expected nodes' "gpus" when each has one).

    Returns ok, alive (count), gpus (total over ALIVE nodes), expected_nodes,
    expected_gpus, missing ([{name, address, state}]: not ALIVE at that
    address; state is DEAD when Ray knows the node as dead, else absent),
    unexpected (ALIVE at an address nobody expects: [{address, gpus}]),
    gpu_mismatch ([{name, address, gpus, expected}]) and message ("" when ok).
    """
    names = {}
    for entry in expected:
        if not entry.get("address"):
            raise RayStateError(f"expected node {entry!r} has no address")
        names[str(entry["address"])] = str(entry.get("name") or entry["address"])
    if expected_gpus is None and expected and all(entry.get("gpus") is not None for entry in expected):
        expected_gpus = float(sum(float(entry["gpus"]) for entry in expected))
    alive = [node for node in found if node["state"] == ALIVE]
    alive_by_address = {}
    for node in alive:
        alive_by_address.setdefault(node["address"], node)
    dead_by_address = {node["address"]: node for node in found if node["state"] != ALIVE}

    missing = []
    for address, name in names.items():
        if address in alive_by_address:
            continue
        dead = dead_by_address.get(address)
        missing.append({"name": name, "address": address, "state": dead["state"] if dead else "absent",
                        "state_message": dead.get("state_message") if dead else None})
    unexpected = [{"address": node["address"], "gpus": node["gpus"], "node_id": node["node_id"]}
                  for node in alive if node["address"] not in names]
    gpu_mismatch = []
    for entry in expected:
        node = alive_by_address.get(str(entry["address"]))
        if node is not None and entry.get("gpus") is not None and float(entry["gpus"]) != node["gpus"]:
            gpu_mismatch.append({"name": names[str(entry["address"])], "address": node["address"],
                                 "gpus": node["gpus"], "expected": float(entry["gpus"])})
    gpus = float(sum(node["gpus"] for node in alive))
    ok = not missing and not unexpected and not gpu_mismatch and (expected_gpus is None or gpus == expected_gpus)

    message = ""
    if not ok:
        want = f"{len(names)} ALIVE nodes" + (f" with {_gpu_text(expected_gpus)} GPUs" if expected_gpus is not None else "")
        lines = [f"{cluster}: expected {want}; Ray reports {len(alive)} ALIVE with {_gpu_text(gpus)} GPUs."]
        if missing:
            described = []
            for entry in missing:
                text = f"{entry['name']} ({entry['address']})"
                if entry["state"] != "absent":
                    text += f" is {entry['state']}" + (f": {entry['state_message']}" if entry["state_message"] else "")
                described.append(text)
            lines.append(f"Missing: {', '.join(described)}.")
        if alive:
            order = {address: index for index, address in enumerate(names)}
            shown = sorted(alive, key=lambda node: (order.get(node["address"], len(order)), node["address"]))
            lines.append("Found: " + ", ".join(_describe(node, names.get(node["address"])) for node in shown) + ".")
        if unexpected:
            lines.append(
                "ALIVE at an address no node should use: "
                + ", ".join(f"{entry['address']} ({_gpu_text(entry['gpus'])} GPUs)" for entry in unexpected)
                + " (a node that joined with another NIC's address: check --node-ip-address and the fabric interface)."
            )
        for entry in gpu_mismatch:
            lines.append(f"{entry['name']} ({entry['address']}) registered {_gpu_text(entry['gpus'])} GPUs, "
                         f"expected {_gpu_text(entry['expected'])}.")
        message = " ".join(lines)
    return {
        "ok": ok,
        "alive": len(alive),
        "gpus": gpus,
        "expected_nodes": len(names),
        "expected_gpus": expected_gpus,
        "missing": missing,
        "unexpected": unexpected,
        "gpu_mismatch": gpu_mismatch,
        "message": message,
    }


def compare_status(expected: Sequence[Mapping], status: Mapping, expected_gpus: float | None = None,
                   cluster: str = "the Ray cluster") -> dict:
    """The same verdict from `ray status` alone (no dashboard): counts only, unless -v named the nodes.

    `ray status` lists node ids, not addresses, so without per-node blocks the
    message can say how many nodes are missing but not which.
    """
    if expected_gpus is None and expected and all(entry.get("gpus") is not None for entry in expected):
        expected_gpus = float(sum(float(entry["gpus"]) for entry in expected))
    gpus = float(status["usage"].get("GPU", {}).get("total", 0.0))
    count = status["node_count"]
    by_address = {str(entry["address"]): str(entry.get("name") or entry["address"]) for entry in expected}
    reported = {node["node"] for node in status.get("per_node", [])}
    missing = []
    if reported and any(address in reported for address in by_address):
        missing = [{"name": name, "address": address, "state": "absent", "state_message": None}
                   for address, name in by_address.items() if address not in reported]
    ok = count == len(by_address) and not missing and (expected_gpus is None or gpus == expected_gpus)
    message = ""
    if not ok:
        want = f"{len(by_address)} nodes" + (f" with {_gpu_text(expected_gpus)} GPUs" if expected_gpus is not None else "")
        message = f"{cluster}: expected {want}; `ray status` reports {count} with {_gpu_text(gpus)} GPUs."
        if missing:
            message += " Missing: " + ", ".join(f"{m['name']} ({m['address']})" for m in missing) + "."
        elif count < len(by_address):
            message += (f" {len(by_address) - count} of " + ", ".join(f"{n} ({a})" for a, n in by_address.items())
                        + " have not joined (`ray status` names nodes by id; the state API names them by address).")
        if status.get("pending"):
            message += " Pending: " + "; ".join(status["pending"]) + "."
        if status.get("failures"):
            message += " Recent failures: " + "; ".join(status["failures"]) + "."
    return {
        "ok": ok,
        "alive": count,
        "gpus": gpus,
        "expected_nodes": len(by_address),
        "expected_gpus": expected_gpus,
        "missing": missing,
        "unexpected": [],
        "gpu_mismatch": [],
        "message": message,
    }
