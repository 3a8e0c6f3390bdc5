#!/usr/bin/env python3
"""A model of several GiB staged to three lab nodes three ways, side by side, and the manifest's hashing speed.

    sudo .venv/bin/python bench/model_stage.py [--name bstage] [--gib 4] [--shards 4] [--keep] [--ways ...]

1. Builds, offline, a model of --gib GiB: the lab's tiny Llama's config and tokenizer plus --shards safetensors
   files of random bf16 (one tensor each), and publishes it into a real mirror (olah, .venv-mirror) on the lab's
   management gateway.
2. Stages it to the three nodes of a fresh lab, each way into its own directory, removed before the next way:
   - controller: role vllm_runtime with the directory on the controller (`ansible.builtin.copy` to each node);
   - mirror: every node runs the role's fetcher (files/model_fetch.py) against the mirror at once, over SSH;
   - fan-out: role vllm_runtime with `hub:<repo>@<commit>` (the first node fetches, the others copy from it);
   reporting each way's wall time and the bytes that left the source (the controller's: the model once per node;
   the mirror's: from olah's access log). The two role ways include the role's manifest check on every node;
   the mirror way is the fetch alone.
3. On the controller, the model's files read once into the page cache, then hashed twice side by side:
   the manifest (module_utils/model/manifest.py, four threads) and `sha256sum` (one process), as GiB/s.

Writes results/bench/model_stage.json and prints a table.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "lab"))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.vllm_ops.cluster.plugins.module_utils.model import manifest as mf  # noqa: E402
from deploy_overhead import Bench  # noqa: E402  (a lab of its own, SSH, ansible-playbook)
from vlab.mirror import Mirror, publish  # noqa: E402

OUT = REPO / "results" / "bench" / "model_stage.json"
TINY = REPO / ".cache" / "models" / "tiny-llama"
REPO_ID = "bench/big-llama"
PORT = 18091
NODES = ("node1", "node2", "node3")
FETCHER = REPO / "roles" / "vllm_runtime" / "files" / "model_fetch.py"
GIB = 1024 ** 3
PLAY = """\
- name: Stage the model (role vllm_runtime's configure tasks only)
  hosts: vllm_nodes
  gather_facts: false
  become: true
  tasks:
    - name: Stage
      ansible.builtin.include_role:
        name: vllm_ops.cluster.vllm_runtime
        tasks_from: configure
"""


def build_model(target: Path, total_gib: float, shards: int) -> int:
    """The tiny Llama's small files plus `shards` safetensors files of random bf16; returns the bytes."""
    shutil.copytree(TINY, target, ignore=shutil.ignore_patterns("model.safetensors", ".cache"))
    per_shard = int(total_gib * GIB / shards) // 2 // 4096 * 4096 * 2  # bytes, whole rows of 4096 bf16
    index = {"metadata": {"total_size": per_shard * shards}, "weight_map": {}}
    for shard in range(shards):
        name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        header = json.dumps({f"extra.{shard}.weight": {"dtype": "BF16", "shape": [per_shard // 2 // 4096, 4096],
                                                        "data_offsets": [0, per_shard]}}).encode()
        header += b" " * (-len(header) % 8)
        with open(target / name, "wb") as handle:
            handle.write(struct.pack("<Q", len(header)) + header)
            left = per_shard
            while left:
                chunk = min(left, 64 * 1024 * 1024)
                handle.write(os.urandom(chunk))
                left -= chunk
        index["weight_map"][f"extra.{shard}.weight"] = name
    (target / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return sum(path.stat().st_size for path in target.rglob("*") if path.is_file())


def mirror_bytes(mirror: Mirror, commit: str, sizes: dict[str, int]) -> int:
    """Bytes olah sent for the commit's files (each 200 GET of a file counts its size)."""
    marker = f'"GET /{REPO_ID}/resolve/{commit}/'
    sent = 0
    for line in mirror.log().splitlines():
        if marker in line and '" 200' in line:
            sent += sizes.get(line.split(marker, 1)[1].split(" HTTP/", 1)[0], 0)
    return sent


def stage_with_role(bench: Bench, play: Path, extra: dict) -> float:
    seconds, _ = bench.run_playbook(str(play), "-e", json.dumps(extra), timeout=7200)
    return seconds


def stage_from_mirror(bench: Bench, mirror: Mirror, commit: str, path: str) -> float:
    def one(node: str) -> None:
        bench.ssh(node, f"HF_ENDPOINT={mirror.endpoint} python3 /root/model_fetch.py {REPO_ID} {commit} {path}",
                  timeout=7200)
    for node in NODES:
        subprocess.run(["scp", "-q", "-i", str(bench.inventory / "ssh" / "id_ed25519"), "-o", "StrictHostKeyChecking=no",
                        "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", str(FETCHER),
                        f"root@{bench.address(node)}:/root/model_fetch.py"], check=True, timeout=60)
    started = time.monotonic()
    with ThreadPoolExecutor(len(NODES)) as pool:
        list(pool.map(one, NODES))
    return time.monotonic() - started


def hash_speeds(model: Path) -> dict:
    files = sorted(str(path) for path in model.rglob("*") if path.is_file())
    size = sum(os.path.getsize(path) for path in files)
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)  # into the page cache
    started = time.monotonic()
    mf.build_manifest(str(model), "controller")
    manifest_s = time.monotonic() - started
    started = time.monotonic()
    mf.build_manifest(str(model), "controller", workers=1)
    one_thread_s = time.monotonic() - started
    started = time.monotonic()
    subprocess.run(["sha256sum", *files], stdout=subprocess.DEVNULL, check=True)
    sha256sum_s = time.monotonic() - started
    return {"bytes": size, "manifest_s": round(manifest_s, 2), "sha256sum_s": round(sha256sum_s, 2),
            "manifest_gib_s": round(size / GIB / manifest_s, 2), "sha256sum_gib_s": round(size / GIB / sha256sum_s, 2),
            "ratio": round(sha256sum_s / manifest_s, 2), "threads": mf.DEFAULT_WORKERS,
            "manifest_one_thread_gib_s": round(size / GIB / one_thread_s, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="bstage")
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    parser.add_argument("--ways", default="controller,mirror,fanout",
                        help="which ways, comma-separated, in this order: controller, mirror, fanout")
    args = parser.parse_args()
    ways = args.ways.split(",")
    if not ways or set(ways) - {"controller", "mirror", "fanout"}:
        parser.error(f"--ways: controller, mirror or fanout, not {args.ways!r}")
    bench = Bench(args.name)
    work = Path(tempfile.mkdtemp(prefix="model-stage-", dir=REPO / ".cache"))
    rows: dict[str, dict] = {}
    try:
        model = work / "big-llama"
        total = build_model(model, args.gib, args.shards)
        sizes = {path.relative_to(model).as_posix(): path.stat().st_size for path in model.rglob("*") if path.is_file()}
        commit = publish(model, work / "mirrors", REPO_ID) if {"mirror", "fanout"} & set(ways) else None
        bench.up()
        play = work / "stage.yml"
        play.write_text(PLAY)
        mirrored = Mirror(work / "mirrors", bench.status["management_gateway"], PORT, args.name) if commit else None
        with mirrored or contextlib.nullcontext() as mirror:
            # The plan's part the fan-out reads: the nodes and their fabric addresses (the copies go over eth1).
            nodes = [{"name": n["node"], "address": n["fabric_address"]} for n in bench.status["nodes"]]
            common = {"vllm_runtime_model_progress_interval": 30, "vllm_cluster_plan": {"cluster": {"nodes": nodes}}}
            if "controller" in ways:
                seconds = stage_with_role(bench, play, {**common, "vllm_cluster_model_path": "/srv/models/by-copy",
                                                        "vllm_runtime_model_source": str(model)})
                rows["controller copy"] = {"seconds": round(seconds, 1), "source_bytes": total * len(NODES)}
                for node in NODES:
                    bench.ssh(node, "rm -rf /srv/models/by-copy")
            if "mirror" in ways:
                before = mirror_bytes(mirror, commit, sizes)
                seconds = stage_from_mirror(bench, mirror, commit, "/srv/models/by-mirror")
                rows["every node from the mirror"] = {"seconds": round(seconds, 1),
                                                      "source_bytes": mirror_bytes(mirror, commit, sizes) - before}
                for node in NODES:
                    bench.ssh(node, "rm -rf /srv/models/by-mirror")
            if "fanout" in ways:
                before = mirror_bytes(mirror, commit, sizes)
                seconds = stage_with_role(bench, play, {**common, "vllm_cluster_model_path": "/srv/models/by-fanout",
                                                        "vllm_runtime_model_source": f"hub:{REPO_ID}@{commit}",
                                                        "vllm_runtime_model_hub_endpoint": mirror.endpoint})
                rows["fan-out"] = {"seconds": round(seconds, 1),
                                   "source_bytes": mirror_bytes(mirror, commit, sizes) - before}
                for node in NODES:  # the directory and the role's record of its revision
                    bench.ssh(node, "rm -rf /srv/models/by-fanout /etc/vllm-cluster/model-sources")
        hashing = hash_speeds(model)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep:
            bench.lab("down")
    result = {"model_bytes": total, "shards": args.shards, "nodes": len(NODES), "ways": rows, "hashing": hashing,
              "cpus": os.cpu_count()}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"model: {total / GIB:.2f} GiB in {args.shards} shards, {len(NODES)} nodes")
    print(f"{'way':<28} {'seconds':>8} {'GiB left the source':>20}")
    for way, row in rows.items():
        print(f"{way:<28} {row['seconds']:>8.1f} {row['source_bytes'] / GIB:>20.2f}")
    print(f"hashing {hashing['bytes'] / GIB:.2f} GiB from the page cache: manifest {hashing['manifest_gib_s']} GiB/s "
          f"({hashing['threads']} threads; {hashing['manifest_one_thread_gib_s']} GiB/s on one), "
          f"sha256sum {hashing['sha256sum_gib_s']} GiB/s, ratio {hashing['ratio']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
