"""Filter ``vllm_ops.cluster.deployed_plan``: the plan the nodes run, read back, and its drift from the inventory's."""

from __future__ import annotations

DOCUMENTATION = r"""
name: deployed_plan
author: vllm-cluster developers (@vllm-ops)
version_added: "0.5.0"
short_description: The plan a running deployment is judged by - what its nodes run - and how the inventory's differs
description:
  - Thin shell over C(readback) in C(plugins/module_utils/plan/history.py). benchmark.yml, doctor.yml and
    checklist.yml judge the deployment by the plan its nodes hold (C(/etc/vllm-cluster/plan.json), written by
    vllm_service), not by a plan computed again from C(-e) flags; a fresh plan from the inventory only says
    how it would differ (C(drift), e.g. "the inventory now plans tp (mp) TP=4 ..., the nodes run tp (mp) TP=2 ...").
  - The head's plan is taken (the node that is node rank 0 in its own plan.json); nodes that hold another
    plan, or none, are named in C(notes). Without any plan.json the inventory's plan is used.
options:
  _input:
    description:
      - Per host, the result of C(ansible.builtin.slurp) of its plan.json (its C(content), base64), or that
        content alone, or null.
      - A result without C(content) (no plan.json on that node, or the node unreachable) counts as no plan.
    type: dict
    required: true
  inventory_plan:
    description: The plan playbooks/plan.yml computed from the inventory in the same run.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Judge against what the nodes run
  ansible.builtin.set_fact:
    readback: "{{ {'node1': slurp_result} | vllm_ops.cluster.deployed_plan(vllm_cluster_plan) }}"
"""

RETURN = r"""
_value:
  description: C(plan) (the one to judge by), C(source) (C(deployed) or C(inventory)), C(from) (the host it was
    read on), C(notes) and C(drift) (lines).
  type: dict
"""

import base64  # noqa: E402
import binascii  # noqa: E402
import json  # noqa: E402

from ansible.errors import AnsibleFilterError  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.history import readback  # noqa: E402


def _decode(host, content):
    if isinstance(content, dict):  # a slurp result: no content when the file or the node was not there
        content = content.get("content")
    if not content:
        return None
    try:
        return json.loads(base64.b64decode(content))
    except (binascii.Error, ValueError) as exc:
        raise AnsibleFilterError(f"deployed_plan: {host}: /etc/vllm-cluster/plan.json is not a JSON plan: {exc}") from None


def deployed_plan(contents, inventory_plan):
    if not isinstance(contents, dict):
        raise AnsibleFilterError(f"deployed_plan: expected {{host: slurp result}}, got {type(contents).__name__}")
    return readback({host: _decode(host, content) for host, content in contents.items()}, inventory_plan)


class FilterModule:
    def filters(self):
        return {"deployed_plan": deployed_plan}
