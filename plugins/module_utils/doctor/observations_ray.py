"""Ray's own start-up failures, read from Ray's session logs and the Ray units' journals.

``doctor_gather`` keeps the tail of each session log of a node (``ray_logs``: file name -> lines); the
Ray units' journals hold what ``ray start`` printed. ``parsers.ray_logs.failures`` finds the failures in
those lines; the observations here turn them into hits with the values the log quotes (the port, the
GCS address, the versions, the node IP) and name what the plan calls them; the catalog's signatures that
name each cause use them (port_in_use, vllm_host_ip_mismatch, head_not_listening, ray_version_mismatch,
ray_node_registration_failed). A pasted log gets the same findings: put its lines in a node's ``ray_logs``
(``log_evidence``) or a Ray unit's journal.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
    RAY_UNITS,
    VLLM_UNIT,
    make_hit,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import ray_logs
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import flag_value

# What a component's port is called, for a port the plan does not name.
_COMPONENT_PORTS = {
    "raylet": "the raylet's node manager or object manager port (--node-manager-port, --object-manager-port)",
    "raylet or GCS": "a port of the raylet or the GCS (--port, --node-manager-port, --object-manager-port)",
    "gcs_server": "the GCS port (--port)",
    "dashboard": "the dashboard port (--dashboard-port)",
}
# The ray start flag of each port the plan names.
_PORT_FLAGS = {
    "ray_gcs": "--port", "ray_dashboard": "--dashboard-port", "ray_client": "--ray-client-server-port",
    "ray_node_manager": "--node-manager-port", "ray_object_manager": "--object-manager-port",
    "ray_runtime_env_agent": "--runtime-env-agent-port", "ray_dashboard_agent_grpc": "--dashboard-agent-grpc-port",
    "ray_dashboard_agent_listen": "--dashboard-agent-listen-port", "ray_metrics_export": "--metrics-export-port",
}


def log_evidence(lines, name="pasted.log"):
    """The ``ray_logs`` evidence of one node for a log that was pasted or saved: {name: lines}."""
    return {"files": {name: {"lines": [ray_logs.clean(line) for line in lines]}}}


def ray_log_files(node):
    """{file name: lines} of the node's Ray session logs ({} when none were read)."""
    files = (node.gather.get("ray_logs") or {}).get("files") or {}
    return {name: list(info.get("lines") or []) for name, info in files.items() if isinstance(info, dict)}


def _streams(node):
    """(source, file name, lines): the Ray units' journals, the vLLM journal (the driver of vLLM on Ray
    prints Ray's connection errors too) and Ray's session logs."""
    for unit in RAY_UNITS:
        lines = node.journal(unit)
        if lines:
            yield f"journal {unit}", None, lines
    lines = node.journal(VLLM_UNIT)
    if lines:
        yield f"journal {VLLM_UNIT}", None, lines
    for name, lines in ray_log_files(node).items():
        yield f"ray log {name}", name, lines


def node_failures(node):
    """[(source, failure)] of every Ray start-up failure the node's logs show (read once per node and diagnosis)."""
    cached = getattr(node, "_ray_failures", None)
    if cached is None:
        cached = []
        for source, name, lines in _streams(node):
            cached.extend((source, failure) for failure in ray_logs.failures(lines, name))
        node._ray_failures = cached
    return cached


def _ray_unit(node):
    for unit in RAY_UNITS:
        if node.installed(unit) or node.journal(unit):
            return unit
    return None


def _alive_in_head(cluster, node):
    """Whether the head's node list shows this node's Ray ALIVE (a retry that later joined is no failure)."""
    head = cluster.head
    address = flag_value(cluster.ray_argv(node), "--node-ip-address") or node.plan.get("address")
    listed = ((head.gather.get("ray") or {}).get("nodes") or []) if head is not None else []
    return bool(address) and any(n.get("node_ip") == address and n.get("state") == "ALIVE" for n in listed)


def _port_names(cluster, node):
    """{port: plan name} of the ports the deployment gives Ray on this node."""
    names = {}
    for name, port in cluster.ports_for(node).items():
        if name.startswith("ray"):
            names.setdefault(int(port), name)
    return names


