"""Parsers for the outputs of ``nvidia-smi``, and the GPU summary the planner reads.

Pure Python (3.11+, no Ansible import). Every parser takes the text a command
printed and returns plain, JSON-serialisable data; unparseable text raises
``NvidiaSmiParseError`` with a message that says what was expected.

Supported outputs (all tested on real captures under ``tests/fixtures/gpu``):

- ``nvidia-smi -q -x``            -> ``parse_query_xml``   (schemas v9 to v13)
- ``nvidia-smi -q``               -> ``parse_query_text``  (same shape as the XML parser)
- ``nvidia-smi topo -m``          -> ``parse_topo_matrix``
- ``nvidia-smi nvlink -s``        -> ``parse_nvlink_status``
- ``nvidia-smi --query-*=... --format=csv[,noheader][,nounits]`` -> ``parse_query_gpu_csv``
- ``nvidia-smi dmon`` / ``pmon``  -> ``parse_dmon`` / ``parse_pmon``
- ``nvidia-smi`` (default table)  -> ``parse_default_table``
- capture bundles made of ``# $ <command>`` banners -> ``split_capture_sections``

``summarize_gpus`` turns a parsed ``-q -x`` (plus ``topo -m`` and ``nvlink -s``)
into the ``vllm_gpu`` facts described in ``docs/architecture.md``.
"""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET

from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.cpuinfo import parse_cpulist
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import strip_ansi


class NvidiaSmiParseError(ValueError):
    """The text is not the nvidia-smi output the parser was asked to read."""


# Values nvidia-smi prints when a reading does not exist on this GPU or driver.
_ABSENT_VALUES = {
    "",
    "n/a",
    "none",
    "not found",
    "not supported",
    "not available",
    "unknown error",
    "insufficient permissions",
    "requested functionality has been deprecated",
}

_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")
_NUMBER_WITH_UNIT = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|W|%|MHz|us|ms|s|C|KB/s|GB/s|bank\(s\))$")
_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")

# Link types printed by ``topo -m``, from nearest to farthest. "SOC" is what
# drivers before 384 printed for today's "SYS".
_LINK_ORDER = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC")
_LINK_TOKEN = re.compile(r"X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC")

# Hopper and Blackwell GPUs have 18 NVLinks, the most any generation has had.
# More links to peers than that can only go through NVSwitch.
MAX_NVLINKS_PER_GPU = 18

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


def clean_value(value: str | None) -> str | None:
    """Strip a value; None when nvidia-smi says the reading does not exist."""
    if value is None:
        return None
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1].strip()
    if text.lower() in _ABSENT_VALUES:
        return None
    return text


def _literal(value: str | None) -> str | None:
    """Like clean_value, but keeps 'None', which some fields use as a real value."""
    text = (value or "").strip()
    return None if text.lower() in ("", "n/a", "[n/a]") else text


def _to_int(value: str | None) -> int | None:
    text = clean_value(value)
    if text is None:
        return None
    match = re.match(r"^(-?\d+)", text)
    return int(match.group(1)) if match else None


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


def _capability_key(capability: str) -> tuple[int, ...]:
    return tuple(int(part) for part in capability.split("."))


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


def _sum_or_none(values: list[int | None]) -> int | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def _ecc_counts_from_pairs(pairs: list[tuple[str, str | None]]) -> dict:
    """Correctable / uncorrectable totals from (name, value) pairs of one ECC section.

    Handles the three layouts nvidia-smi has used: single_bit/double_bit
    totals (before driver 470), sram_/dram_ counts (v11, v12), and sram
    parity/SEC-DED splits (v13).
    """
    names = {name.lower(): value for name, value in pairs}
    if "single_bit" in names or "double_bit" in names:
        return {"correctable": _to_int(names.get("single_bit")), "uncorrectable": _to_int(names.get("double_bit"))}
    correctable = [_to_int(v) for n, v in pairs if "correctable" in n.lower() and "uncorrectable" not in n.lower()]
    uncorrectable = [_to_int(v) for n, v in pairs if "uncorrectable" in n.lower()]
    return {"correctable": _sum_or_none(correctable), "uncorrectable": _sum_or_none(uncorrectable)}


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
                "pid": _to_int(_text(info, "pid")),
                "type": clean_value(_text(info, "type")),
                "name": clean_value(_text(info, "process_name")),
                "used_memory_mib": to_mib(_text(info, "used_memory")),
                "gpu_instance_id": _to_int(_text(info, "gpu_instance_id")),
                "compute_instance_id": _to_int(_text(info, "compute_instance_id")),
            }
        )
    return processes


