"""Filters for the node firewall: the router and monitor hosts' addresses, trusted like the cluster's nodes; who
reaches vLLM's API port (one door behind a router); the controller's addresses that reach it.

Documentation: firewall_trusted_addresses.yml, firewall_api_mode.yml and firewall_controller_addresses.yml beside
this file. The logic is plugins/module_utils/render/nft_policy.py.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.render import nft_policy
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router import front
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.front import inventory_address
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.workers import RouterError


def firewall_trusted_addresses(groups, hostvars, group_names, plan, extra=None):
    """``extra`` then the addresses of the hosts of ``group_names`` that are not ``plan``'s cluster nodes.

    ``extra`` is taken here rather than added in the template: an error raised by this filter inside
    ``a + b`` reaches the operator as a type error that hides its message.
    """
    names = [group_names] if isinstance(group_names, str) else list(group_names or [])
    members = {}
    for group in names:
        for host in groups.get(group) or []:
            if host not in members:
                members[host] = inventory_address(host, hostvars[host] if host in hostvars else {})
    cluster = [node.get("name") for node in ((plan or {}).get("cluster") or {}).get("nodes") or []]
    cluster += [node.get("host") for node in (plan or {}).get("nodes") or []]
    try:
        found = nft_policy.trusted_addresses(members, cluster, " and ".join(f"group {name}" for name in names))
    except nft_policy.FirewallError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    return list(extra or []) + found


def firewall_api_mode(setting, plan, groups, hostvars, router_group="vllm_router"):
    """``clients`` or ``router``: ``auto`` is ``router`` when a host of ``router_group`` fronts the plan's deployment."""
    try:
        fronted = front.front_url(plan or {}, front.routers_of(groups, hostvars, router_group)) is not None
        return nft_policy.api_mode(str(setting), fronted)
    except (RouterError, nft_policy.FirewallError) as exc:
        raise AnsibleFilterError(str(exc)) from exc


def firewall_controller_addresses(setting, destination, host="?"):
    """The controller's addresses that reach a node's API port (``auto``: the one it sends from to ``destination``)."""
    try:
        return nft_policy.controller_addresses(setting if setting == "auto" else list(setting or []),
                                               str(destination), str(host))
    except nft_policy.FirewallError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    """vllm_ops.cluster firewall filters (documentation: firewall_trusted_addresses.yml, firewall_api_mode.yml,
    firewall_controller_addresses.yml)."""

    def filters(self):
        return {"firewall_trusted_addresses": firewall_trusted_addresses, "firewall_api_mode": firewall_api_mode,
                "firewall_controller_addresses": firewall_controller_addresses}
