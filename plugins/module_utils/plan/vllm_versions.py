"""The vLLM releases a plan may target, and the flags and environment variables each one dropped or added.

``vllm_runtime_vllm_version`` (the release installed on the nodes) and the plan's ``vllm_version`` may be a
0.32 or a 0.33 release. What differs between them for an inventory comes from each release's own lists,
captured from its wheel in ``tests/fixtures/vllm/versions/<release>.json`` (``capture.py`` there reads the
``vllm serve`` parser's option strings and ``vllm.envs``' variables; ``tests/unit/test_vllm_versions.py`` holds
these tables to them):

- 0.33 removes the compiled-graph Ray executor (only RayExecutorV2 remains) and with it the environment variables
  that tuned it, and four ROCm (AITER) variables, one of them now ``--monokernel`` (``REMOVED_ENV``); vLLM warns
  of a ``VLLM_*`` variable it does not read (and refuses it with ``--fail-on-environ-validation``). 0.33 no longer
  depends on Ray, which the runtime role pins itself (``vllm_runtime_ray_version``);
- 0.33 deprecates ``--mamba-cache-mode`` (no effect) and ``--ir-op-priority``; both releases still accept but
  ignore ``--disable-cascade-attn`` and point ``--log-config-file`` to its replacement (``DEPRECATED_FLAGS``);
- 0.33 adds ``--watchdog-config``, ``--monokernel``, ``--reasoning-effort-map`` and ``--sleep-mode-backend``
  (``NEW_FLAGS``), which 0.32's parser refuses. No flag of 0.32 is gone in 0.33.

``version_problems`` turns these into one line per problem for the variable check; ``flag_problem`` is what the
planner says of one ``serve_args`` flag. Pure Python, no Ansible import.
"""

from __future__ import annotations

import re

SUPPORTED = ("0.32", "0.33")
DEFAULT = "0.32.0"

_NO_COMPILED_DAG = ("vLLM 0.33 has only RayExecutorV2 (the compiled-graph Ray executor and its settings are gone): "
                    "remove it")
_NO_LONGER_READ = "a ROCm (AITER) setting vLLM 0.33 no longer reads: remove it"
# Environment variables a release no longer reads: {release: ((name or prefix*, what to do instead), ...)}.
REMOVED_ENV = {
    "0.33": (
        ("VLLM_USE_RAY_COMPILED_DAG*", _NO_COMPILED_DAG),
        ("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "vLLM 0.33 always uses RayExecutorV2 with backend ray: remove it"),
        ("VLLM_USE_RAY_WRAPPED_PP_COMM", _NO_COMPILED_DAG),
        ("VLLM_ROCM_MONO_DECODE", "vLLM 0.33 replaced it with --monokernel (ROCm): set "
                                  "vllm_cluster_serve_args.monokernel instead"),
        ("VLLM_ROCM_AITER_MEGA_MOE_FUSE_SHARED_EXPERTS", _NO_LONGER_READ),
        ("VLLM_ROCM_AITER_MLA_DCP_VERIFY", _NO_LONGER_READ),
        ("VLLM_ROCM_USE_AITER_FP4_ASM_GEMM", _NO_LONGER_READ),
    ),
}
# serve_args flags a release deprecates: {release: {flag: what to do instead}}.
DEPRECATED_FLAGS = {
    "0.32": {
        "disable-cascade-attn": "it has no effect in vLLM 0.32: remove it",
        "log-config-file": "vLLM 0.32 reads logging-config.pylogging_config_file instead: set that",
    },
    "0.33": {
        "mamba-cache-mode": "it is deprecated and has no effect in vLLM 0.33: remove it",
        "ir-op-priority": "it is deprecated in vLLM 0.33 and goes in 0.34: remove it",
        "disable-cascade-attn": "it has no effect in vLLM 0.33: remove it",
        "log-config-file": "vLLM 0.33 reads logging-config.pylogging_config_file instead: set that",
    },
}
# serve_args flags new in a release: {flag: the first release that has it}.
NEW_FLAGS = {"monokernel": "0.33", "reasoning-effort-map": "0.33", "sleep-mode-backend": "0.33",
             "watchdog-config": "0.33"}
# The inventory mappings whose names become the environment of vLLM's processes.
ENV_VARIABLES = ("nccl_network_extra_env", "ray_cluster_environment")


def series(version):
    """'0.32' for '0.32.0' (a local suffix such as '+cpu' allowed); None for anything else."""
    match = re.match(r"^(\d+)\.(\d+)(\.\d+)?([+.-][0-9A-Za-z.+-]*)?$", str(version))
    return f"{match.group(1)}.{match.group(2)}" if match else None


def version_problem(version, label="vllm_runtime_vllm_version"):
    """Why ``version`` is not a release the collection plans for; None when it is."""
    if series(version) in SUPPORTED:
        return None
    return f"{label} is {version!r}: the collection plans vLLM {' and '.join(SUPPORTED)} releases (e.g. {DEFAULT})"


def flag_problem(version, flag):
    """What is wrong with vLLM flag ``flag`` (no dashes) on release ``version``; None when nothing is."""
    release = series(version)
    first = NEW_FLAGS.get(flag) or (NEW_FLAGS.get(flag[3:]) if flag.startswith("no-") else None)
    if first and release and tuple(map(int, release.split("."))) < tuple(map(int, first.split("."))):
        return f"--{flag} is new in vLLM {first} and vLLM {version} refuses it: remove it or target vLLM {first}"
    why = DEPRECATED_FLAGS.get(release, {}).get(flag)
    return f"--{flag}: {why}" if why else None


def env_problem(version, name):
    """What is wrong with environment variable ``name`` for release ``version``; None when nothing is."""
    for pattern, instead in REMOVED_ENV.get(series(version), ()):
        if name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1])):
            return f"{name} is gone in vLLM {series(version)}: {instead}"
    return None


def version_problems(host_vars, default=DEFAULT):
    """One line per problem of a deployment's vLLM release and what its inventory sets for that release.

    ``host_vars`` is ``{host: {name: value}}``; every host's own ``vllm_runtime_vllm_version`` (else ``default``)
    judges its ``vllm_cluster_serve_args`` and the environment mappings of ``ENV_VARIABLES``.
    """
    found = {}
    for host, variables in host_vars.items():
        version = variables.get("vllm_runtime_vllm_version", default) if hasattr(variables, "get") else default
        problem = version_problem(version, "vllm_runtime_vllm_version")
        if problem:
            found.setdefault(("", problem), []).append(host)
            continue
        serve_args = variables.get("vllm_cluster_serve_args")
        for flag in sorted(serve_args) if isinstance(serve_args, dict) else ():
            why = flag_problem(version, str(flag).replace("_", "-"))
            if why:
                found.setdefault((f"vllm_cluster_serve_args.{flag}", why), []).append(host)
        for mapping in ENV_VARIABLES:
            env = variables.get(mapping)
            for name in sorted(env) if isinstance(env, dict) else ():
                why = env_problem(version, str(name))
                if why:
                    found.setdefault((f"{mapping}.{name}", why), []).append(host)
    lines = []
    for (where, why), hosts in found.items():
        on = f" on {', '.join(map(str, hosts))}"
        lines.append(f"{why.replace(' is ', on + ' is ', 1)}" if not where else f"{where}{on}: {why}")
    return lines
