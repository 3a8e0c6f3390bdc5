"""Filter ``vllm_ops.cluster.parallel_layout``: a plan request in, the deployment plan out."""

from __future__ import annotations

DOCUMENTATION = r"""
name: parallel_layout
author: vllm-cluster developers
version_added: "0.1.0"
short_description: Compute the vLLM parallel layout (the deployment plan) from a plan request
description:
  - Runs the planner of C(plugins/module_utils/plan/) (C(build.py)) once on the controller.
  - Follows the seed's decision tree (fits one GPU? fast enough? fits one node? MoE?) and vLLM's own
    rules (TP divides the attention heads, the KV-head rule, TP inside a node, EP = TP x DP, even
    experts with EPLB, MLA KV not sharded by TP).
  - Returns the plan object of docs/architecture.md, including the C(vllm serve) argv and environment
    per node and what verification must find in vLLM's logs.
  - When no layout fits, fails with one message that names the numbers.
options:
  _input:
    description:
      - The plan request. Keys are the arguments of C(build_plan); C(model) and C(cluster) are required.
      - C(model) is a catalog name, a hub id, a path on the controller to a model directory or
        C(config.json), or a dict with C(name) or C(config) and optional C(weights_gib).
      - C(cluster) is a list of nodes C({name, address, fabric_interface, ib_hcas, gpus}) where C(gpus)
        holds the gpu_facts summary keys C(count), C(name), C(memory_total_mib), C(nvlink).
      - C(targets) may hold C(max_model_len), C(gpu_memory_utilization), C(kv_tokens_target),
        C(concurrency_target), C(throughput_need_tok_s), C(replica_throughput_tok_s).
      - C(overrides) may hold C(tp), C(pp), C(dp), C(ep) and C(backend) (C(mp) or C(ray)).
      - Also accepted are C(device) (C(cuda) or C(cpu)), C(ports), C(deployment), C(model_path),
        C(allow_tp_across_nodes), C(cpu_kvcache_space_gib), C(cpu_cores_per_node), C(enforce_eager),
        C(load_format), C(enable_eplb), C(api_host) and C(vllm_version). Null values count as unset.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Plan Llama-3.1-70B on one node of four A100-80G
  ansible.builtin.set_fact:
    vllm_cluster_plan: "{{ request | vllm_ops.cluster.parallel_layout }}"
  vars:
    request:
      model: llama-3.1-70b
      cluster:
        - name: gpu0
          address: 192.0.2.10
          gpus: {count: 4, name: NVIDIA A100-SXM4-80GB, memory_total_mib: 81920, nvlink: true}
      targets: {max_model_len: 8192, gpu_memory_utilization: 0.9}

- name: Show the decision path
  ansible.builtin.debug:
    msg: "{{ vllm_cluster_plan.decision }}"
"""

RETURN = r"""
_value:
  description:
    - The plan. Top-level keys include C(plan_version), C(vllm_version), C(deployment), C(model),
      C(cluster), C(targets), C(strategy), C(backend), C(tp), C(pp), C(dp), C(ep), C(world_size),
      C(nodes_used), C(nodes), C(memory), C(ports), C(decision), C(warnings) and C(expect).
  type: dict
"""

from ansible.errors import AnsibleFilterError  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import (  # noqa: E402
    PlanError,
    PlanRequest,
    coerce_text_inputs,
    plan,
    plan_from_request,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.summary import layout_table  # noqa: E402


def parallel_layout(request):
    """Return the plan for ``request``; a PlanError becomes an AnsibleFilterError with its message."""
    try:
        return plan_from_request(coerce_text_inputs(request))
    except PlanError as exc:
        raise AnsibleFilterError(f"parallel_layout: {exc}") from None


def plan_from_inventory(variables, cluster, host=None):
    """The plan of the head's planning variables (plan/request.py's INPUTS) and the cluster plan.yml built."""
    try:
        return plan(PlanRequest.from_variables(variables, cluster, host))
    except PlanError as exc:
        raise AnsibleFilterError(f"plan: {exc}") from None


def plan_table(plan_dict):
    """The layout table of a plan, as lines (plan/summary.py)."""
    return layout_table(plan_dict)


class FilterModule:
    """vllm_ops.cluster planning filters (plan_from_inventory and plan_table: the .yml docs beside this file)."""

    def filters(self):
        return {"parallel_layout": parallel_layout, "plan_from_inventory": plan_from_inventory,
                "plan_table": plan_table}
