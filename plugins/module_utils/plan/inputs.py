"""A checked plan request: every input validated once, in a fixed order, into one ``Inputs`` object.

``prepare(request)`` is the planner's first step; the layout search, the memory
model and the renderers read only its attributes. An error names the input as
the request's user wrote it (plan/request.py).

Pure Python, no Ansible import.
"""

from __future__ import annotations

import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import serve_args, vllm_versions
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import (
    NAME,
    PlanError,
    boolean,
    from_text,
    integer,
    is_number,
    kind_of,
    mapping,
    optional_integer,
    positive,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.gpu_names import nvlink_from_name
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.kv_cache import KV_CACHE_DTYPES
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.memory import BLOCK_SIZE
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.network_env import (
    NetworkEnvError,
    network_env,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.ray_auth import RAY_AUTH_MODES
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.request import DEVICES, LOAD_FORMATS

DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vLLM 0.32/0.33 default
DEFAULT_MAX_MODEL_LEN = 8192  # the seed's value
DEFAULT_CONCURRENCY_TARGET = 16  # full-length requests one replica must hold by default
TARGETS = (
    "max_model_len",
    "gpu_memory_utilization",
    "kv_tokens_target",
    "concurrency_target",
    "throughput_need_tok_s",
    "replica_throughput_tok_s",
)
NODE_KEYS = ("name", "address", "fabric_interface", "ib_hcas", "gpus", "gpu_ids", "cpu_core_ids")


class Inputs:
    """Validated inputs; attributes only (set by ``prepare``)."""

    def moe_shared_dp(self, cand):
        """MoE DP ranks share one world (attention DP + EP), dense DP replicas do not."""
        return self.spec["is_moe"] and cand.dp > 1

    def independent_replicas(self, cand):
        """Dense DP replicas inside a node each: every node runs its own ``vllm serve`` (plan/nodes.py)."""
        return cand.dp > 1 and not self.spec["is_moe"] and not cand.ep_on and cand.r == 1


def check_cluster(cluster):
    if not isinstance(cluster, list) or not cluster:
        raise PlanError("cluster must be a non-empty list of nodes {name, address, gpus, [fabric_interface]}")
    nodes, names, addresses = [], set(), set()
    for index, node in enumerate(cluster):
        where = f"cluster node #{index}"
        if not isinstance(node, dict):
            raise PlanError(f"{where} must be a mapping, got {kind_of(node)}")
        unknown = sorted(str(k) for k in node if k not in NODE_KEYS)
        if unknown:
            raise PlanError(
                f"{where} has unknown keys {unknown}; expected {', '.join(NODE_KEYS)}"
            )
        name, address = node.get("name"), node.get("address", node.get("name"))
        if not isinstance(name, str) or not NAME.match(name):
            raise PlanError(f"{where} needs a name of letters, digits, '.', '_' or '-', got {name!r}")
        if not isinstance(address, str) or not address.strip() or any(c.isspace() for c in address):
            raise PlanError(f"node {name}: address must be a host name or IP address, got {address!r}")
        if name in names:
            raise PlanError(f"node name {name} appears twice in the cluster")
        if address in addresses:
            raise PlanError(f"node {name}: address {address} is already used by another node")
        names.add(name)
        addresses.add(address)
        nodes.append({"name": name, "address": address, **_node_gpus_and_network(name, address, node)})
    return nodes


def _node_gpus_and_network(name, address, node):
    gpus = node.get("gpus")
    if not isinstance(gpus, dict):
        raise PlanError(f"node {name}: gpus must be a mapping {{count, name, memory_total_mib, nvlink}}, got {gpus!r}")
    missing = [k for k in ("count", "name", "memory_total_mib") if k not in gpus]
    if missing:
        raise PlanError(f"node {name}: gpus lacks {missing} (the gpu_facts summary keys)")
    count = integer(from_text(gpus["count"], "int"), f"node {name}: gpus.count")
    if gpus["name"] is None:
        raise PlanError(f"node {name} mixes GPU models (gpus.name is null): the GPUs of a replica must be identical")
    if not isinstance(gpus["name"], str) or not gpus["name"].strip():
        raise PlanError(f"node {name}: gpus.name must be a non-empty string, got {gpus['name']!r}")
    memory = positive(from_text(gpus["memory_total_mib"], "number"), f"node {name}: gpus.memory_total_mib")
    # vLLM budgets gpu_memory_utilization x the total CUDA reports, which is nvidia-smi's FB total
    # minus the driver's reserve (gpu_facts: memory_cuda_total_mib; 616 MiB on an H200).
    if gpus.get("memory_cuda_total_mib") is not None:
        memory = positive(from_text(gpus["memory_cuda_total_mib"], "number"),
                          f"node {name}: gpus.memory_cuda_total_mib")
    gpu_ids = _gpu_ids(name, node.get("gpu_ids"), count)
    if gpu_ids is not None:
        count = len(gpu_ids)
    nvlink, nvlink_source, nvlink_why = _nvlink(name, gpus, count)
    interface = node.get("fabric_interface")
    hcas = node.get("ib_hcas")
    env = {}
    if interface is not None or hcas:
        if interface is None:
            raise PlanError(f"node {name}: ib_hcas given without a fabric_interface")
        try:
            env = network_env(interface, address, hcas)
        except NetworkEnvError as exc:
            raise PlanError(f"node {name}: {exc}") from None
    return {
        "fabric_interface": interface,
        "network_env": env,
        "gpus": {"count": count, "name": gpus["name"].strip(), "memory_total_mib": memory, "nvlink": nvlink},
        "nvlink_source": nvlink_source,
        "nvlink_why": nvlink_why,
        "gpu_ids": gpu_ids,
        "cpu_core_ids": _cpu_core_ids(name, node.get("cpu_core_ids")),
    }


def _cpu_core_ids(name, value):
    """vllm_cluster_cpu_core_ids: the node's cores in the order its CPU workers take them (CPU platform).

    Nodes that share one machine's cores (the lab's containers) each start on a different core: two vLLM workers
    bound to one core stall each other, since each busy-waits on its queue for a second after every step.
    """
    if value is None:
        return None
    if isinstance(value, list):
        value = [from_text(core, "int") for core in value]
    if (not isinstance(value, list) or not value
            or not all(isinstance(core, int) and not isinstance(core, bool) and core >= 0 for core in value)
            or len(set(value)) != len(value)):
        raise PlanError(f"node {name}: vllm_cluster_cpu_core_ids must be a non-empty list of distinct core ids "
                        f"(integers from 0), got {value!r}")
    return value


def _nvlink(name, gpus, count):
    """(nvlink, source, what the GPU name says) of a node: declared, gathered, else from the GPU name.

    Sources: ``declared`` (gpus.nvlink given), ``gathered`` (gpu_facts' summary: its ``links`` matrix is what
    ``nvidia-smi topo -m`` showed), ``single GPU``, ``gpu name`` (plan/gpu_names.py) or ``assumed`` (a name
    that table does not know: no NVLink, the seed's answer without its NVLink exception; a warning says so).
    """
    given = gpus.get("nvlink")
    if given is not None:
        source = "gathered" if "links" in gpus else "declared"
        return boolean(from_text(given, "bool"), f"node {name}: gpus.nvlink"), source, None
    if count < 2:
        return False, "single GPU", None
    nvlink, what = nvlink_from_name(gpus["name"].strip(), count)
    if nvlink is None:
        return False, "assumed", None
    return nvlink, "gpu name", what


def _gpu_ids(name, value, count):
    """vllm_cluster_gpu_ids: the machine's GPUs this deployment uses (a machine shared on disjoint GPUs)."""
    if value is None:
        return None
    if isinstance(value, list):
        value = [from_text(gpu, "int") for gpu in value]
    if (not isinstance(value, list) or not value
            or not all(isinstance(gpu, int) and not isinstance(gpu, bool) for gpu in value)
            or len(set(value)) != len(value)):
        raise PlanError(f"node {name}: vllm_cluster_gpu_ids must be a non-empty list of distinct GPU indices, "
                        f"got {value!r}")
    outside = [gpu for gpu in value if not 0 <= gpu < count]
    if outside:
        raise PlanError(f"node {name}: vllm_cluster_gpu_ids {value} names GPU {outside[0]}, but the node has "
                        f"{count} GPU(s) (indices 0-{count - 1})")
    return sorted(value)


def check_ports(request, mode):
    """The ports the mode opens, defaults filled in, every port distinct."""
    ports = request.get("ports")
    given = mapping(ports, "ports", launch.DEFAULT_PORTS)
    merged = dict(launch.DEFAULT_PORTS)
    for key, value in given.items():
        merged[key] = integer(from_text(value, "int"), request.label("ports", key), 1, 65535)
    opened = {key: merged[key] for key in mode.ports}
    seen = {}
    for key, value in opened.items():
        if key in ("ray_min_worker", "ray_max_worker"):
            continue
        if value in seen:
            raise PlanError(f"ports.{key} and ports.{seen[value]} are both {value}; every port must differ")
        seen[value] = key
    refusal = mode.check_ports(opened)
    if refusal:
        raise PlanError(refusal)
    return dict(sorted(opened.items()))


def prepare(request):
    """Check every input of ``request`` (a PlanRequest) and return the Inputs the planner reads."""
    inputs = Inputs()
    inputs.request = request
    device = request.get("device")
    if device not in DEVICES:
        raise PlanError(f"{request.label('device')} must be 'cuda' or 'cpu', got {device!r}")
    inputs.device = device
    deployment = request.get("deployment")
    if not isinstance(deployment, str) or not NAME.match(deployment):
        raise PlanError(
            f"{request.label('deployment')} must be a name of letters, digits, '.', '_' or '-', got {deployment!r}"
        )
    inputs.deployment = deployment
    vllm_version = request.get("vllm_version")
    if not isinstance(vllm_version, str) or not re.match(r"^\d+\.\d+(\.\d+)?", vllm_version):
        raise PlanError(f"{request.label('vllm_version')} must look like 0.32.0, got {vllm_version!r}")
    unsupported = vllm_versions.version_problem(vllm_version, request.label("vllm_version"))
    if unsupported:
        raise PlanError(unsupported)
    inputs.vllm_version = vllm_version
    inputs.allow_tp_across_nodes = boolean(request.get("allow_tp_across_nodes"),
                                           request.label("allow_tp_across_nodes"))
    inputs.cpu_kvcache_space_gib = integer(request.get("cpu_kvcache_space_gib"),
                                           request.label("cpu_kvcache_space_gib"))
    inputs.cpu_cores_per_node = optional_integer(request.get("cpu_cores_per_node"),
                                                 request.label("cpu_cores_per_node"))
    load_format = request.get("load_format")
    if load_format is not None and load_format not in LOAD_FORMATS:
        raise PlanError(f"{request.label('load_format')} must be one of {list(LOAD_FORMATS)}, got {load_format!r}")
    inputs.load_format = load_format
    kv_cache_dtype = request.get("kv_cache_dtype")
    if kv_cache_dtype is not None and kv_cache_dtype not in KV_CACHE_DTYPES:
        raise PlanError(
            f"{request.label('kv_cache_dtype')} must be one the planner models, {list(KV_CACHE_DTYPES)}; "
            f"got {kv_cache_dtype!r}")
    inputs.kv_cache_dtype = kv_cache_dtype or "auto"
    api_host = request.get("api_host")
    if api_host is not None and (not isinstance(api_host, str) or not api_host or any(c.isspace() for c in api_host)):
        raise PlanError(f"{request.label('api_host')} must be an address to bind, got {api_host!r}")
    inputs.api_host = api_host
    api_guard = request.get("api_guard")
    inputs.api_guard = True if api_guard is None else boolean(api_guard, request.label("api_guard"))
    ray_auth_mode = "token" if request.get("ray_auth") is None else request.get("ray_auth")
    if ray_auth_mode not in RAY_AUTH_MODES:
        raise PlanError(f"{request.label('ray_auth')} must be one of {list(RAY_AUTH_MODES)}, got {ray_auth_mode!r}")
    inputs.ray_auth = ray_auth_mode

    overrides = mapping(request.section("overrides"), "overrides", ("tp", "pp", "dp", "ep", "backend"))
    try:
        mode = launch.get(overrides.pop("backend", launch.DEFAULT))
    except launch.UnknownLaunchMode as exc:
        raise PlanError(str(exc).replace("backend", request.label("overrides.backend"), 1)) from None
    inputs.cpu_ray_support = boolean(request.get("cpu_ray_support"), request.label("cpu_ray_support"))
    refusal = mode.refuse_device(device, inputs.cpu_ray_support)
    if refusal:
        raise PlanError(
            f"{request.setting('overrides.backend', mode.name)} with {request.name('device')}={device}: {refusal}; "
            f"expected {request.name('cpu_ray_support')}=true where the nodes' runtime carries a vLLM platform plugin "
            "that gives the CPU platform a Ray device key (docs/planner.md, \"Backend ray on the CPU platform\"), "
            "else backend mp")
    inputs.mode = mode
    inputs.backend = mode.name
    inputs.pins = {key: integer(value, request.label(f"overrides.{key}")) for key, value in overrides.items()}

    try:
        spec = mc.load_model(request.values["model"], request.get("model_path"))
    except mc.ModelConfigError as exc:
        raise PlanError(f"{request.label('model')}: {exc}") from None
    inputs.spec = spec
    inputs.moe_prefix = _moe_prefix(spec)
    inputs.layer_cache = {}
    inputs.block_size = BLOCK_SIZE[(device, spec["attention"] == "mla")]

    inputs.nodes = check_cluster(request.values.get("cluster"))
    first = inputs.nodes[0]["gpus"]
    inputs.n_nodes = len(inputs.nodes)
    inputs.gpus_per_node = first["count"]
    inputs.gpu_name = first["name"]
    inputs.gpu_memory_bytes = first["memory_total_mib"] * 1024 * 1024
    inputs.nvlink = first["nvlink"]
    inputs.nvlink_source = inputs.nodes[0]["nvlink_source"]
    inputs.nvlink_why = inputs.nodes[0]["nvlink_why"]

    _prepare_targets(inputs, request, spec)
    _prepare_flags(inputs, request, spec)
    serve_args.prepare(inputs, request)  # vLLM's own flags: may set the KV dtype, block size and weight bytes
    inputs.ports = check_ports(request, mode)
    return inputs


def _prepare_targets(inputs, request, spec):
    targets = mapping(request.section("targets"), "targets", TARGETS)
    limit = spec["max_model_len_limit"]
    default_len = DEFAULT_MAX_MODEL_LEN if limit is None else min(DEFAULT_MAX_MODEL_LEN, limit)
    inputs.max_model_len = integer(targets.get("max_model_len", default_len), request.label("targets.max_model_len"))
    if limit is not None and inputs.max_model_len > limit:
        factor, rope_type = spec["_rope_scaling"]
        what = f"max_position_embeddings {spec['max_position_embeddings']:,}"
        if rope_type is not None:
            what = f"limit {limit:,} ({what} x rope_scaling factor {factor:g}, {rope_type})"
        raise PlanError(
            f"max_model_len {inputs.max_model_len:,} exceeds the model's {what}: "
            "vLLM refuses it (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"
        )
    utilization = targets.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION)
    if not is_number(utilization) or not 0 < utilization <= 1:
        raise PlanError(f"{request.label('targets.gpu_memory_utilization')} must be in (0, 1], got {utilization!r}")
    inputs.gpu_memory_utilization = float(utilization)
    inputs.kv_tokens_target = optional_integer(targets.get("kv_tokens_target"),
                                               request.label("targets.kv_tokens_target"))
    concurrency = targets.get("concurrency_target")
    inputs.target_is_default = concurrency is None and inputs.kv_tokens_target is None
    if concurrency is None:
        inputs.concurrency_target = DEFAULT_CONCURRENCY_TARGET if inputs.kv_tokens_target is None else 1.0
    else:
        inputs.concurrency_target = positive(concurrency, request.label("targets.concurrency_target"))
    need = targets.get("throughput_need_tok_s")
    inputs.throughput_need = None if need is None else positive(need, request.label("targets.throughput_need_tok_s"))
    baseline = targets.get("replica_throughput_tok_s")
    inputs.replica_throughput = (
        None if baseline is None else positive(baseline, request.label("targets.replica_throughput_tok_s"))
    )


def _prepare_flags(inputs, request, spec):
    enforce_eager = request.get("enforce_eager")
    if enforce_eager is not None:
        boolean(enforce_eager, request.label("enforce_eager"))
    inputs.enforce_eager_given = enforce_eager
    inputs.enforce_eager = bool(enforce_eager)  # CPU default decided once PP is known
    enable_eplb = request.get("enable_eplb")
    if enable_eplb is not None:
        boolean(enable_eplb, request.label("enable_eplb"))
    inputs.enable_eplb = enable_eplb
    inputs.eplb = False
    inputs.eplb_disabled_reason = None
    if inputs.device != "cpu":
        return
    if spec["head_dim"] < 32:
        raise PlanError(f"head_dim {spec['head_dim']} of {spec['name']}: the CPU attention backend needs head_dim >= 32")
    if spec["is_moe"] and (spec["hidden_size"] % 32 or spec["moe_intermediate_size"] % 32):
        raise PlanError(
            f"{spec['name']} on CPU: the CPU MoE kernel needs hidden_size ({spec['hidden_size']}) and the expert "
            f"intermediate size ({spec['moe_intermediate_size']}) divisible by 32"
        )
    if enable_eplb:
        raise PlanError(
            f"{request.label('enable_eplb')} on the CPU platform: Expert parallelism load balancing is only "
            "supported on CUDA devices or ROCm devices or XPU devices now"
        )


def _moe_prefix(spec):
    """prefix[i] = MoE layers among the first i layers."""
    moe = spec["_moe_layer_set"]
    prefix = [0]
    for index in range(spec["layers"]):
        prefix.append(prefix[-1] + (1 if index in moe else 0))
    return prefix
