#!/usr/bin/python
"""Ansible module: run the all-reduce bandwidth probe and judge its result."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nccl_probe
short_description: Measure all-reduce bandwidth with torch.distributed and prove the NCCL transport
version_added: "0.1.0"
description:
  - Runs C(nccl_probe.py) (shipped in the C(nccl_network) role's C(files/)) with a Python
    interpreter that has PyTorch, for example the node's vLLM virtual environment.
  - The script starts one process per local GPU, all-reduces a size sweep (1 MiB to 4 GiB by
    default) and reports algbw and busbw per size with nccl-tests' definition
    (busbw = algbw x 2(n-1)/n, GB = 1e9 bytes).
  - The module reads the transport from the run's own C(NCCL_DEBUG=INFO) log (P2P or NVLS is
    NVLink, NET/IB is InfiniBand, SHM or NET/Socket is slow), then judges busbw at 1 GiB and above
    against a threshold per GPU model and link type.
  - A slow transport where NVLink or InfiniBand is expected fails the task, as does busbw below
    the fail line.
  - For a fabric test across nodes, run the task on every node at once with the same
    O(nnodes), O(master_addr) and O(master_port) and each node's O(node_rank).
  - The probe changes nothing on the host (no clock, power, MIG or persistence setting); it keeps
    C(NCCL_NVLS_ENABLE=0) unless O(env) or the environment sets it. It runs in check mode too,
    since it only measures, and always reports C(changed=false).
  - It needs the GPUs it measures; run it before vLLM starts or while it is stopped.
options:
  python:
    description: Interpreter with PyTorch (and NCCL for O(backend=nccl)).
    type: path
    required: true
  script:
    description: Path of C(nccl_probe.py) on the node.
    type: path
    required: true
  backend:
    description: C(nccl) on GPUs; C(gloo) on CPU (the lab), which checks orchestration only.
    type: str
    choices: [nccl, gloo]
    default: nccl
  nproc_per_node:
    description: Processes on this node; 0 means every visible GPU (nccl) or 2 (gloo).
    type: int
    default: 0
  nnodes:
    description: Number of nodes in the run; more than 1 selects multi-node mode.
    type: int
    default: 1
  node_rank:
    description: This node's rank, 0 to O(nnodes)-1; node rank 0 hosts the rendezvous.
    type: int
    default: 0
  master_addr:
    description: Address of node rank 0 that every node can reach (its fabric interface address).
    type: str
    default: 127.0.0.1
  master_port:
    description: Rendezvous TCP port on O(master_addr); 0 picks a free one (single node only).
    type: int
    default: 0
  min_bytes:
    description: Smallest message, in bytes or with a binary unit (C(1M)).
    type: str
    default: 1M
  max_bytes:
    description: Largest message (C(4G)); the verdict needs at least 1 GiB.
    type: str
    default: 4G
  factor:
    description: Size step multiplier.
    type: int
    default: 2
  warmup:
    description: Untimed trials per size.
    type: int
    default: 5
  iters:
    description: Timed trials per size; the median is reported.
    type: int
    default: 20
  cuda_graph:
    description:
      - Time CUDA graph replays of the all-reduces (as vLLM runs decode) instead of eager calls.
        Eager PyTorch spends tens of microseconds of host time per call, which dominates messages of
        a few MiB; sizes of 1 GiB and more read the same either way.
    type: bool
    default: false
  timeout:
    description: Seconds the probe may run in all; it stops itself and every rank after that.
    type: int
    default: 600
  env:
    description:
      - Extra environment for the probe, for example C(NCCL_SOCKET_IFNAME), C(NCCL_IB_HCA), or
        C(NCCL_ALGO=RING) for 2-node fabric tests.
    type: dict
    default: {}
  expect_transport:
    description:
      - The transport the run must use. C(auto) means C(nvlink) for a single-node nccl run,
        C(infiniband) for a multi-node nccl run and nothing for gloo. C(any) judges no transport.
    type: str
    choices: [auto, any, nvlink, infiniband, pcie, shm, socket]
    default: auto
  p2p_over_nvlink:
    description:
      - What C(nvidia-smi topo -m) says about the GPU pairs (true when all show NV#). Left unset,
        the probe's NCCL graph lines decide whether P2P runs over NVLink or PCIe.
    type: bool
  gpu_name:
    description: GPU model for the threshold table; default the name torch reports.
    type: str
  nics_per_node:
    description: NICs a node drives in a multi-node run; InfiniBand limits are per NIC and scale with it.
    type: int
    default: 1
  thresholds:
    description:
      - Override the default limits, in GB/s of busbw. Keys C(pass_gbps) (at or above is pass) and
        C(fail_below_gbps) (below is fail; in between is warn).
    type: dict
    default: {}
  fail_on_warn:
    description: Fail the task on a warn verdict too.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - vllm-cluster developers (@vllm-ops)
"""

