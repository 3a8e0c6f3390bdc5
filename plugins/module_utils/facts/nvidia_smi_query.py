"""Parsers of ``nvidia-smi -q -x`` (XML) and ``nvidia-smi -q`` (text); both return the same shape.

Also the CUDA compute capability of a GPU from its product name or
architecture, for the drivers whose output does not report it. Pure Python,
no Ansible import; unparseable text raises ``nvidia_smi.NvidiaSmiParseError``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi import (
    NvidiaSmiParseError,
    clean_value,
    sum_or_none,
    to_int,
)

_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")

# CUDA compute capability by product name, from NVIDIA's published table of
# CUDA GPUs. Names that do not match give None rather than a guess.
_COMPUTE_CAPABILITY_BY_NAME = (
    (re.compile(r"\bG?B300\b"), "10.3"),
    (re.compile(r"\bG?B(?:100|200)\b"), "10.0"),
    (re.compile(r"RTX PRO \d+ Blackwell|GeForce RTX 50\d0"), "12.0"),
    (re.compile(r"\bGH200\b|\bH(?:100|200|800|20)\b"), "9.0"),
    (re.compile(r"\bA(?:100|800|30)\b"), "8.0"),
    (re.compile(r"\bT4\b|GeForce RTX 20\d0|Quadro RTX|TITAN RTX|GTX 16\d0"), "7.5"),
    (re.compile(r"\bA(?:10G?|10M|16|2|40)\b|RTX A\d+|GeForce RTX 30\d0"), "8.6"),
    (re.compile(r"\bL(?:4|20|40S?)\b|Ada Generation|GeForce RTX 40\d0"), "8.9"),
    (re.compile(r"V100|TITAN V\b"), "7.0"),
    (re.compile(r"\bP100\b"), "6.0"),
    (re.compile(r"\bP(?:4|40)\b|GTX 10\d0|TITAN Xp|Quadro P\d+"), "6.1"),
    (re.compile(r"\bK80\b"), "3.7"),
    (re.compile(r"\bK(?:20X?|40)\b"), "3.5"),
)

# Only architectures whose data-centre and desktop parts share one capability;
# Ampere (8.0/8.6/8.7), Blackwell, Pascal, Maxwell and Kepler are ambiguous.
_COMPUTE_CAPABILITY_BY_ARCHITECTURE = {
    "hopper": "9.0",
    "ada lovelace": "8.9",
    "turing": "7.5",
    "volta": "7.0",
}


# ---------------------------------------------------------------- value helpers


def _literal(value: str | None) -> str | None:
    """Like clean_value, but keeps 'None', which some fields use as a real value."""
    text = (value or "").strip()
    return None if text.lower() in ("", "n/a", "[n/a]") else text


def _to_float(value: str | None) -> float | None:
    text = clean_value(value)
    if text is None:
        return None
    match = re.match(r"^(-?\d+(?:\.\d+)?)", text)
    return float(match.group(1)) if match else None


def to_mib(value: str | None) -> int | None:
    """'143771 MiB' -> 143771; GiB and KiB are converted; None when absent."""
    text = clean_value(value)
    if text is None:
        return None
    match = re.match(r"^(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB)?$", text)
    if not match:
        return None
    number = float(match.group(1))
    factor = {"KiB": 1 / 1024, "GiB": 1024}.get(match.group(2) or "MiB", 1)
    return int(round(number * factor))


def _enabled(value: str | None) -> bool | None:
    text = clean_value(value)
    if text is None:
        return None
    lowered = text.lower()
    if lowered in ("enabled", "yes", "on", "active"):
        return True
    if lowered in ("disabled", "no", "off", "not active"):
        return False
    return None


def compute_capability_for(name: str | None, architecture: str | None = None) -> tuple[str | None, str | None]:
    """Compute capability from the product name, else from an unambiguous architecture.

    Returns (capability, source) where source is 'product_name', 'architecture' or None.
    """
    if name:
        for pattern, capability in _COMPUTE_CAPABILITY_BY_NAME:
            if pattern.search(name):
                return capability, "product_name"
    if architecture:
        capability = _COMPUTE_CAPABILITY_BY_ARCHITECTURE.get(architecture.strip().lower())
        if capability:
            return capability, "architecture"
    return None, None


# ---------------------------------------------------------------- -q -x (XML)


def _text(element: ET.Element | None, path: str) -> str | None:
    if element is None:
        return None
    found = element.find(path)
    if found is None or found.text is None:
        return None
    return found.text.strip()


def _first_text(element: ET.Element, *paths: str) -> str | None:
    for path in paths:
        value = clean_value(_text(element, path))
        if value is not None:
            return value
    return None


def _ecc_counts_from_pairs(pairs: list[tuple[str, str | None]]) -> dict:
    """Correctable / uncorrectable totals from (name, value) pairs of one ECC section.

    Handles the three layouts nvidia-smi has used: single_bit/double_bit
    totals (before driver 470), sram_/dram_ counts (v11, v12), and sram
    parity/SEC-DED splits (v13).
    """
    names = {name.lower(): value for name, value in pairs}
    if "single_bit" in names or "double_bit" in names:
        return {"correctable": to_int(names.get("single_bit")), "uncorrectable": to_int(names.get("double_bit"))}
    correctable = [to_int(v) for n, v in pairs if "correctable" in n.lower() and "uncorrectable" not in n.lower()]
    uncorrectable = [to_int(v) for n, v in pairs if "uncorrectable" in n.lower()]
    return {"correctable": sum_or_none(correctable), "uncorrectable": sum_or_none(uncorrectable)}


def _xml_ecc_section(section: ET.Element | None) -> dict:
    if section is None:
        return {"correctable": None, "uncorrectable": None}
    pairs: list[tuple[str, str | None]] = []
    for child in section:
        if child.tag in ("single_bit", "double_bit"):
            total = _text(child, "total")
            pairs.append((child.tag, total))
        elif len(child) == 0:
            pairs.append((child.tag, child.text))
    return _ecc_counts_from_pairs(pairs)


def _xml_processes(gpu: ET.Element) -> list[dict]:
    processes = []
    for info in gpu.findall("processes/process_info"):
        processes.append(
            {
                "pid": to_int(_text(info, "pid")),
                "type": clean_value(_text(info, "type")),
                "name": clean_value(_text(info, "process_name")),
                "used_memory_mib": to_mib(_text(info, "used_memory")),
                "gpu_instance_id": to_int(_text(info, "gpu_instance_id")),
                "compute_instance_id": to_int(_text(info, "compute_instance_id")),
            }
        )
    return processes


def _xml_mig_devices(gpu: ET.Element) -> list[dict]:
    devices = []
    for device in gpu.findall("mig_devices/mig_device"):
        devices.append(
            {
                "index": to_int(_text(device, "index")),
                "gpu_instance_id": to_int(_text(device, "gpu_instance_id")),
                "compute_instance_id": to_int(_text(device, "compute_instance_id")),
                "multiprocessor_count": to_int(_text(device, "device_attributes/shared/multiprocessor_count")),
                "memory_total_mib": to_mib(_text(device, "fb_memory_usage/total")),
                "memory_used_mib": to_mib(_text(device, "fb_memory_usage/used")),
                "ecc_uncorrectable_volatile": to_int(
                    _text(device, "ecc_error_count/volatile_count/sram_uncorrectable")
                ),
            }
        )
    return devices


def _xml_compute_capability(gpu: ET.Element, name: str | None, architecture: str | None) -> tuple:
    reported = clean_value(_text(gpu, "cuda_compute_capability"))
    if reported is None:
        major = clean_value(_text(gpu, "cuda_compute_capability/major"))
        minor = clean_value(_text(gpu, "cuda_compute_capability/minor"))
        if major is not None and minor is not None:
            reported = f"{major}.{minor}"
    if reported is not None and re.match(r"^\d+\.\d+$", reported):
        return reported, "nvidia-smi"
    return compute_capability_for(name, architecture)


def _gpu_from_xml(gpu: ET.Element, index: int) -> dict:
    name = clean_value(_text(gpu, "product_name"))
    architecture = clean_value(_text(gpu, "product_architecture"))
    capability, capability_source = _xml_compute_capability(gpu, name, architecture)
    ecc = gpu.find("ecc_errors")
    remapped = gpu.find("remapped_rows")
    fabric = gpu.find("fabric")
    retired = gpu.find("retired_pages")
    return _finish_gpu(
        {
            "index": index,
            "pci_bus_id": clean_value(_text(gpu, "pci/pci_bus_id")) or gpu.get("id"),
            "uuid": clean_value(_text(gpu, "uuid")),
            "minor_number": to_int(_text(gpu, "minor_number")),
            "name": name,
            "brand": clean_value(_text(gpu, "product_brand")),
            "architecture": architecture,
            "compute_capability": capability,
            "compute_capability_source": capability_source,
            "vbios_version": clean_value(_text(gpu, "vbios_version")),
            "persistence_mode": _enabled(_text(gpu, "persistence_mode")),
            "mig_mode_current": clean_value(_text(gpu, "mig_mode/current_mig")),
            "mig_mode_pending": clean_value(_text(gpu, "mig_mode/pending_mig")),
            "mig_devices": _xml_mig_devices(gpu),
            "memory_total_mib": to_mib(_text(gpu, "fb_memory_usage/total")),
            "memory_reserved_mib": to_mib(_text(gpu, "fb_memory_usage/reserved")),
            "memory_used_mib": to_mib(_text(gpu, "fb_memory_usage/used")),
            "memory_free_mib": to_mib(_text(gpu, "fb_memory_usage/free")),
            "compute_mode": clean_value(_text(gpu, "compute_mode")),
            "virtualization_mode": _literal(_text(gpu, "gpu_virtualization_mode/virtualization_mode")),
            "ecc_mode": clean_value(_text(gpu, "ecc_mode/current_ecc")),
            "ecc_mode_pending": clean_value(_text(gpu, "ecc_mode/pending_ecc")),
            "ecc_errors": {
                "volatile": _xml_ecc_section(ecc.find("volatile") if ecc is not None else None),
                "aggregate": _xml_ecc_section(ecc.find("aggregate") if ecc is not None else None),
            },
            "retired_pages": None
            if retired is None
            else {
                "single_bit": to_int(_text(retired, "multiple_single_bit_retirement/retired_count")),
                "double_bit": to_int(_text(retired, "double_bit_retirement/retired_count")),
                "pending": _enabled(_first_text(retired, "pending_retirement", "pending_blacklist")),
            },
            "remapped_rows": None
            if remapped is None or len(remapped) == 0
            else {
                "correctable": to_int(_text(remapped, "remapped_row_corr")),
                "uncorrectable": to_int(_text(remapped, "remapped_row_unc")),
                "pending": _enabled(_text(remapped, "remapped_row_pending")),
                "failure": _enabled(_text(remapped, "remapped_row_failure")),
            },
            "fabric": None
            if fabric is None
            else {
                "state": clean_value(_text(fabric, "state")),
                "status": clean_value(_text(fabric, "status")),
                "clique_id": clean_value(_text(fabric, "cliqueId")),
                "cluster_uuid": clean_value(_text(fabric, "clusterUuid")),
            },
            "power_limit_w": _to_float(
                _first_text(gpu, "gpu_power_readings/current_power_limit", "power_readings/enforced_power_limit",
                            "power_readings/power_limit")
            ),
            "pcie_link_gen_current": to_int(_text(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
            "pcie_link_gen_max": to_int(_text(gpu, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
            "pcie_link_width_current": to_int(_text(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width")),
            "pcie_link_width_max": to_int(_text(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width")),
            "processes": _xml_processes(gpu),
        }
    )


def _finish_gpu(gpu: dict) -> dict:
    """Fields derived the same way for the XML and the text parser."""
    gpu["mig_enabled"] = (gpu["mig_mode_current"] or "").lower() == "enabled"
    return gpu


def parse_query_xml(text: str) -> dict:
    """Parse ``nvidia-smi -q -x``.

    Returns ``{timestamp, driver_version, cuda_version, attached_gpus, schema,
    gpus: [...]}``; each GPU has index (document order, which is nvidia-smi's
    index), pci_bus_id, uuid, name, memory_*_mib, compute_capability and its
    source, persistence_mode, mig_mode_*, mig_devices, ecc_mode, ecc_errors
    (volatile/aggregate correctable/uncorrectable), retired_pages,
    remapped_rows, fabric, power_limit_w, pcie_link_*, processes.
    """
    if not text or not text.strip():
        raise NvidiaSmiParseError("nvidia-smi -q -x printed nothing; expected an <nvidia_smi_log> XML document")
    try:
        root = ET.fromstring(text.strip().encode("utf-8"))
    except ET.ParseError as error:
        first_line = text.strip().splitlines()[0][:200]
        raise NvidiaSmiParseError(
            f"nvidia-smi -q -x output is not XML ({error}); it starts with: {first_line!r}"
        ) from error
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiParseError(f"expected the root element <nvidia_smi_log>, found <{root.tag}>")
    schema_match = re.search(r'<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+"([^"]+)"', text)
    return {
        "timestamp": clean_value(_text(root, "timestamp")),
        "driver_version": clean_value(_text(root, "driver_version")),
        "cuda_version": clean_value(_text(root, "cuda_version")),
        "attached_gpus": to_int(_text(root, "attached_gpus")),
        "schema": schema_match.group(1) if schema_match else None,
        "gpus": [_gpu_from_xml(gpu, index) for index, gpu in enumerate(root.findall("gpu"))],
    }


# ---------------------------------------------------------------- -q (text)


def _text_tree(text: str) -> list[dict]:
    """Indentation tree of 'Key : value' lines; keys may repeat, so children are lists."""
    root: dict = {"key": None, "value": None, "children": [], "indent": -1}
    stack = [root]
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith("==="):
            continue
        indent = len(line) - len(line.lstrip(" "))
        match = re.match(r"^\s*(\S.*?)\s+:(?:\s(.*))?$", line)
        if match:
            key, value = match.group(1).strip(), (match.group(2) or "").strip()
        else:
            key, value = line.strip(), None
        node = {"key": key, "value": value, "children": [], "indent": indent}
        while stack[-1]["indent"] >= indent:
            stack.pop()
        stack[-1]["children"].append(node)
        stack.append(node)
    return root["children"]


def _child(node: dict | None, *path: str) -> dict | None:
    for key in path:
        if node is None:
            return None
        node = next((c for c in node["children"] if c["key"].lower() == key.lower()), None)
    return node


def _value(node: dict | None, *path: str) -> str | None:
    found = _child(node, *path)
    return None if found is None else found["value"]


def _text_ecc_section(section: dict | None) -> dict:
    if section is None:
        return {"correctable": None, "uncorrectable": None}
    pairs: list[tuple[str, str | None]] = []
    for child in section["children"]:
        key = child["key"].lower()
        if key in ("single bit", "double bit"):
            pairs.append((key.replace(" ", "_"), _value(child, "Total")))
        elif not child["children"]:
            pairs.append((key, child["value"]))
    return _ecc_counts_from_pairs(pairs)


def _text_processes(gpu: dict) -> list[dict]:
    block = _child(gpu, "Processes")
    processes: list[dict] = []
    if block is None:
        return processes
    gpu_instance = compute_instance = None
    for child in block["children"]:
        key = child["key"].lower()
        if key == "gpu instance id":
            gpu_instance = to_int(child["value"])
        elif key == "compute instance id":
            compute_instance = to_int(child["value"])
        elif key == "process id":
            processes.append(
                {
                    "pid": to_int(child["value"]),
                    "type": clean_value(_value(child, "Type")),
                    "name": clean_value(_value(child, "Name")),
                    "used_memory_mib": to_mib(_value(child, "Used GPU Memory")),
                    "gpu_instance_id": gpu_instance,
                    "compute_instance_id": compute_instance,
                }
            )
            gpu_instance = compute_instance = None
    return processes


def _text_mig_devices(gpu: dict) -> list[dict]:
    devices = []
    for node in gpu["children"]:
        if node["key"].lower() != "mig device":
            continue
        memory = _child(node, "Shared FB Memory Usage") or _child(node, "FB Memory Usage")
        devices.append(
            {
                "index": to_int(_value(node, "Index")),
                "gpu_instance_id": to_int(_value(node, "GPU Instance ID")),
                "compute_instance_id": to_int(_value(node, "Compute Instance ID")),
                "multiprocessor_count": to_int(_value(node, "Device Attributes", "Shared", "Multiprocessor count")),
                "memory_total_mib": to_mib(_value(memory, "Total")),
                "memory_used_mib": to_mib(_value(memory, "Used")),
                "ecc_uncorrectable_volatile": to_int(_value(node, "ECC Errors", "Volatile", "SRAM Uncorrectable")),
            }
        )
    return devices


def _gpu_from_text(gpu: dict, index: int) -> dict:
    name = clean_value(_value(gpu, "Product Name"))
    architecture = clean_value(_value(gpu, "Product Architecture"))
    capability, capability_source = compute_capability_for(name, architecture)
    ecc = _child(gpu, "ECC Errors")
    retired = _child(gpu, "Retired Pages")
    remapped = _child(gpu, "Remapped Rows")
    fabric = _child(gpu, "Fabric")
    power = _child(gpu, "GPU Power Readings") or _child(gpu, "Power Readings")
    link = _child(gpu, "PCI", "GPU Link Info")
    return _finish_gpu(
        {
            "index": index,
            "pci_bus_id": clean_value(_value(gpu, "PCI", "Bus Id")) or gpu["key"].split()[-1],
            "uuid": clean_value(_value(gpu, "GPU UUID")),
            "minor_number": to_int(_value(gpu, "Minor Number")),
            "name": name,
            "brand": clean_value(_value(gpu, "Product Brand")),
            "architecture": architecture,
            "compute_capability": capability,
            "compute_capability_source": capability_source,
            "vbios_version": clean_value(_value(gpu, "VBIOS Version")),
            "persistence_mode": _enabled(_value(gpu, "Persistence Mode")),
            "mig_mode_current": clean_value(_value(gpu, "MIG Mode", "Current")),
            "mig_mode_pending": clean_value(_value(gpu, "MIG Mode", "Pending")),
            "mig_devices": _text_mig_devices(gpu),
            "memory_total_mib": to_mib(_value(gpu, "FB Memory Usage", "Total")),
            "memory_reserved_mib": to_mib(_value(gpu, "FB Memory Usage", "Reserved")),
            "memory_used_mib": to_mib(_value(gpu, "FB Memory Usage", "Used")),
            "memory_free_mib": to_mib(_value(gpu, "FB Memory Usage", "Free")),
            "compute_mode": clean_value(_value(gpu, "Compute Mode")),
            "virtualization_mode": _literal(_value(gpu, "GPU Virtualization Mode", "Virtualization Mode")),
            "ecc_mode": clean_value(_value(gpu, "ECC Mode", "Current")),
            "ecc_mode_pending": clean_value(_value(gpu, "ECC Mode", "Pending")),
            "ecc_errors": {
                "volatile": _text_ecc_section(_child(ecc, "Volatile")),
                "aggregate": _text_ecc_section(_child(ecc, "Aggregate")),
            },
            "retired_pages": None
            if retired is None
            else {
                "single_bit": to_int(_value(retired, "Single Bit ECC")),
                "double_bit": to_int(_value(retired, "Double Bit ECC")),
                "pending": _enabled(_value(retired, "Pending Page Blacklist") or _value(retired, "Pending")),
            },
            "remapped_rows": None
            if remapped is None or not remapped["children"]
            else {
                "correctable": to_int(_value(remapped, "Correctable Error")),
                "uncorrectable": to_int(_value(remapped, "Uncorrectable Error")),
                "pending": _enabled(_value(remapped, "Pending")),
                "failure": _enabled(_value(remapped, "Remapping Failure Occurred")),
            },
            "fabric": None
            if fabric is None
            else {
                "state": clean_value(_value(fabric, "State")),
                "status": clean_value(_value(fabric, "Status")),
                "clique_id": clean_value(_value(fabric, "CliqueId")),
                "cluster_uuid": clean_value(_value(fabric, "ClusterUUID")),
            },
            "power_limit_w": _to_float(_value(power, "Current Power Limit") or _value(power, "Enforced Power Limit")),
            "pcie_link_gen_current": to_int(_value(link, "PCIe Generation", "Current")),
            "pcie_link_gen_max": to_int(_value(link, "PCIe Generation", "Max")),
            "pcie_link_width_current": to_int(_value(link, "Link Width", "Current")),
            "pcie_link_width_max": to_int(_value(link, "Link Width", "Max")),
            "processes": _text_processes(gpu),
        }
    )


def parse_query_text(text: str) -> dict:
    """Parse the human-readable ``nvidia-smi -q``; returns the same shape as ``parse_query_xml``."""
    if "NVSMI LOG" not in (text or ""):
        raise NvidiaSmiParseError("expected nvidia-smi -q output with an 'NVSMI LOG' banner")
    tree = _text_tree(text)
    top = {"key": None, "value": None, "children": tree}
    gpus = [node for node in tree if node["key"].startswith("GPU ") and _BUS_ID.match(node["key"].split()[-1])]
    return {
        "timestamp": clean_value(_value(top, "Timestamp")),
        "driver_version": clean_value(_value(top, "Driver Version")),
        "cuda_version": clean_value(_value(top, "CUDA Version")),
        "attached_gpus": to_int(_value(top, "Attached GPUs")),
        "schema": None,
        "gpus": [_gpu_from_text(gpu, index) for index, gpu in enumerate(gpus)],
    }
