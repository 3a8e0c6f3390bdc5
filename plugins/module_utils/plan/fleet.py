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


def shared_machine_problems(selected, machine_of):
    """Lines for inventory hosts that are one machine (same ``ansible_host``): each deployment needs its own machines.

    Two inventory names for one machine would write its vLLM unit, env and plan files, its firewall table and its
    stage stamps from two plans, each undoing the other's. ``machine_of`` maps a host to its ansible_host (missing or
    None: the host's own name).
    """
    by_machine = {}
    for name, members in selected:
        for host in members:
            machine = machine_of.get(host) or host
            by_machine.setdefault(str(machine), []).append((host, name))
    problems = []
    for machine, users in by_machine.items():
        if len(users) < 2:
            continue
        names = sorted({deployment for _, deployment in users})
        hosts = ", ".join(f"{host} ({deployment})" for host, deployment in users)
        where = (f"deployments {', '.join(names)}" if len(names) > 1 else f"deployment {names[0]}")
        problems.append(f"hosts {hosts} are one machine (ansible_host {machine}), in {where}: each machine may hold "
                        "one host of one deployment (its vLLM unit, plan, firewall table and stage stamps are the "
                        "machine's own); give the deployments disjoint machines")
    return problems


def play_hosts(selected):
    """The hosts of a fleet play: each deployment's hosts together, deployment after deployment."""
    return [host for _, members in selected for host in members]


def play_batches(selected):
    """The play's ``serial``: one batch per deployment (a single deployment: one batch of all its hosts)."""
    return [len(members) for _, members in selected]
