"""Filters for a fleet inventory: its deployments, and each play's hosts and serial batches.

One file, three filters: each one's documentation is the .yml of its name beside this file
(fleet_deployments.yml, fleet_hosts.yml, fleet_batches.yml). The logic is plugins/module_utils/plan/fleet.py.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import fleet


def _selected(hosts, hostvars, only):
    if hasattr(hosts, "get"):  # Ansible's groups: the hosts of vllm_nodes, in inventory order
        hosts = hosts.get("vllm_nodes") or []
    if not isinstance(hosts, (list, tuple)):
        raise AnsibleFilterError(f"fleet: expected groups or the host list of vllm_nodes, got {type(hosts).__name__}")
    if hostvars is None:
        # Ansible fills hostvars when its first play starts: before that (--syntax-check, or a --limit that skipped
        # plan.yml's controller plays) every host is one batch. Nothing runs wrongly so: without plan.yml's play
        # no host has a plan, and every role's preflight stops on that.
        return [(None, list(hosts))]

    def read(host, name):
        variables = hostvars[host] if host in hostvars else {}
        return variables.get(name) if hasattr(variables, "get") else None

    try:
        selected = fleet.deployments(list(hosts), {host: read(host, "vllm_cluster_deployment") for host in hosts},
                                     only)
        problems = fleet.shared_machine_problems(selected, {host: read(host, "ansible_host") for host in hosts})
    except fleet.FleetError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    if problems:
        raise AnsibleFilterError("; ".join(problems))
    return selected


def fleet_deployments(hosts, hostvars, only=None):
    """[{name, hosts}] of the selected deployments, in inventory order."""
    if hostvars is None:
        raise AnsibleFilterError("fleet_deployments: hostvars is undefined (call it inside a play)")
    return [{"name": name, "hosts": members} for name, members in _selected(hosts, hostvars, only)]


def fleet_hosts(hosts, hostvars, only=None):
    """A fleet play's hosts: the selected deployments' hosts, deployment after deployment."""
    return fleet.play_hosts(_selected(hosts, hostvars, only))


def fleet_batches(hosts, hostvars, only=None):
    """A fleet play's serial: one batch per deployment."""
    selected = _selected(hosts, hostvars, only)
    return [] if selected and selected[0][0] is None else fleet.play_batches(selected)


class FilterModule:
    """vllm_ops.cluster fleet filters (documentation: fleet_deployments.yml, fleet_hosts.yml, fleet_batches.yml)."""

    def filters(self):
        return {"fleet_deployments": fleet_deployments, "fleet_hosts": fleet_hosts, "fleet_batches": fleet_batches}
