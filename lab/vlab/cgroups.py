"""One cgroup per node, in every hierarchy that matters, made by `lab` itself.

The host's PID 1 is not systemd, so nobody gives a container a cgroup of its
own: without this, all nodes' systemd instances would share one cgroup tree and
trample each other's units. Each node's supervisor joins
<hierarchy>/vllm-cluster-lab/<lab>/<node> before it starts systemd-nspawn, which
also gives per-node memory figures and a complete list of a node's processes.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .shell import mounts
from .spec import CGROUP_ROOT_NAME

# v1 controllers worth joining; cpuset is left out (a new cpuset cgroup is empty and refuses tasks).
V1_WANTED = {"name=systemd", "memory", "pids", "cpu", "cpuacct"}


def hierarchies() -> list[Path]:
    """Mount points of the cgroup hierarchies a node joins (v1 ones of interest, and cgroup2)."""
    found: list[Path] = []
    seen: set[str] = set()
    for point, fstype, options in mounts():
        if fstype == "cgroup2":
            key = "cgroup2"
        elif fstype == "cgroup":
            names = set(options.split(",")) & V1_WANTED
            if not names:
                continue
            key = ",".join(sorted(names))
        else:
            continue
        if key not in seen and point.startswith("/sys/fs/cgroup"):
            seen.add(key)
            found.append(Path(point))
    return found


def lab_dirs(lab: str) -> list[Path]:
    return [h / CGROUP_ROOT_NAME / lab for h in hierarchies()]


def node_dirs(lab: str, node: str) -> list[Path]:
    return [d / node for d in lab_dirs(lab)]


def prepare(lab: str, node: str) -> list[Path]:
    """Create the node's cgroups; on cgroup2, let them account memory and pids."""
    dirs = node_dirs(lab, node)
    for directory in dirs:
        directory.mkdir(parents=True, exist_ok=True)
        if (directory.parent / "cgroup.subtree_control").exists():
            for ancestor in (directory.parent.parent, directory.parent):
                with contextlib.suppress(OSError):
                    (ancestor / "cgroup.subtree_control").write_text("+memory +pids")
    return dirs


def join(dirs: list[Path]) -> None:
    """Move the calling process into dirs (used as the supervisor's preexec step)."""
    for directory in dirs:
        (directory / "cgroup.procs").write_text(str(os.getpid()))


def pids(directories: list[Path]) -> set[int]:
    """Every process in these cgroups and below."""
    found: set[int] = set()
    for top in directories:
        if not top.exists():
            continue
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                found.update(int(x) for x in procs.read_text().split())
    return found


def remove(directories: list[Path]) -> list[str]:
    """rmdir the trees (deepest first); return the ones that could not go."""
    stuck: list[str] = []
    for top in directories:
        if not top.exists():
            continue
        subdirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for directory in [*subdirs, top]:
            try:
                directory.rmdir()
            except OSError as exc:
                stuck.append(f"{directory} ({exc.strerror})")
    return stuck


def memory_bytes(lab: str, node: str) -> dict[str, int] | None:
    """{'usage': all charged memory incl. page cache, 'anon': rss + shmem} of a node, or None."""
    for directory in node_dirs(lab, node):
        stat_file = directory / "memory.stat"
        if not stat_file.exists():
            continue
        stat = {}
        for line in stat_file.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                stat[key] = int(value)
        if (directory / "memory.usage_in_bytes").exists():  # cgroup v1
            usage = int((directory / "memory.usage_in_bytes").read_text())
            anon = stat.get("total_rss", 0) + stat.get("total_shmem", 0)
        else:
            usage = int((directory / "memory.current").read_text())
            anon = stat.get("anon", 0) + stat.get("shmem", 0)
        return {"usage": usage, "anon": anon}
    return None
