"""vLLM's own flags (``serve_args``, ``vllm_cluster_serve_args``): checked, fed to the planner, rendered.

An inventory maps vLLM flag names (without the dashes) to values::

    vllm_cluster_serve_args: {max-num-seqs: 128, kv-cache-dtype: fp8, enable-prefix-caching: true}

``prepare(inputs, request)`` checks them once (plan/inputs.py calls it):

- the names: ``[a-z0-9-]`` after ``_`` -> ``-`` (``max_num_seqs`` is ``max-num-seqs``); vLLM's
  short aliases (``tp``, ``q``, ...) stand for their long flag;
- the flags the plan owns (sizes, ports, host, the multi-node flags, every
  ``data-parallel-*``, max-model-len, gpu-memory-utilization, ...) are refused with the
  input to use instead, named the way the user writes inputs (plan/request.py);
- the flags that change memory feed the planner (``MODELLED``): ``kv-cache-dtype``,
  ``max-num-seqs``, ``max-num-batched-tokens``, ``block-size``, ``cpu-offload-gb``,
  ``quantization``; ``served-model-name`` names the API's model (default: the deployment);
- every other flag passes through unmodelled.

``argv(inputs)`` renders what passes through, sorted by name, the same on every node:
``true`` -> ``--flag``, ``false`` -> ``--no-flag`` (vLLM's BooleanOptionalAction; nothing for
its few store-true flags), a list -> the flag and each item, a mapping -> its JSON text.

Pure Python, no Ansible import.
"""

from __future__ import annotations

import json
import math
import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import vllm_versions
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import (
    GIB,
    PlanError,
    is_int,
    is_number,
    kind_of,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.kv_cache import KV_CACHE_DTYPES

KEY = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# vLLM's --shutdown-timeout for a dense model's independent servers (plan/nodes.py), unless serve_args sets one:
# on SIGTERM a server finishes its requests in flight for up to this long (a rolling change, docs/router.md).
DRAIN_S = 30

# vLLM 0.32's short option strings of `vllm serve` (its parser's option_string_actions), by their long flag.
ALIASES = {
    "tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "dp": "data-parallel-size",
    "dpn": "data-parallel-rank", "dpr": "data-parallel-start-rank", "dpl": "data-parallel-size-local",
    "dpa": "data-parallel-address", "dpp": "data-parallel-rpc-port", "dpb": "data-parallel-backend",
    "dph": "data-parallel-hybrid-lb", "dpe": "data-parallel-external-lb",
    "dpm": "data-parallel-multi-port-external-lb", "ep": "enable-expert-parallel", "n": "nnodes", "r": "node-rank",
    "q": "quantization", "asc": "api-server-count", "dcp": "decode-context-parallel-size",
    "pcp": "prefill-context-parallel-size", "cc": "compilation-config", "ac": "attention-config",
    "sc": "speculative-config", "dc": "diffusion-config",
}

_BACKEND = ("overrides.backend", None, "the plan sets the multi-node flags from its nodes")
# Flags the plan sets: (the input to use instead, its entry, a note).
OWNED = {
    "model": ("model_path", None, None),
    "tensor-parallel-size": ("overrides.tp", None, None),
    "pipeline-parallel-size": ("overrides.pp", None, None),
    "data-parallel-size": ("overrides.dp", None, None),
    "port": ("ports", "api", None),
    "host": ("api_host", None, None),
    "max-model-len": ("targets.max_model_len", None, None),
    "gpu-memory-utilization": ("targets.gpu_memory_utilization", None, None),
    "nnodes": _BACKEND,
    "node-rank": _BACKEND,
    "master-addr": _BACKEND,
    "headless": _BACKEND,
    "distributed-executor-backend": _BACKEND,
    "master-port": ("ports", "master", None),
    "data-parallel-rpc-port": ("ports", "dp_rpc", None),
    "enable-expert-parallel": ("overrides.ep", None, None),
    "enable-eplb": ("enable_eplb", None, None),
    "enforce-eager": ("enforce_eager", None, None),
    "load-format": ("load_format", None, None),
    "kv-cache-memory-bytes": ("targets.gpu_memory_utilization", None,
                              "the plan sizes the KV cache; on CPU vllm_cluster_cpu_kvcache_space_gib"),
    "num-gpu-blocks-override": ("targets.gpu_memory_utilization", None,
                                "the plan sizes the KV cache; on CPU vllm_cluster_cpu_kvcache_space_gib"),
}
DATA_PARALLEL_PREFIX = "data-parallel-"
# Refused with a sentence, not an input.
REFUSED = {
    "api-key": "the API key is vllm_cluster_api_key, kept in a 0600 env file and never in argv",
    "decode-context-parallel-size": "context parallel is not modelled by the planner (it changes the world size)",
    "prefill-context-parallel-size": "context parallel is not modelled by the planner (it changes the world size)",
}
# Flags whose value is never shown in a message.
SECRET = ("api-key",)
# Flags the planner models (docs/planner.md, "vLLM's own flags").
MODELLED = ("block-size", "cpu-offload-gb", "kv-cache-dtype", "max-num-batched-tokens", "max-num-seqs",
            "quantization", "served-model-name")
# Flags that change memory but are passed through unmodelled: the plan warns.
UNMODELLED_MEMORY = ("dtype", "enable-chunked-prefill", "enable-lora", "hf-overrides", "max-cpu-loras",
                     "max-lora-rank", "max-loras", "speculative-config")
# vLLM's store-true flags (no --no- form): false leaves them out.
STORE_TRUE = ("aggregate-engine-logging", "disable-log-stats", "grpc")
# Online quantization of an unquantized checkpoint: bytes per linear weight (scales: one float32 per tensor).
ONLINE_QUANTIZATION = {"fp8": 1.0}
# CUDA attention backends take blocks in multiples of 16 (FlashAttention); vLLM's CPU MLA forces 16.
CUDA_BLOCK_MULTIPLE = 16
CPU_BLOCK_PREFERRED_MULTIPLE = 32


def parse_cli(items):
    """``--serve-arg KEY=VALUE`` (repeatable) as a mapping; values read like YAML scalars."""
    if items is None:
        return None
    result = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise PlanError(f"--serve-arg {item} must be KEY=VALUE (a vLLM flag without its dashes)")
        key = key.strip()
        if key in result:
            raise PlanError(f"--serve-arg {key} is given twice")
        result[key] = scalar(text)
    return result


def scalar(text):
    """A command-line value as YAML reads a plain scalar: true/false, integers, floats, JSON lists and mappings."""
    stripped = text.strip()
    lowered = stripped.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if re.fullmatch(r"[+-]?\d+", stripped):
        return int(stripped)
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+|\.\d+[eE][+-]?\d+)", stripped):
        return float(stripped)
    if stripped[:1] in ("[", "{"):
        try:
            return json.loads(stripped)
        except ValueError:
            return text
    return text


