#!/usr/bin/env python3
"""All-reduce bandwidth probe: one process per GPU, torch.distributed, one JSON document out.

Standalone (Python 3.11+, torch only). It measures; it never changes GPU settings
(no clocks, power, MIG or persistence calls).

Local mode (default): this script spawns --nproc-per-node processes on this host.
Multi-node mode: run it once per node with the same --nnodes/--master-addr/
--master-port and that node's --node-rank; node rank 0's first process hosts the
rendezvous store on --master-addr:--master-port.

    nccl_probe.py --backend nccl --min-bytes 1M --max-bytes 4G
    nccl_probe.py --backend gloo --nproc-per-node 2 --max-bytes 4M          # CPU lab
    nccl_probe.py --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29511 --nproc-per-node 1

Timing: per size, warm-up trials, then --iters timed trials; each trial is a barrier,
then k back-to-back all-reduces, k = --trial-bytes / size capped at --calls-per-trial
(10 calls of 1 MiB, 4 of 1 GiB, 1 of 4 GiB), so one launch's host overhead is spread
over several calls. GPU trials are timed with CUDA events, CPU trials with
perf_counter. A trial's time is the shortest over ranks: every rank's window ends
when the collective ends, and the rank that entered last waited least, so its window
is the collective's duration (the others also hold their head start over it). The
reported time is the median over trials. Bandwidth follows nccl-tests:
algbw = bytes / time (GB = 1e9), busbw = algbw * 2(n-1)/n.

--cuda-graph (GPU): capture the k all-reduces in a CUDA graph and time its replays,
as vLLM runs decode; eager PyTorch spends tens of microseconds of host time per call,
which dominates messages of a few MiB.

NCCL: NCCL_NVLS_ENABLE=0 unless already set (NVLS costs GPU memory and vLLM
deployments here run with it off); NCCL_DEBUG=INFO with NCCL_DEBUG_FILE in a
private directory, so the log that proves the transport comes back in the JSON
("nccl_debug_log"). NCCL_DEBUG_SUBSYS defaults to INIT,ENV,GRAPH,NET.

Exit status: 0 when every rank finished and every all-reduce gave the right sum,
1 otherwise; the JSON document is printed in both cases.
"""
from __future__ import annotations

import argparse
import glob
import json
import multiprocessing
import os
import re
import shutil
import socket
import statistics
import sys
import tempfile
import time
import traceback

PROBE_VERSION = 1
GB = 1e9
UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
DEFAULT_DEBUG_SUBSYS = "INIT,ENV,GRAPH,NET"
ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL", "TORCH_SYMM_MEM", "NVSHMEM_", "CUDA_VISIBLE_DEVICES", "MASTER_")
NOISY_NCCL_LINES = ("Allocated shareable buffer", "Imported shareable buffer", "UDS converted handle")


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", str(text), re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"size {text!r}: use bytes or K/M/G, e.g. 1M or 4G")
    return int(match.group(1)) * UNITS[match.group(2).upper()]


def sweep_sizes(low: int, high: int, factor: int) -> list[int]:
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= factor
    return sizes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--nproc-per-node", type=int, default=0,
                        help="processes on this node; default: every visible GPU (nccl) or 2 (gloo)")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=0, help="default: a free local port (local mode only)")
    parser.add_argument("--min-bytes", type=parse_size, default=parse_size("1M"))
    parser.add_argument("--max-bytes", type=parse_size, default=parse_size("4G"))
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--calls-per-trial", type=int, default=10,
                        help="most back-to-back all-reduces in one timed trial")
    parser.add_argument("--trial-bytes", type=parse_size, default=parse_size("4G"),
                        help="bytes one trial reduces in all: calls = trial-bytes / size, at least 1")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="time CUDA graph replays of the calls (nccl backend only)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                        help="default: bfloat16 on GPU (what vLLM reduces), float32 on CPU")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    parser.add_argument("--log-dir", default=None, help="keep the raw per-process NCCL logs here")
    parser.add_argument("--max-log-bytes", type=int, default=8 * 1024 * 1024)
    return parser


