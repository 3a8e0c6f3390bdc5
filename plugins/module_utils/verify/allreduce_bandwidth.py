"""All-reduce bandwidth: sweep records, nccl-tests parsing, comparison, thresholds, verdict.

Units follow nccl-tests (doc/PERFORMANCE.md): sizes in bytes, bandwidth in GB/s
with GB = 1e9 bytes, algbw = size / time, and for all-reduce
busbw = algbw * 2(n-1)/n.

The threshold table's defaults come from shared/research/performance-anchors.md
(sections 1.3, 1.4, 1.7 and 6.1); each row names its source. Rows marked
"derived" are our own arithmetic on those sources. Every row can be overridden.

Pure Python, no Ansible import.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass

GB = 1e9
GIB = 1024**3
MIB = 1024**2
# The metric we judge: the best busbw over sizes at or above this (anchors section 1.1).
DEFAULT_JUDGE_MIN_BYTES = GIB
# Below this busbw at >= 1 GiB an "NVLink" run is really PCIe/SHM (anchors 6.1).
NVLINK_FLOOR_GBPS = 100.0
# Below this it is the TCP class (anchors 6.1).
TCP_CLASS_GBPS = 20.0

_SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": MIB, "G": GIB, "T": 1024 * GIB}


class BandwidthError(ValueError):
    """A size, sweep or nccl-tests output that cannot be read."""


def parse_size(text) -> int:
    """'1M', '4G', '64KiB', '1048576' -> bytes (binary units, as nccl-tests' -b/-e)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise BandwidthError(f"size {text!r} is not a byte count such as 1048576, 64K, 1M or 4G")
    value = float(match.group("number")) * _UNITS[match.group("unit").upper()]
    if value != int(value):
        raise BandwidthError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def format_size(size_bytes: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale} {unit}"
    return f"{size_bytes} B"


def sweep_sizes(min_bytes, max_bytes, factor: int = 2) -> list[int]:
    """min, min*factor, ... up to max inclusive (nccl-tests -b/-e/-f)."""
    low, high = parse_size(min_bytes), parse_size(max_bytes)
    if low <= 0 or high < low:
        raise BandwidthError(f"size sweep {low}..{high} bytes: need 0 < min <= max")
    if int(factor) < 2:
        raise BandwidthError(f"size factor {factor}: need an integer >= 2")
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= int(factor)
    return sizes


def bus_factor(nranks: int) -> float:
    """All-reduce bus factor 2(n-1)/n; 1.0 for 2 ranks, 1.75 for 8."""
    if nranks < 1:
        raise BandwidthError(f"rank count {nranks}: need at least 1")
    return 2.0 * (nranks - 1) / nranks


def algbw_gbps(size_bytes: int, time_us: float) -> float:
    if time_us <= 0:
        raise BandwidthError(f"time {time_us} us for {size_bytes} bytes: need a positive time")
    return size_bytes / (time_us * 1e-6) / GB


def busbw_gbps(algbw: float, nranks: int) -> float:
    return algbw * bus_factor(nranks)


def sweep_point(size_bytes: int, time_us: float, nranks: int, **extra) -> dict:
    """One sweep record; extra keys (count, trials, correct, ...) are kept as given."""
    algbw = algbw_gbps(size_bytes, time_us)
    point = {
        "size_bytes": int(size_bytes),
        "time_us": float(time_us),
        "algbw_gbps": algbw,
        "busbw_gbps": busbw_gbps(algbw, nranks),
    }
    point.update(extra)
    return point


def median(values) -> float:
    values = [float(v) for v in values]
    if not values:
        raise BandwidthError("median of no values")
    return statistics.median(values)


# --- nccl-tests -------------------------------------------------------------

_NT_VERSION = re.compile(
    r"nccl-tests version (?P<version>\S+)(?: nccl-headers=(?P<headers>\d+))?(?: nccl-library=(?P<library>\d+))?"
)
_NT_PARAMS = re.compile(r"nThread (?P<threads>\d+) nGpus (?P<gpus>\d+) minBytes (?P<min>\d+) maxBytes (?P<max>\d+)")
_NT_WARMUP = re.compile(r"warmup iters: (?P<warmup>\d+) iters: (?P<iters>\d+)")
_NT_DEVICE = re.compile(
    r"#\s+Rank\s+(?P<rank>\d+)\s+Group\s+\d+\s+Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)\s+device\s+(?P<device>\d+)"
    r"\s+\[(?P<bus>[^\]]+)\]\s+(?P<name>.+?)\s*$"
)
_NT_AVG = re.compile(r"# Avg bus bandwidth\s*:\s*(?P<value>[\d.]+)")
_NT_OOB = re.compile(r"# Out of bounds values\s*:\s*(?P<count>\d+)")


def nccl_code_to_version(code) -> str | None:
    """nccl-tests prints NCCL_VERSION_CODE: 22809 -> '2.28.9' (2.9+ encoding)."""
    if code in (None, ""):
        return None
    value = int(code)
    if value >= 10000:
        return f"{value // 10000}.{value // 100 % 100}.{value % 100}"
    return f"{value // 1000}.{value // 100 % 10}.{value % 100}"


def _number(token: str):
    try:
        return float(token)
    except ValueError:
        return None


def parse_nccl_tests(text: str) -> dict:
    """Parse all_reduce_perf (nccl-tests) output: header, devices and one row per size.

    Each row keeps both halves nccl-tests prints: out_of_place and in_place, each
    with time_us, algbw_gbps, busbw_gbps and wrong (None when validation was off).
    """
    result = {
        "nccl_tests_version": None,
        "nccl_headers": None,
        "nccl_library": None,
        "threads": None,
        "gpus_per_thread": None,
        "warmup": None,
        "iters": None,
        "devices": [],
        "nranks": None,
        "points": [],
        "avg_busbw_gbps": None,
        "out_of_bounds": None,
    }
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            match = _NT_VERSION.search(line)
            if match:
                result["nccl_tests_version"] = match.group("version")
                result["nccl_headers"] = nccl_code_to_version(match.group("headers"))
                result["nccl_library"] = nccl_code_to_version(match.group("library"))
            match = _NT_PARAMS.search(line)
            if match:
                result["threads"] = int(match.group("threads"))
                result["gpus_per_thread"] = int(match.group("gpus"))
            match = _NT_WARMUP.search(line)
            if match:
                result["warmup"], result["iters"] = int(match.group("warmup")), int(match.group("iters"))
            match = _NT_DEVICE.search(line)
            if match:
                result["devices"].append(
                    {
                        "rank": int(match.group("rank")),
                        "host": match.group("host"),
                        "device": int(match.group("device")),
                        "bus_id": match.group("bus"),
                        "name": match.group("name"),
                    }
                )
            match = _NT_AVG.search(line)
            if match:
                result["avg_busbw_gbps"] = float(match.group("value"))
            match = _NT_OOB.search(line)
            if match:
                result["out_of_bounds"] = int(match.group("count"))
            continue
        tokens = line.split()
        # size count type redop [root] + 8 figures (time algbw busbw #wrong, twice)
        if len(tokens) < 12 or not tokens[0].isdigit() or not tokens[1].isdigit():
            continue
        figures = tokens[-8:]
        halves = []
        for offset in (0, 4):
            time_us, algbw, busbw = (_number(t) for t in figures[offset : offset + 3])
            if time_us is None or algbw is None or busbw is None:
                break
            wrong = figures[offset + 3]
            halves.append(
                {
                    "time_us": time_us,
                    "algbw_gbps": algbw,
                    "busbw_gbps": busbw,
                    "wrong": int(wrong) if wrong.isdigit() else None,
                }
            )
        if len(halves) != 2:
            continue
        head = tokens[: len(tokens) - 8]
        result["points"].append(
            {
                "size_bytes": int(head[0]),
                "count": int(head[1]),
                "dtype": head[2] if len(head) > 2 else None,
                "redop": head[3] if len(head) > 3 else None,
                "root": int(head[4]) if len(head) > 4 and re.fullmatch(r"-?\d+", head[4]) else None,
                "out_of_place": halves[0],
                "in_place": halves[1],
            }
        )
    if result["devices"]:
        result["nranks"] = len(result["devices"])
    if not result["points"]:
        raise BandwidthError("no result row found in the nccl-tests output")
    return result


def nccl_tests_sweep(parsed: dict, placement: str = "in_place") -> list[dict]:
    """The nccl-tests rows as sweep records (size_bytes, time_us, algbw_gbps, busbw_gbps)."""
    if placement not in ("in_place", "out_of_place"):
        raise BandwidthError(f"placement {placement!r}: use in_place or out_of_place")
    return [
        {"size_bytes": p["size_bytes"], **{k: p[placement][k] for k in ("time_us", "algbw_gbps", "busbw_gbps")}}
        for p in parsed["points"]
    ]


# --- comparison --------------------------------------------------------------


def default_tolerance(size_bytes: int) -> float:
    """Probe vs nccl-tests agreement (anchors 6.2): 5% at >= 256 MiB, else 10%."""
    return 0.05 if size_bytes >= 256 * MIB else 0.10


def compare_sweeps(ours: list[dict], reference: list[dict], sizes=None, tolerance=None) -> dict:
    """Compare busbw size by size. tolerance: a fraction (0.03) or None for default_tolerance().

    sizes: the sizes that must agree (all common sizes when None); each must be in both.
    """
    ours_by_size = {int(p["size_bytes"]): p for p in ours}
    ref_by_size = {int(p["size_bytes"]): p for p in reference}
    common = sorted(set(ours_by_size) & set(ref_by_size))
    required = sorted(parse_size(s) for s in sizes) if sizes else common
    missing = [s for s in required if s not in ours_by_size or s not in ref_by_size]
    rows = []
    for size in common:
        own, ref = ours_by_size[size]["busbw_gbps"], ref_by_size[size]["busbw_gbps"]
        allowed = default_tolerance(size) if tolerance is None else float(tolerance)
        deviation = (own - ref) / ref if ref else float("inf")
        rows.append(
            {
                "size_bytes": size,
                "ours_busbw_gbps": own,
                "reference_busbw_gbps": ref,
                "ratio": own / ref if ref else None,
                "deviation": deviation,
                "tolerance": allowed,
                "within": abs(deviation) <= allowed,
                "required": size in required,
            }
        )
    failed = [r for r in rows if r["required"] and not r["within"]]
    return {
        "rows": rows,
        "required_sizes": required,
        "missing_sizes": missing,
        "agree": not failed and not missing,
        "failed_sizes": [r["size_bytes"] for r in failed],
    }


# --- thresholds ----------------------------------------------------------------


@dataclass(frozen=True)
class ThresholdRow:
    """busbw limits for one GPU family, link class and rank count.

    pass_gbps: at or above is pass; fail_below_gbps: below is fail; between is warn.
    per_nic: limits are per NIC and get multiplied by the NIC count of a node.
    """

    key: str
    gpu_family: str
    link: str
    min_ranks: int
    max_ranks: int
    nvls: bool | None
    pass_gbps: float
    fail_below_gbps: float
    expected_gbps: tuple[float, float] | None
    per_nic: bool
    source: str


DEFAULT_THRESHOLDS: tuple[ThresholdRow, ...] = (
    ThresholdRow(
        "hopper_sxm_nvlink_nvls_8", "hopper_sxm", "nvlink", 8, 8, True, 430.0, 330.0, (470.0, 482.0), False,
        "performance-anchors 6.1, TP=8 NVLS row: PASS >= 430 (~90% of 480; Azure NHC H200 432), "
        "WARN below (looks like Ring), FAIL < 330",
    ),
    ThresholdRow(
        "hopper_sxm_nvlink_ring", "hopper_sxm", "nvlink", 2, 8, None, 330.0, 300.0, (363.0, 370.0), False,
        "performance-anchors 6.1, TP=2/4 Ring row (also NVLS off at any count): PASS >= 330 (~90% of 365), "
        "WARN 300-330, FAIL < 300",
    ),
    ThresholdRow(
        "a100_sxm_nvlink_8", "a100_sxm", "nvlink", 8, 8, None, 228.0, 205.0, None, False,
        "performance-anchors 1.7: Azure NHC NDv4 A100 8-GPU all-reduce >= 228; FAIL < 205 is derived (90%)",
    ),
    ThresholdRow(
        "h100_pcie_nvlink_bridge_2", "h100_pcie", "nvlink", 2, 2, None, 104.0, 93.0, (116.0, 116.0), False,
        "performance-anchors 1.3: 2x H100 PCIe with NVLink bridge ~116 (nccl#1161); "
        "PASS 90% / FAIL below 80% derived",
    ),
    ThresholdRow(
        "pcie_only", "any", "pcie", 2, 8, None, 16.0, 14.0, (18.0, 45.0), False,
        "performance-anchors 1.3 and 6.1: PCIe-only 18-45 (Gen4-Gen5); PASS 90% / FAIL below ~80% "
        "of 18 derived",
    ),
    ThresholdRow(
        "pcie_shm", "any", "shm", 2, 8, None, 16.0, 14.0, (18.0, 22.0), False,
        "performance-anchors 1.3: 4x4090 Gen4 SHM 18 (nccl#1603); PASS 90% / FAIL below ~80% derived",
    ),
    ThresholdRow(
        "infiniband_ndr_per_nic", "any", "infiniband", 2, 1 << 20, None, 42.5, 37.5, (46.0, 48.0), True,
        "performance-anchors 1.4 and 6.1: NDR 400G 46-48 per NIC; multi-node PASS >= 340 / FAIL < 300 "
        "for 8 NICs, i.e. 42.5 / 37.5 per NIC (derived); run 2-node tests with NCCL_ALGO=RING",
    ),
)


def gpu_family(gpu_name: str | None) -> str:
    """'NVIDIA H200' -> hopper_sxm; PCIe/NVL cards and unknown names get their own family."""
    name = (gpu_name or "").upper()
    if not name:
        return "unknown"
    if re.search(r"\bH(100|200|800)\b", name):
        if "PCIE" in name:
            return "h100_pcie" if "H100" in name else "unknown"
        if re.search(r"\bNVL\b", name):
            return "unknown"
        return "hopper_sxm"
    if "A100" in name:
        return "a100_sxm" if "SXM" in name else "unknown"
    return "unknown"


def find_threshold(gpu_name, link: str, nranks: int, nvls_active: bool = False,
                   table=DEFAULT_THRESHOLDS) -> ThresholdRow | None:
    family = gpu_family(gpu_name)
    for row in table:
        if row.link != link or not (row.min_ranks <= nranks <= row.max_ranks):
            continue
        if row.gpu_family not in ("any", family):
            continue
        if row.nvls is True and not nvls_active:
            continue
        return row
    return None


def judged_point(sweep: list[dict], min_bytes: int = DEFAULT_JUDGE_MIN_BYTES) -> tuple[dict, bool]:
    """The point we judge: best busbw at >= min_bytes; else the largest size (flag False)."""
    if not sweep:
        raise BandwidthError("empty sweep: nothing to judge")
    large = [p for p in sweep if p["size_bytes"] >= min_bytes]
    if large:
        return max(large, key=lambda p: p["busbw_gbps"]), True
    return max(sweep, key=lambda p: p["size_bytes"]), False


_RANK = {"pass": 0, "warn": 1, "fail": 2}


def _worst(statuses) -> str:
    return max(statuses, key=lambda s: _RANK[s], default="pass")


def judge_transport(expected: str | None, transport: dict | None) -> tuple[str, list[str]]:
    """Slow transport where NVLink or InfiniBand is expected is a hard failure."""
    if not expected or expected == "any":
        return "pass", []
    if transport is None:
        return "warn", [f"transport not detected (no NCCL debug output); expected {expected}"]
    if expected == "infiniband":
        seen = transport.get("inter_node") or transport.get("transport")
    elif expected == "nvlink":
        seen = transport.get("intra_node") or transport.get("transport")
    else:
        seen = transport.get("transport")
    if seen == expected:
        reasons = []
        if expected == "infiniband" and transport.get("gdrdma") is False:
            return "warn", ["InfiniBand without GPUDirect RDMA (no GDRDMA in the NET/IB lines): nvidia-peermem?"]
        return "pass", reasons
    if seen in SLOW_TRANSPORTS and expected in ("nvlink", "infiniband"):
        return "fail", [f"all-reduce ran over {seen} where {expected} is expected"]
    if seen in (None, "unknown"):
        return "warn", [f"transport could not be proven from the NCCL log; expected {expected}"]
    return "warn", [f"transport is {seen}, expected {expected}"]


SLOW_TRANSPORTS = ("socket", "shm", "pcie")


@dataclass
class Verdict:
    status: str
    reasons: list
    metric: dict | None
    threshold: dict | None
    transport: str | None
    expected_transport: str | None

    def as_dict(self) -> dict:
        return asdict(self)


def judge(sweep: list[dict], nranks: int, gpu_name: str | None = None, transport: dict | None = None,
          expected_transport: str | None = None, nvls_active: bool | None = None, nics_per_node: int = 1,
          overrides: dict | None = None, judge_bandwidth: bool = True,
          min_bytes: int = DEFAULT_JUDGE_MIN_BYTES, table=DEFAULT_THRESHOLDS) -> dict:
    """pass / warn / fail with reasons.

    overrides: {"pass_gbps": x, "fail_below_gbps": y} replace the chosen row's limits
    (or supply limits where no row matches). judge_bandwidth=False (CPU/gloo lab runs)
    checks completion and transport only.
    """
    statuses, reasons = [], []
    status, why = judge_transport(expected_transport, transport)
    statuses.append(status)
    reasons.extend(why)
    point, large_enough = judged_point(sweep, min_bytes)
    metric = {"size_bytes": point["size_bytes"], "busbw_gbps": point["busbw_gbps"],
              "algbw_gbps": point["algbw_gbps"], "judged_at_full_size": large_enough}
    detected = (transport or {}).get("transport") if transport else None
    link = expected_transport if expected_transport not in (None, "any") else detected
    if nvls_active is None:
        nvls_active = bool(((transport or {}).get("nvls") or {}).get("active"))
    threshold = None
    if judge_bandwidth:
        if not large_enough:
            statuses.append("warn")
            reasons.append(
                f"largest size {format_size(point['size_bytes'])} is below {format_size(min_bytes)}: "
                "bandwidth not judged (peak needs >= 1 GiB)"
            )
        else:
            row = find_threshold(gpu_name, link, nranks, nvls_active, table) if link else None
            limits = None
            if row is not None:
                scale = max(1, int(nics_per_node)) if row.per_nic else 1
                limits = {"key": row.key, "pass_gbps": row.pass_gbps * scale,
                          "fail_below_gbps": row.fail_below_gbps * scale,
                          "expected_gbps": [v * scale for v in row.expected_gbps] if row.expected_gbps else None,
                          "source": row.source, "scaled_by_nics": scale if row.per_nic else None}
            if overrides:
                limits = dict(limits or {"key": "operator", "source": "operator override", "expected_gbps": None})
                for name in ("pass_gbps", "fail_below_gbps"):
                    if overrides.get(name) is not None:
                        limits[name] = float(overrides[name])
                limits["overridden"] = sorted(k for k in ("pass_gbps", "fail_below_gbps") if overrides.get(k) is not None)
            busbw = point["busbw_gbps"]
            if limits and limits.get("pass_gbps") is not None and limits.get("fail_below_gbps") is not None:
                threshold = limits
                if busbw >= limits["pass_gbps"]:
                    statuses.append("pass")
                elif busbw >= limits["fail_below_gbps"]:
                    statuses.append("warn")
                    reasons.append(
                        f"busbw {busbw:.1f} GB/s at {format_size(point['size_bytes'])} is below the pass line "
                        f"{limits['pass_gbps']:.1f} ({limits['key']})"
                    )
                else:
                    statuses.append("fail")
                    reasons.append(
                        f"busbw {busbw:.1f} GB/s at {format_size(point['size_bytes'])} is below the fail line "
                        f"{limits['fail_below_gbps']:.1f} ({limits['key']})"
                    )
            else:
                statuses.append("warn")
                reasons.append(
                    f"no threshold for GPU {gpu_name!r} over {link or 'an unknown link'} with {nranks} ranks: "
                    "set thresholds.pass_gbps and thresholds.fail_below_gbps"
                )
            if link == "nvlink" and busbw < NVLINK_FLOOR_GBPS:
                statuses.append("fail")
                kind = "the TCP class" if busbw < TCP_CLASS_GBPS else "a PCIe/SHM path"
                reasons.append(
                    f"busbw {busbw:.1f} GB/s at >= 1 GiB is under {NVLINK_FLOOR_GBPS:.0f} GB/s: {kind}, not NVLink"
                )
    return Verdict(
        status=_worst(statuses), reasons=reasons, metric=metric, threshold=threshold,
        transport=detected, expected_transport=expected_transport,
    ).as_dict()
