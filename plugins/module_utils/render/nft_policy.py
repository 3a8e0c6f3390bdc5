"""The node firewall: one nftables table that keeps the deployment's internal ports to its own nodes.

Pure Python (no ansible import); the node_firewall module and role use it.

The table only restricts what the project opens, it never becomes a default-deny
firewall: its chain has policy accept, so SSH and the operator's own services are
left alone. Inside it, in this order:

1. replies to connections the node opened (conntrack) and loopback pass;
2. the public ports pass from the configured CIDRs and from the cluster's
   nodes, and are dropped for everyone else: the vLLM API port, and the
   client ports (the router's, on a router host). With ``api_from_cidrs``
   false the vLLM API port passes from the cluster's nodes only (clients go
   through the router, whose hosts are among the trusted addresses); the
   controller's addresses (``admin_addresses``: verify, the doctor and the
   converged check ask the API from there) reach the API port in either case;
3. every packet from a cluster node passes (NCCL, Gloo and vLLM's ZMQ/DP traffic
   also use ephemeral ports that no plan can list);
4. the protected ports (the plan's master/dp_rpc ports, every Ray port and the
   ephemeral range) are dropped for everyone else.

"The cluster's own nodes" (scope): `deployment` (the default) is every host the
plan was made for, plan['cluster']['nodes'] (the hosts of vllm_nodes, with their
fabric addresses): the network stage proves all-pairs reachability between them
and a re-plan may put any of them to work. `plan` is only the nodes that run
ranks, plan['nodes'] (tighter; a host of vllm_nodes that the plan leaves out,
the lab's node3, is then outside like the controller). The router and monitor
hosts outside vllm_nodes join them (``trusted_addresses``): the router reaches
the API ports, Prometheus scrapes node exporter, Ray and vLLM.
"""
from __future__ import annotations

import ipaddress
import re
import socket

from ansible_collections.vllm_ops.cluster.plugins.module_utils.launch import DEFAULT_PORTS

TABLE_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
# Linux's default net.ipv4.ip_local_port_range: where Gloo, NCCL's bootstrap and
# vLLM's ZMQ sockets bind when they ask the kernel for a free port.
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)
# Ray's own ports when the plan has none (backend mp): a Ray cluster started by
# hand on these nodes is still kept inside: the planner's defaults.
RAY_DEFAULT_PORTS = {name: port for name, port in DEFAULT_PORTS.items() if name.startswith("ray_")}


class FirewallError(ValueError):
    """An input the policy cannot be built from; the message names the value."""


