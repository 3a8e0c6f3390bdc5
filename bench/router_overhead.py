#!/usr/bin/env python3
"""What the front door costs: one vLLM replica direct vs through vllm-router, same load, side by side.

    .venv/bin/python bench/router_overhead.py [--rounds 8] [--num-prompts 480]

On the controller's loopback, no lab and no root needed:

1. the tiny Llama of the lab (lab/make_tiny_model.py, built offline once);
2. vllm-router's own venv (.cache/bench/router-venv) from the wheelhouse and
   requirements/router.lock, as roles/vllm_router installs it on a router host;
3. one `vllm serve` (.venv-runtime, vLLM's CPU platform) on 127.0.0.1 with the
   lab's settings (max-model-len 512, 1 GiB KV space, bound to core 0 like a lab node's one worker), and one vllm-router in
   front of it with exactly the role's defaults (roles/vllm_router/defaults,
   through plugins/module_utils/router/argv.router_argv), one worker, on
   127.0.0.1;
4. per round, `vllm bench serve` under the lab's load profile
   (inventories/lab/group_vars, through module_utils/bench/profile.bench_argv;
   --num-prompts 480 by default, ten times the lab's 48, so that one side's load
   lasts seconds rather than one: on a shared 2-core host a one-second load is
   mostly noise)
   against the replica directly and against the router, the order swapped
   every round so neither side always runs on a warmer server.

Per side: the median over rounds of TTFT P50 and P99 and output throughput;
per metric the median of the rounds' own ratios router/direct (goal: TTFT ratios <= 1.05, throughput ratio >= 0.97,
issue 18), and any failed request. Writes results/bench/router_overhead.json
and prints a table. Exit 0 when every request completed (the goal is reported,
not enforced: a busy host moves the ratios, docs/performance.md says how they
were measured).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench.profile import bench_argv  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.argv import SETTINGS, router_argv  # noqa: E402

RUNTIME = REPO / ".venv-runtime" / "bin"
WHEELHOUSE = REPO / ".cache" / "wheelhouse"
ROUTER_LOCK = REPO / "requirements" / "router.lock"
ROUTER_VENV = REPO / ".cache" / "bench" / "router-venv"
MODEL = REPO / ".cache" / "models" / "tiny-llama"
ROUTER_DEFAULTS = REPO / "roles" / "vllm_router" / "defaults" / "main.yml"
LAB_VARS = REPO / "inventories" / "lab" / "group_vars" / "vllm_nodes.yml"
OUT = REPO / "results" / "bench" / "router_overhead.json"
SERVED = "tiny-llama"
START_TIMEOUT_S = 900
GOALS = {"ttft_p50": 1.05, "ttft_p99": 1.05, "output_throughput": 0.97}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_model() -> None:
    if (MODEL / "model.safetensors").exists():
        return
    subprocess.run([str(RUNTIME / "python"), str(REPO / "lab" / "make_tiny_model.py"), "llama", str(MODEL),
                    "--weights"], check=True, timeout=600)


def ensure_router_venv() -> Path:
    """vllm-router installed offline from the wheelhouse, once per router.lock (a stamp of its digest)."""
    digest = hashlib.sha256(ROUTER_LOCK.read_bytes()).hexdigest()
    stamp = ROUTER_VENV / ".lock-digest"
    if stamp.exists() and stamp.read_text().strip() == digest:
        return ROUTER_VENV / "bin" / "vllm-router"
    subprocess.run([str(RUNTIME / "python"), "-m", "venv", "--clear", str(ROUTER_VENV)], check=True, timeout=300)
    proc = subprocess.run([str(ROUTER_VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                           "--disable-pip-version-check", "--find-links", str(WHEELHOUSE), "-r", str(ROUTER_LOCK)],
                          capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"cannot install vllm-router from {WHEELHOUSE} ({ROUTER_LOCK}): {proc.stderr[-1500:]}\n"
                         "expected scripts/bootstrap to have downloaded its wheels")
    stamp.write_text(digest + "\n")
    return ROUTER_VENV / "bin" / "vllm-router"


def role_settings(port: int, prometheus_port: int) -> dict:
    """The role's default settings, listening on loopback (the bench has no cluster network)."""
    defaults = yaml.safe_load(ROUTER_DEFAULTS.read_text())
    settings = {s.name: defaults.get(f"vllm_router_{s.name}") for s in SETTINGS}
    settings.update(listen_address="127.0.0.1", port=port, prometheus_address="127.0.0.1",
                    prometheus_port=prometheus_port)
    return settings


def lab_profile(num_prompts: int | None = None) -> dict:
    profile = yaml.safe_load(LAB_VARS.read_text())["vllm_benchmark_profile"]
    return {**profile, "num_prompts": num_prompts} if num_prompts else profile


def http_ok(url: str, timeout: float = 5) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def wait_ready(url: str, process: subprocess.Popen, what: str, log: Path) -> float:
    started = time.monotonic()
    while time.monotonic() - started < START_TIMEOUT_S:
        if http_ok(url):
            return time.monotonic() - started
        if process.poll() is not None:
            raise SystemExit(f"{what} exited {process.returncode} before {url} answered; its log ({log}):\n"
                             + log.read_text(errors="replace")[-3000:])
        time.sleep(1)
    raise SystemExit(f"{what}: {url} did not answer within {START_TIMEOUT_S} s; log: {log}")


