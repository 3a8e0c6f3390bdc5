"""Observations between nodes: interface names and addresses, Ray membership, probes, firewalls, InfiniBand.

And between the clients and the API: ``obs_api_unanswered_from_client`` (the controller's probes).

The socket interface variables and ``VLLM_HOST_IP`` against the fabric and
the plan, Ray nodes the head does not list as ALIVE, TCP probes of the head's
rendezvous ports, firewall rules that drop a port a probe could not reach,
declared InfiniBand HCAs and their ports, the pinned memory RDMA needs, and TP
spanning nodes. Each ``obs_*`` function is named in ``observations.OBSERVATIONS``.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
    RAY_UNITS,
    VLLM_UNIT,
    make_hit,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.net import rule_ports, source_accepted
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.systemd import READY_PATTERNS
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import flag_value, is_ip

SOCKET_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def obs_ray_node_not_alive(cluster, params):
    """Ray nodes (by their --node-ip-address) that the head's state API does not list as ALIVE."""
    head = cluster.head
    ray_info = head.gather.get("ray") if head else None
    listed = (ray_info or {}).get("nodes")
    if not isinstance(listed, list):
        return []
    alive = {entry.get("node_ip") for entry in listed if entry.get("state") == "ALIVE"}
    dead = {entry.get("node_ip"): entry for entry in listed if entry.get("state") != "ALIVE"}
    hits = []
    for node in cluster.nodes:
        argv = cluster.ray_argv(node) if node.reachable else []
        address = flag_value(argv, "--node-ip-address") or node.plan.get("address")
        planned = node.plan and launch.of_plan(cluster.plan).cluster_units_on(node.plan.get("node_rank", 1))
        if not argv and not planned:
            continue
        if address and address not in alive:
            state = dead.get(address, {}).get("state", "absent")
            hits.append(
                make_hit(
                    node,
                    f"ray list nodes (on {head.name})",
                    f"Ray node {node.name} ({address}) is {state} in the head's node list "
                    f"({len(alive)} ALIVE: {', '.join(sorted(a for a in alive if a)) or 'none'})",
                    address=address, ray_state=state,
                )
            )
    return hits


def obs_ray_gpus_below_plan(cluster, params):
    """ALIVE Ray nodes that registered fewer GPUs than the plan gives them (its ray_start_argv's --num-gpus).

    vLLM's placement group asks for the plan's GPUs on each node, so it stays pending while one node
    offers fewer: the node is named, with the --num-gpus its Ray unit runs and the drop-ins that set it.
    """
    head = cluster.head
    listed = ((head.gather.get("ray") if head else None) or {}).get("nodes")
    if not isinstance(listed, list):
        return []
    registered = {entry.get("node_ip"): (entry.get("resources_total") or {}).get("GPU", 0)
                  for entry in listed if entry.get("state") == "ALIVE"}
    hits = []
    for node in cluster.nodes:
        planned_argv = (node.plan or {}).get("ray_start_argv") or []
        planned = flag_value(planned_argv, "--num-gpus")
        address = flag_value(planned_argv, "--node-ip-address") or (node.plan or {}).get("address")
        if planned is None or address not in registered:
            continue
        try:
            planned_gpus, gpus = float(planned), float(registered[address] or 0)
        except (TypeError, ValueError):
            continue
        if gpus >= planned_gpus:
            continue
        unit = next((u for u in RAY_UNITS if node.reachable and node.installed(u)), None)
        running = flag_value(cluster.ray_argv(node), "--num-gpus") if unit else None
        dropins = (node.unit(unit).get("DropInPaths") or "") if unit else ""
        unit = unit or "the Ray unit"
        hits.append(
            make_hit(node, f"ray list nodes (on {head.name})",
                     f"Ray node {node.name} ({address}) registered {gpus:g} GPUs; the plan gives it {planned_gpus:g}"
                     f" ({unit} runs --num-gpus {running if running is not None else 'unknown'}"
                     f"{'; drop-ins: ' + dropins if dropins else ''})",
                     address=address, gpus=f"{gpus:g}", planned_gpus=f"{planned_gpus:g}", unit=unit,
                     running_gpus=running if running is not None else "unknown",
                     dropins=dropins or "none"))
    return hits


def _nccl_ifname_matches(value, expected):
    """NCCL_SOCKET_IFNAME semantics: prefixes, '=' for exact names, '^' to exclude."""
    exact = value.startswith("=")
    body = value.lstrip("=")
    exclude = body.startswith("^")
    names = [name for name in body.lstrip("^").split(",") if name]
    if exclude:
        return not any(expected == name if exact else expected.startswith(name) for name in names)
    return any(expected == name if exact else expected.startswith(name) for name in names)