def _holder(node, port):
    """{process, pid} of who listens on the port now, from the node's `ss` (outside the deployment's units first)."""
    own = node.deployment_pids
    for sock in node.gather.get("listening") or []:
        if sock.get("port") != port:
            continue
        processes = sorted(sock.get("processes") or [], key=lambda p: p.get("pid") in own)
        if processes:
            return {"process": processes[0].get("name"), "pid": processes[0].get("pid")}
    return None


def obs_ray_port_in_use(cluster, params):
    """A Ray component could not bind its port: the port from the log, named as the plan names it."""
    hits = []
    for node in cluster.reachable_nodes():
        names = _port_names(cluster, node)
        for source, failure in node_failures(node):
            # vLLM's own ports (its API server, torch's TCPStore) are port_in_use's
            if failure["kind"] != "port_in_use" or source == f"journal {VLLM_UNIT}":
                continue
            values = failure["values"]
            port = int(values["port"])
            component = values.get("component") or "ray"
            plan_name = names.get(port)
            flag = _PORT_FLAGS.get(plan_name)
            port_name = (f"{plan_name} ({flag})" if plan_name and flag else plan_name
                         or _COMPONENT_PORTS.get(component) or f"a port of Ray's {component}")
            holder = _holder(node, port) or {}
            hits.append(make_hit(
                node, source, failure["line"], port=port, component=component,
                port_name=f"Ray's {component}: {port_name}", unit=_ray_unit(node) or "the Ray unit", **holder,
            ))
    return _first_per(hits, ("node", "port"))


def obs_ray_gcs_unreachable(cluster, params):
    """A Ray node could not reach its GCS or register with it (params what: connect or register; both unset): the
    address from the log, else the unit's --address, else the plan's head and GCS port."""
    hits = []
    wanted = params.get("what")
    head = cluster.head
    for node in cluster.reachable_nodes():
        argv = cluster.ray_argv(node)
        joined = flag_value(argv, "--address") or ""
        own = flag_value(argv, "--node-ip-address")
        if _alive_in_head(cluster, node):
            continue
        failures = node_failures(node)
        # the node's own address: its unit's --node-ip-address, else (a log without its unit) the "Local node IP"
        # Ray printed; a GCS at that address is the node's own
        own_ips = {own} if argv else {f["values"].get("address") for _, f in failures if f["kind"] == "local_ip"}
        gcs = [(source, failure) for source, failure in failures if failure["kind"] == "gcs_unreachable"
               and (not wanted or failure["values"].get("what") == wanted)]
        # the line that names the address first: it gives the finding its values
        gcs.sort(key=lambda item: not item[1]["values"].get("address"))
        for source, failure in gcs:
            values = dict(failure["values"])
            if not values.get("address") and ":" in joined:
                values["address"], _, values["port"] = joined.rpartition(":")
            if not values.get("address") and head is not None and (cluster.plan.get("ports") or {}).get("ray_gcs"):
                values["address"] = head.plan.get("address")
                values["port"] = cluster.plan["ports"]["ray_gcs"]
            own_gcs = "--head" in argv or values.get("address") in own_ips
            known = bool(values.get("address"))
            values["target"] = f"{values['address']}:{values['port']}" if known else "an address the log does not name"
            values.setdefault("address", "<the head's address>")
            values.setdefault("port", "<its GCS port>")
            values["whose"] = "its own GCS" if own_gcs else "the head's GCS" if known else "the GCS"
            gcs_port = (cluster.plan.get("ports") or {}).get("ray_gcs")
            values["port_name"] = "ray_gcs" if str(gcs_port) == str(values["port"]) else "Ray GCS"
            if values.get("what") == "register":
                values["hint"] = ("its raylet did not start or register in time (the session's raylet.out and "
                                  "raylet.err say why: a port taken, a node IP that is not the node's) or the GCS "
                                  "did not answer")
            elif own_gcs:
                values["hint"] = ("the GCS did not start (its gcs_server.out says why) or the node IP Ray uses is "
                                  "not an address of this node (--node-ip-address)")
            else:
                values["hint"] = ("the head's Ray is not up on that address, the node's --address names another "
                                  "address or port, or the path to the GCS port is blocked")
            hits.append(make_hit(node, source, failure["line"], unit=_ray_unit(node) or "the Ray unit",
                                 **{key: str(value) for key, value in values.items()}))
    return _first_per(hits, ("node",))