EXAMPLES = r"""
- name: Measure NVLink all-reduce bandwidth on every GPU of the node
  vllm_ops.cluster.nccl_probe:
    python: /opt/vllm/venv/bin/python
    script: /usr/local/libexec/vllm-cluster/nccl_probe.py
  register: nccl_network_probe

- name: Fabric test across two nodes, one GPU each (run on both hosts at once)
  vllm_ops.cluster.nccl_probe:
    python: /opt/vllm/venv/bin/python
    script: /usr/local/libexec/vllm-cluster/nccl_probe.py
    nnodes: 2
    node_rank: "{{ ansible_play_hosts.index(inventory_hostname) }}"
    master_addr: "{{ hostvars[ansible_play_hosts[0]]['ansible_facts'][vllm_cluster_fabric_interface]['ipv4']['address'] }}"
    master_port: 29511
    nproc_per_node: 1
    env:
      NCCL_ALGO: RING
      NCCL_SOCKET_IFNAME: "{{ vllm_cluster_fabric_interface }}"

- name: Orchestration check on CPU (lab)
  vllm_ops.cluster.nccl_probe:
    python: /opt/vllm/venv/bin/python
    script: /usr/local/libexec/vllm-cluster/nccl_probe.py
    backend: gloo
    max_bytes: 4M
"""

RETURN = r"""
verdict:
  description: Judgement of the run.
  returned: when the probe produced a sweep
  type: dict
  contains:
    status:
      description: pass, warn or fail.
      type: str
    reasons:
      description: One sentence per problem found.
      type: list
      elements: str
    metric:
      description: The judged point (best busbw at 1 GiB and above).
      type: dict
    threshold:
      description: The limits applied and their source.
      type: dict
  sample:
    status: pass
    reasons: []
    metric: {size_bytes: 4294967296, busbw_gbps: 348.0, algbw_gbps: 348.0, judged_at_full_size: true}
sweep:
  description: One record per size with size_bytes, time_us (median), algbw_gbps, busbw_gbps, correct.
  returned: when the probe produced a sweep
  type: list
  elements: dict
transport:
  description:
    - What the NCCL log proves - transport (bottleneck class), intra_node, inter_node,
      class_counts, path_counts, nccl_version, nvls, gdrdma, notes and the evidence lines.
  returned: for backend nccl
  type: dict
probe:
  description: Run facts - hostname, backend, mode, world_size, node_rank, versions, settings, env, devices.
  returned: always
  type: dict
"""

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify import (
    allreduce_bandwidth,  # noqa: E402
    nccl_transport,  # noqa: E402
)

# Seconds the module waits beyond the probe's own --timeout before killing it.
GRACE_S = 60


def probe_command(params: dict) -> list[str]:
    command = [params["python"], params["script"], "--backend", params["backend"],
               "--nnodes", str(params["nnodes"]), "--node-rank", str(params["node_rank"]),
               "--master-addr", params["master_addr"], "--master-port", str(params["master_port"]),
               "--min-bytes", str(params["min_bytes"]), "--max-bytes", str(params["max_bytes"]),
               "--factor", str(params["factor"]), "--warmup", str(params["warmup"]),
               "--iters", str(params["iters"]), "--timeout", str(params["timeout"])]
    if params["nproc_per_node"]:
        command += ["--nproc-per-node", str(params["nproc_per_node"])]
    if params["cuda_graph"]:
        command.append("--cuda-graph")
    return command


def run_probe(command: list[str], env_update: dict, timeout: int) -> tuple[int, str, str]:
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in env_update.items()})
    # Own session, so a hung run is stopped with every rank it spawned.
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout + GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return -9, out, err + f"\nkilled after {timeout + GRACE_S} s"
    return proc.returncode, out, err


def parse_probe_output(stdout: str) -> dict | None:
    start = stdout.find("{")
    if start < 0:
        return None
    try:
        return json.loads(stdout[start:])
    except ValueError:
        return None


def resolve_expected(params: dict) -> str | None:
    expected = params["expect_transport"]
    if expected == "auto":
        if params["backend"] != "nccl":
            return None
        return "infiniband" if params["nnodes"] > 1 else "nvlink"
    return None if expected == "any" else expected


