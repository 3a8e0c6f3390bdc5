"""Filter ``vllm_ops.cluster.parallel_layout``: a plan request in, the deployment plan out.

Also plan_from_inventory and plan_table; each filter's documentation is the .yml of its name beside
this file, since ansible-doc would show a DOCUMENTATION here for all three.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import (
    PlanError,
    PlanRequest,
    coerce_text_inputs,
    plan,
    plan_from_request,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.summary import layout_table


def parallel_layout(request):
    """Return the plan for ``request``; a PlanError becomes an AnsibleFilterError with its message."""
    try:
        return plan_from_request(coerce_text_inputs(request))
    except PlanError as exc:
        raise AnsibleFilterError(f"parallel_layout: {exc}") from None


def plan_from_inventory(variables, cluster, host=None, refusal=False, model=None):
    """The plan of the head's planning variables (plan/request.py's INPUTS) and the cluster plan.yml built.

    With ``refusal`` a PlanError is returned as ``{"refusal": message}`` (playbooks/plan.yml fails with it, the
    planner's words alone) instead of raised. ``model`` stands for the head's vllm_cluster_model (the config.json
    plan.yml read from a hub source's pinned commit).
    """
    if model:
        variables = _Overlay(variables, {"vllm_cluster_model": model})
    try:
        return plan(PlanRequest.from_variables(variables, cluster, host))
    except PlanError as exc:
        if refusal:
            return {"refusal": str(exc)}
        raise AnsibleFilterError(f"plan: {exc}") from None


class _Overlay(Mapping):
    """A host's variables with some of them replaced (hostvars stay lazy: only what the planner asks is read)."""

    def __init__(self, base, replaced):
        self.base, self.replaced = base, replaced

    def __getitem__(self, key):
        return self.replaced[key] if key in self.replaced else self.base[key]

    def __iter__(self):
        yield from self.replaced
        yield from (key for key in self.base if key not in self.replaced)

    def __len__(self):
        return len(set(self.base) | set(self.replaced))


def plan_table(plan_dict):
    """The layout table of a plan, as lines (plan/summary.py)."""
    return layout_table(plan_dict)


class FilterModule:
    """vllm_ops.cluster planning filters (plan_from_inventory and plan_table: the .yml docs beside this file)."""

    def filters(self):
        return {"parallel_layout": parallel_layout, "plan_from_inventory": plan_from_inventory,
                "plan_table": plan_table}