def obs_socket_ifname_mismatch(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        env = node.env
        expected = cluster.fabric_interface(node)
        route_dev = None
        head = cluster.head
        if head is not None and head.plan.get("address"):
            route_dev = (node.gather.get("routes") or {}).get(head.plan["address"])
        for var in SOCKET_IFNAME_VARS:
            if var not in env:
                continue
            value, path, (number, text) = env[var]
            want = expected or route_dev
            problems = []
            if var == "NCCL_SOCKET_IFNAME":
                if want and not _nccl_ifname_matches(value, want):
                    problems.append(f"selects no interface named like {want}")
            else:
                if "," in value or value.startswith("^"):
                    problems.append("Gloo and torch take one concrete interface name, not a list")
                elif want and value != want:
                    problems.append(f"expected {want}")
                elif node.interfaces and value not in node.interfaces:
                    problems.append(f"no interface {value} on this node ({', '.join(sorted(node.interfaces))})")
            if problems:
                hits.append(
                    make_hit(
                        node,
                        f"{path}:{number}",
                        f"{text.strip()}  <- {'; '.join(problems)} (the fabric interface"
                        f"{' from the inventory' if expected else ' that routes to the head'})",
                        var=var, value=value, expected=want or "?", path=path,
                    )
                )
    return hits


def obs_host_ip_mismatch(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        env = node.env
        planned = node.plan.get("address")
        local = node.local_addresses()
        if "VLLM_HOST_IP" in env:
            value, path, (number, text) = env["VLLM_HOST_IP"]
            problems = []
            if planned and is_ip(planned) and value != planned:
                problems.append(f"the plan gives this node {planned}")
            # The planned address itself gone from every interface is address_missing's (the setting is right).
            if local and value not in local and value != planned:
                problems.append("no interface of this node has that address")
            if problems:
                hits.append(
                    make_hit(node, f"{path}:{number}", f"{text.strip()}  <- {'; '.join(problems)}",
                             value=value, expected=planned or "?")
                )
        ray_ip = flag_value(cluster.ray_argv(node), "--node-ip-address")
        host_ip = env.get("VLLM_HOST_IP", (None,))[0]
        if ray_ip and host_ip and ray_ip != host_ip:
            hits.append(
                make_hit(node, "ray unit ExecStart",
                         f"ray start --node-ip-address {ray_ip} but VLLM_HOST_IP={host_ip}: vLLM and Ray name "
                         "this node differently",
                         value=host_ip, expected=ray_ip)
            )
    return hits


def obs_rendezvous_probe(cluster, params):
    """A node's TCP probe of a head port: results in params['results'] (default timeout/unreachable)."""
    wanted = set(params.get("results", ["timeout", "unreachable"]))
    hits = []
    head = cluster.head
    for node in cluster.reachable_nodes():
        for probe in node.gather.get("probes") or []:
            if probe.get("result") not in wanted:
                continue
            if probe.get("result") == "refused" and head is not None and _still_starting(head, probe.get("name")):
                continue  # the head's unit is up but has not opened the port yet: a start, not a fault
            listening = ""
            if head is not None and head.reachable:
                if any(sock["port"] == probe.get("port") for sock in head.gather.get("listening") or []):
                    listening = f"; {head.name} listens on {probe.get('port')}"
                else:
                    listening = f"; nothing listens on {probe.get('port')} at {head.name}"
            hits.append(
                make_hit(
                    node,
                    "tcp probe",
                    f"{node.name} -> {probe.get('address')}:{probe.get('port')} ({probe.get('name')}): "
                    f"{probe.get('result')} after {probe.get('elapsed_ms', '?')} ms{listening}",
                    address=probe.get("address"), port=probe.get("port"), port_name=probe.get("name"),
                    result=probe.get("result"),
                )
            )
    return hits


def _still_starting(head, probe_name):
    unit = "ray-head.service" if probe_name == "ray_gcs" else VLLM_UNIT
    info = head.unit(unit)
    if info.get("ActiveState") not in ("active", "activating") or info.get("SubState") == "auto-restart":
        return False
    ready = [re.compile(pattern) for pattern in READY_PATTERNS]
    return not any(r.search(line) for r in ready for line in head.journal(unit))


def obs_firewall_drops_port(cluster, params):
    """Drop/reject rules on a node for a port another node's probe of that node could not reach.

    A rule alone proves nothing: a hardened node drops the internal ports for
    sources outside the cluster on purpose (after accepting the cluster's own
    nodes). A rule is quoted only when a probe over the fabric (timeout or
    unreachable) shows the port is blocked for a node of the cluster.
    """
    wanted = set(params.get("results", ["timeout", "unreachable"]))
    blocked = {}  # target node name -> {port: port name}
    probers = {}  # target node name -> addresses of the nodes whose probe failed
    hits = []
    for prober in cluster.reachable_nodes():
        for probe in prober.gather.get("probes") or []:
            if probe.get("result") not in wanted or not isinstance(probe.get("port"), int):
                continue
            hits += _outgoing_rule_hits(prober, probe)
            for target in cluster.reachable_nodes():
                if target is not prober and probe.get("address") in target.local_addresses() | {
                    target.plan.get("address")
                }:
                    blocked.setdefault(target.name, {})[probe["port"]] = probe.get("name") or "port"
                    probers.setdefault(target.name, set()).update(
                        {prober.plan.get("address")} | prober.local_addresses() - {None})
    for node in cluster.reachable_nodes():
        ports = blocked.get(node.name) or {}
        firewall = node.gather.get("firewall") or {}
        accepted = firewall.get("accepted_sources") or {}
        for rule in firewall.get("rules", []):
            named = sorted(rule_ports(rule) & set(ports))
            # A rule its chain never lets the probing nodes reach (they are accepted before it) is not the cause.
            if named and any(source_accepted(address, accepted.get(rule, []))
                             for address in probers.get(node.name, ()) if address):
                continue
            if named:
                hits.append(
                    make_hit(node, (node.gather.get("firewall") or {}).get("tool", "firewall"),
                             f"{rule}  <- drops deployment port {', '.join(f'{p} ({ports[p]})' for p in named)}",
                             port=named[0], port_name=ports[named[0]])
                )
    return hits


def _outgoing_rule_hits(prober, probe):
    """The prober's own rules that drop its connection to the probed address and port (an outgoing filter)."""
    firewall = prober.gather.get("firewall") or {}
    address, port = probe.get("address"), probe["port"]
    hits = []
    for rule in firewall.get("rules", []):
        if port in rule_ports(rule) and re.search(rf"(?:daddr|-d)\s+{re.escape(str(address))}(?:/32)?(?!\d)", rule):
            hits.append(make_hit(prober, firewall.get("tool", "firewall"),
                                 f"{rule}  <- {prober.name} drops its own connections to {address}:{port} "
                                 f"({probe.get('name') or 'port'}) on the way out",
                                 port=port, port_name=probe.get("name") or "port"))
    return hits


def _ib_declared(node):
    """IB is declared by the plan (the inventory's HCAs); the node's own env files only without a plan."""
    if node.plan.get("env"):
        env = node.plan["env"]
        hca, disabled = env.get("NCCL_IB_HCA"), env.get("NCCL_IB_DISABLE") == "1"
    else:
        env = node.env
        hca = env.get("NCCL_IB_HCA", (None,))[0]
        disabled = env.get("NCCL_IB_DISABLE", ("0",))[0] == "1"
    return bool(hca) and not disabled, hca


def obs_ib_declared(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        declared, hca = _ib_declared(node)
        if declared:
            hits.append(make_hit(node, "env", f"NCCL_IB_HCA={hca} on {node.name}", hca=hca))
    return hits


def obs_ib_port_down(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        declared, hca = _ib_declared(node)
        if not declared:
            continue
        if "present" not in node.ib:
            continue  # ib_facts did not run or failed: nothing to compare
        names = [name.split(":")[0] for name in hca.lstrip("=^").split(",") if name]
        ports = node.ib.get("ports") or []
        for name in names:
            mine = [port for port in ports if port.get("ca") == name]
            if not mine:
                hits.append(make_hit(node, "ibstat", f"{name} is declared in NCCL_IB_HCA but ibstat does not show it",
                                     hca=name, state="absent"))
            for port in mine:
                if port.get("state") != "Active":
                    hits.append(
                        make_hit(node, "ibstat",
                                 f"{port.get('name')}: State {port.get('state')}, Physical state "
                                 f"{port.get('physical_state')} (declared in NCCL_IB_HCA)",
                                 hca=port.get("name"), state=port.get("state"))
                    )
    return hits


def obs_memlock_limited(cluster, params):
    minimum = params.get("min_bytes")
    hits = []
    for node in cluster.reachable_nodes():
        declared, _ = _ib_declared(node)
        if params.get("only_with_ib", True) and not declared:
            continue
        for unit in cluster.expected_units(node):
            if not node.installed(unit):
                continue
            limit = node.unit(unit).get("LimitMEMLOCK")
            if limit in (None, "", "infinity"):
                continue
            if limit.isdigit() and minimum is not None and int(limit) >= int(minimum):
                continue
            hits.append(make_hit(node, "systemctl", f"{unit}: LimitMEMLOCK={limit} (RDMA needs pinned memory)",
                                 unit=unit, limit=limit))
    return hits


def obs_tp_across_nodes(cluster, params):
    plan = cluster.plan
    per_node = (plan.get("cluster") or {}).get("gpus_per_node")
    if plan.get("tp") and per_node and plan["tp"] > per_node:
        return [make_hit(None, "plan", f"TP={plan['tp']} spans nodes of {per_node} GPUs each "
                         "(allow_tp_across_nodes): every layer's all-reduce crosses the network",
                         tp=plan["tp"], gpus_per_node=per_node)]
    return []


def refused_for_want_of_a_chat_template(probe):
    """A chat probe that vLLM answered 400 because the model's tokenizer defines no chat template."""
    return (probe.get("probe", "").endswith("/chat/completions") and probe.get("status") == 400
            and "chat template" in (probe.get("error") or "").lower())


def obs_chat_template_missing(cluster, params):
    """The chat probe refused for want of a chat template (the server works: its completion answered)."""
    refused = [probe for probe in (cluster.client.get("probes") or [])
               if not probe.get("ok") and refused_for_want_of_a_chat_template(probe)]
    if not refused:
        return []
    head = cluster.head
    url = cluster.client.get("url") or "?"
    probe = refused[0]
    return [make_hit(head.name if head else None, "controller", f"from the controller, {url}: {probe['probe']} -> "
                     f"{probe['error']}", url=url, probe=probe["probe"], error=probe["error"])]


def obs_api_unanswered_from_client(cluster, params):
    """The API's probes from the controller that got no good answer: one hit on the API node, every failure quoted.

    A node can look healthy from inside while no client gets an answer (a path blocked between the clients and the
    API node, a server that is alive but does not answer): this is what a client sees. A chat refused for want of a
    chat template is the server answering, not this (obs_chat_template_missing).
    """
    failed = [probe for probe in (cluster.client.get("probes") or [])
              if not probe.get("ok") and not refused_for_want_of_a_chat_template(probe)]
    if not failed:
        return []
    head = cluster.head
    url = cluster.client.get("url") or "?"
    quoted = "; ".join(f"{probe['probe']} -> {probe.get('error') or 'no answer'}"
                       + (f" after {probe['elapsed_s']} s" if probe.get("elapsed_s") is not None else "")
                       for probe in failed)
    first = failed[0]
    return [make_hit(head.name if head else None, "controller", f"from the controller, {url}: {quoted}",
                     url=url, probe=first["probe"], error=first.get("error") or "no answer")]


# --- Compared facts: the fabric interface's MTU and state, the routes to the other nodes ----------


def reference_value(values, head_name=None):
    """The value the others are compared with: the most common; a tie goes to the head's value (when head_name is
    given), else to the larger.

    ``values``: {node name: value}. Returns None when every node agrees (nothing to compare).
    """
    if len(set(values.values())) < 2:
        return None
    counts = {}
    for value in values.values():
        counts[value] = counts.get(value, 0) + 1
    best = max(counts.values())
    tied = [value for value, count in counts.items() if count == best]
    if len(tied) > 1 and head_name in values and values[head_name] in tied:
        return values[head_name]
    try:
        return max(tied)
    except TypeError:
        return max(tied, key=str)


def _fabric(cluster):
    """(node, its fabric interface, that interface's facts or None) for each node whose interfaces were read."""
    for node in cluster.reachable_nodes():
        if not node.interfaces:
            continue
        name = cluster.fabric_device(node)
        if name:
            yield node, name, node.interfaces.get(name)


def obs_fabric_mtu_differs(cluster, params):
    """The MTU of a node's fabric interface differs from the inventory's (nccl_network_mtu) or from the other nodes'."""
    mtus = {node.name: (name, info["mtu"]) for node, name, info in _fabric(cluster) if info and info.get("mtu")}
    expected = next((node.expected.get("mtu") for node in cluster.reachable_nodes() if node.expected.get("mtu")), None)
    if expected:
        reference, whence = int(expected), "the inventory's nccl_network_mtu"
    else:
        # A tie (two nodes) goes to the larger MTU: the jumbo frames one node uses show the fabric carries them.
        reference = reference_value({name: mtu for name, (_, mtu) in mtus.items()})
        whence = "the other nodes' fabric interfaces"
    if reference is None:
        return []
    summary = ", ".join(f"{name} {dev}={mtu}" for name, (dev, mtu) in mtus.items())
    return [
        make_hit(name, "ip -j addr", f"{name}: {dev} has mtu {mtu}; {whence} have {reference} ({summary})",
                 interface=dev, mtu=mtu, expected=reference, mtus=summary)
        for name, (dev, mtu) in mtus.items() if mtu != reference
    ]


def _ib_netdevs_down(cluster):
    """(node, netdev) of the declared IB/RoCE ports ib_port_down reports: that finding names the port already."""
    nodes = {node.name: node for node in cluster.nodes}
    covered = set()
    for hit in obs_ib_port_down(cluster, {}):
        node = nodes.get(hit["node"])
        for port in (node.ib.get("ports") or []) if node else []:
            if port.get("netdev") and hit["values"].get("hca") in (port.get("name"), port.get("ca")):
                covered.add((node.name, port["netdev"]))
    return covered


def obs_fabric_link_down(cluster, params):
    """A node's fabric interface is not up (operstate DOWN, LOWERLAYERDOWN, ...) or absent.

    The netdev of a declared InfiniBand/RoCE port that is down is left to ib_port_down (the port is the cause).
    """
    healthy = set(params.get("up", ["UP", "UNKNOWN"]))
    covered = _ib_netdevs_down(cluster)
    hits = []
    for node, name, info in _fabric(cluster):
        if (node.name, name) in covered:
            continue
        if info is None:
            hits.append(make_hit(node, "ip -j addr", f"{node.name}: the fabric interface {name} does not exist "
                                 f"(interfaces: {', '.join(sorted(node.interfaces))})", interface=name, state="absent"))
        elif info.get("state") not in healthy:
            addresses = ", ".join(info.get("addresses") or []) or "no address"
            hits.append(make_hit(node, "ip -j addr", f"{node.name}: {name} state {info.get('state')} "
                                 f"(mtu {info.get('mtu')}, {addresses})", interface=name, state=info.get("state")))
    return hits


def obs_route_to_peer_wrong(cluster, params):
    """A node's route to another node's address leaves by another interface than its fabric interface, or is missing."""
    book = {node.plan.get("address"): node.name for node in cluster.nodes if node.plan.get("address")}
    hits = []
    for node in cluster.reachable_nodes():
        fabric = cluster.fabric_interface(node) or cluster.fabric_device(node)
        for address, dev in sorted(node.routes.items()):
            peer = book.get(address)
            if peer is None or peer == node.name:
                continue
            details = node.route_details.get(address) or {}
            via = f" via {details['gateway']}" if details.get("gateway") else ""
            if dev is None:
                problem = f"no route ({details.get('error') or 'ip route get failed'})"
            elif fabric and dev != fabric:
                problem = f"leaves by {dev}{via}, not the fabric interface {fabric}"
            else:
                continue
            hits.append(make_hit(node, "ip -j route get", f"{node.name} -> {address} ({peer}): {problem}",
                                 address=address, peer=peer, interface=fabric or "?", device=dev or "none",
                                 problem=problem))
    return hits


def _prefix_len(cluster, node):
    """The prefix length the other nodes give their planned address (the fabric's subnet), or None."""
    for other in cluster.reachable_nodes():
        address = other.plan.get("address")
        if other is node or not address:
            continue
        for info in other.interfaces.values():
            for cidr in info.get("addresses") or []:
                if cidr.split("/")[0] == address and "/" in cidr:
                    return cidr.split("/")[1]
    return None


def obs_address_missing(cluster, params):
    """A node's planned address (its fabric address: VLLM_HOST_IP, the rendezvous, Ray) is on none of its interfaces."""
    hits = []
    for node in cluster.reachable_nodes():
        address = node.plan.get("address")
        if not address or not is_ip(address) or not node.interfaces or address in node.local_addresses():
            continue
        fabric = cluster.fabric_interface(node) or "the fabric interface"
        info = node.interfaces.get(fabric) or {}
        now = ", ".join(a for a in info.get("addresses") or [] if not a.startswith("fe80:")) or "no address"
        prefix = _prefix_len(cluster, node)
        hits.append(make_hit(node, "ip -j addr",
                             f"{node.name}: the plan's address {address} is on none of its interfaces "
                             f"({fabric}: state {info.get('state', 'absent')}, {now})",
                             address=address, interface=fabric, cidr=f"{address}/{prefix}" if prefix else address,
                             current=now))
    return hits
