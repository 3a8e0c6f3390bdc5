"""Filters for the node firewall: the router and monitor hosts' addresses, trusted like the cluster's nodes.

Documentation: firewall_trusted_addresses.yml beside this file. The logic is plugins/module_utils/render/nft_policy.py.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.render import nft_policy


def _planned_address(host, hostvars):
    """The host's address in its own plan (a node of some deployment), or None."""
    plan = hostvars[host].get("vllm_cluster_plan") if host in hostvars else None
    for node in ((plan or {}).get("cluster") or {}).get("nodes") or []:
        if node.get("name") == host:
            return node.get("address")
    return None


def firewall_trusted_addresses(groups, hostvars, group_names, plan):
    """The addresses of the hosts of ``group_names`` that are not ``plan``'s cluster nodes."""
    names = [group_names] if isinstance(group_names, str) else list(group_names or [])
    members = {}
    for group in names:
        for host in groups.get(group) or []:
            if host not in members:
                own = hostvars[host].get("vllm_cluster_fabric_address") if host in hostvars else None
                members[host] = own or _planned_address(host, hostvars)
    cluster = [node.get("name") for node in ((plan or {}).get("cluster") or {}).get("nodes") or []]
    cluster += [node.get("host") for node in (plan or {}).get("nodes") or []]
    try:
        return nft_policy.trusted_addresses(members, cluster, " and ".join(f"group {name}" for name in names))
    except nft_policy.FirewallError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    """vllm_ops.cluster firewall filters (documentation: firewall_trusted_addresses.yml)."""

    def filters(self):
        return {"firewall_trusted_addresses": firewall_trusted_addresses}
