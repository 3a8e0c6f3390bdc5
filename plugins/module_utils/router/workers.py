"""vllm-router's workers: the API server of every replica of every deployment the router fronts, from the plans.

Pure Python (3.11+); imports nothing from Ansible. The filter ``router_workers`` and the role ``vllm_router`` use it.

A worker is one vLLM API server, ``http://<address>:<port>``. In a plan, a node serves the API when it runs
``vllm serve`` without ``--headless`` (``runs_vllm`` and not ``headless``):

- one replica (TP, PP, TP x PP over nodes): its head;
- a dense model's DP replicas (``dp_replicas``, plan ``data_parallel.mode: independent``): every node is an
  independent server of its own replicas, so every node is a worker;
- vLLM's DP with internal load balancing (MoE: ``ep_dp`` and a MoE model's ``dp_replicas``): one API server,
  the head, which fronts every DP rank of the deployment; the other nodes are headless;
- DP with hybrid load balancing (``--data-parallel-hybrid-lb``): every node serves its local ranks, so every
  node is a worker.

The address is the node's own (``--host`` when vLLM binds one address, else the node's fabric address in the
plan); the port is the node's ``--port`` (``plan['ports']['api']``). A node bound to a loopback address cannot
be reached from the router and is refused.
"""

from __future__ import annotations

import ipaddress

from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import flag_value

HYBRID_LB_FLAG = "--data-parallel-hybrid-lb"
WILDCARD_HOSTS = ("", "0.0.0.0", "::")


class RouterError(ValueError):
    """A router that cannot be configured; the message names the host, the value and the expectation."""


def url(address, port):
    """``http://address:port``, an IPv6 address in brackets."""
    address = str(address)
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"
    return f"http://{address}:{int(port)}"


def unique_plans(plans):
    """The plans once per deployment, in their first order (every host of a deployment holds the same plan)."""
    if not isinstance(plans, (list, tuple)):
        raise RouterError(f"router workers: expected a list of plans (vllm_cluster_plan of the hosts of vllm_nodes), "
                          f"got {type(plans).__name__}")
    found = {}
    for plan in plans:
        if not isinstance(plan, dict) or not plan.get("deployment") or not isinstance(plan.get("nodes"), list):
            raise RouterError("router workers: every plan needs 'deployment' and 'nodes' (the plan that "
                              "playbooks/plan.yml sets as vllm_cluster_plan)")
        name = plan["deployment"]
        if name in found and found[name] != plan:
            raise RouterError(f"router workers: deployment {name} has two different plans in this run; expected "
                              "one plan per deployment (plan it once, with playbooks/plan.yml)")
        found.setdefault(name, plan)
    return list(found.values())


def _is_loopback(address):
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def serves_api(node):
    """Whether a planned node runs a vLLM API server (``vllm serve`` without ``--headless``)."""
    return bool(node.get("runs_vllm")) and not node.get("headless")


def node_worker(plan, node):
    """The worker of one API-serving node: ``{deployment, host, url, served_model_name, replicas}``."""
    name = plan["deployment"]
    host = node.get("host", "?")
    argv = [str(word) for word in node.get("argv") or []]
    planned_port = (plan.get("ports") or {}).get("api")
    port = flag_value(argv, "--port") or planned_port
    if port is None:
        raise RouterError(f"host {host} (deployment {name}): no API port (neither --port in its argv nor "
                          "ports.api in the plan); expected the plan of playbooks/plan.yml")
    if planned_port is not None and str(port) != str(planned_port):
        raise RouterError(f"host {host} (deployment {name}): its argv has --port {port} but the plan's ports.api "
                          f"is {planned_port}; expected one port (re-plan with playbooks/plan.yml)")
    bound = flag_value(argv, "--host")
    if bound is not None and _is_loopback(bound):
        raise RouterError(f"host {host} (deployment {name}): vLLM's API binds {bound} (vllm_cluster_api_host), "
                          "which the router cannot reach from another machine; expected a cluster address, "
                          "0.0.0.0 or no vllm_cluster_api_host")
    address = node.get("address") if bound in WILDCARD_HOSTS or bound is None else bound
    if not address:
        raise RouterError(f"host {host} (deployment {name}): no address in the plan; expected nodes[].address")
    api_nodes = [other for other in plan["nodes"] if serves_api(other)]
    if len(api_nodes) == 1:  # vLLM's internal DP: the head fronts every replica of the deployment
        replicas = sorted({int(rank) for other in plan["nodes"] for rank in other.get("dp_ranks") or [0]})
    else:
        replicas = sorted(int(rank) for rank in node.get("dp_ranks") or [0])
    return {"deployment": name, "host": host, "url": url(address, port),
            "served_model_name": plan.get("served_model_name") or name, "replicas": replicas}


def selected_plans(plans, deployments=None):
    """The plans of ``deployments`` (names; empty or None: every plan), in plan order; an unknown name fails."""
    every = unique_plans(plans)
    if deployments in (None, "", []):
        return every
    if isinstance(deployments, str):
        deployments = [part.strip() for part in deployments.split(",") if part.strip()]
    if not isinstance(deployments, (list, tuple)) or not all(isinstance(name, str) for name in deployments):
        raise RouterError(f"vllm_router_deployments must be a list of deployment names, got {deployments!r}")
    known = [plan["deployment"] for plan in every]
    unknown = [name for name in deployments if name not in known]
    if unknown:
        raise RouterError(f"vllm_router_deployments names {', '.join(unknown)}, which no plan of this run has; "
                          f"expected some of: {', '.join(known) or 'none (no host has vllm_cluster_plan)'}")
    return [plan for plan in every if plan["deployment"] in deployments]


def router_workers(plans, deployments=None):
    """Every worker of the fronted deployments, deployment after deployment, node order within each.

    Fails when there is none, when a URL would be listed twice, or when the fronted deployments serve different
    model names: vllm-router's regular mode sends any request to any worker, so one router fronts one model.
    """
    chosen = selected_plans(plans, deployments)
    for plan in chosen:
        for node in plan["nodes"]:
            if HYBRID_LB_FLAG in (node.get("argv") or []) and node.get("headless"):
                raise RouterError(f"host {node.get('host', '?')} (deployment {plan['deployment']}): its argv has "
                                  f"{HYBRID_LB_FLAG} and --headless; expected no --headless with hybrid load "
                                  "balancing (every node serves its local ranks)")
    workers = [node_worker(plan, node) for plan in chosen for node in plan["nodes"] if serves_api(node)]
    if not workers:
        raise RouterError("router workers: the fronted deployments ("
                          f"{', '.join(plan['deployment'] for plan in chosen) or 'none'}) have no node that serves "
                          "the API; expected at least one node with runs_vllm and not headless")
    seen = {}
    for worker in workers:
        if worker["url"] in seen:
            other = seen[worker["url"]]
            raise RouterError(f"host {worker['host']} (deployment {worker['deployment']}): worker {worker['url']} is "
                              f"also host {other['host']}'s (deployment {other['deployment']}); expected distinct "
                              "API ports for deployments that share a machine (vllm_cluster_ports)")
        seen[worker["url"]] = worker
    models = {}
    for worker in workers:
        models.setdefault(worker["served_model_name"], []).append(worker["deployment"])
    if len(models) > 1:
        listed = "; ".join(f"{model}: {', '.join(dict.fromkeys(names))}" for model, names in models.items())
        raise RouterError(f"the fronted deployments serve different models ({listed}); vllm-router sends any request "
                          "to any worker, so one router fronts one model: set vllm_router_deployments to the "
                          "deployments of one model (a router host group per model)")
    return workers
