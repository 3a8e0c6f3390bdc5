"""Filters for the vllm.service unit: the rollout stage's argv and systemd quoting.

One file, six filters: each one's documentation is the .yml of its name beside this file
(vllm_stage_argv.yml, vllm_exec_start.yml, ...), since ansible-doc would show a DOCUMENTATION here for all six.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.render import vllm_unit


def vllm_stage_argv(node, plan, stage="final"):
    try:
        return vllm_unit.stage_argv(plan, node, stage)
    except vllm_unit.StageError as exc:
        raise AnsibleFilterError(f"vllm_stage_argv: {exc}") from None


def vllm_exec_start(argv, binary):
    try:
        return vllm_unit.exec_start(binary, argv)
    except vllm_unit.StageError as exc:
        raise AnsibleFilterError(f"vllm_exec_start: {exc}") from None


def vllm_env_file(env):
    """A dict of variables -> the lines of a systemd EnvironmentFile, in key order."""
    try:
        return "\n".join(vllm_unit.env_file_line(name, env[name]) for name in sorted(env))
    except vllm_unit.StageError as exc:
        raise AnsibleFilterError(f"vllm_env_file: {exc}") from None


def vllm_eager_stage_unsafe(plan):
    return vllm_unit.eager_stage_unsafe(plan) or ""


class FilterModule:
    """vllm_ops.cluster unit filters."""

    def filters(self):
        return {
            "vllm_stage_argv": vllm_stage_argv,
            "vllm_exec_start": vllm_exec_start,
            "vllm_api_probe_host": vllm_unit.api_probe_host,
            "vllm_served_model_name": vllm_unit.served_model_name,
            "vllm_eager_stage_unsafe": vllm_eager_stage_unsafe,
            "vllm_env_file": vllm_env_file,
        }
