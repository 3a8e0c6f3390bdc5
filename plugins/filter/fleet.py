"""Filters for a fleet inventory: its deployments, and each play's hosts and serial batches.

One file, seven filters: each one's documentation is the .yml of its name beside this file
(fleet_deployments.yml, fleet_problems.yml, fleet_hosts.yml, fleet_batches.yml, fleet_co_resident_problems.yml,
fleet_machine_plans.yml, deployment_service.yml). The logic is plugins/module_utils/plan/fleet.py.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import stages as deploy_stages
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import fleet


def _select(hosts, hostvars, only, with_co_residents=False):
    """``(selected deployments, [])``, or ``(None, problems)``: one line each."""
    if hasattr(hosts, "get"):  # Ansible's groups: the hosts of vllm_nodes, in inventory order
        hosts = hosts.get("vllm_nodes") or []
    if not isinstance(hosts, (list, tuple)):
        raise AnsibleFilterError(f"fleet: expected groups or the host list of vllm_nodes, got {type(hosts).__name__}")
    if hostvars is None:
        # Ansible fills hostvars when its first play starts: before that (--syntax-check, or a --limit that skipped
        # plan.yml's controller plays) every host is one batch. Nothing runs wrongly so: without plan.yml's play
        # no host has a plan, and every role's preflight stops on that.
        return [(None, list(hosts))], []

    # hostvars[host] computes all of the host's variables: once per host, three names read from it.
    views = {host: hostvars[host] if host in hostvars else {} for host in hosts}

    def read(host, name):
        variables = views[host]
        return variables.get(name) if hasattr(variables, "get") else None

    try:
        deployment_of = {host: read(host, "vllm_cluster_deployment") for host in hosts}
        every = fleet.deployments(list(hosts), deployment_of)
        selected = fleet.deployments(list(hosts), deployment_of, only)
        machine_of = {host: read(host, "ansible_host") for host in hosts}
        problems = fleet.shared_machine_problems(every, machine_of,
                                                 {host: read(host, "vllm_cluster_gpu_ids") for host in hosts})
    except fleet.FleetError as exc:
        return None, [str(exc)]
    if problems:
        return None, problems
    if with_co_residents:
        return fleet.co_residents(every, selected, machine_of), []
    return selected, []


# Ansible's hostvars[host] computes every variable of the host (tens of milliseconds), and every fleet play asks
# for its hosts and its serial: the deployments come from the inventory, so one run reads them once. The memo
# holds Ansible's own hostvars object (one per playbook run) and starts over with another one; plain dicts (tests,
# callers outside a play) are never memoized. A play that changes vllm_cluster_deployment, ansible_host or
# vllm_cluster_gpu_ids with set_fact is not seen by later plays of the same run: they are inventory variables.
_RUN_MEMO = {"hostvars": None, "selections": {}}


def _select_once(hosts, hostvars, only, with_co_residents):
    if hostvars is None or isinstance(hostvars, dict):
        return _select(hosts, hostvars, only, with_co_residents)
    if _RUN_MEMO["hostvars"] is not hostvars:
        _RUN_MEMO.update(hostvars=hostvars, selections={})
    members = hosts.get("vllm_nodes") if hasattr(hosts, "get") else hosts
    key = (repr(members), repr(only), with_co_residents)
    if key not in _RUN_MEMO["selections"]:
        _RUN_MEMO["selections"][key] = _select(hosts, hostvars, only, with_co_residents)
    return _RUN_MEMO["selections"][key]


def _selected(hosts, hostvars, only, with_co_residents=False):
    selected, problems = _select_once(hosts, hostvars, only, with_co_residents)
    if problems:
        raise AnsibleFilterError("; ".join(problems))
    return selected


def _machine_of(hosts, hostvars):
    def read(host):
        variables = hostvars[host] if host in hostvars else {}
        return variables.get("ansible_host") if hasattr(variables, "get") else None
    return {host: read(host) for host in hosts}


def _plans(hosts, hostvars):
    plans = {}
    for host in hosts:
        variables = hostvars[host] if host in hostvars else {}
        plan = variables.get("vllm_cluster_plan") if hasattr(variables, "get") else None
        if isinstance(plan, dict):
            plans[host] = plan
    return plans


def fleet_deployments(hosts, hostvars, only=None, with_co_residents=False):
    """[{name, hosts}] of the selected deployments (and, with_co_residents, those sharing a machine with them)."""
    if hostvars is None:
        raise AnsibleFilterError("fleet_deployments: hostvars is undefined (call it inside a play)")
    return [{"name": name, "hosts": members}
            for name, members in _selected(hosts, hostvars, only, with_co_residents)]


def fleet_problems(hosts, hostvars, only=None):
    """Lines for what fleet_deployments would fail on (a bad name or selection, a machine shared without disjoint
    GPUs); [] when the fleet is sound. playbooks/plan.yml prints them once, before fleet_deployments runs."""
    if hostvars is None:
        raise AnsibleFilterError("fleet_problems: hostvars is undefined (call it inside a play)")
    return _select_once(hosts, hostvars, only, True)[1]


def fleet_co_resident_problems(hosts, hostvars):
    """Lines for machines whose deployments' plans collide (ports, a Ray backend); [] when none share one."""
    if hasattr(hosts, "get"):
        hosts = hosts.get("vllm_nodes") or []
    return fleet.co_resident_problems(_plans(hosts, hostvars), _machine_of(hosts, hostvars))


