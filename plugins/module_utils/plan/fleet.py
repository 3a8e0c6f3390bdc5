"""The deployments of an inventory: the hosts of vllm_nodes grouped by their vllm_cluster_deployment.

A deployment is the set of hosts that share one ``vllm_cluster_deployment`` value (set it in the deployment's
group_vars). An inventory of today sets it once for vllm_nodes, or not at all (the default ``vllm``): one
deployment, as before. Each deployment is planned from its own hosts (playbooks/plan.yml) and every play of the
playbooks runs them as serial batches, one batch per deployment, in the order of their first host in vllm_nodes:
``run_once`` then means once per deployment and ``ansible_play_batch`` is the deployment's hosts.

``vllm_cluster_deployments`` (an extra var: a list or a comma-separated text) narrows a run to some deployments.
"""

from __future__ import annotations

import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import from_text

DEFAULT_DEPLOYMENT = "vllm"  # plan/request.py's default for vllm_cluster_deployment
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class FleetError(ValueError):
    """An inventory whose deployments cannot be run; the message names the hosts, the value and the expectation."""


def _selection(only):
    if only is None or only == "":
        return []
    names = only.split(",") if isinstance(only, str) else only
    if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) for name in names):
        raise FleetError(f"vllm_cluster_deployments must be a list of deployment names or a comma-separated text, "
                         f"got {only!r}")
    return [name.strip() for name in names if name.strip()]


def deployments(hosts, deployment_of, only=None):
    """``[(name, [host, ...]), ...]``: the deployments in the order of their first host, the selected ones only.

    ``hosts`` is vllm_nodes' host list in inventory order; ``deployment_of`` maps a host to its
    ``vllm_cluster_deployment`` (missing or None: the default); ``only`` is ``vllm_cluster_deployments``.
    """
    found = {}
    for host in hosts:
        name = deployment_of.get(host)
        name = DEFAULT_DEPLOYMENT if name is None else name
        if not isinstance(name, str) or not NAME.match(name):
            raise FleetError(f"host {host}: vllm_cluster_deployment must be a name of letters, digits, '.', '_' or "
                             f"'-', got {name!r}")
        found.setdefault(name, []).append(host)
    wanted = _selection(only)
    unknown = [name for name in wanted if name not in found]
    if unknown:
        raise FleetError(f"vllm_cluster_deployments names {', '.join(unknown)}, which no host of vllm_nodes has as "
                         f"its vllm_cluster_deployment; this inventory's deployments: {', '.join(found) or 'none'}")
    return [(name, members) for name, members in found.items() if not wanted or name in wanted]


def machines(selected, machine_of):
    """``{machine: [(host, deployment), ...]}`` for every machine (``ansible_host``, else the host's name)."""
    by_machine = {}
    for name, members in selected:
        for host in members:
            machine = machine_of.get(host) or host
            by_machine.setdefault(str(machine), []).append((host, name))
    return by_machine


def _gpu_ids(host, value):
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        value = [from_text(gpu, "int") for gpu in value]  # "0" is GPU 0, as everywhere the plan reads a number
    if (not isinstance(value, (list, tuple)) or not value
            or not all(isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0 for gpu in value)
            or len(set(value)) != len(value)):
        raise FleetError(f"host {host}: vllm_cluster_gpu_ids must be a non-empty list of distinct GPU indices "
                         f"(0, 1, ...), got {value!r}")
    return sorted(value)


