"""Filters for deploy.yml's fast path: a node's input digest and the stages to run."""

from __future__ import annotations

DOCUMENTATION = r"""
name: stage_inputs_digest
author: vllm-cluster developers
version_added: "0.4.0"
short_description: One digest of what a deploy.yml run asks of a node
description:
  - Thin shell over C(plugins/module_utils/deploy/stage_stamp.py). sha256 over the plan, the node's
    project variables and vllm-cluster's code digest (lookup C(vllm_ops.cluster.code_digest)).
  - The same file provides C(stages_to_run) - from every node's C(stage_stamp) check, the stages
    deploy.yml skips (converged on every node, and every stage before them) and the ones it runs,
    with each node's reasons.
options:
  _input:
    description: The plan (C(vllm_cluster_plan)).
    type: dict
    required: true
  variables:
    description: The node's project variables, name to value.
    type: dict
    required: true
  code:
    description: vllm-cluster's code digest.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: The node's digest
  ansible.builtin.set_fact:
    vllm_cluster_stage_digest: >-
      {{ vllm_cluster_plan | vllm_ops.cluster.stage_inputs_digest({'vllm_cluster_model': 'tiny'},
         lookup('vllm_ops.cluster.code_digest')) }}
"""

RETURN = r"""
_value:
  description: A sha256 hex digest.
  type: str
"""

from ansible.errors import AnsibleFilterError  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import stage_stamp, stages  # noqa: E402


def stage_inputs_digest(plan, variables, code):
    if not isinstance(variables, dict):
        raise AnsibleFilterError(f"stage_inputs_digest: variables must be a dict, got {type(variables).__name__}")
    return stage_stamp.inputs_digest(plan, variables, code)


def stages_to_run(checks, forced_by="", tags=None, stages=None):
    """checks: {host: stage_stamp check result (its 'stages')} -> {'skip', 'run', 'reasons', 'summary'}.

    forced_by: why nothing is skipped (an -e or a tag selection); empty for the fast path.
    tags: the run's --tags; when they name only stages, 'run' (the stamps cleared) is those stages.
    stages: the stages of this deployment, in order (filter deploy_stages); default all.
    """
    by_host = {host: {stage: entry.get("reasons", ["not checked"]) for stage, entry in (result or {}).items()}
               for host, result in checks.items()}
    decision = stage_stamp.stages_to_run(by_host, stages=tuple(stages or stage_stamp.STAGES), force=bool(forced_by),
                                           tags=tags)
    verified_at = {host: (result or {}).get("verify", {}).get("recorded_at") for host, result in checks.items()}
    decision["summary"] = stage_stamp.summary(decision, forced_by, {h: t for h, t in verified_at.items() if t})
    return decision


def deploy_stages(plan, every=False):
    """The plan's deploy.yml stages in order, [{name, playbook, role}] (plugins/module_utils/deploy/stages.py).

    every: the rows of every stage a stamp may carry (each launch mode's own included), whatever the plan.
    """
    if every:
        return [stages.row(name) for name in stages.ALL_NAMES]
    return stages.for_plan(plan)


def deploy_stage(name, plan=None):
    """One stage's row of the stage table by name, {name, playbook, role}."""
    try:
        return stages.row(name, plan)
    except KeyError as exc:
        raise AnsibleFilterError(f"deploy_stage: {exc.args[0]}") from None


class FilterModule:
    """vllm_ops.cluster stage filters (stages_to_run, deploy_stages, deploy_stage: the .yml docs beside this file)."""

    def filters(self):
        return {"stage_inputs_digest": stage_inputs_digest, "stages_to_run": stages_to_run,
                "deploy_stages": deploy_stages, "deploy_stage": deploy_stage}
