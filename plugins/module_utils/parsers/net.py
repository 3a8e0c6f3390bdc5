"""Network state as the nodes print it: listening sockets, interfaces, firewall rules.

``ss -ltnp``, ``ip -j addr``, ``nft list ruleset`` (or ``iptables-save``):
what ``doctor_gather`` records on a node, and the two helpers the doctor reads
firewall rules with (the ports a rule names, whether an earlier rule accepts a
source address).

Pure Python, no Ansible import.
"""

from __future__ import annotations

import ipaddress
import json
import re


def parse_ss_listening(text):
    """``ss -Hltnp`` (or with a header) -> [{address, port, processes: [{name, pid}], line}]."""
    sockets = []
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line.startswith(("State", "Netid")):
            continue
        fields = line.split()
        # Netid may lead (ss -a); the local address is the field after Recv-Q and Send-Q.
        if fields[0] in ("tcp", "udp"):
            fields = fields[1:]
        if len(fields) < 4 or fields[0] not in ("LISTEN", "UNCONN"):
            continue
        local = fields[3]
        address, _, port = local.rpartition(":")
        if not port.isdigit():
            continue
        address = address.strip("[]")
        if "%" in address:
            address = address.split("%", 1)[0]
        processes = [
            {"name": name, "pid": int(pid)}
            for name, pid in re.findall(r'\("([^"]*)",pid=(\d+)', line)
        ]
        sockets.append({"address": address, "port": int(port), "processes": processes, "line": line})
    return sockets


def parse_ip_addr_json(text):
    """``ip -j addr`` -> {ifname: {state, mtu, addresses: ["10.0.0.1/24"]}}."""
    try:
        data = json.loads(text or "[]")
    except ValueError:
        return {}
    interfaces = {}
    for entry in data:
        name = entry.get("ifname")
        if not name:
            continue
        interfaces[name] = {
            "state": entry.get("operstate"),
            "mtu": entry.get("mtu"),
            "addresses": [
                f"{info.get('local')}/{info.get('prefixlen')}"
                for info in entry.get("addr_info", [])
                if info.get("family") in ("inet", "inet6") and info.get("local")
            ],
        }
    return interfaces


def firewall_rules(text):
    """Lines of ``nft list ruleset`` (or ``iptables-save``) that drop or reject traffic."""
    rules = []
    for raw in (text or "").splitlines():
        line = raw.strip()
        if re.search(r"\b(drop|reject)\b|-j (DROP|REJECT)\b", line) and not line.startswith(("type ", "policy ")):
            rules.append(line)
    return rules


_NFT_SOURCE_ACCEPT = re.compile(r"^ip6? saddr (?P<source>@\w+|\{[^}]*\}|[0-9a-fA-F.:/]+) accept$")


def firewall_accepted_sources(text):
    """nft only: {drop/reject rule: [source CIDRs its chain accepts before it, whatever the port]}.

    A rule such as the hardened node's "tcp dport { 29501, ... } drop" follows
    "ip saddr @cluster_v4 accept": traffic from those sources never reaches it.
    Named sets are resolved from their elements in the same table.
    """
    sets, accepted, result = {}, [], {}
    table, collecting, pending = None, None, ""
    for raw in (text or "").splitlines():
        line = raw.strip()
        if collecting is not None:
            pending += " " + line
            if "}" in line:
                sets[(table, collecting)] = re.findall(r"[0-9a-fA-F.:]+(?:/\d+)?(?:-[0-9a-fA-F.:]+)?", pending)
                collecting = None
            continue
        if line.startswith("table "):
            table = line.split("{", 1)[0].strip()
        elif line.startswith("set "):
            current_set = line.split()[1]
        elif line.startswith("elements = {"):
            pending = line.split("{", 1)[1]
            if "}" in line:
                sets[(table, current_set)] = re.findall(r"[0-9a-fA-F.:]+(?:/\d+)?(?:-[0-9a-fA-F.:]+)?", pending)
            else:
                collecting = current_set
        elif line.startswith("chain "):
            accepted = []
        else:
            match = _NFT_SOURCE_ACCEPT.match(line)
            if match:
                source = match.group("source")
                if source.startswith("@"):
                    accepted.extend(sets.get((table, source[1:]), []))
                else:
                    accepted.extend(re.findall(r"[0-9a-fA-F.:]+(?:/\d+)?", source))
            elif line in firewall_rules(line) and accepted:
                result[line] = list(accepted)
    return result


def source_accepted(address, sources):
    """True when the address is inside one of the CIDRs, addresses or ranges (a-b) an earlier rule accepts."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    for source in sources:
        try:
            if "-" in source:
                low, high = (ipaddress.ip_address(part) for part in source.split("-", 1))
                if low.version == ip.version and low <= ip <= high:
                    return True
            elif ip in ipaddress.ip_network(source, strict=False):
                return True
        except ValueError:
            continue
    return False


def rule_ports(rule):
    """Destination ports a firewall rule names: 'dport 29501', 'dport { 8000, 29501 }', '--dport 29501'."""
    ports = set()
    for match in re.finditer(r"dport\s+(\{[^}]*\}|\d+(?:-\d+)?)", rule):
        for token in re.findall(r"\d+(?:-\d+)?", match.group(1)):
            low, _, high = token.partition("-")
            ports.update(range(int(low), int(high or low) + 1) if high else [int(low)])
    for match in re.finditer(r"--dports?\s+([\d,:]+)", rule):
        for token in match.group(1).split(","):
            low, _, high = token.partition(":")
            ports.update(range(int(low), int(high or low) + 1) if high else [int(low)])
    return ports
