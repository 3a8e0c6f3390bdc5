"""Parsers for InfiniBand / RoCE adapter tools, and the ``vllm_ib`` summary.

Pure Python (3.11+, no Ansible import). ``parse_ibstat``, ``parse_ibstatus``
and ``parse_ibv_devinfo`` all return the same shape::

    {"cas": {"mlx5_0": {"type", "port_count", "firmware", "hardware_version",
                        "node_guid", "system_guid", "vendor_part_id", "board_id",
                        "ports": [{"port", "state", "physical_state", "rate_gbps",
                                   "width_speed", "base_lid", "sm_lid", "lmc",
                                   "port_guid", "link_layer", "capability_mask"}]}},
     "errors": [lines the tool printed about its own failure]}

so ``summarize_ib`` reads any of them. Unparseable text raises ``IbParseError``.
"""

from __future__ import annotations

import re


class IbParseError(ValueError):
    """The text is not the tool output the parser was asked to read."""


# ibv_devinfo prints PORT_ACTIVE (4); ibstatus prints '4: ACTIVE'; ibstat prints 'Active'.
_STATE_NAMES = {
    "active": "Active",
    "port_active": "Active",
    "down": "Down",
    "port_down": "Down",
    "init": "Initializing",
    "initializing": "Initializing",
    "port_init": "Initializing",
    "armed": "Armed",
    "port_armed": "Armed",
    "active_defer": "ActiveDefer",
    "port_active_defer": "ActiveDefer",
}

_PHYSICAL_STATE_NAMES = {
    "linkup": "LinkUp",
    "polling": "Polling",
    "disabled": "Disabled",
    "sleep": "Sleep",
    "portconfigurationtraining": "PortConfigurationTraining",
    "linkerrorrecovery": "LinkErrorRecovery",
    "phytest": "PhyTest",
}

# What an operator should look at, by (state, physical state).
_PORT_DIAGNOSES = {
    ("Down", "Polling"): "no link: check the cable, the transceiver and the switch port",
    ("Down", "Disabled"): "port disabled (administratively down or not cabled by design)",
    ("Initializing", "LinkUp"): "link is up but no subnet manager has configured the port (start opensm or UFM)",
    ("Armed", "LinkUp"): "the subnet manager configured the port but has not activated it",
}


def _normal_state(value: str | None) -> str | None:
    if value is None:
        return None
    text = value.strip()
    # '4: ACTIVE' (ibstatus) and 'PORT_ACTIVE (4)' (ibv_devinfo).
    text = re.sub(r"^\d+:\s*", "", text)
    text = re.sub(r"\s*\(\d+\)$", "", text)
    return _STATE_NAMES.get(text.lower(), text)


def _normal_physical_state(value: str | None) -> str | None:
    if value is None:
        return None
    text = re.sub(r"^\d+:\s*", "", value.strip())
    return _PHYSICAL_STATE_NAMES.get(text.lower().replace(" ", ""), text)


def _number(value: str | None) -> int | float | None:
    if value is None:
        return None
    match = re.match(r"^\s*(\d+(?:\.\d+)?)", value)
    if not match:
        return None
    text = match.group(1)
    return float(text) if "." in text else int(text)


def _int_auto(value: str | None) -> int | None:
    """'13247' or '0x33bf' -> int."""
    if value is None:
        return None
    text = value.strip()
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def _guid(value: str | None) -> str | None:
    """'0x58a2e10300dae626' or '58a2:e103:00da:e626' -> '0x58a2e10300dae626'."""
    if value is None:
        return None
    text = value.strip().lower()
    if re.match(r"^[0-9a-f]{4}(:[0-9a-f]{4}){3}$", text):
        return "0x" + text.replace(":", "")
    if re.match(r"^0x[0-9a-f]+$", text):
        return text
    return None


def _new_port(number: int) -> dict:
    return {
        "port": number,
        "state": None,
        "physical_state": None,
        "rate_gbps": None,
        "width_speed": None,
        "base_lid": None,
        "sm_lid": None,
        "lmc": None,
        "port_guid": None,
        "link_layer": None,
        "capability_mask": None,
    }


def _new_ca() -> dict:
    return {
        "type": None,
        "port_count": None,
        "firmware": None,
        "hardware_version": None,
        "node_guid": None,
        "system_guid": None,
        "vendor_part_id": None,
        "board_id": None,
        "ports": [],
    }