def _shown(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _check_value(request, key, value):
    where = request.setting("serve_args", _shown(value), key)
    if value is None:
        raise PlanError(f"{where}: --{key} needs a value (true for a switch)")
    if isinstance(value, bool):
        if value is False and key.startswith("no-"):
            raise PlanError(f"{where}: write {key[3:]}: true instead of a doubled negation")
        return
    if isinstance(value, str):
        if any(char in value for char in "\n\r\0"):
            raise PlanError(f"{where}: --{key}'s value must be one line")
        return
    if is_number(value):
        return
    if isinstance(value, list):
        if not value or not all(isinstance(item, str) or is_number(item) for item in value):
            raise PlanError(f"{where}: a list for --{key} must hold strings or numbers, at least one")
        if any(isinstance(item, str) and any(c in item for c in "\n\r\0") for item in value):
            raise PlanError(f"{where}: --{key}'s values must be one line each")
        return
    if isinstance(value, dict):
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise PlanError(f"{where}: a mapping for --{key} must be plain JSON") from None
        return
    raise PlanError(f"{where}: --{key} takes a string, a number, true/false, a list or a mapping")


def normalise(request):
    """The serve_args mapping with vLLM's long flag names, plan-owned flags refused (PlanError)."""
    given = request.get("serve_args")
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise PlanError(
            f"{request.label('serve_args')} must be a mapping of vLLM flag names to values "
            f"(max-num-seqs: 128), got {kind_of(given)}")
    result, written = {}, {}
    for raw, value in given.items():
        if not isinstance(raw, str):
            raise PlanError(f"{request.label('serve_args')}: flag name {raw!r} must be a string")
        if raw.startswith("-"):
            raise PlanError(f"{request.setting('serve_args', _shown(value), raw)}: name the flag without its dashes "
                            f"({raw.lstrip('-')})")
        key = raw.replace("_", "-")
        if not KEY.match(key):
            raise PlanError(f"{request.setting('serve_args', _shown(value), raw)}: a vLLM flag name is lower-case "
                            "letters, digits and '-'")
        flag = f"-{key}" if key in ALIASES else f"--{key}"
        key = ALIASES.get(key, key)
        _refuse_owned(request, raw, flag, key, value)
        if key in result:
            raise PlanError(f"{request.label('serve_args')} sets --{key} twice ({written[key]} and {raw})")
        _check_value(request, raw, value)
        result[key] = value
        written[key] = raw
    return dict(sorted(result.items()))


def _refuse_owned(request, raw, flag, key, value):
    base = key[3:] if key.startswith("no-") else key
    where = request.setting("serve_args", "(hidden)" if base in SECRET else _shown(value), raw)
    if base in REFUSED:
        raise PlanError(f"{where}: {flag} is refused: {REFUSED[base]}")
    owner = OWNED.get(base)
    if owner is None and base.startswith(DATA_PARALLEL_PREFIX):
        owner = ("overrides.dp", None, "the plan sets every data-parallel flag")
    if owner is None:
        return
    use_key, sub, note = owner
    raise PlanError(f"{where}: {flag} is set by the plan; use {request.name(use_key, sub)} instead"
                    + (f" ({note})" if note else ""))


def prepare(inputs, request):
    """Check serve_args and feed the modelled flags into ``inputs`` (call once the model and cluster are known).

    Sets ``serve_args`` (every flag, normalised), ``serve_passthrough`` (what serve_argv renders),
    ``served_model_names``, ``max_num_seqs``, ``max_num_batched_tokens``, ``cpu_offload_bytes``,
    ``serve_warnings``; changes ``kv_cache_dtype``, ``block_size`` and the model's weight bytes.
    """
    args = normalise(request)
    inputs.serve_args = args
    inputs.serve_warnings = []
    passthrough = dict(args)

    def setting(key):
        return request.setting("serve_args", _shown(args[key]), key)

    for key in args:  # what this vLLM release dropped, deprecated or does not have yet
        problem = vllm_versions.flag_problem(inputs.vllm_version, key)
        if problem:
            raise PlanError(f"{setting(key)}: {problem}")

    def integer(key, minimum=1):
        value = args.get(key)
        if value is None:
            return None
        if not is_int(value) or value < minimum:
            raise PlanError(f"{setting(key)}: --{key} must be an integer >= {minimum}")
        return value

    names = passthrough.pop("served-model-name", None)
    if names is None:
        names = [inputs.deployment]
    elif isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() and not any(c.isspace() for c in n)
                                              for n in names):
        raise PlanError(f"{setting('served-model-name')}: --served-model-name takes names without spaces "
                        "(a list serves several; the first is the API's model id)")
    inputs.served_model_names = names

    dtype = passthrough.pop("kv-cache-dtype", None)
    if dtype is not None:
        if dtype not in KV_CACHE_DTYPES:
            raise PlanError(f"{setting('kv-cache-dtype')}: --kv-cache-dtype must be one the planner models, "
                            f"{list(KV_CACHE_DTYPES)}")
        given = request.get("kv_cache_dtype")
        if given is not None and given != dtype:
            raise PlanError(f"{setting('kv-cache-dtype')} differs from "
                            f"{request.setting('kv_cache_dtype', given)}: set one of them")
        inputs.kv_cache_dtype = dtype

    inputs.max_num_seqs = integer("max-num-seqs")
    inputs.max_num_batched_tokens = integer("max-num-batched-tokens")
    if inputs.max_num_seqs is not None and inputs.max_num_batched_tokens is not None \
            and inputs.max_num_batched_tokens < inputs.max_num_seqs:
        raise PlanError(
            f"{setting('max-num-batched-tokens')} is below max-num-seqs {inputs.max_num_seqs}: vLLM refuses it "
            f"(max_num_batched_tokens ({inputs.max_num_batched_tokens}) must be greater than or equal to "
            f"max_num_seqs ({inputs.max_num_seqs}))")

    block = integer("block-size")
    if block is not None:
        _check_block(inputs, setting("block-size"), block)
        inputs.block_size = block

    inputs.cpu_offload_bytes = 0
    offload = args.get("cpu-offload-gb")
    if offload is not None:
        if not is_number(offload) or offload < 0:
            raise PlanError(f"{setting('cpu-offload-gb')}: --cpu-offload-gb must be a number of GiB >= 0 (per GPU)")
        if inputs.device == "cpu" and offload:
            raise PlanError(f"{setting('cpu-offload-gb')}: the CPU platform keeps its weights in memory already; "
                            "--cpu-offload-gb is for GPUs")
        inputs.cpu_offload_bytes = offload * GIB

    quantization = args.get("quantization")
    if quantization is not None:
        inputs.spec = _quantized(inputs.spec, setting("quantization"), quantization)

    unmodelled = [f"--{key}" for key in passthrough if key in UNMODELLED_MEMORY]
    if unmodelled:
        verb = "changes" if len(unmodelled) == 1 else "change"
        inputs.serve_warnings.append(
            f"{', '.join(unmodelled)} {verb} memory the planner does not model: vLLM's KV cache may differ "
            "from the plan's (verify compares within the plan's tolerance).")
    inputs.serve_passthrough = passthrough