def validate(args) -> str | None:
    if args.factor < 2:
        return f"--factor {args.factor}: need an integer >= 2"
    if args.min_bytes <= 0 or args.max_bytes < args.min_bytes:
        return f"--min-bytes {args.min_bytes} / --max-bytes {args.max_bytes}: need 0 < min <= max"
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        return f"--node-rank {args.node_rank} with --nnodes {args.nnodes}: need 0 <= node-rank < nnodes"
    if args.nnodes > 1 and not args.master_port:
        return "--master-port is required with --nnodes > 1 (all nodes must agree on it)"
    if args.iters < 1 or args.warmup < 0 or args.calls_per_trial < 1:
        return "--iters >= 1, --warmup >= 0 and --calls-per-trial >= 1 are required"
    if args.timeout <= 0:
        return f"--timeout {args.timeout}: need a positive number of seconds"
    return None


def prepare_environment(args, log_dir: str) -> list[str]:
    """Environment every rank inherits; returns what was set by default."""
    applied = []
    if "NCCL_NVLS_ENABLE" not in os.environ:
        os.environ["NCCL_NVLS_ENABLE"] = "0"
        applied.append("NCCL_NVLS_ENABLE=0")
    if args.backend == "nccl":
        if os.environ.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
            os.environ["NCCL_DEBUG"] = "INFO"
            applied.append("NCCL_DEBUG=INFO")
        if "NCCL_DEBUG_SUBSYS" not in os.environ:
            os.environ["NCCL_DEBUG_SUBSYS"] = DEFAULT_DEBUG_SUBSYS
            applied.append(f"NCCL_DEBUG_SUBSYS={DEFAULT_DEBUG_SUBSYS}")
        # %h host, %p pid: one file per process, read back after the run.
        os.environ["NCCL_DEBUG_FILE"] = os.path.join(log_dir, "nccl.%h.%p.log")
    return applied