def parse_ibstat(text: str) -> dict:
    """Parse ``ibstat`` (infiniband-diags): every CA block and its Port blocks.

    Lines outside the blocks are ignored except the tool's own error lines
    ('ibpanic: ...', 'ibwarn: ...'), which are returned under ``errors``.
    """
    cas: dict = {}
    errors: list[str] = []
    ca: dict | None = None
    port: dict | None = None
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line:
            continue
        if re.match(r"^(ibpanic|ibwarn|ibstat):", line):
            errors.append(line)
            continue
        header = re.match(r"^CA '([^']+)'$", line)
        if header:
            ca = _new_ca()
            cas[header.group(1)] = ca
            port = None
            continue
        if ca is None:
            continue
        port_header = re.match(r"^Port (\d+):$", line)
        if port_header:
            port = _new_port(int(port_header.group(1)))
            ca["ports"].append(port)
            continue
        key, separator, value = line.partition(":")
        if not separator:
            continue
        key, value = key.strip().lower(), value.strip()
        if port is not None:
            if key == "state":
                port["state"] = _normal_state(value)
            elif key == "physical state":
                port["physical_state"] = _normal_physical_state(value)
            elif key == "rate":
                port["rate_gbps"] = _number(value)
            elif key == "base lid":
                port["base_lid"] = _int_auto(value)
            elif key == "sm lid":
                port["sm_lid"] = _int_auto(value)
            elif key == "lmc":
                port["lmc"] = _int_auto(value)
            elif key == "port guid":
                port["port_guid"] = _guid(value)
            elif key == "link layer":
                port["link_layer"] = value
            elif key == "capability mask":
                port["capability_mask"] = value
        elif key == "ca type":
            ca["type"] = value
        elif key == "number of ports":
            ca["port_count"] = _int_auto(value)
        elif key == "firmware version":
            ca["firmware"] = value
        elif key == "hardware version":
            ca["hardware_version"] = value
        elif key == "node guid":
            ca["node_guid"] = _guid(value)
        elif key == "system image guid":
            ca["system_guid"] = _guid(value)
    if (text or "").strip() and not cas and not errors:
        raise IbParseError("ibstat output has no \"CA '<name>'\" block")
    return {"cas": cas, "errors": errors}


def parse_ibstatus(text: str) -> dict:
    """Parse ``ibstatus`` ("Infiniband device 'mlx5_0' port 1 status:" blocks)."""
    cas: dict = {}
    port: dict | None = None
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line:
            continue
        header = re.match(r"^Infiniband device '([^']+)' port (\d+) status:$", line)
        if header:
            ca = cas.setdefault(header.group(1), _new_ca())
            port = _new_port(int(header.group(2)))
            ca["ports"].append(port)
            continue
        if port is None:
            continue
        key, separator, value = line.partition(":")
        if not separator:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "state":
            port["state"] = _normal_state(value)
        elif key == "phys state":
            port["physical_state"] = _normal_physical_state(value)
        elif key == "rate":
            port["rate_gbps"] = _number(value)
            detail = re.search(r"\(([^)]+)\)", value)
            port["width_speed"] = detail.group(1) if detail else None
        elif key == "base lid":
            port["base_lid"] = _int_auto(value)
        elif key == "sm lid":
            port["sm_lid"] = _int_auto(value)
        elif key == "link_layer":
            port["link_layer"] = value
    if (text or "").strip() and not cas:
        raise IbParseError("ibstatus output has no \"Infiniband device '<name>' port N status:\" block")
    for ca in cas.values():
        ca["port_count"] = len(ca["ports"])
    return {"cas": cas, "errors": []}


def parse_ibv_devinfo(text: str) -> dict:
    """Parse ``ibv_devinfo`` ('hca_id:' blocks, 'port:' sub-blocks).

    Plain ``ibv_devinfo`` prints no rate or physical state; those stay None.
    A block cut short keeps what it has.
    """
    cas: dict = {}
    ca: dict | None = None
    port: dict | None = None
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line:
            continue
        header = re.match(r"^hca_id:\s*(\S+)$", line)
        if header:
            ca = _new_ca()
            cas[header.group(1)] = ca
            port = None
            continue
        if ca is None:
            continue
        key, separator, value = line.partition(":")
        if not separator:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "port":
            port = _new_port(int(value))
            ca["ports"].append(port)
        elif port is not None:
            if key == "state":
                port["state"] = _normal_state(value)
            elif key == "phys_state":
                port["physical_state"] = _normal_physical_state(value)
            elif key == "sm_lid":
                port["sm_lid"] = _int_auto(value)
            elif key == "port_lid":
                port["base_lid"] = _int_auto(value)
            elif key == "port_lmc":
                port["lmc"] = _int_auto(value)
            elif key == "link_layer":
                port["link_layer"] = value
        elif key == "fw_ver":
            ca["firmware"] = value
        elif key == "hw_ver":
            ca["hardware_version"] = value
        elif key == "node_guid":
            ca["node_guid"] = _guid(value)
        elif key == "sys_image_guid":
            ca["system_guid"] = _guid(value)
        elif key == "vendor_part_id":
            ca["vendor_part_id"] = _int_auto(value)
        elif key == "phys_port_cnt":
            ca["port_count"] = _int_auto(value)
        elif key == "board_id":
            ca["board_id"] = value
    if (text or "").strip() and not cas:
        raise IbParseError("ibv_devinfo output has no 'hca_id:' block")
    return {"cas": cas, "errors": []}