def _check_block(inputs, where, block):
    mla = inputs.spec["attention"] == "mla"
    if inputs.device == "cuda" and block % CUDA_BLOCK_MULTIPLE:
        raise PlanError(f"{where}: --block-size must be a multiple of {CUDA_BLOCK_MULTIPLE} on CUDA "
                        "(the attention backends' kernel block sizes)")
    if inputs.device == "cpu" and mla and block != 16:
        raise PlanError(f"{where}: vLLM's CPU MLA backend always uses block_size 16 (it overrides any other)")
    if inputs.device == "cpu" and block % CPU_BLOCK_PREFERRED_MULTIPLE:
        inputs.serve_warnings.append(
            f"--block-size {block} is not a multiple of {CPU_BLOCK_PREFERRED_MULTIPLE}: vLLM's CPU backend "
            "works but says it is not optimized.")


def _quantized(spec, where, method):
    """The model with ``--quantization`` applied: online quantization of an unquantized checkpoint."""
    if not isinstance(method, str):
        raise PlanError(f"{where}: --quantization takes a method name")
    if spec.get("weights_source") == "given":
        return spec  # the operator's weights_gib is what vLLM loads
    current = spec.get("quantization")
    if current is not None:
        if method in (current, f"{current}_marlin") or (current, method) == ("gptq", "marlin"):
            return spec
        raise PlanError(f"{where}: the checkpoint is quantized with {current}; vLLM refuses another method "
                        f"(Quantization method specified in the model config ({current}) does not match the "
                        f"quantization method specified in the `quantization` argument ({method}))")
    if method not in ONLINE_QUANTIZATION:
        raise PlanError(f"{where}: online quantization with {method} is not modelled (modelled: "
                        f"{', '.join(ONLINE_QUANTIZATION)}); {mc.OVERRIDE_HINT}")
    quantized = dict(spec)
    quantized["quantization"] = f"{method} (online)"
    quantized["weight_bytes_per_param"] = ONLINE_QUANTIZATION[method]
    quantized["weights_gib"] = round(mc.model_bytes(quantized) / GIB, 3)
    return quantized


def _rendered(key, value):
    if value is True:
        return [f"--{key}"]
    if value is False:
        return [] if key in STORE_TRUE else [f"--no-{key}"]
    if isinstance(value, list):
        return [f"--{key}", *(_word(item) for item in value)]
    if isinstance(value, dict):
        return [f"--{key}", json.dumps(value, sort_keys=True, separators=(",", ":"))]
    return [f"--{key}", _word(value)]


def _word(value):
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


def served_argv(inputs):
    """``--served-model-name`` and its names (the deployment's name unless serve_args names it)."""
    return ["--served-model-name", *inputs.served_model_names]


def argv(inputs):
    """The flags that pass through (the modelled ones included), sorted by name: the same on every node."""
    words = []
    for key, value in inputs.serve_passthrough.items():
        words += _rendered(key, value)
    return words