def evaluate(params: dict, doc: dict) -> dict:
    """Recompute bandwidth from the times, detect the transport, judge."""
    world = int(doc["world_size"])
    kept = ("count", "correct", "trials", "calls_per_trial", "time_us_min", "time_us_max", "rank_spread_us",
            "cuda_graph", "cuda_graph_error")
    sweep = [allreduce_bandwidth.sweep_point(p["size_bytes"], p["time_us"], world,
                                             **{k: p[k] for k in kept if k in p})
             for p in doc.get("sweep", [])]
    transport = None
    if params["backend"] == "nccl":
        transport = nccl_transport.parse_nccl_debug(doc.get("nccl_debug_log") or "",
                                                    p2p_over_nvlink=params.get("p2p_over_nvlink"))
    gpu_name = params.get("gpu_name") or next(
        (d.get("name") for d in doc.get("devices", []) if d.get("name") and d.get("name") != "cpu"), None)
    verdict = allreduce_bandwidth.judge(
        sweep, world, gpu_name=gpu_name, transport=transport, expected_transport=resolve_expected(params),
        nics_per_node=params["nics_per_node"], overrides=params["thresholds"] or None,
        judge_bandwidth=params["backend"] == "nccl",
    )
    return {"sweep": sweep, "transport": transport, "verdict": verdict, "gpu_name": gpu_name}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "script": {"type": "path", "required": True},
            "backend": {"type": "str", "choices": ["nccl", "gloo"], "default": "nccl"},
            "nproc_per_node": {"type": "int", "default": 0},
            "nnodes": {"type": "int", "default": 1},
            "node_rank": {"type": "int", "default": 0},
            "master_addr": {"type": "str", "default": "127.0.0.1"},
            "master_port": {"type": "int", "default": 0},
            "min_bytes": {"type": "str", "default": "1M"},
            "max_bytes": {"type": "str", "default": "4G"},
            "factor": {"type": "int", "default": 2},
            "warmup": {"type": "int", "default": 5},
            "iters": {"type": "int", "default": 20},
            "cuda_graph": {"type": "bool", "default": False},
            "timeout": {"type": "int", "default": 600},
            "env": {"type": "dict", "default": {}},
            "expect_transport": {"type": "str", "default": "auto",
                                 "choices": ["auto", "any", "nvlink", "infiniband", "pcie", "shm", "socket"]},
            "p2p_over_nvlink": {"type": "bool"},
            "gpu_name": {"type": "str"},
            "nics_per_node": {"type": "int", "default": 1},
            "thresholds": {"type": "dict", "default": {}},
            "fail_on_warn": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    host = os.uname().nodename
    for name in ("python", "script"):
        if not os.path.isfile(params[name]):
            module.fail_json(msg=f"nccl_probe on {host}: {name} {params[name]!r} does not exist; "
                                 f"expected the path of the {'PyTorch interpreter' if name == 'python' else 'probe script'}")
    if params["nnodes"] > 1 and not params["master_port"]:
        module.fail_json(msg=f"nccl_probe on {host}: master_port is 0 with nnodes={params['nnodes']}; "
                             "expected one fixed port that every node uses")
    unknown = sorted(set(params["thresholds"]) - {"pass_gbps", "fail_below_gbps"})
    if unknown:
        module.fail_json(msg=f"nccl_probe on {host}: thresholds has unknown keys {unknown}; "
                             "expected pass_gbps and/or fail_below_gbps")
    try:
        for min_max in ("min_bytes", "max_bytes"):
            allreduce_bandwidth.parse_size(params[min_max])
    except allreduce_bandwidth.BandwidthError as exc:
        module.fail_json(msg=f"nccl_probe on {host}: {exc}")

    command = probe_command(params)
    rc, stdout, stderr = run_probe(command, params["env"], params["timeout"])
    doc = parse_probe_output(stdout)
    if doc is None:
        module.fail_json(msg=f"nccl_probe on {host}: the probe printed no JSON document (exit code {rc}); "
                             f"expected one from {params['script']}", rc=rc, stderr=stderr[-4000:], cmd=command)
    probe = {k: v for k, v in doc.items() if k not in ("sweep", "nccl_debug_log")}
    if not doc.get("ok"):
        module.fail_json(msg=f"nccl_probe on {host}: the probe failed: {doc.get('error')}; "
                             f"expected every one of {doc.get('world_size', '?')} ranks to finish with correct sums",
                         probe=probe, rc=rc, stderr=stderr[-4000:])
    result = evaluate(params, doc)
    verdict = result["verdict"]
    outcome = {"changed": False, "probe": probe, "sweep": result["sweep"], "transport": result["transport"],
               "verdict": verdict, "gpu_name": result["gpu_name"]}
    failing = verdict["status"] == "fail" or (params["fail_on_warn"] and verdict["status"] == "warn")
    if failing:
        metric = verdict["metric"]
        module.fail_json(
            msg=f"nccl_probe on {host}: {verdict['status']}: {'; '.join(verdict['reasons'])} "
                f"(busbw {metric['busbw_gbps']:.1f} GB/s at {metric['size_bytes']} bytes, "
                f"transport {verdict['transport']}, expected {verdict['expected_transport']})",
            **outcome)
    module.exit_json(**outcome)


if __name__ == "__main__":
    main()
