"""Is the fabric usable between the nodes? Interface, MTU, InfiniBand ports and all-pairs TCP, judged.

The nccl_network role gathers facts and probe results on every node; these
functions turn them into a verdict and one message per check that names the
node (or the pair of nodes), the port, the interface and the value, so an
operator at 3 a.m. knows where to look without reading a matrix.

Pure Python (3.11+); imports nothing from Ansible.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence

from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.parity import compare


class FabricError(ValueError):
    """An input the checks cannot work with, or a node whose fabric interface is unusable."""


# --------------------------------------------------------------------------- interface


def fabric_address(host: str, interface: str, interfaces: Iterable[str], interface_facts: Mapping | None) -> dict:
    """The IPv4 address and MTU of ``interface`` on ``host``, from Ansible's network facts.

    ``interfaces`` is ``ansible_facts['interfaces']``; ``interface_facts`` is
    ``ansible_facts[interface]`` (None when absent). Raises FabricError naming
    the host, the interface and what exists instead.
    """
    existing = sorted(interfaces or [])
    if interface not in existing or not interface_facts:
        raise FabricError(
            f"{host}: fabric interface {interface!r} does not exist; interfaces on {host}: "
            f"{', '.join(existing) or 'none'} (set vllm_cluster_fabric_interface to the NIC that carries "
            "NCCL/Gloo/Ray traffic)"
        )
    ipv4 = interface_facts.get("ipv4") or {}
    address = ipv4.get("address") if isinstance(ipv4, Mapping) else None
    if not address:
        raise FabricError(f"{host}: fabric interface {interface} has no IPv4 address; expected one on the fabric network")
    if not interface_facts.get("active", True):
        raise FabricError(f"{host}: fabric interface {interface} ({address}) is down (link not active); expected up")
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        raise FabricError(f"{host}: fabric interface {interface} reports address {address!r}, not IPv4") from None
    return {"address": address, "mtu": interface_facts.get("mtu"), "netmask": ipv4.get("netmask"),
            "network": ipv4.get("network")}


# --------------------------------------------------------------------------- ports


def probe_ports(ports: Mapping[str, int] | Sequence[int]) -> list[dict]:
    """The TCP ports to probe, as ``[{name, port}]`` sorted by port, one entry per port number.

    ``ports`` is the plan's ``ports`` dict (``{api: 8000, master: 29501, ...}``)
    or a plain list of numbers. The Ray worker range is probed at its two
    ends (``ray_min_worker``, ``ray_max_worker``), not port by port: a firewall
    that blocks a range blocks its ends too, and 1000 listeners per node would
    exhaust a default file-descriptor limit.
    """
    items = ports.items() if isinstance(ports, Mapping) else ((f"port {p}", p) for p in ports)
    by_port: dict[int, list[str]] = {}
    for name, port in items:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise FabricError(f"port {name}={port!r} is not a TCP port number (1-65535)")
        by_port.setdefault(port, []).append(str(name))
    return [{"name": "/".join(names), "port": port} for port, names in sorted(by_port.items())]


def tcp_targets(nodes: Sequence[Mapping], source: str, ports: Sequence[Mapping]) -> list[dict]:
    """Every (other node, port) that ``source`` must reach: ``[{host, address, port, name}]``."""
    hosts = [node["host"] for node in nodes]
    if source not in hosts:
        raise FabricError(f"{source} is not one of the nodes {hosts}")
    return [
        {"host": node["host"], "address": node["address"], "port": port["port"], "name": port["name"]}
        for node in nodes
        if node["host"] != source
        for port in ports
    ]


# --------------------------------------------------------------------------- checks


def check_mtu(mtus: Mapping[str, object], interfaces: Mapping[str, str], expected: int | None = None) -> dict:
    """Every node's fabric MTU equals ``expected`` (default: the first node's).

    Returns ``{ok, expected, message}``; the message names each node, its
    interface and MTU.
    """
    if not mtus:
        raise FabricError("no node reported a fabric MTU")
    first = next(iter(mtus))
    want = expected if expected is not None else mtus[first]
    labelled = {host: {"MTU": mtu} for host, mtu in mtus.items()}
    result = compare(labelled, expected={"MTU": want}, subject=f"the fabric interfaces of {len(mtus)} nodes")
    if result["ok"]:
        return {"ok": True, "expected": want, "message": ""}
    source = "nccl_network_mtu" if expected is not None else f"the MTU of the first node, {first}"
    odd = result["odd_hosts"]["MTU"]
    details = ", ".join(f"{host} ({interfaces.get(host, '?')}) has {mtus[host]}" for host in odd)
    message = (
        f"fabric MTU mismatch: expected {want} ({source}); {details}. Frames larger than the smallest MTU "
        "on the path are dropped silently, so NCCL and Gloo hang instead of failing: set the same MTU on "
        "every fabric interface and switch port"
    )
    return {"ok": False, "expected": want, "message": message}


def _hca_ports(hca: str) -> tuple[str, int | None]:
    name, _, port = hca.partition(":")
    return name, int(port) if port else None


def check_ib(nodes: Mapping[str, Mapping], rate_gbps: float | None) -> dict:
    """InfiniBand on the nodes that declare it: every declared HCA port Active, LinkUp, at ``rate_gbps``.

    ``nodes``: ``{host: {ib_hcas: [...], expect_ib: bool, ib_ports: vllm_ib['ports'] | None}}``.
    A node is checked when it lists HCAs (``mlx5_0`` = every port of that CA,
    ``mlx5_0:1`` = port 1) or sets ``expect_ib`` (then every port ibstat reports,
    at least one). ``rate_gbps`` None skips the rate. Returns ``{ok, problems, message}``.
    """
    problems: list[str] = []
    for host, node in nodes.items():
        hcas = list(node.get("ib_hcas") or [])
        if not hcas and not node.get("expect_ib"):
            continue
        ports = node.get("ib_ports")
        if not ports:
            declared = f"declares HCAs {', '.join(hcas)}" if hcas else "expects InfiniBand"
            problems.append(f"{host} {declared} but ibstat reports no InfiniBand port")
            continue
        selected: list[Mapping] = []
        if hcas:
            for hca in hcas:
                name, number = _hca_ports(hca)
                found = [p for p in ports if p.get("ca") == name and (number is None or p.get("port") == number)]
                if not found:
                    cas = sorted({str(p.get("ca")) for p in ports})
                    problems.append(f"{host}: HCA {hca} is not present; ibstat lists {', '.join(cas)}")
                selected.extend(found)
        else:
            selected = list(ports)
        for port in selected:
            name = port.get("name") or f"{port.get('ca')}/{port.get('port')}"
            state, physical, rate = port.get("state"), port.get("physical_state"), port.get("rate_gbps")
            if state != "Active" or physical != "LinkUp":
                problems.append(f"{host}: {name} is {state}/{physical}; expected Active/LinkUp")
            elif rate_gbps is not None and (rate is None or float(rate) != float(rate_gbps)):
                problems.append(f"{host}: {name} runs at {rate} Gb/s; expected {rate_gbps:g} Gb/s")
    message = ""
    if problems:
        message = (
            f"InfiniBand check failed on {len(problems)} port{'s' if len(problems) > 1 else ''}:\n"
            + "\n".join(f"- {p}" for p in problems)
            + "\nA port that is Down/Polling has no link (cable, transceiver or switch port); Down/Disabled "
            "was switched off; Initializing/Armed waits for the subnet manager (opensm)"
        )
    return {"ok": not problems, "problems": problems, "message": message}


def _likely_cause(failures: list[dict], sources: Sequence[str], ports_per_dest: Mapping[str, int]) -> list[str]:
    """Patterns in the failures that point at one node or one port."""
    causes: list[str] = []
    by_dest_port: dict[tuple[str, int], set[str]] = {}
    by_dest: dict[str, set[tuple[str, int]]] = {}
    for row in failures:
        if row["kind"] != "tcp":
            continue
        by_dest_port.setdefault((row["destination"], row["port"]), set()).add(row["source"])
        by_dest.setdefault(row["destination"], set()).add((row["source"], row["port"]))
    for dest, pairs in sorted(by_dest.items()):
        others = [s for s in sources if s != dest]
        if len(pairs) == len(others) * ports_per_dest.get(dest, 0) and pairs:
            causes.append(f"{dest} is unreachable on every port from every node: its fabric link, address or "
                          "a firewall dropping all input on it")
            continue
        for (d, port), from_sources in sorted(by_dest_port.items()):
            if d == dest and set(others) <= from_sources and len(others) > 1:
                causes.append(f"every node fails to reach {dest} on port {port}: a firewall rule on {dest} "
                              f"(nft list ruleset / iptables -S) or on the switch drops TCP {port}")
    return causes


def check_pairs(results: Mapping[str, Sequence[Mapping]], interfaces: Mapping[str, str],
                expected_sources: Sequence[str] | None = None) -> dict:
    """Judge the all-pairs probe: every (source, destination, port) must connect; large datagrams must pass.

    ``results``: ``{source: port_probe 'results'}``, each item
    ``{kind: tcp|mtu, host, address, port, name, ok, error, ...}``.
    ``interfaces``: ``{host: fabric interface}``. ``expected_sources``: hosts
    that must have reported (a missing one is a failure too).
    Returns ``{ok, checked, failures, table, message}``.
    """
    failures: list[dict] = []
    checked = 0
    sources = list(expected_sources or results)
    missing = [host for host in sources if host not in results]
    dest_ports: dict[str, set[int]] = {}
    for source, items in results.items():
        for item in items:
            if item.get("kind", "tcp") == "tcp":
                checked += 1
                dest_ports.setdefault(item["host"], set()).add(item["port"])
            if item.get("ok"):
                continue
            failures.append({
                "kind": item.get("kind", "tcp"),
                "source": source,
                "destination": item["host"],
                "address": item["address"],
                "port": item["port"],
                "name": item.get("name") or "",
                "interface": f"{interfaces.get(source, '?')} -> {interfaces.get(item['host'], '?')}",
                "error": item.get("error") or "failed",
            })
    header = ("source", "destination", "address:port", "interface", "error")
    rows = [
        (
            row["source"],
            row["destination"],
            f"{row['address']}:{row['port']}" + (f" ({row['name']})" if row["name"] else ""),
            row["interface"],
            row["error"],
        )
        for row in failures
    ]
    table = ""
    if rows:
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
        lines = ["  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(r[:-1])) + "  " + str(r[-1])
                 for r in [header, *rows]]
        table = "\n".join(line.rstrip() for line in lines)
    parts = []
    if missing:
        parts.append(f"no probe results from {', '.join(missing)} (the node failed or was unreachable earlier)")
    if failures:
        tcp_failed = sum(1 for f in failures if f["kind"] == "tcp")
        mtu_failed = len(failures) - tcp_failed
        what = []
        if tcp_failed:
            what.append(f"{tcp_failed} of {checked} TCP connections")
        if mtu_failed:
            what.append(f"{mtu_failed} path-MTU probe{'s' if mtu_failed > 1 else ''}")
        parts.append(f"fabric reachability failed for {' and '.join(what)}:\n{table}")
        causes = _likely_cause(failures, sources, {dest: len(ports) for dest, ports in dest_ports.items()})
        if causes:
            parts.append("likely cause: " + "; ".join(causes))
    message = "\n".join(parts)
    return {"ok": not parts, "checked": checked, "failures": failures, "table": table, "message": message}
