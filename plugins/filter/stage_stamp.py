"""Filters for deploy.yml's fast path: a node's input digest and the stages to run.

One file, four filters: each one's documentation is the .yml of its name beside this file
(stage_inputs_digest.yml, stages_to_run.yml, deploy_stages.yml, deploy_stage.yml), since ansible-doc
would show a DOCUMENTATION here for all four.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import stage_stamp, stages


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
