"""The layout on the nodes: one row per worker, then each node's role, ``vllm serve`` argv and environment.

``rank_table`` says where every rank runs and what vLLM's lines will say about
it (verify reads it through plan/expect.py); ``layout_nodes`` renders the
plan's ``nodes``: the launch mode decides which nodes run ``vllm serve``, which
are headless and the executor's arguments (launch/). ``data_parallel`` says how
the replicas of a DP plan run and why: a dense model's replicas are independent
servers (each node its own ``vllm serve`` and API server, no multi-node or
cross-node DP flags; a router fronts them), MoE keeps vLLM's DP.

Pure Python, no Ansible import.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import is_ip
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import serve_args
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import PlanError

# vllm-cluster's guard on every route of the API server (roles/vllm_service/files/vllm_cluster_api_guard.py,
# shipped by the vllm_service role): vLLM's own key covers only /v1, /v2, /inference and /cohere.
API_GUARD_MIDDLEWARE = "vllm_cluster_api_guard.ApiGuard"


def rank_table(inputs, cand):
    """One row per worker: where it runs and what vLLM's log lines will say about it."""
    rows, world = [], cand.world
    shared = inputs.moe_shared_dp(cand)
    for d in range(cand.dp):
        for w in range(world):
            tp_rank, pp_rank = w % cand.tp, w // cand.tp
            if cand.r > 1:
                node = d * cand.r + w // cand.local
                local_rank = w % cand.local
                device_index = local_rank
            else:
                node = d // cand.rpn
                local_rank = w
                device_index = (d % cand.rpn) * world + w
            ep_rank = (d if shared else 0) * cand.tp + tp_rank if inputs.spec["is_moe"] else None
            name = "Worker"
            if shared and cand.dp > 1:
                name += f"_DP{d}"
            if cand.pp > 1:
                name += f"_PP{pp_rank}"
            if cand.tp > 1:
                name += f"_TP{tp_rank}"
            if cand.ep_on:
                name += f"_EP{ep_rank}"
            engine = f"EngineCore_DP{d}" if cand.dp > 1 else "EngineCore"
            if inputs.independent_replicas(cand):  # the node's own vllm serve counts its replicas from 0
                engine = f"EngineCore_DP{d % cand.rpn}" if cand.rpn > 1 else "EngineCore"
            rows.append(
                {
                    "rank": d * world + w,
                    "node": inputs.nodes[node]["name"],
                    "node_index": node,
                    "device_index": device_index,
                    "local_rank": local_rank,
                    "dp": d,
                    "pp": pp_rank,
                    "tp": tp_rank,
                    "ep": ep_rank if cand.ep_on else None,
                    "process": name,
                    "engine": engine,
                    "log_rank": d * world + w if shared else w,
                    "log_world_size": world * cand.dp if shared else world,
                    "log_dp_rank": d if shared else 0,
                    "log_ep_rank": ep_rank,
                    "log_eplb_rank": ep_rank if inputs.eplb else None,
                }
            )
    return rows


def _cpu_binding(inputs, node, workers):
    """VLLM_CPU_OMP_THREADS_BIND: each worker's cores, ``|`` between workers (vLLM's CPU platform)."""
    if node.get("gpu_ids"):  # a shared machine on the CPU platform: lab GPU i is core i, so deployments bind apart
        return "|".join(str(core) for core in node["gpu_ids"][:workers])
    cores = inputs.cpu_cores_per_node if inputs.cpu_cores_per_node is not None else workers
    if cores < workers:
        raise PlanError(
            f"node {node['name']} runs {workers} CPU workers but has {cores} cores: "
            "VLLM_CPU_OMP_THREADS_BIND needs at least one core per worker"
        )
    ids = node.get("cpu_core_ids") or list(range(cores))
    if len(ids) < cores:
        raise PlanError(
            f"node {node['name']}: vllm_cluster_cpu_core_ids {ids} names {len(ids)} cores; expected at least {cores}"
            f" ({workers} CPU workers, cpu_cores_per_node {inputs.cpu_cores_per_node})")
    share = cores // workers
    return "|".join(_core_list(ids[index * share:(index + 1) * share]) for index in range(workers))


def _core_list(cores):
    """vLLM's core list text: ``0-3`` for a run, else ``5,2``."""
    if len(cores) > 1 and cores == list(range(cores[0], cores[0] + len(cores))):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(str(core) for core in cores)


def serve_argv(inputs, cand, node_rank, head_address):
    """``vllm serve`` for one node: the model, port, sizes, targets, the served name, vLLM's own flags
    (serve_args, sorted), then the launch mode's arguments (the only part that differs between nodes)."""
    spec, ports = inputs.spec, inputs.ports
    argv = ["vllm", "serve", spec["path"], "--port", str(ports["api"])]
    if inputs.api_host is not None:
        argv += ["--host", inputs.api_host]
    argv += ["--tensor-parallel-size", str(cand.tp), "--pipeline-parallel-size", str(cand.pp)]
    independent = inputs.independent_replicas(cand)
    local_dp = cand.rpn if independent else cand.dp  # independent servers: only the node's own replicas
    if local_dp > 1:
        argv += ["--data-parallel-size", str(local_dp)]
    if cand.ep_on:
        argv.append("--enable-expert-parallel")
    if inputs.eplb:
        argv.append("--enable-eplb")
    argv += ["--max-model-len", str(inputs.max_model_len),
             "--gpu-memory-utilization", f"{inputs.gpu_memory_utilization:g}"]
    if inputs.enforce_eager:
        argv.append("--enforce-eager")
    if inputs.load_format is not None:
        argv += ["--load-format", inputs.load_format]
    if inputs.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", inputs.kv_cache_dtype]
    if inputs.api_guard:
        argv += ["--middleware", API_GUARD_MIDDLEWARE]
    argv += serve_args.served_argv(inputs) + serve_args.argv(inputs)
    if independent and "shutdown-timeout" not in inputs.serve_passthrough:
        # A rolling change stops one of them at a time behind the router: its requests in flight finish first.
        argv += ["--shutdown-timeout", str(serve_args.DRAIN_S)]
    if independent:  # one node is the whole server: no --nnodes, --master-addr or DP RPC between replicas
        return argv + inputs.mode.executor_argv(1, local_dp, 0, head_address, ports)
    return argv + inputs.mode.executor_argv(cand.nnodes, cand.dp, node_rank, head_address, ports)


