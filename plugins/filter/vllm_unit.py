"""Filters for the vllm.service unit: the rollout stage's argv and systemd quoting."""

from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_stage_argv
author: vllm-cluster developers
version_added: "0.1.0"
short_description: The plan node's vllm serve argv for a rollout stage
description:
  - Thin shell over C(plugins/module_utils/render/vllm_unit.py). Stage V(final) is the plan's argv as it is;
    stage V(eager) adds C(--enforce-eager) (the seed's functional first start).
  - Refuses the eager stage where it is known to break (PP on the CPU platform) with one message
    that names the node and the reason.
  - The same file provides C(vllm_exec_start) (argv to a systemd C(ExecStart=) value, quoted the way
    systemd parses it), C(vllm_api_probe_host) (where a probe on the node reaches the API),
    C(vllm_served_model_name), C(vllm_eager_stage_unsafe) (the reason, or an empty string) and
    C(vllm_env_file) (a dict of variables as systemd EnvironmentFile lines).
options:
  _input:
    description: One entry of the plan's C(nodes) list.
    type: dict
    required: true
  plan:
    description: The whole plan (C(vllm_cluster_plan)).
    type: dict
    required: true
  stage:
    description: V(eager) or V(final).
    type: str
    default: final
"""

EXAMPLES = r"""
- name: ExecStart for this node's final stage
  ansible.builtin.set_fact:
    exec_start: >-
      {{ node | vllm_ops.cluster.vllm_stage_argv(vllm_cluster_plan, 'final')
         | vllm_ops.cluster.vllm_exec_start('/opt/vllm-cluster/venv/bin/vllm') }}
"""

RETURN = r"""
_value:
  description: The argv (a list starting with C(vllm), C(serve)).
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.render import vllm_unit  # noqa: E402


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
