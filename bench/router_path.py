#!/usr/bin/env python3
"""The front door on the lab's network: replicas on their own nodes, vllm-router on another, the client on the host.

    .venv/bin/python bench/router_path.py --inventory DIR [--rounds 3] [--num-prompts 240]

DIR is an inventory whose front is deployed (deploy.yml, then playbooks/router.yml): the group `vllm_router`
holds one host, and the router's workers are the deployment's replicas (vllm_cluster_dp independent servers).
Per round, in an order that turns every round, the same load (`vllm bench serve`, the lab's profile from
inventories/lab/group_vars with --num-prompts) on the lab host against:

- `direct`: the first replica, on its management address;
- `router-1`: the router with only that replica (the others taken out with the router's own /remove_worker and
  put back after the round, also on failure; called over SSH on the router host, where its guard lets them pass);
- `router-N`: the router with every replica;

and, one request at a time (max-concurrency 1, a third of the prompts), `direct` and `router-N` again: a replica
that stalls behind the router shows there as a TTFT P99 near a second.

Per side: the median over rounds of TTFT P50 and P99 and output throughput. Goals: TTFT through the router at most
1.1x direct, and router-N's output throughput at least 0.9 x N x direct. Writes results/bench/router_path.json and
prints a table. Exit 0 when every request completed: the goals are reported, not enforced (docs/performance.md
says where the lab's two cores stop them).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from router_overhead import REPO, ensure_model, run_load  # noqa: E402

OUT = REPO / "results" / "bench" / "router_path.json"
ROUTER_DEFAULTS = REPO / "roles" / "vllm_router" / "defaults" / "main.yml"
GOALS = {"ttft_p50": 1.1, "ttft_p99": 1.1, "throughput_per_replica": 0.9}


def hosts_of(inventory: Path) -> tuple[list[dict], dict]:
    """(replicas, router): each {name, management, fabric} from the inventory's hosts.yml and host_vars."""
    listing = yaml.safe_load((inventory / "hosts.yml").read_text())["all"]["children"]

    def members(group: dict) -> dict:
        found = dict(group.get("hosts") or {})
        for child in (group.get("children") or {}).values():
            found.update(members(child))
        return found

    def described(name: str, entry: dict | None) -> dict:
        host_vars = yaml.safe_load((inventory / "host_vars" / f"{name}.yml").read_text())
        return {"name": name, "management": (entry or {}).get("ansible_host") or host_vars["lab_management_address"],
                "fabric": host_vars["lab_fabric_address"]}

    routers = members(listing.get("vllm_router") or {})
    if len(routers) != 1:
        raise SystemExit(f"{inventory}: group vllm_router holds {sorted(routers)}; expected one router host")
    replicas = members(listing["vllm_nodes"])  # the router may run on one of them (tests/lab/test_router.py)
    if not replicas:
        raise SystemExit(f"{inventory}: no replica host in group vllm_nodes")
    (router_name, router_entry), = routers.items()
    return [described(n, e) for n, e in replicas.items()], described(router_name, router_entry)


def request(url: str, key: str | None = None, method: str = "GET") -> str:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers), timeout=30) as answer:
        return answer.read().decode()


def router_admin(inventory: Path, router_host: dict, port: int):
    """A call of the router's admin API on the router host itself (curl over SSH to 127.0.0.1): its guard refuses
    the admin API to every other host."""
    nodes = yaml.safe_load((inventory / "hosts.yml").read_text())["all"]["children"]["vllm_nodes"]
    key_file = nodes["vars"]["ansible_ssh_private_key_file"]

    def call(path: str, method: str = "GET") -> str:
        argv = ["ssh", "-i", key_file, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR", f"root@{router_host['management']}",
                f"curl -sf --max-time 30 -X {method} 'http://127.0.0.1:{port}{path}'"]
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    return call