def node_env(inputs, node, workers):
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    local_model = inputs.spec["path"].startswith("/")
    if inputs.device == "cpu" or local_model:
        env["HF_HUB_OFFLINE"] = "1"
    if inputs.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(inputs.cpu_kvcache_space_gib)
        env["VLLM_CPU_OMP_THREADS_BIND"] = _cpu_binding(inputs, node, workers)
        if is_ip(node["address"]):
            env["VLLM_HOST_IP"] = node["address"]
    if node.get("gpu_ids"):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in node["gpu_ids"])
    env.update(node["network_env"])
    return dict(sorted(env.items()))


def layout_nodes(inputs, cand, rows):
    """The plan's ``nodes``: rank, role, ranks, GPUs, argv and env of every node the layout uses."""
    mode = inputs.mode
    independent = inputs.independent_replicas(cand)
    used = inputs.nodes[: cand.nnodes]
    head = used[0]
    by_node = {node["name"]: [] for node in used}
    for row in rows:
        by_node[row["node"]].append(row)
    result = []
    for index, node in enumerate(used):
        node_rows = by_node[node["name"]]
        ids = node.get("gpu_ids")
        runs_vllm = mode.runs_vllm(index)
        entry = {
            "node_rank": index,
            "host": node["name"],
            "address": node["address"],
            "role": "head" if index == 0 else "worker",
            "ranks": [row["rank"] for row in node_rows],
            # nvidia-smi's indices: on a shared machine, the node's vllm_cluster_gpu_ids (CUDA_VISIBLE_DEVICES)
            "local_gpus": sorted({ids[row["device_index"]] if ids else row["device_index"] for row in node_rows}),
            "dp_ranks": sorted({row["dp"] for row in node_rows}),
            "headless": False if independent else mode.headless(index),
            "runs_vllm": runs_vllm,
            "argv": serve_argv(inputs, cand, index, head["address"]) if runs_vllm else [],
            "env": node_env(inputs, node, len(node_rows)),
        }
        if runs_vllm:
            entry["env"] = dict(sorted({**entry["env"], **mode.vllm_env(head, inputs.ports)}.items()))
        if node["fabric_interface"]:
            entry["fabric_interface"] = node["fabric_interface"]
        if node.get("gpu_ids"):
            entry["gpu_ids"] = node["gpu_ids"]  # the deployment's GPUs of the machine (CUDA_VISIBLE_DEVICES)
        entry.update(mode.node_extras(node, head, len(entry["local_gpus"]), inputs.ports))
        result.append(entry)
    return result


def data_parallel(inputs, cand):
    """The plan's ``data_parallel``: how its replicas run (``mode``), its API servers and why, in one sentence.

    ``independent``: a dense model's DP replicas, each node its own ``vllm serve`` with its own API server
    (vLLM's advice for dense models: their replicas share nothing); ``replicas_per_server`` > 1 when a node
    holds several, which its one server runs as vLLM's DP inside the node. ``vllm``: vLLM's own DP, one API
    server on the head for every rank (MoE: its DP ranks share one world; a dense replica over several nodes).
    ``none``: one replica.
    """
    if cand.dp == 1:
        return {"mode": "none", "api_servers": 1, "replicas_per_server": 1, "why": "One replica: no data parallel."}
    if inputs.independent_replicas(cand):
        local = (f"; each node's {cand.rpn} replicas share its server as vLLM's DP inside the node"
                 if cand.rpn > 1 else "")
        return {
            "mode": "independent", "api_servers": cand.nnodes, "replicas_per_server": cand.rpn,
            "why": (f"Dense model: its {cand.dp} DP replicas share nothing (no expert layers to synchronise), so "
                    f"they run as {cand.nnodes} independent vLLM server(s), one per node, each with its own API "
                    f"server and no --nnodes, --master-addr or cross-node --data-parallel-* flags{local}; a "
                    "router (role vllm_router) spreads requests over them, and one that fails stops no other."),
        }
    if inputs.spec["is_moe"]:
        why = (f"MoE model: its {cand.dp} DP ranks share one world (expert layers run in lockstep over every DP "
               "rank), so they stay vLLM's DP, one API server on the head for every rank.")
    else:
        why = (f"Dense model, but each replica spans {cand.r} nodes: its {cand.dp} replicas stay vLLM's DP "
               "under one head (independent multi-node replicas, each with a head of its own, are not planned yet).")
    return {"mode": "vllm", "api_servers": 1, "replicas_per_server": cand.dp, "why": why}