def _xml_mig_devices(gpu: ET.Element) -> list[dict]:
    devices = []
    for device in gpu.findall("mig_devices/mig_device"):
        devices.append(
            {
                "index": _to_int(_text(device, "index")),
                "gpu_instance_id": _to_int(_text(device, "gpu_instance_id")),
                "compute_instance_id": _to_int(_text(device, "compute_instance_id")),
                "multiprocessor_count": _to_int(_text(device, "device_attributes/shared/multiprocessor_count")),
                "memory_total_mib": to_mib(_text(device, "fb_memory_usage/total")),
                "memory_used_mib": to_mib(_text(device, "fb_memory_usage/used")),
                "ecc_uncorrectable_volatile": _to_int(
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
            "minor_number": _to_int(_text(gpu, "minor_number")),
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
                "single_bit": _to_int(_text(retired, "multiple_single_bit_retirement/retired_count")),
                "double_bit": _to_int(_text(retired, "double_bit_retirement/retired_count")),
                "pending": _enabled(_first_text(retired, "pending_retirement", "pending_blacklist")),
            },
            "remapped_rows": None
            if remapped is None or len(remapped) == 0
            else {
                "correctable": _to_int(_text(remapped, "remapped_row_corr")),
                "uncorrectable": _to_int(_text(remapped, "remapped_row_unc")),
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
            "pcie_link_gen_current": _to_int(_text(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
            "pcie_link_gen_max": _to_int(_text(gpu, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
            "pcie_link_width_current": _to_int(_text(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width")),
            "pcie_link_width_max": _to_int(_text(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width")),
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
        "attached_gpus": _to_int(_text(root, "attached_gpus")),
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
            gpu_instance = _to_int(child["value"])
        elif key == "compute instance id":
            compute_instance = _to_int(child["value"])
        elif key == "process id":
            processes.append(
                {
                    "pid": _to_int(child["value"]),
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
                "index": _to_int(_value(node, "Index")),
                "gpu_instance_id": _to_int(_value(node, "GPU Instance ID")),
                "compute_instance_id": _to_int(_value(node, "Compute Instance ID")),
                "multiprocessor_count": _to_int(_value(node, "Device Attributes", "Shared", "Multiprocessor count")),
                "memory_total_mib": to_mib(_value(memory, "Total")),
                "memory_used_mib": to_mib(_value(memory, "Used")),
                "ecc_uncorrectable_volatile": _to_int(_value(node, "ECC Errors", "Volatile", "SRAM Uncorrectable")),
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
            "minor_number": _to_int(_value(gpu, "Minor Number")),
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
                "single_bit": _to_int(_value(retired, "Single Bit ECC")),
                "double_bit": _to_int(_value(retired, "Double Bit ECC")),
                "pending": _enabled(_value(retired, "Pending Page Blacklist") or _value(retired, "Pending")),
            },
            "remapped_rows": None
            if remapped is None or not remapped["children"]
            else {
                "correctable": _to_int(_value(remapped, "Correctable Error")),
                "uncorrectable": _to_int(_value(remapped, "Uncorrectable Error")),
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
            "pcie_link_gen_current": _to_int(_value(link, "PCIe Generation", "Current")),
            "pcie_link_gen_max": _to_int(_value(link, "PCIe Generation", "Max")),
            "pcie_link_width_current": _to_int(_value(link, "Link Width", "Current")),
            "pcie_link_width_max": _to_int(_value(link, "Link Width", "Max")),
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
        "attached_gpus": _to_int(_value(top, "Attached GPUs")),
        "schema": None,
        "gpus": [_gpu_from_text(gpu, index) for index, gpu in enumerate(gpus)],
    }


# ---------------------------------------------------------------- topo -m


def link_rank(link: str | None) -> int:
    """Order of a topo link type: 0 for X (self), 1 for NV#, ... 6 for SYS; 99 unknown."""
    if not link:
        return 99
    key = "NV" if link.startswith("NV") else link
    return _LINK_ORDER.index(key) if key in _LINK_ORDER else 99


def nvlink_count(link: str | None) -> int | None:
    """'NV18' -> 18; None for any other link type."""
    match = re.match(r"^NV(\d+)$", link or "")
    return int(match.group(1)) if match else None


def _split_glued(cell: str) -> list[str]:
    """'NODENODE' -> ['NODE', 'NODE']: pasted captures sometimes lose a tab."""
    cell = cell.strip()
    tokens = _LINK_TOKEN.findall(cell)
    if tokens and "".join(tokens) == cell:
        return tokens
    return [cell]


_AFFINITY_COLUMNS = {"cpu affinity": "cpu_affinity", "numa affinity": "numa_affinity", "gpu numa id": "gpu_numa_id"}


def parse_topo_matrix(text: str) -> dict:
    """Parse ``nvidia-smi topo -m``.

    Returns ``{devices, gpus, nics, matrix, affinity, nic_names, incomplete_rows}``:
    ``matrix[a][b]`` is the link type between devices a and b ('X', 'NV18',
    'PIX', 'PXB', 'PHB', 'NODE', 'SYS'); ``affinity[GPUn]`` holds cpu_affinity,
    cpus (expanded list), numa_affinity and gpu_numa_id (None when empty or
    N/A); ``nic_names`` maps 'NIC0' to 'mlx5_0' when the NIC legend is
    present. Rows cut short (as in pasted captures) are listed in
    ``incomplete_rows``; a GPU row cut short is an error.
    """
    lines = [strip_ansi(line).rstrip("\r\n") for line in (text or "").splitlines()]
    # The header is the last non-empty line before the first 'GPU0' row.
    header_index = None
    first_row = next((index for index, line in enumerate(lines) if re.match(r"^GPU0\s", line)), None)
    if first_row is not None:
        header_index = next(
            (index for index in range(first_row - 1, -1, -1) if lines[index].strip()), None
        )
    if header_index is not None and "GPU0" not in lines[header_index]:
        header_index = None
    if header_index is None:
        raise NvidiaSmiParseError("no topology matrix found: expected a header with GPU0 followed by a 'GPU0' row")
    header = lines[header_index]
    devices = re.findall(r"(?:GPU|NIC)\d+", header)
    expanded_header = header.expandtabs(8).lower()
    affinity_columns = sorted(
        (expanded_header.find(label), name) for label, name in _AFFINITY_COLUMNS.items() if label in expanded_header
    )

    matrix: dict = {}
    affinity: dict = {}
    incomplete: list[str] = []
    for line in lines[header_index + 1:]:
        if not line.strip():
            if matrix:
                break
            continue
        match = re.match(r"^\s*((?:GPU|NIC)\d+)(.*)$", line)
        if not match:
            break
        label = match.group(1)
        if "\t" in line:
            links, trailing = _split_tabbed_row(match.group(2), len(devices), affinity_columns)
        else:
            links, trailing = _split_spaced_row(line, len(label), len(devices), affinity_columns)
        matrix[label] = dict(zip(devices, links, strict=False))
        if len(links) < len(devices):
            if label.startswith("GPU"):
                raise NvidiaSmiParseError(f"topology row {label} has {len(links)} link cells, expected {len(devices)}")
            incomplete.append(label)
        if label.startswith("GPU"):
            entry = {name: clean_value(trailing.get(name)) for _, name in affinity_columns}
            cpu_text = entry.get("cpu_affinity")
            entry["cpus"] = parse_cpulist(cpu_text) if cpu_text else []
            affinity[label] = entry

    nic_names = {}
    for line in lines[header_index:]:
        legend = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", line)
        if legend:
            nic_names[legend.group(1)] = legend.group(2)

    if not any(label.startswith("GPU") for label in matrix):
        raise NvidiaSmiParseError("topology matrix has no GPU rows")
    return {
        "devices": devices,
        "gpus": [device for device in devices if device.startswith("GPU")],
        "nics": [device for device in devices if device.startswith("NIC")],
        "matrix": matrix,
        "affinity": affinity,
        "nic_names": nic_names,
        "incomplete_rows": incomplete,
    }


def _take_links(cells: list[str], device_count: int) -> tuple[list[str], int]:
    links: list[str] = []
    used = 0
    while used < len(cells) and len(links) < device_count:
        links.extend(_split_glued(cells[used]))
        used += 1
    return links[:device_count], used


def _split_tabbed_row(rest: str, device_count: int, affinity_columns: list) -> tuple[list[str], dict]:
    """A row as nvidia-smi prints it: tab-separated.

    nvidia-smi puts an empty cell before 'GPU NUMA ID', so with more cells than
    affinity columns the last cell belongs to the last column.
    """
    cells = rest.split("\t")
    if cells and cells[0].strip() == "":
        cells = cells[1:]
    links, used = _take_links(cells, device_count)
    extra = cells[used:]
    names = [name for _, name in affinity_columns]
    if names and len(extra) > len(names):
        extra = extra[: len(names) - 1] + [extra[-1]]
    return links, dict(zip(names, extra, strict=False))


def _split_spaced_row(line: str, label_length: int, device_count: int, affinity_columns: list) -> tuple[list[str], dict]:
    """A row whose tabs became spaces (pasted captures): affinity cells by column position.

    A cell belongs to the rightmost header column that starts no more than one
    tab stop (8 columns) after it, which places empty cells correctly.
    """
    tokens = [(m.start(), m.group()) for m in re.finditer(r"\S+", line) if m.start() >= label_length]
    links, used = _take_links([token for _, token in tokens], device_count)
    trailing: dict = {}
    for start, token in tokens[used:]:
        candidates = [name for offset, name in affinity_columns if offset <= start + 8]
        if candidates:
            trailing[candidates[-1]] = token
    return links, trailing


# ---------------------------------------------------------------- nvlink -s


def parse_nvlink_status(text: str) -> dict:
    """Parse ``nvidia-smi nvlink -s``.

    Returns ``{gpus: [{index, name, uuid, supported, links: [{link, active,
    speed_gb_s}], active_links, inactive_links, total_gb_s}]}``. ``supported``
    is False when nvidia-smi says NVLink queries do not apply (MIG mode).
    """
    gpus: list[dict] = []
    current: dict | None = None
    for raw in (text or "").splitlines():
        line = strip_ansi(raw).strip()
        if not line:
            continue
        header = re.match(r"^GPU (\d+): (.*?) \(UUID: ([^)]+)\)$", line)
        if header:
            current = {
                "index": int(header.group(1)),
                "name": header.group(2),
                "uuid": header.group(3),
                "supported": True,
                "links": [],
            }
            gpus.append(current)
            continue
        if current is None:
            raise NvidiaSmiParseError(f"nvlink -s: expected a 'GPU n: NAME (UUID: ...)' line first, got {line!r}")
        link = re.match(r"^Link (\d+): (.*)$", line)
        if link:
            speed = re.match(r"^(\d+(?:\.\d+)?) GB/s$", link.group(2).strip())
            current["links"].append(
                {"link": int(link.group(1)), "active": bool(speed), "speed_gb_s": float(speed.group(1)) if speed else None}
            )
        elif "not supported" in line.lower():
            current["supported"] = False
    for gpu in gpus:
        active = [link for link in gpu["links"] if link["active"]]
        gpu["active_links"] = len(active)
        gpu["inactive_links"] = len(gpu["links"]) - len(active)
        gpu["total_gb_s"] = round(sum(link["speed_gb_s"] for link in active), 3)
    if text and text.strip() and not gpus:
        raise NvidiaSmiParseError("nvlink -s output has no 'GPU n:' lines")
    return {"gpus": gpus}


# ---------------------------------------------------------------- CSV queries

# Fields whose values stay text even when they look like numbers.
_STRING_FIELDS = {
    "timestamp", "driver_version", "kmd_version", "name", "serial", "uuid", "vbios_version", "compute_cap",
    "hostname", "gpu_name", "gpu_bus_id", "gpu_serial", "gpu_uuid", "process_name", "fabric.clusteruuid",
    "fabric.cliqueid", "platform.chassis_serial_number", "platform.gpu_fabric_guid", "retired_pages.address",
    "retired_pages.timestamp", "gpu_recovery_action", "gsp.mode.current", "gsp.mode.default",
}
_STRING_PREFIXES = ("pci.", "inforom.", "clocks_event_reasons.", "clocks_throttle_reasons.", "vgpu")

# The fields gpu_facts' CSV cross-check and the lab's nvidia-smi double use.
QUERY_GPU_FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "driver_version", "memory.total", "memory.used", "memory.free",
    "utilization.gpu", "compute_cap", "persistence_mode", "mig.mode.current",
)


def _field_name(header_cell: str) -> tuple[str, str | None]:
    match = re.match(r"^\s*(.*?)\s*(?:\[(.*)\])?\s*$", header_cell)
    return match.group(1), match.group(2)


def _csv_value(field: str, raw: str):
    value = clean_value(raw)
    if value is None:
        return None
    lowered = field.lower()
    if lowered in _STRING_FIELDS or lowered.startswith(_STRING_PREFIXES):
        return value
    with_unit = _NUMBER_WITH_UNIT.match(value)
    number = with_unit.group(1) if with_unit else (value if _NUMBER.match(value) else None)
    if number is None:
        return value
    return float(number) if "." in number else int(number)


def parse_query_gpu_csv(text: str, fields: list[str] | tuple[str, ...] | None = None) -> list[dict]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    Also reads ``--query-compute-apps`` and the other ``--query-*`` switches.
    With a header the field names come from it (units such as '[MiB]' are
    removed); without one, pass ``fields`` in query order. Numbers become int
    or float (units stripped), '[N/A]', '[Not Supported]' and the like become
    None, and identifiers (uuid, bus id, versions, compute_cap) stay strings.
    """
    rows = [row for row in csv.reader(io.StringIO(text or ""), skipinitialspace=True) if any(c.strip() for c in row)]
    if not rows:
        return []
    first = [_field_name(cell)[0] for cell in rows[0]]
    header_present = fields is None or [f.lower() for f in first] == [f.lower() for f in fields]
    if fields is None:
        names = first
        data = rows[1:]
        if not all(re.match(r"^[a-z_][a-z0-9_.]*$", name, re.IGNORECASE) for name in names):
            raise NvidiaSmiParseError(f"expected a CSV header of nvidia-smi field names, got {rows[0]!r}")
    else:
        names = list(fields)
        data = rows[1:] if header_present else rows
    result = []
    for row in data:
        if len(row) != len(names):
            raise NvidiaSmiParseError(
                f"CSV row has {len(row)} values for {len(names)} fields: {', '.join(row)[:200]!r}"
            )
        result.append({name: _csv_value(name, cell) for name, cell in zip(names, row, strict=True)})
    return result


# ---------------------------------------------------------------- dmon / pmon


def _monitor_rows(text: str) -> list[dict]:
    """Rows of dmon/pmon output keyed by the lower-case names of the last '# gpu ...' header."""
    columns: list[str] | None = None
    rows: list[dict] = []
    for raw in (text or "").splitlines():
        line = strip_ansi(raw).rstrip()
        if not line.strip():
            continue
        if line.startswith("#"):
            # Two header lines: names ('# gpu pwr ...'), then units ('# Idx W ...').
            names = [name.lower() for name in line[1:].split()]
            if "gpu" in names:
                columns = names
            continue
        if columns is None:
            raise NvidiaSmiParseError(f"monitor output row before any '# gpu ...' header: {line!r}")
        cells = line.split()
        if len(cells) < len(columns):
            raise NvidiaSmiParseError(f"monitor row has {len(cells)} values for {len(columns)} columns: {line!r}")
        if len(cells) > len(columns):
            # Only the last column (pmon's command name) can hold spaces.
            cells = cells[: len(columns) - 1] + [" ".join(cells[len(columns) - 1:])]
        rows.append(dict(zip(columns, cells, strict=True)))
    return rows


def _monitor_number(value: str):
    if value in ("-", "N/A"):
        return None
    if _NUMBER.match(value):
        return float(value) if "." in value else int(value)
    return value


def parse_dmon(text: str) -> list[dict]:
    """Parse ``nvidia-smi dmon`` (any ``-s`` selection, ``-o DT`` too).

    One dict per sample row with ``gpu`` and each metric column (lower-case
    names from the header: pwr, gtemp, sm, mem, fb, ...) as int/float, or
    None where dmon printed '-'.
    """
    return [{key: _monitor_number(value) for key, value in row.items()} for row in _monitor_rows(text)]


def parse_pmon(text: str) -> list[dict]:
    """Parse ``nvidia-smi pmon``: one dict per row (gpu, pid, type, sm, mem, ..., command)."""
    rows = []
    for row in _monitor_rows(text):
        parsed = {
            key: ((None if value == "-" else value) if key in ("type", "command") else _monitor_number(value))
            for key, value in row.items()
        }
        rows.append(parsed)
    return rows


# ---------------------------------------------------------------- default table


def parse_default_table(text: str) -> dict:
    """Parse the plain ``nvidia-smi`` table: versions, one entry per GPU, processes."""
    header = re.search(r"Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)", text or "")
    if not header:
        raise NvidiaSmiParseError("expected the nvidia-smi table header with 'Driver Version' and 'CUDA Version'")
    gpus: list[dict] = []
    processes: list[dict] = []
    lines = (text or "").splitlines()
    in_processes = False
    for index, line in enumerate(lines):
        if "Processes:" in line:
            in_processes = True
            continue
        first = re.match(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|\s+(\S+)\s+(\S+)\s+\|\s+(.+?)\s+\|$", line)
        if first and not in_processes:
            second = lines[index + 1] if index + 1 < len(lines) else ""
            third = lines[index + 2] if index + 2 < len(lines) else ""
            memory = re.search(r"(\d+)MiB\s*/\s*(\d+)MiB", second)
            mig = re.search(r"\|\s*(\S+)\s*\|$", third)
            gpus.append(
                {
                    "index": int(first.group(1)),
                    "name": first.group(2).strip(),
                    "persistence_mode": first.group(3) == "On",
                    "pci_bus_id": first.group(4),
                    "memory_used_mib": int(memory.group(1)) if memory else None,
                    "memory_total_mib": int(memory.group(2)) if memory else None,
                    "volatile_uncorrectable_ecc": _to_int(first.group(6)),
                    "mig_mode": clean_value(mig.group(1)) if mig else None,
                }
            )
            continue
        process = re.match(
            r"^\|\s+(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(C\+G|C|G)\s+(.+?)\s+(\d+)MiB\s*\|$", line
        )
        if process and in_processes:
            processes.append(
                {
                    "gpu": int(process.group(1)),
                    "gpu_instance_id": _to_int(process.group(2)),
                    "compute_instance_id": _to_int(process.group(3)),
                    "pid": int(process.group(4)),
                    "type": process.group(5),
                    "name": process.group(6),
                    "used_memory_mib": int(process.group(7)),
                }
            )
    return {
        "driver_version": header.group(1),
        "cuda_version": clean_value(header.group(2)),
        "gpus": gpus,
        "processes": processes,
    }


def parse_version(text: str) -> dict:
    """Parse ``nvidia-smi --version``: {nvidia_smi, nvml, driver, cuda}."""
    values = {}
    for line in (text or "").splitlines():
        key, separator, value = line.partition(":")
        if separator:
            values[key.strip().lower()] = value.strip()
    if "driver version" not in values:
        raise NvidiaSmiParseError("expected nvidia-smi --version output with a 'DRIVER version' line")
    return {
        "nvidia_smi": values.get("nvidia-smi version"),
        "nvml": values.get("nvml version"),
        "driver": values.get("driver version"),
        "cuda": values.get("cuda version"),
    }


# ---------------------------------------------------------------- capture bundles


def split_capture_sections(text: str) -> list[dict]:
    """Split a capture bundle into sections.

    A section starts with a '#####' rule, '# <title>' and optionally
    '# $ <command>' lines, and a closing '#####' rule; its body runs to the
    next opening rule. Returns ``[{title, command, body}]``.
    """
    lines = (text or "").splitlines()
    sections: list[dict] = []
    index = 0
    rule = re.compile(r"^#{20,}\s*$")
    while index < len(lines):
        if rule.match(lines[index]):
            banner_end = index + 1
            while banner_end < len(lines) and lines[banner_end].startswith("#") and not rule.match(lines[banner_end]):
                banner_end += 1
            if banner_end < len(lines) and rule.match(lines[banner_end]):
                banner = [line[1:].strip() for line in lines[index + 1:banner_end]]
                command = next((line[2:].strip() for line in banner if line.startswith("$ ")), None)
                title = next((line for line in banner if not line.startswith("$ ")), "")
                body_start = banner_end + 1
                body_end = body_start
                while body_end < len(lines) and not (
                    rule.match(lines[body_end])
                    and body_end + 1 < len(lines)
                    and lines[body_end + 1].startswith("# ")
                ):
                    body_end += 1
                sections.append({"title": title, "command": command, "body": "\n".join(lines[body_start:body_end])})
                index = body_end
                continue
        index += 1
    return sections


# ---------------------------------------------------------------- summary


def _common(values: list):
    known = {value for value in values if value is not None}
    return known.pop() if len(known) == 1 else None


def topology_links(topo: dict | None, gpu_labels: list[str]) -> tuple[bool | None, int | None, bool]:
    """(nvlink, links_per_pair, through_switch) for the GPUs named in ``gpu_labels``.

    nvlink: every pair is NV# (False with fewer than two GPUs; None without a
    topology). links_per_pair: the smallest NV# count. through_switch: the
    GPUs have more NVLinks to peers than one GPU has (MAX_NVLINKS_PER_GPU),
    which only an NVSwitch allows.
    """
    if len(gpu_labels) < 2:
        return False, None, False
    if not topo:
        return None, None, False
    matrix = topo.get("matrix", {})
    pair_links = [
        matrix.get(left, {}).get(right)
        for position, left in enumerate(gpu_labels)
        for right in gpu_labels[position + 1:]
    ]
    nvlink = all(link is not None and link.startswith("NV") for link in pair_links)
    if not nvlink:
        return False, None, False
    links_per_pair = min(nvlink_count(link) for link in pair_links)
    through_switch = links_per_pair * (len(gpu_labels) - 1) > MAX_NVLINKS_PER_GPU
    return True, links_per_pair, through_switch


def summarize_gpus(parsed_xml: dict, topo: dict | None = None, nvlink_status: dict | None = None) -> dict:
    """The ``vllm_gpu`` facts: what the planner, preflight and doctor read.

    Top-level keys: present, count, attached_gpus, name, names, homogeneous,
    memory_total_mib (the smallest GPU), memory_total_gib, memory_cuda_total_mib
    (FB total minus the driver reserve: the total CUDA and vLLM see), driver_version,
    cuda_version, compute_capability (the lowest), architecture,
    persistence_mode (all enabled), mig_mode (any GPU in MIG mode),
    mig_pending_change, ecc_uncorrectable_volatile, ecc_uncorrectable_aggregate,
    nvlink (every GPU pair is NV#; None when unknown), nvlink_links_per_pair,
    nvswitch, fabric_state, gpus (per GPU, with topology and NVLink link
    counts), links (the topo matrix), nics, processes, warnings.

    Each entry of ``gpus`` is a GPU from the parser (see ``parse_query_xml``)
    plus, with a topology, cpu_affinity, numa_affinity, gpu_numa_id,
    closest_nics (NIC names with the nearest link) and closest_nic_link, and,
    with ``nvlink_status``, nvlink_active_links, nvlink_inactive_links and
    nvlink_total_gb_s.
    """
    gpus = [dict(gpu) for gpu in parsed_xml.get("gpus", [])]
    count = len(gpus)
    warnings: list[str] = []
    attached = parsed_xml.get("attached_gpus")
    if attached is not None and attached != count:
        warnings.append(f"nvidia-smi reports {attached} attached GPUs but describes {count}")

    names = sorted({gpu["name"] for gpu in gpus if gpu.get("name")})
    homogeneous = len(names) <= 1
    if not homogeneous:
        warnings.append(f"GPUs of different models on one host: {', '.join(names)}")
    memories = [gpu["memory_total_mib"] for gpu in gpus if gpu.get("memory_total_mib") is not None]
    # What CUDA reports as total (cudaMemGetInfo): FB total minus the driver's reserve.
    cuda_totals = [gpu["memory_total_mib"] - (gpu.get("memory_reserved_mib") or 0)
                   for gpu in gpus if gpu.get("memory_total_mib") is not None]
    capabilities = [gpu["compute_capability"] for gpu in gpus if gpu.get("compute_capability")]

    if topo:
        for gpu in gpus:
            label = f"GPU{gpu['index']}"
            placement = topo.get("affinity", {}).get(label, {})
            gpu.update({key: value for key, value in placement.items() if key != "cpus"})
            row = topo.get("matrix", {}).get(label, {})
            best = min((link_rank(link) for nic, link in row.items() if nic.startswith("NIC")), default=None)
            gpu["closest_nics"] = [
                topo.get("nic_names", {}).get(nic, nic)
                for nic, link in row.items()
                if nic.startswith("NIC") and best is not None and link_rank(link) == best
            ]
            gpu["closest_nic_link"] = next(
                (link for nic, link in row.items() if nic.startswith("NIC") and link_rank(link) == best), None
            )
    if nvlink_status:
        by_index = {entry["index"]: entry for entry in nvlink_status.get("gpus", [])}
        for gpu in gpus:
            entry = by_index.get(gpu["index"])
            if entry is not None:
                gpu["nvlink_active_links"] = entry["active_links"]
                gpu["nvlink_inactive_links"] = entry["inactive_links"]
                gpu["nvlink_total_gb_s"] = entry["total_gb_s"]
                if entry["inactive_links"]:
                    warnings.append(
                        f"GPU{gpu['index']} has {entry['inactive_links']} inactive NVLink(s) "
                        f"of {len(entry['links'])}"
                    )

    nvlink, links_per_pair, through_switch = topology_links(topo, [f"GPU{gpu['index']}" for gpu in gpus])

    fabrics = [gpu.get("fabric") or {} for gpu in gpus]
    fabric_states = [fabric.get("state") for fabric in fabrics]
    fabric_registered = bool(gpus) and all(
        fabric.get("state") == "Completed" and fabric.get("status") == "Success" for fabric in fabrics
    )
    fabric_reported = [fabric for fabric in fabrics if fabric.get("state") is not None]
    for gpu, fabric in zip(gpus, fabrics, strict=True):
        state = fabric.get("state")
        if state is not None and (state != "Completed" or fabric.get("status") not in (None, "Success")):
            warnings.append(
                f"GPU{gpu['index']} NVSwitch fabric state is {state!r} (status {fabric.get('status')!r}): "
                "nvidia-fabricmanager must be running and match the driver version"
            )
    nvswitch = fabric_registered or through_switch

    mig_pending = False
    for gpu in gpus:
        current, pending = gpu.get("mig_mode_current"), gpu.get("mig_mode_pending")
        if current and pending and current != pending:
            mig_pending = True
            warnings.append(f"GPU{gpu['index']} MIG mode is {current} but {pending} is pending: the GPU needs a reset")
        remapped = gpu.get("remapped_rows") or {}
        if remapped.get("pending"):
            warnings.append(f"GPU{gpu['index']} has a row remapping pending: the GPU needs a reset")
        if remapped.get("failure"):
            warnings.append(f"GPU{gpu['index']} reports a row remapping failure: replace or RMA the GPU")
        retired = gpu.get("retired_pages") or {}
        if retired.get("pending"):
            warnings.append(f"GPU{gpu['index']} has a page retirement pending: the GPU needs a reset")
        volatile = gpu["ecc_errors"]["volatile"]["uncorrectable"]
        if volatile:
            warnings.append(f"GPU{gpu['index']} has {volatile} volatile uncorrectable ECC error(s)")
        if gpu.get("persistence_mode") is False:
            warnings.append(f"GPU{gpu['index']} persistence mode is off")

    processes = []
    for gpu in gpus:
        for process in gpu.get("processes", []):
            processes.append({"gpu": gpu["index"], "gpu_uuid": gpu.get("uuid"), **process})

    persistence = [gpu.get("persistence_mode") for gpu in gpus]
    return {
        "present": count > 0,
        "count": count,
        "attached_gpus": attached,
        "name": names[0] if len(names) == 1 else None,
        "names": names,
        "homogeneous": homogeneous,
        "memory_total_mib": min(memories) if memories else None,
        "memory_total_gib": round(min(memories) / 1024, 2) if memories else None,
        "memory_cuda_total_mib": min(cuda_totals) if cuda_totals else None,
        "driver_version": parsed_xml.get("driver_version"),
        "cuda_version": parsed_xml.get("cuda_version"),
        "compute_capability": min(capabilities, key=_capability_key) if capabilities else None,
        "architecture": _common([gpu.get("architecture") for gpu in gpus]),
        "persistence_mode": bool(gpus) and all(value is True for value in persistence),
        "mig_mode": any(gpu.get("mig_enabled") for gpu in gpus),
        "mig_pending_change": mig_pending,
        "ecc_uncorrectable_volatile": _sum_or_none([gpu["ecc_errors"]["volatile"]["uncorrectable"] for gpu in gpus]),
        "ecc_uncorrectable_aggregate": _sum_or_none(
            [gpu["ecc_errors"]["aggregate"]["uncorrectable"] for gpu in gpus]
        ),
        "nvlink": nvlink,
        "nvlink_links_per_pair": links_per_pair,
        "nvswitch": nvswitch,
        "fabric_state": _common(fabric_states) if fabric_reported else None,
        "gpus": gpus,
        "links": dict(topo.get("matrix", {})) if topo else {},
        "nics": dict(topo.get("nic_names", {})) if topo else {},
        "processes": processes,
        "warnings": warnings,
    }


def absent_summary() -> dict:
    """The ``vllm_gpu`` facts of a host without NVIDIA GPUs."""
    return summarize_gpus({"gpus": [], "attached_gpus": 0})