def set_workers(admin, wanted: list[str], every: list[str]) -> None:
    """The router's workers become `wanted` (its /remove_worker and /add_worker, through `admin`)."""
    listed = [w["url"] for w in json.loads(admin("/workers"))["workers"]]
    for url in every:
        query = urllib.parse.urlencode({"url": url})
        if url in listed and url not in wanted:
            admin(f"/remove_worker?{query}", method="POST")
        elif url not in listed and url in wanted:
            admin(f"/add_worker?{query}", method="POST")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        workers = json.loads(admin("/workers"))["workers"]
        if sorted(w["url"] for w in workers if w.get("is_healthy")) == sorted(wanted):
            return
        time.sleep(1)
    raise SystemExit(f"the router did not list exactly {wanted} as healthy within 120 s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", type=Path, required=True, help="the lab inventory of the deployed front")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=240, help="requests per side and round (the lab: 48)")
    args = parser.parse_args(argv)
    ensure_model()
    replicas, router_host = hosts_of(args.inventory)
    defaults = yaml.safe_load(ROUTER_DEFAULTS.read_text())
    group_vars = args.inventory / "group_vars" / "vllm_router.yml"
    settings = {**defaults, **(yaml.safe_load(group_vars.read_text()) if group_vars.exists() else {})}
    router = f"http://{router_host['management']}:{settings['vllm_router_port']}"
    admin = router_admin(args.inventory, router_host, settings["vllm_router_port"])
    direct = f"http://{replicas[0]['management']}:8000"
    workers = [f"http://{r['fabric']}:8000" for r in replicas]
    key = (args.inventory / "secrets" / "vllm-api-key").read_text().strip()
    served = json.loads(request(f"{direct}/v1/models", key))["data"][0]["id"]
    os.environ["OPENAI_API_KEY"] = key  # vllm bench serve sends it as the bearer token
    workdir = Path(tempfile.mkdtemp(prefix="router-path-"))
    sides = {"direct": (direct, None), "router-1": (router, workers[:1]), "router-N": (router, workers)}
    rounds = []
    try:
        for index in range(args.rounds):
            order = list(sides)
            order = order[index % 3:] + order[:index % 3]
            measured = {}
            for side in order:
                url, wanted = sides[side]
                if wanted:
                    set_workers(admin, wanted, workers)
                measured[side] = run_load(url, workdir, f"{side}-{index}", args.num_prompts, served=served)
            for side in ("direct", "router-N"):
                url, wanted = sides[side]
                if wanted:
                    set_workers(admin, wanted, workers)
                measured[f"{side} one at a time"] = run_load(url, workdir, f"{side}-seq-{index}",
                                                             max(args.num_prompts // 3, 8), served=served,
                                                             max_concurrency=1)
            measured["order"] = order
            rounds.append(measured)
            print(f"round {index + 1}: " + ", ".join(
                f"{side} TTFT P50 {m['ttft_p50']:.0f} P99 {m['ttft_p99']:.0f} ms, {m['output_throughput']:.0f} tok/s"
                for side, m in measured.items() if side != "order"), flush=True)
    finally:
        set_workers(admin, workers, workers)
    names = [side for side in rounds[0] if side != "order"]
    median = {side: {metric: statistics.median(r[side][metric] for r in rounds)
                     for metric in ("ttft_p50", "ttft_p99", "tpot_p50", "output_throughput")} for side in names}
    n = len(workers)
    ratios = {
        "ttft_p50": statistics.median(r["router-N"]["ttft_p50"] / r["direct"]["ttft_p50"] for r in rounds),
        "ttft_p99": statistics.median(r["router-N"]["ttft_p99"] / r["direct"]["ttft_p99"] for r in rounds),
        "throughput_per_replica": statistics.median(
            r["router-N"]["output_throughput"] / (n * r["direct"]["output_throughput"]) for r in rounds),
    }
    goal_met = {metric: ratios[metric] >= limit if metric.startswith("throughput") else ratios[metric] <= limit
                for metric, limit in GOALS.items()}
    failed = sum(r[side]["failed"] + r[side]["num_prompts"] - r[side]["completed"] for r in rounds for side in names)
    record = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host_cpus": len(os.sched_getaffinity(0)),
        "host_load_average": os.getloadavg(), "replicas": replicas, "router": router_host, "rounds": rounds,
        "median": median, "ratios": ratios, "goals": GOALS, "goal_met": goal_met, "failed_requests": failed,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\n{'median of ' + str(args.rounds) + ' rounds':<30}{'TTFT P50 ms':>12}{'TTFT P99 ms':>12}{'tok/s':>9}")
    for side in names:
        m = median[side]
        print(f"{side:<30}{m['ttft_p50']:>12.1f}{m['ttft_p99']:>12.1f}{m['output_throughput']:>9.1f}")
    for metric, limit in GOALS.items():
        sign = ">=" if metric.startswith("throughput") else "<="
        print(f"{metric}: {ratios[metric]:.2f} (goal {sign} {limit}: {'met' if goal_met[metric] else 'MISSED'})")
    print(f"N = {n} replicas on a host of {record['host_cpus']} cores; failed or incomplete requests: {failed}; "
          f"written {OUT}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