def fleet_machine_plans(hosts, hostvars, host):
    """The plans of every deployment on ``host``'s machine that has one in this run, in inventory order (the same
    list whichever of them asks: the machine's one table must not change with the deployment that renders it)."""
    if hasattr(hosts, "get"):
        hosts = hosts.get("vllm_nodes") or []
    machine_of = _machine_of(hosts, hostvars)
    machine = machine_of.get(host) or host
    plans = _plans(hosts, hostvars)
    mates = [other for other in hosts if (machine_of.get(other) or other) == machine and other in plans]
    return [plans[other] for other in mates]


def _stage_to_run(selected, hostvars, stage):
    """The deployments whose deploy.yml stage ``stage`` runs: a deployment whose hosts carry it (or, for ``launch``,
    every launch mode's stage) in ``vllm_cluster_stages_skipped`` (playbooks/converged.yml) is left out, so a
    skipped stage's play has no host to visit. Without the fact (the stage's playbook run alone) all are kept."""
    if stage is None or hostvars is None:
        return selected
    names = deploy_stages.LAUNCH_STAGES if stage == deploy_stages.LAUNCH else [stage]
    kept = []
    for name, members in selected:
        variables = hostvars[members[0]] if members[0] in hostvars else {}
        skipped = variables.get("vllm_cluster_stages_skipped") if hasattr(variables, "get") else None
        if not isinstance(skipped, (list, tuple)) or any(stage_name not in skipped for stage_name in names):
            kept.append((name, members))
    return kept


def fleet_hosts(hosts, hostvars, only=None, stage=None):
    """A fleet play's hosts: the selected deployments' hosts, deployment after deployment; with ``stage``, only
    the deployments whose deploy.yml stage runs."""
    return fleet.play_hosts(_stage_to_run(_selected(hosts, hostvars, only), hostvars, stage))


def fleet_batches(hosts, hostvars, only=None, rolling=False, stage=None):
    """A fleet play's serial: one batch per deployment; with ``rolling``, one host per batch for a deployment whose
    hosts carry ``vllm_service_roll.one_at_a_time`` (set by vllm_service's roll.yml in an earlier play); with
    ``stage``, the batches of fleet_hosts' deployments with that stage."""
    selected = _stage_to_run(_selected(hosts, hostvars, only), hostvars, stage)
    if selected and selected[0][0] is None:
        return []
    one_at_a_time = []
    if rolling:
        for name, members in selected:
            variables = hostvars[members[0]] if members[0] in hostvars else {}
            roll = variables.get("vllm_service_roll") if hasattr(variables, "get") else None
            if hasattr(roll, "get") and roll.get("one_at_a_time"):
                one_at_a_time.append(name)
    return fleet.play_batches(selected, one_at_a_time)


def deployment_service(deployment, shares_machines=False):
    """{unit, config_dir, stage_dir, shares_machines} of a deployment: the plan's ``service``, from the inventory
    (``vllm_cluster_deployment`` and whether it sets ``vllm_cluster_gpu_ids``) where no plan is at hand."""
    if deployment is None:
        deployment = fleet.DEFAULT_DEPLOYMENT
    if not isinstance(deployment, str) or not fleet.NAME.match(deployment):
        raise AnsibleFilterError(f"deployment_service: a deployment name of letters, digits, '.', '_' or '-', "
                                 f"got {deployment!r}")
    # The planner, imported here: every fleet play's hosts and serial load this file, most never plan.
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import build

    return build.service(deployment, bool(shares_machines))


class FilterModule:
    """vllm_ops.cluster fleet filters (documentation: fleet_deployments.yml, fleet_hosts.yml, fleet_batches.yml)."""

    def filters(self):
        return {"fleet_deployments": fleet_deployments, "fleet_problems": fleet_problems, "fleet_hosts": fleet_hosts,
                "fleet_batches": fleet_batches,
                "fleet_co_resident_problems": fleet_co_resident_problems,
                "fleet_machine_plans": fleet_machine_plans, "deployment_service": deployment_service}
