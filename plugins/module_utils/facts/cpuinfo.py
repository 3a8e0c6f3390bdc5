"""Parsers for the kernel's CPU, memory and NUMA files, and the ``vllm_cpu`` summary.

Pure Python (3.11+, no Ansible import). Parsers take the files' text;
``read_cpu_sources`` is the one function that touches the file system, and it
reads under a root path so tests can point it at a copied tree.
"""

from __future__ import annotations

import glob
import os
import re


class CpuInfoParseError(ValueError):
    """The text is not the kernel file the parser was asked to read."""


# CPU features that decide which vLLM CPU kernels can run.
FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "asimd", "sve")


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    cpus: list[int] = []
    stripped = (text or "").strip()
    if not stripped:
        return cpus
    for part in stripped.split(","):
        part = part.strip()
        match = re.match(r"^(\d+)(?:-(\d+))?(?::(\d+)(?:/(\d+))?)?$", part)
        if not match:
            raise CpuInfoParseError(f"not a cpulist: {text!r} (bad part {part!r})")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        if last < first:
            raise CpuInfoParseError(f"not a cpulist: {text!r} (range {part!r} runs backwards)")
        # The 'a-b:used/group' stride form of cpuset lists.
        used = int(match.group(3)) if match.group(3) else None
        group = int(match.group(4)) if match.group(4) else used
        for cpu in range(first, last + 1):
            if used is None or (cpu - first) % group < used:
                cpus.append(cpu)
    return sorted(set(cpus))


