"""Filter ``vllm_ops.cluster.launch_mode``: what a plan's launch mode says, for the roles."""

from __future__ import annotations

DOCUMENTATION = r"""
name: launch_mode
author: vllm-cluster developers (@vllm-ops)
version_added: "0.5.0"
short_description: What the plan's launch mode (mp, ray) tells the roles
description:
  - Thin shell over C(plugins/module_utils/launch/). Roles and playbooks ask the launch mode instead of
    comparing C(plan['backend']) with a string.
  - Keys C(name), C(stage) (its deploy.yml stage, or null), C(stage_role), C(cluster_units) (the mode's own
    units, head first), C(headless_follow_head) (headless workers restart when their head goes away),
    C(vllm_part_of_cluster_unit) (vLLM restarts with the mode's unit), C(placement_from_cluster) (verify
    reads the workers' placement from the mode's cluster), C(ports) (the port keys it opens).
options:
  _input:
    description: The plan (C(vllm_cluster_plan)).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Headless workers follow their head
  ansible.builtin.debug:
    msg: "{{ (vllm_cluster_plan | vllm_ops.cluster.launch_mode)['headless_follow_head'] }}"
"""

RETURN = r"""
_value:
  description: The launch mode's facts.
  type: dict
"""

from ansible.errors import AnsibleFilterError  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch  # noqa: E402


def launch_mode(plan):
    if not isinstance(plan, dict):
        raise AnsibleFilterError(f"launch_mode: the plan must be a dict, got {type(plan).__name__}")
    try:
        return launch.of_plan(plan).facts()
    except launch.UnknownLaunchMode as exc:
        raise AnsibleFilterError(f"launch_mode: {exc}") from None


class FilterModule:
    def filters(self):
        return {"launch_mode": launch_mode}
