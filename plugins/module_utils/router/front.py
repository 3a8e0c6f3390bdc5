"""Where a client of one deployment should send its load: the router in front of it, or the one API server it has.

``benchmark.yml`` measures a stage under one fixed load. A deployment of independent DP replicas (plan
``data_parallel.mode: independent``) has one API server per node: load sent to one of them measures one replica,
not the stage. ``front_url`` gives the URL of the router that fronts the deployment (group ``vllm_router``, every
deployment or the ones its ``vllm_router_deployments`` names), or None where the deployment has one API server (the
head answers for every replica) or no router fronts it; ``needs_front`` says whether the load must go through one.

Pure Python (3.11+); imports nothing from Ansible.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.workers import (
    RouterError,
    serves_api,
    url,
)


def api_servers(plan):
    """The hosts of the plan that serve the API, in plan order."""
    return [node.get("host", "?") for node in plan.get("nodes") or [] if serves_api(node)]


def needs_front(plan):
    """A deployment with several API servers: load sent to one of them measures one replica."""
    return len(api_servers(plan)) > 1


def front_url(plan, routers):
    """The URL of the first router that fronts ``plan``'s deployment, or None when none does.

    ``routers``: ``[{host, address, port, deployments}]`` in inventory order; ``deployments`` empty fronts every
    deployment (vllm_router_deployments). A fronting router without an address is refused by name.
    """
    name = plan.get("deployment")
    for router in routers or []:
        fronted = router.get("deployments") or []
        if isinstance(fronted, str):
            fronted = [part.strip() for part in fronted.split(",") if part.strip()]
        if fronted and name not in fronted:
            continue
        if not router.get("address"):
            raise RouterError(f"host {router.get('host', '?')} (group vllm_router) fronts deployment {name} but has "
                              "no address: expected it to be a node of a plan, or vllm_cluster_fabric_address")
        return url(router["address"], router.get("port") or 8080)
    return None


def routers_of(groups, hostvars, group="vllm_router"):
    """``[{host, address, port, deployments}]`` of the router group's hosts, in inventory order (front_url's input)."""
    routers = []
    for host in groups.get(group) or []:
        variables = hostvars[host] if host in hostvars else {}
        routers.append({"host": host, "address": inventory_address(host, variables),
                        "port": variables.get("vllm_router_port") or 8080,
                        "deployments": variables.get("vllm_router_deployments") or []})
    return routers


def inventory_address(host, variables):
    """A host's cluster address from its variables: ``vllm_cluster_fabric_address``, else its address in its own
    plan (a node of some deployment), else None."""
    variables = variables or {}
    if variables.get("vllm_cluster_fabric_address"):
        return str(variables["vllm_cluster_fabric_address"])
    plan = variables.get("vllm_cluster_plan") or {}
    for node in (plan.get("cluster") or {}).get("nodes") or []:
        if node.get("name") == host:
            return node.get("address")
    return None