def relevant_env() -> dict:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def calls_for(size: int, args) -> int:
    return max(1, min(args.calls_per_trial, -(-args.trial_bytes // size)))


def capture_graph(torch, dist, tensor, calls: int):
    """A CUDA graph of `calls` all-reduces on tensor, or the error that stopped the capture."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph asks
            for _ in range(2):
                dist.all_reduce(tensor)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                dist.all_reduce(tensor)
        torch.cuda.synchronize()
        return graph, None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def run_rank(local_rank: int, args_dict: dict, result_dir: str, init_method: str) -> None:
    """One rank: init, sweep, write rank-<global>.json. Runs in a spawned process."""
    args = argparse.Namespace(**args_dict)
    global_rank = args.node_rank * args.nproc_per_node + local_rank
    world = args.nnodes * args.nproc_per_node
    out = {"global_rank": global_rank, "local_rank": local_rank, "ok": False}
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        use_cuda = args.backend == "nccl"
        if use_cuda:
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
            props = torch.cuda.get_device_properties(local_rank)
            out["device"] = {"name": props.name, "uuid": str(getattr(props, "uuid", "")),
                             "total_memory_bytes": int(props.total_memory), "cuda_index": local_rank}
        else:
            device = torch.device("cpu")
            out["device"] = {"name": "cpu", "cuda_index": None}
        dtype = getattr(torch, args.dtype)
        element = torch.tensor([], dtype=dtype).element_size()
        kwargs = {"backend": args.backend, "init_method": init_method, "rank": global_rank,
                  "world_size": world, "timeout": timedelta(seconds=args.timeout)}
        try:
            dist.init_process_group(**kwargs, **({"device_id": device} if use_cuda else {}))
        except TypeError:  # torch without device_id
            dist.init_process_group(**kwargs)

        expected_sum = world * (world + 1) / 2
        sweep = []
        for size in sweep_sizes(args.min_bytes, args.max_bytes, args.factor):
            count = size // element
            tensor = torch.empty(count, dtype=dtype, device=device)
            # Correctness first: every element must be 1 + 2 + ... + world.
            tensor.fill_(global_rank + 1)
            dist.all_reduce(tensor)
            correct = bool((tensor == expected_sum).all().item())
            calls = calls_for(size, args)
            graph, graph_error = None, None
            if use_cuda and args.cuda_graph:
                graph, graph_error = capture_graph(torch, dist, tensor, calls)
                # Every rank replays or none does: a lone replay would wait for its peers forever.
                captured = torch.tensor([1 if graph is not None else 0], dtype=torch.int64, device=device)
                dist.all_reduce(captured, op=dist.ReduceOp.MIN)
                if not captured.item():
                    graph = None
                    graph_error = graph_error or "capture failed on another rank"
            trials = []
            for trial in range(args.warmup + args.iters):
                tensor.fill_(global_rank + 1)  # keeps repeated sums finite in bf16
                dist.barrier()
                if use_cuda:
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    if graph is not None:
                        graph.replay()
                    else:
                        for _ in range(calls):
                            dist.all_reduce(tensor)
                    end.record()
                    end.synchronize()
                    elapsed_us = start.elapsed_time(end) * 1000.0 / calls
                else:
                    began = time.perf_counter()
                    for _ in range(calls):
                        dist.all_reduce(tensor)
                    elapsed_us = (time.perf_counter() - began) * 1e6 / calls
                if trial >= args.warmup:
                    trials.append(elapsed_us)
            # Shortest window over ranks per trial (see the module doc), median over trials.
            local = torch.tensor(trials, dtype=torch.float64, device=device)
            shortest, longest = local.clone(), local.clone()
            dist.all_reduce(shortest, op=dist.ReduceOp.MIN)
            dist.all_reduce(longest, op=dist.ReduceOp.MAX)
            per_trial = shortest.tolist()
            skew = [b - a for a, b in zip(per_trial, longest.tolist(), strict=True)]
            flags = torch.tensor([0 if correct else 1], dtype=torch.int64, device=device)
            dist.all_reduce(flags)
            time_us = statistics.median(per_trial)
            algbw = size / (time_us * 1e-6) / GB
            sweep.append({
                "size_bytes": size, "count": count, "calls_per_trial": calls, "trials": len(per_trial),
                "time_us": time_us, "time_us_min": min(per_trial), "time_us_max": max(per_trial),
                "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (world - 1) / world,
                "rank_spread_us": statistics.median(skew), "cuda_graph": graph is not None,
                "correct": int(flags.item()) == 0,
            })
            if graph_error:
                sweep[-1]["cuda_graph_error"] = graph_error
            del tensor, local, shortest, longest, graph
            if use_cuda:
                torch.cuda.empty_cache()
        out["sweep"] = sweep
        out["ok"] = all(point["correct"] for point in sweep)
        if not out["ok"]:
            out["error"] = "an all-reduce returned a wrong sum"
        dist.destroy_process_group()
    except Exception as exc:  # reported in the JSON, not swallowed
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc(limit=8)
    with open(os.path.join(result_dir, f"rank-{global_rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(out, handle)


def versions(backend: str) -> dict:
    info = {"python": sys.version.split()[0]}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        if backend == "nccl" and torch.cuda.is_available():
            raw = torch.cuda.nccl.version()
            info["nccl"] = ".".join(str(p) for p in raw) if isinstance(raw, tuple) else str(raw)
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def default_nproc(backend: str) -> int:
    if backend == "gloo":
        return 2
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def read_nccl_logs(log_dir: str, limit: int) -> tuple[str, bool]:
    parts, total, truncated = [], 0, False
    for path in sorted(glob.glob(os.path.join(log_dir, "nccl.*.log"))):
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if any(noise in line for noise in NOISY_NCCL_LINES):
                    continue
                if total + len(line) > limit:
                    truncated = True
                    break
                parts.append(line)
                total += len(line)
    return "".join(parts), truncated


def supervise(processes, deadline: float) -> str | None:
    """Wait for every rank; stop the rest when one fails or time runs out."""
    failed_at = None
    while True:
        alive = [p for p in processes if p.is_alive()]
        if not alive:
            return None
        now = time.monotonic()
        if failed_at is None and any(p.exitcode not in (None, 0) for p in processes):
            failed_at = now
        if now >= deadline or (failed_at is not None and now - failed_at > 30):
            for proc in alive:
                proc.terminate()
            for proc in alive:
                proc.join(5)
                if proc.is_alive():
                    proc.kill()
                    proc.join(5)
            return "timed out" if now >= deadline else "a rank failed; the others were stopped"
        alive[0].join(0.2)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    started = time.monotonic()
    problem = validate(args)
    doc = {
        "probe": "nccl_probe", "probe_version": PROBE_VERSION, "ok": False, "error": problem,
        "hostname": socket.gethostname(), "backend": args.backend,
        "mode": "multinode" if args.nnodes > 1 else "local",
    }
    if problem:
        print(json.dumps(doc))
        return 1
    work = tempfile.mkdtemp(prefix="nccl-probe-")
    log_dir = args.log_dir or os.path.join(work, "nccl")
    os.makedirs(log_dir, exist_ok=True)
    try:
        applied = prepare_environment(args, log_dir)
        if args.dtype is None:
            args.dtype = "bfloat16" if args.backend == "nccl" else "float32"
        if not args.nproc_per_node:
            args.nproc_per_node = default_nproc(args.backend)
        if args.nproc_per_node < 1:
            doc["error"] = f"no GPU visible on {doc['hostname']} for backend nccl (torch.cuda.device_count() is 0)"
            print(json.dumps(doc))
            return 1
        if args.nnodes == 1 and not args.master_port:
            args.master_port = free_port()
        world = args.nnodes * args.nproc_per_node
        doc.update({
            "device_type": "cuda" if args.backend == "nccl" else "cpu",
            "nnodes": args.nnodes, "node_rank": args.node_rank, "nproc_per_node": args.nproc_per_node,
            "world_size": world, "master_addr": args.master_addr, "master_port": args.master_port,
            "dtype": args.dtype, "versions": versions(args.backend),
            "settings": {
                "min_bytes": args.min_bytes, "max_bytes": args.max_bytes, "factor": args.factor,
                "warmup": args.warmup, "iters": args.iters, "calls_per_trial": args.calls_per_trial,
                "trial_bytes": args.trial_bytes, "cuda_graph": args.cuda_graph, "timeout_s": args.timeout,
                "timing": "cuda_events" if args.backend == "nccl" else "perf_counter",
                "statistic": "median over trials of the shortest rank window per trial",
            },
            "env_defaults_applied": applied, "env": relevant_env(),
        })
        if world < 2:
            doc["error"] = f"world size {world}: an all-reduce needs at least 2 ranks"
            print(json.dumps(doc))
            return 1
        init_method = f"tcp://{args.master_addr}:{args.master_port}"
        context = multiprocessing.get_context("spawn")
        processes = [
            context.Process(target=run_rank, args=(local, vars(args), work, init_method), daemon=False)
            for local in range(args.nproc_per_node)
        ]
        for proc in processes:
            proc.start()
        stopped = supervise(processes, started + args.timeout)
        ranks = []
        for local in range(args.nproc_per_node):
            global_rank = args.node_rank * args.nproc_per_node + local
            path = os.path.join(work, f"rank-{global_rank}.json")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as handle:
                    ranks.append(json.load(handle))
            else:
                ranks.append({"global_rank": global_rank, "local_rank": local, "ok": False,
                              "error": f"no result (exit code {processes[local].exitcode})"})
        doc["devices"] = [dict(r.get("device") or {}, global_rank=r["global_rank"], local_rank=r["local_rank"])
                          for r in ranks]
        first = next((r for r in ranks if r.get("sweep")), None)
        doc["sweep"] = first["sweep"] if first else []
        doc["rank_errors"] = [{"global_rank": r["global_rank"], "error": r.get("error"),
                               "traceback": r.get("traceback")} for r in ranks if not r.get("ok")]
        if args.backend == "nccl":
            doc["nccl_debug_log"], doc["nccl_debug_truncated"] = read_nccl_logs(log_dir, args.max_log_bytes)
        doc["ok"] = stopped is None and not doc["rank_errors"] and bool(doc["sweep"])
        if not doc["ok"]:
            errors = [e["error"] for e in doc["rank_errors"] if e.get("error")]
            doc["error"] = "; ".join(filter(None, [stopped] + errors[:3])) or "no sweep result"
    except Exception as exc:
        doc["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        doc["elapsed_s"] = round(time.monotonic() - started, 3)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(doc))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
