"""Which transport NCCL really used, read from its NCCL_DEBUG=INFO output.

NCCL prints one line per channel connection when a communicator connects:

    host:pid:tid [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
    host:pid:tid [1] NCCL INFO Channel 00 : 2[1] -> 0[0] via SHM/direct/direct
    host:pid:tid [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
    host:pid:tid [0] NCCL INFO Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA

Those lines are the proof of the path; "Using network Socket" alone is not (NCCL
initialises a network plugin even when every peer is on the same host and all
traffic goes over P2P). Classes, slowest first: socket, shm, pcie, infiniband,
nvlink; unknown when a path is not recognised (another network plugin) or no
connection line was logged. The bottleneck of a run is its slowest link.

Pure Python, no Ansible import: used by the nccl_probe module, the proof run
in bench/gpu and the unit tests.
"""
from __future__ import annotations

import re

TRANSPORT_CLASSES = ("socket", "shm", "pcie", "infiniband", "nvlink", "unknown")
# Slowest first; "unknown" is ranked apart (see bottleneck()).
SPEED_ORDER = ("socket", "shm", "pcie", "infiniband", "nvlink")
SLOW_CLASSES = ("socket", "shm", "pcie")

# nvidia-smi topo / NCCL graph path types that are NVLink (NVB: NVLink through a
# peer GPU). Any other intra-node type is PCIe or the CPU interconnect.
NVLINK_PATH_TYPES = ("NVL", "NVB")
PCI_PATH_TYPES = ("PIX", "PXB", "PXN", "P2C", "PHB", "SYS", "NODE", "C2C")

_CONNECTION = re.compile(
    r"Channel (?P<channel>\d+)(?:/(?P<sub>\d+))? : (?P<src>\d+)\[(?P<src_dev>[0-9a-fA-Fx]+)\]"
    r" -> (?P<dst>\d+)\[(?P<dst_dev>[0-9a-fA-Fx]+)\](?: \[(?P<direction>send|receive)\])?"
    r" via (?P<path>.+?)\s*$"
)
_VERSION = re.compile(r"NCCL version (?P<version>\d+\.\d+\.\d+)(?:\+cuda(?P<cuda>[\d.]+))?")
_COMM = re.compile(
    r"comm 0x[0-9a-fA-F]+ rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+)"
    r" localRanks (?P<local_ranks>\d+) localRank (?P<local_rank>\d+)"
)
_INIT_RANK = re.compile(
    r"ncclCommInitRank\w* comm 0x[0-9a-fA-F]+ rank (?P<rank>\d+) nranks (?P<nranks>\d+)"
    r" cudaDev (?P<cuda_dev>\d+)(?: nvmlDev (?P<nvml_dev>\d+))?(?: busId (?P<bus_id>[0-9a-fA-F]+))?"
)
_CHANNEL_COUNTS = re.compile(
    r"(?P<coll>\d+) coll channels, (?:(?P<collnet>\d+) collnet channels, )?(?P<nvls>\d+) nvls channels"
)
_NVLS_SUPPORT = re.compile(r"NVLS multicast support is (?P<negation>not )?available on dev (?P<dev>\d+)")
_NVLS_COMM = re.compile(r"NVLS comm 0x[0-9a-fA-F]+ .*nvlsTotalSize (?P<size>\d+)")
_USING_NETWORK = re.compile(r"Using network (?P<net>\S+)")
_IB_NO_DEVICE = re.compile(r"NET/IB ?: No device found")
_ENV_SET = re.compile(r"(?P<name>NCCL_[A-Z0-9_]+) set by environment to (?P<value>.*?)\.?\s*$")
_GRAPH_PATTERN = re.compile(
    r"Pattern \d+, crossNic \d+, nChannels \d+, bw [\d.]+/[\d.]+, type (?P<intra>\w+)/(?P<inter>\w+)"
)
_TOPO_NVLINK = re.compile(r"\+ NVL\[[\d.]+\] - (?:GPU|NVS)/")
_LINE_PREFIX = re.compile(r"^(?:\[\d+\]\s*)?(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\]")


def classify_path(path: str, p2p_over_nvlink: bool | None = None) -> str:
    """Class of one connection path as NCCL prints it after 'via'.

    P2P is NVLink unless the evidence (graph path types, topology) says the peers
    are joined by PCIe only; p2p_over_nvlink=None means no evidence either way.
    """
    head = path.split("/", 1)[0].strip().upper()
    if head == "P2P":
        return "pcie" if p2p_over_nvlink is False else "nvlink"
    if head == "SHM":
        return "shm"
    if head == "NVLS":
        return "nvlink"
    if head in ("COLLNET", "COLLNETDIRECT", "COLLNETCHAIN"):
        return "infiniband"
    if head == "NET":
        net = path.split("/")[1].strip() if "/" in path else ""
        if net.lower() == "socket":
            return "socket"
        if net.upper().startswith("IB"):
            return "infiniband"
        return "unknown"
    return "unknown"


