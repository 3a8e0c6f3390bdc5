"""Filter router_front_url: the router in front of a deployment, for a client's load (benchmark.yml).

Documentation: router_front_url.yml beside this file. The logic is plugins/module_utils/router/front.py.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router import front
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.workers import RouterError


def router_front_url(plan, groups, hostvars, group="vllm_router"):
    """The URL of the router that fronts ``plan``'s deployment, '' when none does."""
    try:
        return front.front_url(plan, front.routers_of(groups, hostvars, group)) or ""
    except RouterError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def api_servers(plan):
    """The hosts of the plan that serve the API."""
    return front.api_servers(plan)


class FilterModule:
    """vllm_ops.cluster router front filters (documentation: router_front_url.yml, router_api_servers.yml)."""

    def filters(self):
        return {"router_front_url": router_front_url, "router_api_servers": api_servers}
