"""Filters for deploy.yml's fast path: a node's input digest and the stages to run.

One file, six filters: each one's documentation is the .yml of its name beside this file
(stage_inputs_digest.yml, stages_to_run.yml, deploy_stages.yml, deploy_stage.yml, deployment_units.yml,
api_targets.yml), since ansible-doc would show a DOCUMENTATION here for all six.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import health as health_mod
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import stage_stamp, stages


def stage_inputs_digest(plan, variables, code):
    if not isinstance(variables, dict):
        raise AnsibleFilterError(f"stage_inputs_digest: variables must be a dict, got {type(variables).__name__}")
    return stage_stamp.inputs_digest(plan, variables, code)


def stages_to_run(checks, forced_by="", tags=None, stages=None, health=None, client=None):
    """checks: {host: stage_stamp check result (its 'stages')} -> {'skip', 'run', 'reasons', 'unhealthy', 'probe',
    'summary'}.

    forced_by: why nothing is skipped (an -e or a tag selection); empty for the fast path.
    tags: the run's --tags; when they name only stages, 'run' (the stamps cleared) is those stages.
    stages: the stages of this deployment, in order (filter deploy_stages); default all.
    health: {host: stage_stamp's health_problems}; client: the controller's findings (lookup api_completion).
    Any finding runs every stage. 'probe': whether the controller's completion is still wanted: the stamps and
    the nodes would let the vllm stage be skipped, and no completion was asked yet. Where the vllm stage runs
    anyway it (re)starts vLLM where needed and verify asks the completion from the controller, so the stages
    before it that hold stay skipped (the green path of a first start, or of a changed unit, pays no re-run).
    """
    by_host = {host: {stage: entry.get("reasons", ["not checked"]) for stage, entry in (result or {}).items()}
               for host, result in checks.items()}
    unhealthy = health_mod.problems(health or {}, client)
    decision = stage_stamp.stages_to_run(by_host, stages=tuple(stages or stage_stamp.STAGES), force=bool(forced_by),
                                         tags=tags, unhealthy=unhealthy)
    decision["probe"] = "vllm" in decision["skip"] and client is None
    verified_at = {host: (result or {}).get("verify", {}).get("recorded_at") for host, result in checks.items()}
    decision["summary"] = stage_stamp.summary(decision, forced_by, {h: t for h, t in verified_at.items() if t})
    return decision


def deployment_units(plan, host):
    """The deployment's units on host whose health a skipped stage needs (vLLM's, Ray's)."""
    return health_mod.units_to_check(plan, host)


def api_targets(plan, addresses=None):
    """[{host, url, model}]: where the controller asks each API server for a completion."""
    return health_mod.api_targets(plan, addresses)


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
    """vllm_ops.cluster stage filters (stages_to_run, deploy_stages, deploy_stage, deployment_units, api_targets: the
    .yml docs beside this file)."""

    def filters(self):
        return {"stage_inputs_digest": stage_inputs_digest, "stages_to_run": stages_to_run,
                "deploy_stages": deploy_stages, "deploy_stage": deploy_stage,
                "deployment_units": deployment_units, "api_targets": api_targets}