def shared_machine_problems(selected, machine_of, gpu_ids_of=None):
    """Lines for machines (same ``ansible_host``) that several inventory hosts name, where they cannot share it.

    Deployments may share a machine on disjoint GPUs: each of its inventory hosts names its GPUs with
    ``vllm_cluster_gpu_ids`` (``gpu_ids_of`` maps a host to that list), and each such deployment runs as its
    own instance (unit ``vllm-<deployment>.service``, files under ``/etc/vllm-cluster/deployments/<deployment>``;
    plan/build.py ``service``). Refused: two hosts of one deployment on one machine, a host without the list
    (it would take every GPU and the machine's own ``vllm.service``), and GPU lists that overlap. Ports and
    backends are checked once the plans exist (``co_resident_problems``).
    """
    gpu_ids_of = gpu_ids_of or {}
    problems = []
    for machine, users in machines(selected, machine_of).items():
        if len(users) < 2:
            continue
        names = [deployment for _, deployment in users]
        hosts = ", ".join(f"{host} ({deployment})" for host, deployment in users)
        where = f"hosts {hosts} are one machine (ansible_host {machine})"
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            problems.append(f"{where}: deployment {', '.join(twice)} has two hosts on it; a deployment uses a "
                            "machine once (give it its GPUs with vllm_cluster_gpu_ids on one host)")
            continue
        lists = {host: _gpu_ids(host, gpu_ids_of.get(host)) for host, _ in users}
        missing = [host for host, ids in lists.items() if ids is None]
        if missing:
            problems.append(f"{where}: deployments that share a machine each name their GPUs with "
                            f"vllm_cluster_gpu_ids (disjoint lists); {', '.join(missing)} set{'s' if len(missing) == 1 else ''} none")
            continue
        owner = {}
        for host, ids in lists.items():
            for gpu in ids:
                if gpu in owner:
                    problems.append(f"{where}: GPU {gpu} is in vllm_cluster_gpu_ids of both {owner[gpu]} "
                                    f"({lists[owner[gpu]]}) and {host} ({ids}); expected disjoint GPU lists")
                    break
                owner[gpu] = host
    return problems


def co_residents(every, selected, machine_of):
    """The deployments of ``every`` to plan for a run of ``selected``: those, and any sharing a machine with them.

    A shared machine's firewall table holds every deployment on it, so planning one deployment plans its
    machine-mates too (their hosts are read, never changed, by a run that did not select them).
    """
    wanted = {name for name, _ in selected}
    grew = True
    while grew:
        grew = False
        for users in machines(every, machine_of).values():
            names = {deployment for _, deployment in users}
            if names & wanted and not names <= wanted:
                wanted |= names
                grew = True
    return [(name, members) for name, members in every if name in wanted]


def co_resident_problems(plans_by_host, machine_of):
    """Lines for machines whose deployments' plans collide: a port opened twice, or a launch mode with cluster
    units of its own (Ray's head and worker: the machine's own). ``plans_by_host`` maps an inventory host to its deployment's plan."""
    by_machine = {}
    for host, plan in plans_by_host.items():
        by_machine.setdefault(str(machine_of.get(host) or host), []).append((host, plan))
    problems = []
    for machine, users in by_machine.items():
        if len(users) < 2:
            continue
        taken = {}
        for host, plan in users:
            name = plan.get("deployment")
            mode = launch.of_plan(plan)
            if mode.cluster_units:
                problems.append(f"host {host} ({name}) shares machine {machine} with another deployment and plans "
                                f"backend {mode.name}; its units ({', '.join(mode.cluster_units)}) are the machine's "
                                "own, so a shared machine runs backend mp (set vllm_cluster_backend: mp)")
            for port_name, port in sorted((plan.get("ports") or {}).items()):
                if port_name in ("ray_min_worker", "ray_max_worker"):
                    continue
                if port in taken and taken[port][0] != name:
                    other, other_port = taken[port]
                    problems.append(f"host {host} ({name}) on machine {machine}: port {port_name}={port} is also "
                                    f"{other}'s {other_port}; deployments that share a machine need distinct "
                                    "ports (vllm_cluster_ports)")
                taken.setdefault(port, (name, port_name))
    return problems


def play_hosts(selected):
    """The hosts of a fleet play: each deployment's hosts together, deployment after deployment."""
    return [host for _, members in selected for host in members]


def play_batches(selected, one_at_a_time=()):
    """The play's ``serial``: one batch per deployment (a single deployment: one batch of all its hosts); a
    deployment named in ``one_at_a_time`` (a rolling change behind the router) gets one batch per host."""
    batches = []
    for name, members in selected:
        batches += [1] * len(members) if name in one_at_a_time else [len(members)]
    return batches
