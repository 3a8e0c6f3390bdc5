"""CPU / NUMA / memory parsers, on this machine's real kernel files copied into a tmp tree."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.cpuinfo import (
    FLAGS_OF_INTEREST,
    CpuInfoParseError,
    format_cpulist,
    parse_cpuinfo,
    parse_cpulist,
    parse_meminfo,
    parse_proc_status,
    read_cpu_sources,
    summarize_cpu,
)
from hypothesis import given
from hypothesis import strategies as st

KERNEL_FILES = [
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/sys/fs/cgroup/memory.max",
    *glob.glob("/sys/devices/system/node/node[0-9]*/cpulist"),
    *glob.glob("/sys/devices/system/node/node[0-9]*/meminfo"),
    *glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology/physical_package_id"),
    *glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology/core_id"),
]


def copy_kernel_files(root: Path) -> Path:
    """A tree under root with this machine's CPU, memory and NUMA files (and this process's status)."""
    for source in KERNEL_FILES:
        if not os.path.exists(source):
            continue
        target = root / source.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(Path(source).read_bytes())
    status = root / "proc" / "self" / "status"
    status.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile("/proc/self/status", status)
    return root


def lscpu_topology() -> list[tuple[int, int, int, int]]:
    """(cpu, core, socket, node) rows from util-linux lscpu, an independent reader of the same kernel data."""
    output = subprocess.run(
        ["lscpu", "-p=CPU,CORE,SOCKET,NODE"], check=True, capture_output=True, text=True, timeout=30
    ).stdout
    rows = []
    for line in output.splitlines():
        if line.startswith("#"):
            continue
        cpu, core, socket, node = (int(value) if value else 0 for value in line.split(","))
        rows.append((cpu, core, socket, node))
    return rows


def test_summary_of_this_machine_matches_lscpu_and_the_os(tmp_path):
    summary = summarize_cpu(read_cpu_sources(str(copy_kernel_files(tmp_path))))
    rows = lscpu_topology()
    assert summary["present"] is True
    assert summary["logical_cpus"] == len(rows)
    assert summary["physical_cores"] == len({(socket, core) for _, core, socket, _ in rows})
    assert summary["sockets"] == len({socket for _, _, socket, _ in rows})
    assert summary["numa_node_count"] == len({node for *_, node in rows})
    assert summary["threads_per_core"] == len(rows) // summary["physical_cores"]
    assert summary["memory_total_mib"] == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    assert summary["allowed_cpus"] == format_cpulist(sorted(os.sched_getaffinity(0)))
    nodes_cpus = sorted(cpu for node in summary["numa_nodes"] for cpu in node["cpus"])
    assert nodes_cpus == sorted(cpu for cpu, *_ in rows)
    assert all(node["memory_total_mib"] and node["memory_total_mib"] > 0 for node in summary["numa_nodes"])
    assert set(summary["flags"]) <= set(FLAGS_OF_INTEREST)


def test_reading_the_live_root_gives_the_same_topology(tmp_path):
    live = summarize_cpu(read_cpu_sources("/"))
    copied = summarize_cpu(read_cpu_sources(str(copy_kernel_files(tmp_path))))
    for key in ("logical_cpus", "physical_cores", "sockets", "numa_node_count", "model_name", "vendor", "flags"):
        assert live[key] == copied[key]


def test_cpuinfo_fields_of_this_machine():
    text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    parsed = parse_cpuinfo(text)
    assert [entry["processor"] for entry in parsed["processors"]] == list(range(parsed["logical_cpus"]))
    assert parsed["logical_cpus"] == text.count("\nprocessor") + text.startswith("processor")
    assert parsed["flags"]  # x86 'flags' or Arm 'Features'


def test_meminfo_system_and_node_files():
    system = parse_meminfo(Path("/proc/meminfo").read_text(encoding="utf-8"))
    assert system["MemTotal"] * 1024 == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert "MemAvailable" in system
    for path in glob.glob("/sys/devices/system/node/node[0-9]*/meminfo"):
        node = parse_meminfo(Path(path).read_text(encoding="utf-8"))  # lines start with 'Node N '
        assert 0 < node["MemTotal"] <= system["MemTotal"]
        assert node["MemFree"] <= node["MemTotal"]


def test_proc_status_cpu_list():
    status = parse_proc_status(Path("/proc/self/status").read_text(encoding="utf-8"))
    assert parse_cpulist(status["Cpus_allowed_list"]) == sorted(os.sched_getaffinity(0))
    assert "Mems_allowed_list" in status


def test_numa_cpulist_files_cover_the_online_cpus():
    online = parse_cpulist(Path("/sys/devices/system/cpu/online").read_text(encoding="utf-8"))
    listed = []
    for path in glob.glob("/sys/devices/system/node/node[0-9]*/cpulist"):
        listed.extend(parse_cpulist(Path(path).read_text(encoding="utf-8")))
    assert sorted(listed) == online


def test_missing_files_fail_with_the_file_name(tmp_path):
    with pytest.raises(CpuInfoParseError, match="/proc/cpuinfo could not be read"):
        summarize_cpu(read_cpu_sources(str(tmp_path)))
    (tmp_path / "proc").mkdir()
    shutil.copyfile("/proc/cpuinfo", tmp_path / "proc" / "cpuinfo")
    with pytest.raises(CpuInfoParseError, match="/proc/meminfo could not be read"):
        summarize_cpu(read_cpu_sources(str(tmp_path)))


def test_parsers_reject_the_wrong_file():
    with pytest.raises(CpuInfoParseError, match="MemTotal"):
        parse_meminfo(Path("/proc/cpuinfo").read_text(encoding="utf-8"))
    with pytest.raises(CpuInfoParseError, match="processor"):
        parse_cpuinfo(Path("/proc/meminfo").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
        ("0-55,112-167", list(range(56)) + list(range(112, 168))),
        ("6,14,22,30", [6, 14, 22, 30]),
        ("0-7:2/4", [0, 1, 4, 5]),
        ("", []),
    ],
)
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["0-", "a-b", "3-1", "0,,1"])
def test_parse_cpulist_rejects_garbage(text):
    with pytest.raises(CpuInfoParseError):
        parse_cpulist(text)


@given(st.sets(st.integers(min_value=0, max_value=4096), max_size=300))
def test_cpulist_round_trip(cpus):
    assert parse_cpulist(format_cpulist(sorted(cpus))) == sorted(cpus)