def start(argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    handle = log.open("w")
    return subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                            start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def run_load(base_url: str, workdir: Path, name: str, num_prompts: int, *, served: str = SERVED,
             max_concurrency: int | None = None) -> dict:
    profile = lab_profile(num_prompts)
    if max_concurrency:
        profile["max_concurrency"] = max_concurrency
    argv = bench_argv(profile, base_url, served, str(MODEL), result_dir=str(workdir),
                      result_filename=f"{name}.json", vllm=str(RUNTIME / "vllm"))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve against {base_url} exited {proc.returncode}:\n{proc.stdout[-2000:]}"
                         f"\n{proc.stderr[-2000:]}")
    result = json.loads((workdir / f"{name}.json").read_text())
    return {
        "ttft_p50": result["median_ttft_ms"],
        "ttft_p99": result["p99_ttft_ms"],
        "tpot_p50": result["median_tpot_ms"],
        "output_throughput": result["output_throughput"],
        "completed": result["completed"],
        "failed": result.get("failed", len([e for e in result.get("errors", []) if e])),
        "num_prompts": result["num_prompts"],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="side-by-side rounds (each: direct and router)")
    parser.add_argument("--num-prompts", type=int, default=480, help="requests per side and round (the lab: 48)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    ensure_model()
    router_bin = ensure_router_venv()
    workdir = Path(tempfile.mkdtemp(prefix="router-overhead-"))
    vllm_port, router_port, metrics_port = free_port(), free_port(), free_port()
    direct, routed = f"http://127.0.0.1:{vllm_port}", f"http://127.0.0.1:{router_port}"
    vllm_env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "TMPDIR": str(workdir)}
    vllm = start([str(RUNTIME / "vllm"), "serve", str(MODEL), "--served-model-name", SERVED, "--host", "127.0.0.1",
                  "--port", str(vllm_port), "--max-model-len", "512"], workdir / "vllm.log", vllm_env)
    router = None
    try:
        vllm_start_s = wait_ready(f"{direct}/health", vllm, "vllm serve", workdir / "vllm.log")
        router_command = [str(router_bin), *router_argv(role_settings(router_port, metrics_port), [direct],
                                                        host="bench")]
        router = start(router_command, workdir / "router.log")
        router_start_s = wait_ready(f"{routed}/readiness", router, "vllm-router", workdir / "router.log")
        rounds = []
        for index in range(args.rounds):
            order = [("direct", direct), ("router", routed)]
            if index % 2:
                order.reverse()
            measured = {side: run_load(url, workdir, f"{side}-{index}", args.num_prompts) for side, url in order}
            measured["order"] = [side for side, _ in order]
            rounds.append(measured)
            print(f"round {index + 1}: " + ", ".join(
                f"{side} TTFT P50 {measured[side]['ttft_p50']:.1f} ms P99 {measured[side]['ttft_p99']:.1f} ms "
                f"out {measured[side]['output_throughput']:.1f} tok/s" for side, _ in order), flush=True)
    finally:
        if router is not None:
            stop(router)
        stop(vllm)
    sides = {side: {metric: statistics.median(r[side][metric] for r in rounds)
                    for metric in ("ttft_p50", "ttft_p99", "tpot_p50", "output_throughput")}
             for side in ("direct", "router")}
    # Judged on the median of each round's own ratio: the two sides of a round ran minutes apart at most,
    # so a host that got busier between rounds moves both.
    ratios = {metric: statistics.median(r["router"][metric] / r["direct"][metric] for r in rounds)
              for metric in GOALS}
    goal_met = {metric: (ratios[metric] <= limit if metric.startswith("ttft") else ratios[metric] >= limit)
                for metric, limit in GOALS.items()}
    failed = sum(r[side]["failed"] for r in rounds for side in ("direct", "router"))
    incomplete = sum(r[side]["num_prompts"] - r[side]["completed"] for r in rounds for side in ("direct", "router"))
    record = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()},
        "load_profile": lab_profile(args.num_prompts), "host_load_average": os.getloadavg(),
        "router_argv": router_command[1:], "rounds": rounds,
        "vllm_start_s": round(vllm_start_s, 1), "router_start_s": round(router_start_s, 1),
        "median": sides, "ratio_router_over_direct": ratios, "goals": GOALS, "goal_met": goal_met,
        "failed_requests": failed, "incomplete_requests": incomplete,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\n{'median of ' + str(args.rounds) + ' rounds':<24}{'direct':>12}{'router':>12}{'ratio*':>8}  goal")
    for metric, limit in GOALS.items():
        unit = "tok/s" if metric == "output_throughput" else "ms"
        sign = ">=" if metric == "output_throughput" else "<="
        print(f"{metric + ' (' + unit + ')':<24}{sides['direct'][metric]:>12.1f}{sides['router'][metric]:>12.1f}"
              f"{ratios[metric]:>8.3f}  {sign} {limit} {'met' if goal_met[metric] else 'MISSED'}")
    print("* the median of each round's ratio router/direct")
    print(f"failed requests: {failed}, incomplete: {incomplete}; written {OUT}")
    return 0 if failed == 0 and incomplete == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
