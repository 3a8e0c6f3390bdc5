"""Filter ``vllm_ops.cluster.model_fanout``: who copies the model from whom."""

from __future__ import annotations

DOCUMENTATION = r"""
name: model_fanout
author: vllm-cluster developers (@vllm-ops)
version_added: "0.1.0"
short_description: The fan-out of a model's bytes over the fabric - who copies from whom, in rounds
description:
  - The source node fetches the model once; every other node copies it from a node that already holds it, over
    the fabric network, in a tree where no node sends more than O(degree) copies (about log_degree(nodes)
    rounds), so no single link carries every copy.
  - Deterministic - the same nodes in the same order give the same plan.
  - Thin shell over C(plugins/module_utils/model/fanout.py).
options:
  _input:
    description: The nodes that need the model, in order - C({name, address}) dicts (the plan's C(cluster.nodes)).
    type: list
    elements: dict
    required: true
  source:
    description: The node that fetches the model (one of the nodes).
    type: str
    required: true
  degree:
    description: The most copies one node sends.
    type: int
    default: 2
  shared:
    description:
      - Nodes that see the source node's model directory itself (a filesystem they mount with it) - they get no
        copy and send none.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Show the fan-out
  ansible.builtin.debug:
    msg: "{{ (vllm_cluster_plan.cluster.nodes | vllm_ops.cluster.model_fanout('node1'))['table'] }}"
"""

RETURN = r"""
_value:
  description: >-
    C(source), C(degree), C(rounds), C(edges) (each C({round, from, from_address, to, to_address, network}):
    node C(to) copies from C(from) in that round), C(shared) (the nodes given, in the nodes' order),
    C(sender_of) (each receiving node's edge) and C(table) (lines
    that show it).
  type: dict
"""

from ansible.errors import AnsibleFilterError  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.model import fanout  # noqa: E402


def model_fanout(nodes, source, degree=fanout.DEFAULT_DEGREE, shared=None):
    if not isinstance(nodes, list):
        raise AnsibleFilterError(f"model_fanout: the nodes must be a list, got {type(nodes).__name__}")
    if isinstance(degree, int) and not isinstance(degree, bool):
        degree = int(degree)  # a templated int may be a subclass; plan_fanout takes exact ints only
    try:
        plan = fanout.plan_fanout(nodes, str(source), degree=degree, shared=list(shared or []))
    except fanout.FanoutError as exc:
        raise AnsibleFilterError(f"model_fanout: {exc}") from None
    return {**plan, "sender_of": fanout.sender_of(plan), "table": fanout.fanout_table(plan)}


class FilterModule:
    def filters(self):
        return {"model_fanout": model_fanout}