def format_cpulist(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    index = 0
    while index < len(ordered):
        start = index
        while index + 1 < len(ordered) and ordered[index + 1] == ordered[index] + 1:
            index += 1
        parts.append(str(ordered[start]) if start == index else f"{ordered[start]}-{ordered[index]}")
        index += 1
    return ",".join(parts)


def parse_cpuinfo(text: str) -> dict:
    """Parse ``/proc/cpuinfo`` (x86 and Arm layouts).

    Returns ``{processors: [{processor, physical_id, core_id, model_name}],
    logical_cpus, model_name, vendor, flags}``.
    """
    processors: list[dict] = []
    current: dict = {}
    common: dict = {}
    for line in (text or "").splitlines() + [""]:
        if not line.strip():
            if current:
                processors.append(current)
                current = {}
            continue
        if ":" not in line:
            continue
        key, _, value = line.partition(":")
        key = key.strip().lower()
        value = value.strip()
        if key == "processor" and value.isdigit():
            if current:
                processors.append(current)
            current = {"processor": int(value)}
        elif current:
            current[key] = value
        else:
            common[key] = value
    if not processors:
        raise CpuInfoParseError("no 'processor : N' entries: this is not /proc/cpuinfo")
    first = processors[0]
    flags = (first.get("flags") or first.get("features") or "").split()
    model_name = first.get("model name") or common.get("model name") or common.get("hardware") or first.get("cpu model")
    vendor = first.get("vendor_id") or first.get("cpu implementer")
    return {
        "processors": [
            {
                "processor": entry["processor"],
                "physical_id": int(entry["physical id"]) if entry.get("physical id", "").isdigit() else None,
                "core_id": int(entry["core id"]) if entry.get("core id", "").isdigit() else None,
            }
            for entry in processors
        ],
        "logical_cpus": len(processors),
        "model_name": model_name,
        "vendor": vendor,
        "flags": flags,
    }


def parse_meminfo(text: str) -> dict:
    """Parse ``/proc/meminfo`` or a NUMA node's ``meminfo`` into ``{name: kB}``.

    Node files prefix every line with 'Node N '; that prefix is dropped.
    HugePages_* counts have no unit and are returned as plain numbers.
    """
    values: dict = {}
    for line in (text or "").splitlines():
        match = re.match(r"^\s*(?:Node\s+\d+\s+)?([A-Za-z0-9_()]+):\s+(\d+)(?:\s*kB)?\s*$", line)
        if match:
            values[match.group(1)] = int(match.group(2))
    if "MemTotal" not in values:
        raise CpuInfoParseError("no 'MemTotal:' line: this is not a meminfo file")
    return values


def parse_proc_status(text: str) -> dict:
    """The CPU and memory placement lines of ``/proc/<pid>/status``."""
    values = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("Cpus_allowed_list", "Mems_allowed_list"):
            values[key] = value.strip()
    return values


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def read_cpu_sources(root: str = "/") -> dict:
    """Collect the texts ``summarize_cpu`` needs, from under ``root``.

    Returns ``{cpuinfo, meminfo, status, nodes: {N: {cpulist, meminfo}},
    topology: {cpu: {physical_package_id, core_id}}, cgroup_memory_max}``;
    a file that cannot be read is None.
    """

    def path(*parts: str) -> str:
        return os.path.join(root, *parts)

    nodes = {}
    for node_dir in sorted(glob.glob(path("sys", "devices", "system", "node", "node[0-9]*"))):
        number = int(os.path.basename(node_dir)[4:])
        nodes[number] = {
            "cpulist": _read(os.path.join(node_dir, "cpulist")),
            "meminfo": _read(os.path.join(node_dir, "meminfo")),
        }
    topology = {}
    for cpu_dir in glob.glob(path("sys", "devices", "system", "cpu", "cpu[0-9]*")):
        number = int(os.path.basename(cpu_dir)[3:])
        package = _read(os.path.join(cpu_dir, "topology", "physical_package_id"))
        core = _read(os.path.join(cpu_dir, "topology", "core_id"))
        if package is not None and core is not None:
            topology[number] = {"physical_package_id": package.strip(), "core_id": core.strip()}
    return {
        "cpuinfo": _read(path("proc", "cpuinfo")),
        "meminfo": _read(path("proc", "meminfo")),
        "status": _read(path("proc", "self", "status")),
        "nodes": nodes,
        "topology": topology,
        "cgroup_memory_max": _read(path("sys", "fs", "cgroup", "memory.max")),
    }


def summarize_cpu(sources: dict) -> dict:
    """The ``vllm_cpu`` facts from ``read_cpu_sources`` output.

    Keys: present, logical_cpus, physical_cores, sockets, threads_per_core,
    model_name, vendor, flags (those of FLAGS_OF_INTEREST present),
    memory_total_mib, memory_available_mib, cgroup_memory_limit_mib (None when
    unlimited), allowed_cpus (cpulist this process may run on),
    numa_node_count, numa_nodes [{node, cpulist, cpus, memory_total_mib}].
    Raises CpuInfoParseError when /proc/cpuinfo or /proc/meminfo is missing
    or unreadable.
    """
    if sources.get("cpuinfo") is None:
        raise CpuInfoParseError("/proc/cpuinfo could not be read")
    if sources.get("meminfo") is None:
        raise CpuInfoParseError("/proc/meminfo could not be read")
    cpuinfo = parse_cpuinfo(sources["cpuinfo"])
    meminfo = parse_meminfo(sources["meminfo"])

    # sysfs topology is authoritative (Arm cpuinfo has no physical/core ids).
    pairs = set()
    packages = set()
    for entry in (sources.get("topology") or {}).values():
        pairs.add((entry["physical_package_id"], entry["core_id"]))
        packages.add(entry["physical_package_id"])
    if not pairs:
        for processor in cpuinfo["processors"]:
            if processor["physical_id"] is not None and processor["core_id"] is not None:
                pairs.add((processor["physical_id"], processor["core_id"]))
                packages.add(processor["physical_id"])
    logical = cpuinfo["logical_cpus"]
    physical_cores = len(pairs) or logical
    sockets = len(packages) or 1

    numa_nodes = []
    for number, node in sorted((sources.get("nodes") or {}).items()):
        cpulist = (node.get("cpulist") or "").strip()
        node_memory = parse_meminfo(node["meminfo"]) if node.get("meminfo") else {}
        numa_nodes.append(
            {
                "node": number,
                "cpulist": cpulist,
                "cpus": parse_cpulist(cpulist),
                "memory_total_mib": node_memory["MemTotal"] // 1024 if "MemTotal" in node_memory else None,
            }
        )

    cgroup_limit = None
    cgroup_text = (sources.get("cgroup_memory_max") or "").strip()
    if cgroup_text.isdigit():
        cgroup_limit = int(cgroup_text) // (1024 * 1024)

    status = parse_proc_status(sources.get("status") or "")
    flags = set(cpuinfo["flags"])
    return {
        "present": True,
        "logical_cpus": logical,
        "physical_cores": physical_cores,
        "sockets": sockets,
        "threads_per_core": max(1, logical // physical_cores),
        "model_name": cpuinfo["model_name"],
        "vendor": cpuinfo["vendor"],
        "flags": [flag for flag in FLAGS_OF_INTEREST if flag in flags],
        "memory_total_mib": meminfo["MemTotal"] // 1024,
        "memory_available_mib": meminfo["MemAvailable"] // 1024 if "MemAvailable" in meminfo else None,
        "cgroup_memory_limit_mib": cgroup_limit,
        "allowed_cpus": status.get("Cpus_allowed_list"),
        "numa_node_count": len(numa_nodes) or 1,
        "numa_nodes": numa_nodes,
    }
