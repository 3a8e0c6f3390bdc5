#!/usr/bin/env python3
"""Boot-to-SSH time and memory of the nspawn lab at 3 and 9 nodes.

    sudo .venv/bin/python bench/lab_boot.py [--sizes 3 9] [--repeat 1] [--name bboot]

For each size: `lab up` (timed: it returns only when every node answers SSH and
systemd reports running/degraded), an independent SSH check of every node,
memory (host MemAvailable before/after, each node's cgroup charge, and the PSS
of each node's processes), then `lab down` (timed, with its leftovers check).
Prints a table and writes results/bench/lab_boot.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "lab" / "lab"
sys.path.insert(0, str(REPO / "lab"))

from vlab import cgroups, layer, rootfs  # noqa: E402  (stdlib-only helpers of lab/lab)
from vlab.machines import SSH_OPTIONS  # noqa: E402

SETTLE_S = 5  # let late units finish before memory is read


def mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def lab(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(LAB), *args], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"lab {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def pss_kib(lab_name: str, node: str) -> int:
    total = 0
    for pid in cgroups.pids(cgroups.node_dirs(lab_name, node)):
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total += sum(int(line.split()[1]) for line in text.splitlines() if line.startswith("Pss:"))
    return total


def measure(name: str, nodes: int) -> dict:
    before = mem_available_kib()
    started = time.monotonic()
    lab("up", "--name", name, "--nodes", str(nodes))
    up_s = time.monotonic() - started
    status = json.loads(lab("status", "--name", name, "--json").stdout)
    key = Path(status["spec"]["inventory_dir"]) / "ssh" / "id_ed25519"
    states = {}
    for node in status["nodes"]:
        out = subprocess.run(["ssh", "-i", str(key), *SSH_OPTIONS, f"root@{node['management_address']}",
                              "systemctl is-system-running"], capture_output=True, text=True, timeout=60,
                             check=False).stdout.strip()
        states[node["node"]] = out
    verified_s = time.monotonic() - started
    bad = {n: s for n, s in states.items() if s not in ("running", "degraded")}
    if bad:
        raise RuntimeError(f"nodes not running after `lab up`: {bad}")
    time.sleep(SETTLE_S)
    after = mem_available_kib()
    per_node = []
    for node in status["nodes"]:
        charge = cgroups.memory_bytes(name, node["node"]) or {"usage": 0, "anon": 0}
        per_node.append({"node": node["node"], "cgroup_usage_mib": round(charge["usage"] / 2**20, 1),
                         "cgroup_anon_mib": round(charge["anon"] / 2**20, 1),
                         "pss_mib": round(pss_kib(name, node["node"]) / 1024, 1)})
    started = time.monotonic()
    down = lab("down", "--name", name, timeout=300)
    down_s = time.monotonic() - started
    return {
        "nodes": nodes,
        "up_to_ssh_running_s": round(up_s, 2),
        "up_plus_independent_ssh_check_s": round(verified_s, 2),
        "down_s": round(down_s, 2),
        "down_leftovers_check": "nothing remains" in down.stdout,
        "host_mem_available_delta_mib": round((before - after) / 1024, 1),
        "per_node_pss_mib_mean": round(sum(n["pss_mib"] for n in per_node) / nodes, 1),
        "per_node_cgroup_anon_mib_mean": round(sum(n["cgroup_anon_mib"] for n in per_node) / nodes, 1),
        "per_node_cgroup_usage_mib_mean": round(sum(n["cgroup_usage_mib"] for n in per_node) / nodes, 1),
        "per_node": per_node,
        "states": states,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 9])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--name", default="bboot", help="lab name for the runs (default bboot)")
    parser.add_argument("--out", default=str(REPO / "results" / "bench" / "lab_boot.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: the lab needs namespaces, mounts and systemd-nspawn")
    image_started = time.monotonic()
    rootfs.ensure_rootfs()
    layer.ensure_layer()
    image_s = time.monotonic() - image_started
    runs = [measure(args.name, size) for size in args.sizes for _ in range(args.repeat)]
    result = {
        "benchmark": "lab_boot",
        "host": {"cpus": os.cpu_count(), "mem_total_mib": round(int(Path("/proc/meminfo").read_text().split()[1])
                                                               / 1024), "kernel": platform.release()},
        "image_ready_s": round(image_s, 2),
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"image ready in {image_s:.1f}s (cached images take well under a second)")
    print(f"{'nodes':>5} {'up->ssh+running s':>18} {'down s':>7} {'host mem MiB':>13} {'PSS/node MiB':>13} "
          f"{'cgroup anon/node':>17} {'clean':>6}")
    for run in runs:
        print(f"{run['nodes']:>5} {run['up_to_ssh_running_s']:>18.2f} {run['down_s']:>7.2f} "
              f"{run['host_mem_available_delta_mib']:>13.1f} {run['per_node_pss_mib_mean']:>13.1f} "
              f"{run['per_node_cgroup_anon_mib_mean']:>17.1f} {str(run['down_leftovers_check']):>6}")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
