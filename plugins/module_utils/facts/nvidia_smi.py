"""nvidia-smi: what its parsers share, and the GPU summary the gpu_facts module sets.

Pure Python (3.11+, no Ansible import). Every nvidia-smi parser takes the text a
command printed and returns plain, JSON-serialisable data; unparseable text
raises ``NvidiaSmiParseError`` (defined here) with a message that says what was
expected. The parsers live next to this file, by what they read (all tested on
real captures under ``tests/fixtures/gpu``):

- ``nvidia_smi_query``:  ``nvidia-smi -q -x`` -> ``parse_query_xml`` (schemas v9 to v13),
  ``nvidia-smi -q`` -> ``parse_query_text`` (same shape as the XML parser)
- ``nvidia_smi_topo``:   ``nvidia-smi topo -m`` -> ``parse_topo_matrix``,
  ``nvidia-smi nvlink -s`` -> ``parse_nvlink_status``
- ``nvidia_smi_tables``: ``nvidia-smi --query-*=... --format=csv[,noheader][,nounits]`` -> ``parse_query_gpu_csv``,
  ``dmon`` / ``pmon`` -> ``parse_dmon`` / ``parse_pmon``, the default table -> ``parse_default_table``,
  ``--version`` -> ``parse_version``, capture bundles made of ``# $ <command>`` banners
  -> ``split_capture_sections``

This file holds the value helpers more than one of them uses (``clean_value``,
``to_int``, ``sum_or_none``), the order of the ``topo -m`` link types
(``link_rank``, ``nvlink_count``), and ``summarize_gpus``, which turns a parsed
``-q -x`` (plus ``topo -m`` and ``nvlink -s``) into the ``vllm_gpu`` facts
described in ``docs/architecture.md``; the gpu_facts module calls it.
"""

from __future__ import annotations

import re


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

# Link types printed by ``topo -m``, from nearest to farthest. "SOC" is what
# drivers before 384 printed for today's "SYS".
_LINK_ORDER = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC")

# Hopper and Blackwell GPUs have 18 NVLinks, the most any generation has had.
# More links to peers than that can only go through NVSwitch.
MAX_NVLINKS_PER_GPU = 18


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


def to_int(value: str | None) -> int | None:
    """The leading integer of a value ('58 C' -> 58); None when absent or not a number."""
    text = clean_value(value)
    if text is None:
        return None
    match = re.match(r"^(-?\d+)", text)
    return int(match.group(1)) if match else None


def sum_or_none(values: list[int | None]) -> int | None:
    """The sum of the known values; None when none is known."""
    known = [value for value in values if value is not None]
    return sum(known) if known else None


# ---------------------------------------------------------------- topo -m link types


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


# ---------------------------------------------------------------- summary


def _common(values: list):
    known = {value for value in values if value is not None}
    return known.pop() if len(known) == 1 else None


def _capability_key(capability: str) -> tuple[int, ...]:
    return tuple(int(part) for part in capability.split("."))


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

    Each entry of ``gpus`` is a GPU from the parser (see ``nvidia_smi_query.parse_query_xml``)
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
        "ecc_uncorrectable_volatile": sum_or_none([gpu["ecc_errors"]["volatile"]["uncorrectable"] for gpu in gpus]),
        "ecc_uncorrectable_aggregate": sum_or_none(
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