def bottleneck(classes) -> str:
    """The slowest class among links; unknown only when no slow link is proven."""
    present = set(classes)
    for name in SLOW_CLASSES:
        if name in present:
            return name
    if "unknown" in present or not present:
        return "unknown"
    for name in SPEED_ORDER:
        if name in present:
            return name
    return "unknown"


def _host_of(line: str) -> str | None:
    match = _LINE_PREFIX.search(line)
    return match.group("host") if match else None


def _remember(evidence: list[str], seen: set[str], key: str, line: str, limit: int) -> None:
    if key in seen or len(evidence) >= limit:
        return
    seen.add(key)
    evidence.append(line.rstrip())


def parse_nccl_debug(text: str, p2p_over_nvlink: bool | None = None, max_evidence: int = 40) -> dict:
    """Parse NCCL_DEBUG=INFO output (one or many ranks, interleaved) into a report.

    p2p_over_nvlink: what the GPU facts say (nvidia_smi.summarize_gpus()['nvlink']:
    every GPU pair shows NV# in `nvidia-smi topo -m`); None lets the NCCL graph
    lines decide, if they were logged.
    """
    links: dict[tuple, dict] = {}
    path_counts: dict[str, int] = {}
    evidence: list[str] = []
    seen: set[str] = set()
    versions: set[str] = set()
    cuda_versions: set[str] = set()
    hosts: set[str] = set()
    ranks: dict[int, dict] = {}
    nranks = nnodes = None
    nvls_channels: list[int] = []
    collnet_channels: list[int] = []
    nvls_supported: set[bool] = set()
    nvls_total_size = None
    networks: set[str] = set()
    ib_missing = False
    env: dict[str, str] = {}
    graph_intra: set[str] = set()
    topo_nvlink = False
    warn_lines: list[str] = []

    for raw in text.splitlines():
        line = raw.rstrip()
        if not line:
            continue
        host = _host_of(line)
        if host:
            hosts.add(host)
        if " NCCL WARN " in line and len(warn_lines) < 20:
            warn_lines.append(line)
        conn = _CONNECTION.search(line)
        if conn:
            path = conn.group("path")
            key = (conn.group("channel"), conn.group("src"), conn.group("dst"), conn.group("direction"), path)
            if key not in links:
                links[key] = {
                    "src_rank": int(conn.group("src")),
                    "dst_rank": int(conn.group("dst")),
                    "direction": conn.group("direction"),
                    "path": path,
                    "network": path.upper().startswith(("NET/", "COLLNET")),
                    "gdrdma": "GDRDMA" in path.upper(),
                }
                path_counts[path] = path_counts.get(path, 0) + 1
            _remember(evidence, seen, "path:" + path, line, max_evidence)
            continue
        match = _VERSION.search(line)
        if match:
            versions.add(match.group("version"))
            if match.group("cuda"):
                cuda_versions.add(match.group("cuda"))
            _remember(evidence, seen, "version:" + match.group("version"), line, max_evidence)
            continue
        match = _COMM.search(line)
        if match:
            nranks = int(match.group("nranks"))
            nnodes = max(nnodes or 0, int(match.group("nnodes")))
            rank = ranks.setdefault(int(match.group("rank")), {})
            rank["local_rank"] = int(match.group("local_rank"))
            if host:
                rank["host"] = host
            _remember(evidence, seen, "comm:" + match.group("nnodes"), line, max_evidence)
            continue
        match = _INIT_RANK.search(line)
        if match:
            nranks = int(match.group("nranks"))
            rank = ranks.setdefault(int(match.group("rank")), {})
            rank["cuda_dev"] = int(match.group("cuda_dev"))
            if match.group("bus_id"):
                rank["bus_id"] = match.group("bus_id")
            if host:
                rank["host"] = host
            continue
        match = _CHANNEL_COUNTS.search(line)
        if match:
            nvls_channels.append(int(match.group("nvls")))
            if match.group("collnet"):
                collnet_channels.append(int(match.group("collnet")))
            _remember(evidence, seen, "channels:" + match.group("nvls"), line, max_evidence)
            continue
        match = _NVLS_SUPPORT.search(line)
        if match:
            nvls_supported.add(match.group("negation") is None)
            _remember(evidence, seen, "nvls-support:" + str(match.group("negation")), line, max_evidence)
            continue
        match = _NVLS_COMM.search(line)
        if match:
            nvls_total_size = int(match.group("size"))
            _remember(evidence, seen, "nvls-comm", line, max_evidence)
            continue
        match = _USING_NETWORK.search(line)
        if match:
            networks.add(match.group("net"))
            _remember(evidence, seen, "network:" + match.group("net"), line, max_evidence)
            continue
        if _IB_NO_DEVICE.search(line):
            ib_missing = True
            _remember(evidence, seen, "ib-missing", line, max_evidence)
            continue
        match = _ENV_SET.search(line)
        if match:
            env[match.group("name")] = match.group("value").strip()
            _remember(evidence, seen, "env:" + match.group("name"), line, max_evidence)
            continue
        match = _GRAPH_PATTERN.search(line)
        if match:
            graph_intra.add(match.group("intra").upper())
            _remember(evidence, seen, "graph:" + match.group("intra"), line, max_evidence)
            continue
        if _TOPO_NVLINK.search(line):
            topo_nvlink = True
            _remember(evidence, seen, "topo-nvl", line, max_evidence)

    notes: list[str] = []
    nvlink_evidence = p2p_over_nvlink
    nvlink_source = "caller (topology)" if p2p_over_nvlink is not None else None
    if nvlink_evidence is None:
        if graph_intra & set(NVLINK_PATH_TYPES) or topo_nvlink:
            nvlink_evidence, nvlink_source = True, "NCCL graph/topology lines"
        elif graph_intra & set(PCI_PATH_TYPES):
            nvlink_evidence, nvlink_source = False, "NCCL graph lines (PCI path types only)"

    link_list = list(links.values())
    for link in link_list:
        link["class"] = classify_path(link["path"], nvlink_evidence)
    if any(link["path"].upper().startswith("P2P") for link in link_list) and nvlink_evidence is None:
        notes.append("P2P links counted as NVLink: no NCCL graph line or topology proves the peers are NVLink-connected")
    unknown_paths = sorted({link["path"] for link in link_list if link["class"] == "unknown"})
    if unknown_paths:
        notes.append("unrecognised paths: " + ", ".join(unknown_paths))
    if not link_list:
        notes.append("no 'Channel ... via ...' line found: NCCL_DEBUG=INFO (subsystem INIT) output missing or no peer connected")

    class_counts: dict[str, int] = {}
    for link in link_list:
        class_counts[link["class"]] = class_counts.get(link["class"], 0) + 1
    intra = [link["class"] for link in link_list if not link["network"]]
    inter = [link["class"] for link in link_list if link["network"]]
    net_links = [link for link in link_list if link["network"] and link["class"] == "infiniband"]
    gdrdma = all(link["gdrdma"] for link in net_links) if net_links else None
    if net_links and not gdrdma:
        notes.append("InfiniBand without GDRDMA on some links: GPUDirect RDMA not in use (nvidia-peermem?)")
    nvls_max = max(nvls_channels) if nvls_channels else None

    return {
        "transport": bottleneck(class_counts.keys()),
        "intra_node": bottleneck(intra) if intra else None,
        "inter_node": bottleneck(inter) if inter else None,
        "class_counts": class_counts,
        "path_counts": path_counts,
        "links": len(link_list),
        "gdrdma": gdrdma,
        "nccl_version": sorted(versions)[-1] if versions else None,
        "nccl_versions": sorted(versions),
        "cuda_version": sorted(cuda_versions)[-1] if cuda_versions else None,
        "nranks": nranks,
        "nnodes": nnodes,
        "hosts": sorted(hosts),
        "ranks": {str(rank): info for rank, info in sorted(ranks.items())},
        "nvls": {
            "channels": nvls_max,
            "active": bool(nvls_max),
            "multicast_available": (True in nvls_supported) if nvls_supported else None,
            "total_size_bytes": nvls_total_size,
        },
        "collnet_channels": max(collnet_channels) if collnet_channels else None,
        "networks": sorted(networks),
        "ib_device_found": False if ib_missing else None,
        "nvlink_evidence": nvlink_evidence,
        "nvlink_evidence_source": nvlink_source,
        "graph_path_types": sorted(graph_intra),
        "env": env,
        "warnings": warn_lines,
        "notes": notes,
        "evidence": evidence,
    }
