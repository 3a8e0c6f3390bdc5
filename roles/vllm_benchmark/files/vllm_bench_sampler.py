#!/usr/bin/env python3
"""Sample accelerator and vLLM worker load on one node while a benchmark runs.

One JSON object per line: first a header, then one sample per interval until
the stop file appears or --max-seconds pass (it always stops by itself).

  GPU mode: the output of
      nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits
    verbatim under "gpus" (the controller parses it with nvidia_smi_tables.parse_query_gpu_csv).
  Both modes: every process whose title starts with "VLLM::" (vLLM names its
    processes VLLM::EngineCore, VLLM::Worker_TP0_PP1 ... with setproctitle) with
    its CPU use since the previous sample (100 = one core busy), resident memory
    and CPU affinity, read from /proc. On the CPU platform these are the only
    measured figures; they also prove which workers run on this node.

Standard library only: it runs with the node's system Python.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

GPU_FIELDS = "index,utilization.gpu,memory.used,memory.total"
TITLE_PREFIX = "VLLM::"


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return None


def vllm_processes() -> dict[int, dict]:
    """{pid: {title, ticks, rss_kib, cpus}} for processes titled VLLM::*."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        cmdline = _read(f"/proc/{entry}/cmdline")
        if not cmdline:
            continue
        title = cmdline.replace("\0", " ").strip()
        if not title.startswith(TITLE_PREFIX):
            continue
        stat = _read(f"/proc/{entry}/stat")
        status = _read(f"/proc/{entry}/status") or ""
        if stat is None:
            continue
        # Fields after the command name (which may hold spaces) start after the last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        ticks = int(fields[11]) + int(fields[12])  # utime + stime
        rss_kib, cpus = None, None
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
            elif line.startswith("Cpus_allowed_list:"):
                cpus = line.split(":", 1)[1].strip()
        found[int(entry)] = {"title": title.split()[0], "ticks": ticks, "rss_kib": rss_kib, "cpus": cpus}
    return found


def query_gpus(nvidia_smi: str, timeout: float) -> tuple[str | None, str | None]:
    try:
        proc = subprocess.run(
            [nvidia_smi, f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"{nvidia_smi}: {error}"
    if proc.returncode != 0:
        return None, f"{nvidia_smi} exited {proc.returncode}: {proc.stderr.strip()[:200]}"
    return proc.stdout, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("gpu", "cpu"), required=True)
    parser.add_argument("--out", required=True, help="JSON lines file to write")
    parser.add_argument("--stop-file", required=True, help="stop when this file exists")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="stop after this long regardless")
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.max_seconds <= 0:
        parser.error("--interval and --max-seconds must be positive")

    clk_tck = os.sysconf("SC_CLK_TCK")
    started = time.time()
    deadline = time.monotonic() + args.max_seconds
    previous: dict[int, dict] = {}
    previous_at = time.monotonic()
    with open(args.out, "w", encoding="utf-8") as out:
        header = {"sampler": 1, "mode": args.mode, "interval_s": args.interval, "clk_tck": clk_tck,
                  "cpu_count": os.cpu_count(), "hostname": os.uname().nodename, "started": started,
                  "gpu_fields": GPU_FIELDS.split(",") if args.mode == "gpu" else None}
        out.write(json.dumps(header) + "\n")
        previous = vllm_processes()
        previous_at = time.monotonic()
        stop_reason = "max-seconds"
        while time.monotonic() < deadline:
            time.sleep(args.interval)
            now_wall, now = time.time(), time.monotonic()
            current = vllm_processes()
            elapsed = max(now - previous_at, 1e-6)
            workers = []
            for pid, proc in sorted(current.items()):
                before = previous.get(pid)
                cpu_pct = None
                if before is not None and before["title"] == proc["title"]:
                    cpu_pct = round(100.0 * (proc["ticks"] - before["ticks"]) / clk_tck / elapsed, 1)
                workers.append({
                    "pid": pid, "title": proc["title"], "cpu_pct": cpu_pct,
                    "rss_mib": round(proc["rss_kib"] / 1024, 1) if proc["rss_kib"] is not None else None,
                    "cpus": proc["cpus"],
                })
            sample = {"t": round(now_wall, 3), "workers": workers}
            if args.mode == "gpu":
                text, error = query_gpus(args.nvidia_smi, timeout=max(2.0, args.interval * 5))
                sample["gpus"] = text
                if error:
                    sample["error"] = error
            out.write(json.dumps(sample) + "\n")
            out.flush()
            previous, previous_at = current, now
            if os.path.exists(args.stop_file):
                stop_reason = "stop-file"
                break
        out.write(json.dumps({"end": round(time.time(), 3), "reason": stop_reason}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
