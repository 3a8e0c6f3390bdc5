"""Host bridges, one network namespace per node and its two veth links.

  management bridge <lab>-mgmt  10.231.<index>.1/24 on the host; eth0 in every node
  fabric bridge     <lab>-fab   no host address (node to node only); eth1, MTU 9000

Each node's default route points at the host's end of the management bridge,
as on a real cluster; the host does not forward, so nothing leaves the lab.
"""
from __future__ import annotations

import ipaddress
import json

from .shell import LabError, run
from .spec import MANAGEMENT_MTU, LabSpec


def link_exists(name: str, netns: str | None = None) -> bool:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["link", "show", "dev", name]
    return run(argv, check=False).returncode == 0


def netns_list() -> list[str]:
    out = run(["ip", "-j", "netns", "list"], check=False).stdout.strip()
    return [entry["name"] for entry in json.loads(out or "[]")]


def host_links() -> list[dict]:
    return json.loads(run(["ip", "-j", "link", "show"]).stdout or "[]")


def check_subnets_free(spec: LabSpec) -> None:
    """Refuse a lab whose subnets overlap an address or route this host already has (outside the lab)."""
    ours = {spec.bridge_management, spec.bridge_fabric}
    taken = json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout or "[]")
    for route in taken:
        dst = route.get("dst", "")
        if route.get("dev") in ours or dst in ("", "default") or route.get("type") in ("local", "broadcast"):
            continue
        try:
            network = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        for mine in (spec.management_network, spec.fabric_network):
            if network.overlaps(mine):
                raise LabError(f"lab {spec.name}: subnet {mine} overlaps the host route {dst} dev {route.get('dev')}; "
                               "pick another lab name (another index) or remove that route")


def ensure_bridge(name: str, mtu: int, address: str | None) -> None:
    if not link_exists(name):
        run(["ip", "link", "add", name, "mtu", str(mtu), "type", "bridge", "stp_state", "0", "forward_delay", "0"])
    run(["ip", "link", "set", name, "mtu", str(mtu), "up"])
    if address:
        run(["ip", "addr", "replace", address, "dev", name])


def ensure_bridges(spec: LabSpec) -> None:
    check_subnets_free(spec)
    prefix = spec.management_network.prefixlen
    ensure_bridge(spec.bridge_management, MANAGEMENT_MTU, f"{spec.management_gateway}/{prefix}")
    ensure_bridge(spec.bridge_fabric, spec.fabric_mtu, None)


def _ensure_veth(host_end: str, netns: str, inner: str, bridge: str, mtu: int) -> None:
    if link_exists(host_end) and link_exists(inner, netns):
        run(["ip", "link", "set", host_end, "master", bridge, "up"])
        return
    # A stale host end (its namespace gone, or a half-made pair) blocks re-creation.
    run(["ip", "link", "del", host_end], check=False)
    run(["ip", "link", "add", host_end, "mtu", str(mtu), "type", "veth",
         "peer", "name", inner, "mtu", str(mtu), "netns", netns])
    run(["ip", "link", "set", host_end, "master", bridge, "up"])


def ensure_node_links(spec: LabSpec, k: int, fabric_mtu: int, fabric_link: str) -> None:
    """Create node k's namespace and links (if missing) and (re)apply its addresses, MTU and routes.

    Called at `up` and at every node start, so a node reboots with its provisioned
    network, as a real one would, whatever was changed at runtime inside it.
    """
    node = f"node{k}"
    netns = spec.netns(node)
    if netns not in netns_list():
        run(["ip", "netns", "add", netns])
    run(["ip", "-n", netns, "link", "set", "lo", "up"])
    _ensure_veth(spec.veth_management(k), netns, "eth0", spec.bridge_management, MANAGEMENT_MTU)
    _ensure_veth(spec.veth_fabric(k), netns, "eth1", spec.bridge_fabric, spec.fabric_mtu)
    prefix = spec.management_network.prefixlen
    run(["ip", "-n", netns, "addr", "replace", f"{spec.management_address(k)}/{prefix}", "dev", "eth0"])
    run(["ip", "-n", netns, "link", "set", "eth0", "mtu", str(MANAGEMENT_MTU), "up"])
    run(["ip", "-n", netns, "addr", "replace",
         f"{spec.fabric_address(k)}/{spec.fabric_network.prefixlen}", "dev", "eth1"])
    apply_fabric(spec, k, fabric_mtu, fabric_link)
    run(["ip", "-n", netns, "route", "replace", "default", "via", spec.management_gateway, "dev", "eth0"])


def apply_fabric(spec: LabSpec, k: int, mtu: int, link: str) -> None:
    """Set node k's fabric MTU and cable state (both ends, as a NIC and its switch port would be)."""
    netns = spec.netns(f"node{k}")
    host_end = spec.veth_fabric(k)
    run(["ip", "link", "set", host_end, "mtu", str(max(mtu, spec.fabric_mtu))])
    run(["ip", "-n", netns, "link", "set", "eth1", "mtu", str(mtu)])
    state = "up" if link == "up" else "down"
    run(["ip", "link", "set", host_end, state])
    run(["ip", "-n", netns, "link", "set", "eth1", "up"])


def remove_node_links(spec: LabSpec, node: str, k: int) -> None:
    # Deleting the host end removes the pair even when lingering sockets keep the
    # old namespace alive for a while (see research §1.6).
    for host_end in (spec.veth_management(k), spec.veth_fabric(k)):
        run(["ip", "link", "del", host_end], check=False)
    if spec.netns(node) in netns_list():
        run(["ip", "netns", "del", spec.netns(node)])


def remove_bridges(spec: LabSpec) -> None:
    for bridge in (spec.bridge_management, spec.bridge_fabric):
        if link_exists(bridge):
            run(["ip", "link", "del", bridge])


def node_addresses(spec: LabSpec, node: str) -> dict[str, dict]:
    """Live view of a node's links from inside its namespace: {ifname: {address, mtu, state}}."""
    out = run(["ip", "-n", spec.netns(node), "-j", "addr", "show"], check=False).stdout
    links = {}
    for entry in json.loads(out or "[]"):
        if entry.get("ifname") == "lo":
            continue
        v4 = [f"{a['local']}/{a['prefixlen']}" for a in entry.get("addr_info", []) if a.get("family") == "inet"]
        links[entry["ifname"]] = {"address": v4[0] if v4 else None, "mtu": entry.get("mtu"),
                                  "state": entry.get("operstate")}
    return links