def _port(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise FirewallError(f"port {name}={value!r}: expected a whole number 1-65535")
    try:
        number = int(value)
    except ValueError as exc:
        raise FirewallError(f"port {name}={value!r}: expected a whole number 1-65535") from exc
    if not 1 <= number <= 65535:
        raise FirewallError(f"port {name}={number}: expected 1-65535")
    return number


def merge_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sort port spans and merge overlapping or adjacent ones (nftables refuses overlapping set elements)."""
    merged: list[tuple[int, int]] = []
    for low, high in sorted(spans):
        if low > high:
            raise FirewallError(f"port range {low}-{high}: the first port must not exceed the last")
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def protected_spans(ports: dict, *, api_port: int, include_ray_defaults: bool = True,
                    ephemeral_range: tuple[int, int] | None = DEFAULT_EPHEMERAL_RANGE,
                    extra_ports: list | None = None) -> list[tuple[int, int]]:
    """The port spans only cluster nodes may reach: every plan port but the API, Ray's, the ephemeral range."""
    named = dict(RAY_DEFAULT_PORTS) if include_ray_defaults else {}
    named.update(ports or {})
    spans: list[tuple[int, int]] = []
    low = named.pop("ray_min_worker", None)
    high = named.pop("ray_max_worker", None)
    if (low is None) != (high is None):
        raise FirewallError("ports ray_min_worker and ray_max_worker: expected both or neither")
    if low is not None:
        spans.append((_port("ray_min_worker", low), _port("ray_max_worker", high)))
    for name, value in named.items():
        number = _port(name, value)
        if number != api_port:
            spans.append((number, number))
    if ephemeral_range:
        first, last = ephemeral_range
        spans.append((_port("ephemeral range start", first), _port("ephemeral range end", last)))
    for index, value in enumerate(extra_ports or []):
        text = str(value)
        if "-" in text:
            first, _, last = text.partition("-")
            spans.append((_port(f"extra port {index}", first.strip()), _port(f"extra port {index}", last.strip())))
        else:
            number = _port(f"extra port {index}", text)
            spans.append((number, number))
    merged = merge_spans(spans)
    if any(first <= api_port <= last for first, last in merged):
        raise FirewallError(
            f"the API port {api_port} falls inside a protected port range "
            f"({', '.join(_span_text(s) for s in merged)}): move the API port or the range")
    return merged


def split_networks(values: list, what: str) -> tuple[list[str], list[str]]:
    """Addresses or CIDRs -> (IPv4, IPv6) lists of normalised networks; a bad value names itself."""
    v4: list[str] = []
    v6: list[str] = []
    for value in values or []:
        try:
            network = ipaddress.ip_network(str(value).strip(), strict=False)
        except ValueError as exc:
            raise FirewallError(f"{what}: {value!r} is not an IP address or CIDR") from exc
        text = str(network.network_address) if network.num_addresses == 1 else str(network)
        target = v4 if network.version == 4 else v6
        if text not in target:
            target.append(text)
    return v4, v6


def _span_text(span: tuple[int, int]) -> str:
    return str(span[0]) if span[0] == span[1] else f"{span[0]}-{span[1]}"


def _set(name: str, kind: str, elements: list[str]) -> list[str]:
    lines = [f"  set {name} {{", f"    type {kind}", "    flags interval"]
    if elements:
        lines.append(f"    elements = {{ {', '.join(elements)} }}")
    lines.append("  }")
    return lines


def _public_port_rules(port: int, *, from_cidrs: bool, what: str, admin: bool = False) -> list[str]:
    """Accept a public port from the client CIDRs (when ``from_cidrs``), the controller (when ``admin``) and the
    cluster; drop it for the rest."""
    clients = [f"    tcp dport {port} ip saddr @api_v4 accept",
               f"    tcp dport {port} ip6 saddr @api_v6 accept"] if from_cidrs else []
    if admin:
        clients += [f"    tcp dport {port} ip saddr @admin_v4 accept",
                    f"    tcp dport {port} ip6 saddr @admin_v6 accept"]
    return clients + [
        f"    tcp dport {port} ip saddr @cluster_v4 accept",
        f"    tcp dport {port} ip6 saddr @cluster_v6 accept",
        f'    tcp dport {port} counter drop comment "{what}"',
    ]


def render_ruleset(*, table: str, cluster_addresses: list, api_port: int | list, api_cidrs: list,
                   protected: list[tuple[int, int]], comment: str = "", client_ports: list | None = None,
                   api_from_cidrs: bool = True, admin_addresses: list | None = None) -> str:
    """The nftables script: replaces the whole table atomically when loaded with `nft -f`.

    ``api_port`` is one port, or a list of them (the deployments that share a machine): each gets the same rules.
    ``client_ports`` (the router's) are open to ``api_cidrs`` and the cluster; the API ports too, unless
    ``api_from_cidrs`` is false: then only the cluster (the router's hosts among it) reaches them.
    ``admin_addresses`` (the controller's) reach the API ports in either case, and nothing else.
    """
    if not TABLE_NAME_RE.match(table or ""):
        raise FirewallError(f"table name {table!r}: expected a letter then up to 31 letters, digits or _")
    api_ports = [_port("api", port) for port in (api_port if isinstance(api_port, list) else [api_port])]
    cluster_v4, cluster_v6 = split_networks(cluster_addresses, "cluster node address")
    if not cluster_v4 and not cluster_v6:
        raise FirewallError("cluster node addresses: none given; expected the plan's node addresses")
    api_v4, api_v6 = split_networks(api_cidrs, "API CIDR")
    admin_v4, admin_v6 = split_networks(list(admin_addresses or []), "controller address")
    if not protected:
        raise FirewallError("protected ports: none given")
    lines = [f"# {line}" for line in comment.splitlines()] if comment else []
    # Declaring then deleting the table makes the load idempotent and atomic (one transaction).
    lines += [f"table inet {table}", f"delete table inet {table}", f"table inet {table} {{"]
    lines += _set("cluster_v4", "ipv4_addr", cluster_v4)
    lines += _set("cluster_v6", "ipv6_addr", cluster_v6)
    lines += _set("api_v4", "ipv4_addr", api_v4)
    lines += _set("api_v6", "ipv6_addr", api_v6)
    lines += _set("admin_v4", "ipv4_addr", admin_v4)
    lines += _set("admin_v6", "ipv6_addr", admin_v6)
    ports = ", ".join(_span_text(span) for span in protected)
    lines += [
        "  chain input {",
        "    type filter hook input priority filter - 10; policy accept;",
        "    ct state established,related accept",
        '    iif "lo" accept',
    ]
    for port in api_ports:
        lines += _public_port_rules(port, from_cidrs=api_from_cidrs, admin=True, what=(
            "vLLM API from outside the allowed CIDRs" if api_from_cidrs else "vLLM API from outside the cluster"))
    for port in [_port("client", port) for port in client_ports or []]:
        if port in api_ports:
            raise FirewallError(f"client port {port} is also a vLLM API port on this machine; expected another port")
        lines += _public_port_rules(port, from_cidrs=True, what="router from outside the allowed CIDRs")
    lines += [
        "    ip saddr @cluster_v4 accept",
        "    ip6 saddr @cluster_v6 accept",
        f'    tcp dport {{ {ports} }} counter drop comment "cluster-internal ports from outside the cluster"',
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


SCOPES = ("deployment", "plan")


def trusted_addresses(members: dict, cluster_names: list, groups_text: str = "the router and monitor groups") -> list:
    """The addresses of the router and monitor hosts that are not the cluster's nodes, to trust like them.

    ``members``: host -> its fabric address (``vllm_cluster_fabric_address``) or None; ``cluster_names``: the
    cluster's nodes, already trusted by their planned address. A host outside them without an address is refused:
    its traffic would be dropped (the router could not reach the API, Prometheus could not scrape).
    """
    found: list[str] = []
    for host, address in members.items():
        if host in cluster_names:
            continue
        if not address:
            raise FirewallError(
                f"host {host} (in {groups_text}) is not a node of the deployment and has no vllm_cluster_fabric_address;"
                " expected its address on the cluster network, so that the nodes' firewall lets it reach the API "
                "and metrics ports (or add it to node_firewall_extra_cluster_addresses)")
        split_networks([address], f"vllm_cluster_fabric_address of {host}")
        if str(address) not in found:
            found.append(str(address))
    return found


def cluster_nodes(plan: dict, scope: str) -> list[dict]:
    """[{name, address}] of the cluster's own nodes for a scope (see the module docstring)."""
    if scope == "plan":
        return [{"name": node["host"], "address": node["address"]} for node in plan["nodes"]]
    if scope == "deployment":
        nodes = (plan.get("cluster") or {}).get("nodes") or []
        if not nodes:
            raise FirewallError("plan cluster.nodes: empty; expected every host of the deployment (scope deployment)")
        return [{"name": node["name"], "address": node["address"]} for node in nodes]
    raise FirewallError(f"scope {scope!r}: expected one of {', '.join(SCOPES)}")


def build_policy(*, table: str, plan: dict, api_cidrs: list, scope: str = "deployment",
                 include_ray_defaults: bool = True,
                 ephemeral_range: list | tuple | None = DEFAULT_EPHEMERAL_RANGE,
                 extra_protected_ports: list | None = None, extra_cluster_addresses: list | None = None,
                 machine_plans: list | None = None, client_ports: list | None = None,
                 api_from_cidrs: bool = True, admin_addresses: list | None = None) -> dict:
    """From the plan: the ruleset text and the facts behind it (for the role's report and checks).

    ``machine_plans``: the plans of the other deployments on this machine (deployments that share it on disjoint
    GPUs), the plan itself among them or not. The machine has one table: their API ports, cluster nodes and protected
    ports are added to the plan's, so that no deployment's table closes another's ports.
    ``client_ports``: ports open like the API (the router's client port on a router host); ``api_from_cidrs`` false
    keeps the vLLM API ports to the cluster's own addresses (the router's hosts among them).
    ``admin_addresses``: the controller's, which reach the API ports (and nothing else) in either case.
    """
    # The machine's plans in their given (inventory) order when the plan is among them, so that every deployment
    # on the machine renders the same table; else the plan first.
    mates = list(machine_plans or [])
    plans = mates if any(other == plan for other in mates) else [plan] + mates
    ephemeral = None
    if ephemeral_range:
        if len(ephemeral_range) != 2:
            raise FirewallError(f"ephemeral range {ephemeral_range!r}: expected [first, last]")
        ephemeral = (_port("ephemeral range start", ephemeral_range[0]),
                     _port("ephemeral range end", ephemeral_range[1]))
    api_ports, members, spans = [], [], []
    for one in plans:
        if not isinstance(one, dict) or not one.get("nodes") or "ports" not in one:
            raise FirewallError("plan: expected the deployment plan with nodes and ports (playbooks/plan.yml)")
        ports = dict(one["ports"])
        if "api" not in ports:
            raise FirewallError(f"plan ports of deployment {one.get('deployment', '?')}: no api port")
        api_port = _port("api", ports.pop("api"))
        if api_port not in api_ports:
            api_ports.append(api_port)
        for node in cluster_nodes(one, scope):
            if node["address"] not in [member["address"] for member in members]:
                members.append(node)
        spans += protected_spans(ports, api_port=api_port, include_ray_defaults=include_ray_defaults,
                                 ephemeral_range=ephemeral, extra_ports=extra_protected_ports)
    spans = merge_spans(spans)
    for api_port in api_ports:
        if any(first <= api_port <= last for first, last in spans):
            raise FirewallError(
                f"the API port {api_port} falls inside a protected port range of a deployment on this machine "
                f"({', '.join(_span_text(s) for s in spans)}): move the API port or the range")
    clients = [_port("client", port) for port in client_ports or []]
    for port in clients:
        if any(first <= port <= last for first, last in spans):
            raise FirewallError(
                f"the client port {port} (the router's) falls inside a protected port range on this machine "
                f"({', '.join(_span_text(s) for s in spans)}): move the router's port or the range")
    addresses = [node["address"] for node in members] + list(extra_cluster_addresses or [])
    hosts = ", ".join(f"{node['name']} {node['address']}" for node in members)
    names = ", ".join(str(one.get("deployment", "?")) for one in plans)
    ruleset = render_ruleset(
        table=table, cluster_addresses=addresses, api_port=api_ports[0] if len(api_ports) == 1 else api_ports,
        api_cidrs=api_cidrs, protected=spans, client_ports=clients, api_from_cidrs=api_from_cidrs,
        admin_addresses=admin_addresses,
        comment=(f"vllm-cluster firewall of deployment{'s' if len(plans) > 1 else ''} {names} "
                 "(managed; edits are lost).\n"
                 f"Cluster nodes (scope {scope}): {hosts}."))
    cluster_v4, cluster_v6 = split_networks(addresses, "cluster node address")
    return {
        "ruleset": ruleset,
        "table": table,
        "scope": scope,
        "cluster_nodes": members,
        "api_port": api_ports[0],
        "api_ports": api_ports,
        "deployments": [one.get("deployment") for one in plans],
        "api_cidrs": api_cidrs,
        "api_from_cidrs": api_from_cidrs,
        "admin_addresses": list(admin_addresses or []),
        "client_ports": clients,
        "cluster_addresses": cluster_v4 + cluster_v6,
        "protected_ports": [_span_text(span) for span in spans],
    }


API_REACHABLE_FROM = ("auto", "clients", "router")


def api_mode(setting: str, fronted: bool) -> str:
    """Who reaches vLLM's API port: ``clients`` or ``router`` (the router's and the cluster's hosts only).

    ``auto`` is ``router`` when a router fronts the deployment (``fronted``: vllm_router's hosts, every deployment
    or those of vllm_router_deployments), else ``clients``: with a router in front there is one door.
    """
    if setting not in API_REACHABLE_FROM:
        raise FirewallError(f"node_firewall_api_reachable_from {setting!r}: expected one of "
                            f"{', '.join(API_REACHABLE_FROM)}")
    if setting == "auto":
        return "router" if fronted else "clients"
    return setting


def source_address(destination: str, port: int = 22, opener=None) -> str:
    """The address this machine sends from to reach ``destination`` (the kernel's route choice; a UDP socket's
    connect sends no packet). ``opener(family)``: a socket factory, for tests."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(str(destination), int(port), type=socket.SOCK_DGRAM)[0]
    except (OSError, IndexError) as exc:
        raise FirewallError(f"{destination!r}: cannot resolve it ({exc})") from exc
    sock = (opener or (lambda fam: socket.socket(fam, socket.SOCK_DGRAM)))(family)
    try:
        sock.connect(sockaddr)
        return str(sock.getsockname()[0])
    except OSError as exc:
        raise FirewallError(f"{destination!r}: no route to it from the controller ({exc})") from exc
    finally:
        sock.close()


def controller_addresses(setting, destination: str, host: str, opener=None) -> list[str]:
    """The controller's addresses that reach a node's API port: ``auto`` is the address the controller sends from
    to reach the node (``destination``: its ansible_host); a list is taken as given (checked); [] admits none."""
    if setting == "auto":
        try:
            return [source_address(destination, opener=opener)]
        except FirewallError as exc:
            raise FirewallError(
                f"host {host}: node_firewall_controller_addresses is auto and the controller's address towards "
                f"{exc}; expected a reachable ansible_host, or the controller's addresses as the node sees them "
                "(a list; [] admits none)") from exc
    if not isinstance(setting, (list, tuple)):
        raise FirewallError(f"host {host}: node_firewall_controller_addresses {setting!r}: expected auto or a "
                            "list of addresses or CIDRs")
    split_networks(list(setting), f"host {host}: node_firewall_controller_addresses")
    return [str(value).strip() for value in setting]