def obs_ray_log_version_mismatch(cluster, params):
    """Ray refused a node for its Ray or Python version: the versions as Ray printed them."""
    hits = []
    for node in cluster.reachable_nodes():
        for source, failure in node_failures(node):
            if failure["kind"] != "version_mismatch":
                continue
            values = failure["values"]
            if not values.get("node_ray"):
                continue
            cluster_side = f"Ray {values['cluster_ray']}, Python {values['cluster_python']}"
            node_side = f"Ray {values['node_ray']}, Python {values['node_python']}"
            differs = "Ray" if values["cluster_ray"] != values["node_ray"] else "Python"
            if differs == "Python" and values["cluster_python"].split(".")[:2] == values["node_python"].split(".")[:2]:
                differs = "Python (patch)"
            hits.append(make_hit(
                node, source, failure["line"],
                package=differs.split()[0],
                version=values["node_ray"] if differs == "Ray" else values["node_python"],
                expected=values["cluster_ray"] if differs == "Ray" else values["cluster_python"],
                versions=f"the cluster runs {cluster_side}, {values['address']} {node_side}",
                address=values["address"],
            ))
    return _first_per(hits, ("node",))


def obs_ray_node_ip_wrong(cluster, params):
    """Ray runs a node under an address that is not the node's: Ray says no raylet matches the node's IP, or
    the node IP Ray took (its --node-ip-address, or the "Local node IP" it printed) is on none of the node's
    interfaces (judged only where the interfaces were read)."""
    hits = []
    for node in cluster.reachable_nodes():
        local = {address for address in node.local_addresses() if address}
        argv = cluster.ray_argv(node)
        configured = flag_value(argv, "--node-ip-address")
        unit = _ray_unit(node) or "the Ray unit"
        # the plan's own address missing from the node is address_missing's finding
        planned = node.plan.get("address")
        for source, failure in node_failures(node):
            address = failure["values"].get("address")
            if failure["kind"] == "node_ip_unmatched":
                hits.append(_node_ip_hit(node, source, failure["line"], address, unit, local,
                                         "no raylet of the cluster registered with it"))
            elif failure["kind"] == "local_ip" and _not_local(address, local, planned):
                hits.append(_node_ip_hit(node, source, failure["line"], address, unit, local,
                                         "no interface of the node has it"))
        if _not_local(configured, local, planned):
            hits.append(_node_ip_hit(node, "systemctl", f"{unit} runs --node-ip-address {configured}; {node.name}'s "
                                     f"addresses: {', '.join(sorted(local))}", configured, unit, local,
                                     "no interface of the node has it"))
    return _first_per(hits, ("node", "address"))


def _not_local(address, local, planned):
    """An address Ray runs the node under that no interface of it has (judged only where interfaces were read)."""
    return bool(address and local and address not in local and address != planned and not address.startswith("127."))


def _node_ip_hit(node, source, line, address, unit, local, why):
    addresses = ", ".join(sorted(local)) or "not read"
    note = (f" Ray runs {node.name} under {address} ({unit}): {why} (the node's addresses: {addresses}), so the node "
            "and the cluster cannot reach each other.")
    return make_hit(node, source, line, address=address, unit=unit, addresses=addresses, why=why,
                    ray_address_note=note)


def ray_ran(lines):
    """Whether a Ray unit's journal shows that Ray ran: a record of Ray's own log, or a failure Ray names."""
    return any(_RAY_RECORD.search(line) for line in lines) or bool(ray_logs.failures(lines))


# Ray's log records: the C++ daemons' "[YYYY-MM-DD 12:38:29,614 W 6904 6904]", the Python CLI's
# "YYYY-MM-DD 12:37:36,632	INFO scripts.py:1043 --".
_RAY_RECORD = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [IWEF] \d+ \d+\]"
                         r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(?:INFO|WARNING|ERROR|VINFO|SUCC) [\w.]+:\d+ --")


def _first_per(hits, keys):
    """One hit per node (and value) stays the finding's value; the other lines are kept as evidence after it."""
    firsts, rest, seen = [], [], set()
    for hit in hits:
        key = tuple(hit["node"] if k == "node" else hit["values"].get(k) for k in keys)
        (rest if key in seen else firsts).append(hit)
        seen.add(key)
    return firsts + rest
