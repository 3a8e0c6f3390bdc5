"""Observations of the router's view: each router host's workers compared with the deployment's planned
workers (``router_workers`` of its plan). Read from ``evidence["routers"]`` (``router_view.routers_from_saved``);
without router hosts in the inventory they see nothing.

A finding about a worker is placed on the worker's node (so that the node's own findings, a dead vLLM, explain it
through the catalog's ``explains``) and names the router host in its source and values; a router that does not
answer is placed on the router host.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import VLLM_UNIT, make_hit
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.router_view import (
    planned_workers,
    worker_state,
)


def _port(url):
    return int(url.rsplit(":", 1)[1]) if url and url.rsplit(":", 1)[-1].isdigit() else None


def _replica_nodes(cluster, host):
    """The planned nodes whose vLLM the worker on ``host`` needs: itself, and when it is the deployment's one API
    server (TP/PP over nodes, vLLM's internal DP), every other node that runs vLLM (its headless ranks)."""
    nodes = cluster.plan.get("nodes") or []
    servers = [n for n in nodes if n.get("runs_vllm") and not n.get("headless")]
    ranks = [n.get("host") for n in nodes if n.get("runs_vllm") and n.get("host") != host]
    return [host] + (ranks if len(servers) == 1 else [])


def node_vllm_state(cluster, host, url):
    """``(state, why)`` of the vLLM behind a worker, from the nodes' own evidence: up, down or unknown. Down when
    the worker's node or a node of its other ranks shows its vLLM down (the API server cannot serve without them)."""
    state, why = _one_node_vllm_state(cluster, host, url)
    if state != "down":
        for other in _replica_nodes(cluster, host)[1:]:
            other_state, other_why = _one_node_vllm_state(cluster, other, None)
            if other_state == "down":
                return "down", f"{other_why} (a rank of the replica {host} serves)"
    return state, why


def _one_node_vllm_state(cluster, host, url):
    node = next((n for n in cluster.nodes if n.name == host), None)
    if node is None or not node.gather and node.reachable:
        return "unknown", f"the doctor has no evidence of {host}'s own vLLM"
    if not node.reachable:
        return "down", f"{host} cannot be reached ({node.error or 'unreachable'})"
    unit = node.unit(VLLM_UNIT)
    if unit.get("ActiveState") != "active":
        return "down", f"{VLLM_UNIT} on {host} is {unit.get('ActiveState') or 'not installed'} ({unit.get('SubState') or '-'})"
    stopped = [p for p in node.processes.get(VLLM_UNIT) or [] if p.get("state") in ("T", "t")]
    if stopped:
        return "down", f"{VLLM_UNIT} on {host} is frozen: pid {stopped[0].get('pid')} is stopped (state T)"
    port = _port(url)
    if port is not None and not any(sock.get("port") == port for sock in node.gather.get("listening") or []):
        return "down", f"nothing listens on port {port} on {host} although {VLLM_UNIT} is active"
    return "up", f"{VLLM_UNIT} on {host} is active" + (f" and listens on port {port}" if port is not None else "")


def _routers(cluster):
    return [view for view in cluster.routers if not view.get("error")]


def obs_router_unreachable(cluster, params):
    """A router host whose client port did not answer the doctor's GET on that host."""
    return [make_hit(view["host"], f"router {view['host']}", f"{view['host']}: {view['error']}",
                     router=view["host"], router_url=view.get("url") or "?", error=view["error"])
            for view in cluster.routers if view.get("error")]


def obs_router_worker_missing(cluster, params):
    """A planned worker of the deployment that a router does not list (taken out and never put back)."""
    hits = []
    for view in _routers(cluster):
        listed = ", ".join(view["listed"]) or "none"
        for worker in planned_workers(cluster.plan):
            if worker_state(view, worker["url"])["listed"]:
                continue
            hits.append(make_hit(
                worker["host"], f"router {view['host']} /list_workers",
                f"{view['host']} fronts {listed}; the planned worker {worker['url']} ({worker['host']}) is not listed",
                router=view["host"], router_url=view.get("url") or "?", worker_url=worker["url"],
                worker_host=worker["host"], listed=listed))
    return hits


def obs_router_worker_unhealthy(cluster, params):
    """A planned worker a router lists as unhealthy (it sends it nothing); the node's own vLLM state beside it."""
    hits = []
    for view in _routers(cluster):
        for worker in planned_workers(cluster.plan):
            state = worker_state(view, worker["url"])
            if not state["listed"] or state["healthy"] is not False:
                continue
            vllm, why = node_vllm_state(cluster, worker["host"], worker["url"])
            if vllm == "up":
                suspect = (f"{why}, so the router's health checks from {view['host']} do not reach it: suspect the "
                           f"path router -> replica (a firewall between them, a route)")
            elif vllm == "down":
                suspect = f"{why}: the router marks it unhealthy because its vLLM is down"
            else:
                suspect = f"{why}; compare its vLLM (systemctl status {VLLM_UNIT}) with the path from {view['host']}"
            health = (view["metrics"].get("health") or {}).get(worker["url"])
            line = (f"{view['host']} lists {worker['url']} ({worker['host']}) with is_healthy false"
                    + (f", vllm_router_worker_health {health:.0f}" if health is not None else "")
                    + (f", {state['processed']} request(s) processed" if state["processed"] is not None else "")
                    + f"; {why}")
            hits.append(make_hit(worker["host"], f"router {view['host']} /workers", line,
                                 router=view["host"], router_url=view.get("url") or "?", worker_url=worker["url"],
                                 worker_host=worker["host"], vllm_state=vllm, suspect=suspect))
    return hits