def parse_ibdev2netdev(text: str) -> list[dict]:
    """Parse ``ibdev2netdev``: ``[{ca, port, netdev, up}]``; trailing '# ...' notes are ignored."""
    mappings = []
    for raw in (text or "").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.match(r"^(\S+)\s+port\s+(\d+)\s+==>\s+(\S+)\s+\((Up|Down)\)$", line)
        if match:
            mappings.append(
                {
                    "ca": match.group(1),
                    "port": int(match.group(2)),
                    "netdev": match.group(3),
                    "up": match.group(4) == "Up",
                }
            )
    if (text or "").strip() and not mappings:
        raise IbParseError("ibdev2netdev output has no '<ca> port N ==> <netdev> (Up|Down)' line")
    return mappings


def _ca_sort_key(name: str) -> tuple:
    """mlx5_2 before mlx5_10 (ibstat lists them in lexical order)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def summarize_ib(parsed: dict, netdevs: list[dict] | None = None) -> dict:
    """The ``vllm_ib`` facts from a parsed ibstat/ibstatus/ibv_devinfo.

    Keys: present, ca_count, port_count, ports (flat, with ca and netdev),
    active_ports / down_ports ('mlx5_0/1'), active_count, down_count,
    active_cas (CAs with an active port: the NCCL_IB_HCA candidates),
    infiniband_active, ethernet_active (RoCE), rates_gbps (of active ports),
    link_layers (count per layer), warnings, errors.
    """
    netdev_by_port = {(entry["ca"], entry["port"]): entry for entry in netdevs or []}
    ports = []
    warnings = []
    for ca_name in sorted(parsed.get("cas", {}), key=_ca_sort_key):
        ca = parsed["cas"][ca_name]
        for port in ca["ports"]:
            mapping = netdev_by_port.get((ca_name, port["port"]))
            entry = {
                "ca": ca_name,
                "name": f"{ca_name}/{port['port']}",
                "ca_type": ca.get("type"),
                "firmware": ca.get("firmware"),
                **port,
                "netdev": mapping["netdev"] if mapping else None,
                "netdev_up": mapping["up"] if mapping else None,
            }
            ports.append(entry)
            diagnosis = _PORT_DIAGNOSES.get((port["state"], port["physical_state"]))
            if port["state"] != "Active":
                physical = f" ({port['physical_state']})" if port["physical_state"] else ""
                advice = f": {diagnosis}" if diagnosis else ""
                warnings.append(f"{entry['name']} is {port['state']}{physical}{advice}")
    active = [port for port in ports if port["state"] == "Active"]
    down = [port for port in ports if port["state"] != "Active"]
    rates = sorted({port["rate_gbps"] for port in active if port["rate_gbps"] is not None})
    infiniband_rates = sorted(
        {port["rate_gbps"] for port in active if port["link_layer"] == "InfiniBand" and port["rate_gbps"] is not None}
    )
    if len(infiniband_rates) > 1:
        warnings.append(
            "active InfiniBand ports run at different rates: "
            + ", ".join(f"{rate} Gb/s" for rate in infiniband_rates)
        )
    layers: dict = {}
    for port in ports:
        layer = port["link_layer"] or "unknown"
        layers[layer] = layers.get(layer, 0) + 1
    active_cas = []
    for port in active:
        if port["ca"] not in active_cas:
            active_cas.append(port["ca"])
    return {
        "present": bool(ports),
        "ca_count": len(parsed.get("cas", {})),
        "port_count": len(ports),
        "ports": ports,
        "active_ports": [port["name"] for port in active],
        "down_ports": [port["name"] for port in down],
        "active_count": len(active),
        "down_count": len(down),
        "active_cas": active_cas,
        "infiniband_active": [port["name"] for port in active if port["link_layer"] == "InfiniBand"],
        "ethernet_active": [port["name"] for port in active if port["link_layer"] == "Ethernet"],
        "rates_gbps": rates,
        "link_layers": layers,
        "warnings": warnings,
        "errors": list(parsed.get("errors", [])),
    }


def absent_summary() -> dict:
    """The ``vllm_ib`` facts of a host without InfiniBand or RoCE adapters."""
    return summarize_ib({"cas": {}, "errors": []})
