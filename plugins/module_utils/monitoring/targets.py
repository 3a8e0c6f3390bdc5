"""Prometheus file-SD target groups for a fleet, from the plans of its deployments.

Pure Python (3.11+); imports nothing from Ansible. The filter ``monitoring_targets`` and the role
``vllm_monitoring`` (which writes the groups to /etc/prometheus/file_sd/vllm-cluster.json) use it.

One group per target, three kinds, told apart by the label ``component`` (Prometheus keeps each kind
in its own scrape job, ``vllm``, ``node`` or ``ray``, by that label):

- ``vllm``: vLLM's ``/metrics`` on the API port (``plan['ports']['api']``) of every node that serves the
  API (``runs_vllm`` and not ``headless``: the head, mp's other nodes being headless and Ray's running no
  vLLM; or every node of a dense model's independent DP replicas, plan ``data_parallel.mode: independent``).
- ``node``: Prometheus's node exporter on every host the deployment was planned from
  (``plan['cluster']['nodes']``), the ranked ones and the idle ones.
- ``ray``: the metrics agent of every node that runs ``ray start``, on the port of its
  ``--metrics-export-port`` (``ports.ray_metrics_export``, 6384 by default): read from the node's
  ``ray_start_argv``, so a plan without Ray (backend mp) has none, and no backend name is compared.
- ``dcgm``: NVIDIA's DCGM exporter on every node that holds ranks, when the inventory says its nodes run one
  (``dcgm_exporter_port``, 0: none; the project does not install it): GPU utilisation, memory, power, XID
  errors, NVLink counters, with the node's labels.
- ``router``: vllm-router's own metrics on every host of the router's group (``router_groups``; not from
  a plan: the router fronts deployments, it is none of them), labels ``node``, ``role: router`` and
  ``fronts`` (the deployments it fronts, joined, or ``*`` for every one).

Labels of every group: ``deployment``; ``node`` (the inventory host); ``role`` (``head``/``worker``, or
``idle`` for a host without ranks); ``rank`` (the node's global ranks, joined with ``,``); ``replica``
(the DP ranks, ascending, joined: a node's own; under vLLM's multi-node DP the one API server fronts every
replica of its deployment, since it serves them all from the head; ``0`` for a plan of one replica). An idle
host has no ``rank`` and no ``replica``. Node exporter targets also carry ``vllm_unit``, the systemd unit the
node runs for this deployment (its vLLM unit, Ray's worker unit on a Ray worker), which the alert on a
stopped rank compares with node exporter's systemd collector.

Each of vLLM's own series carries ``engine``, the number of the engine it describes. The scrape job
(prometheus.yml's metric_relabel_configs) sets the series' ``replica`` to entry number ``engine`` of its
target's ``replica`` list, so every replica of a deployment has its own value, the plan's DP rank:
independent servers (a dense model's DP) number their engines from 0 each (three of them, one replica each,
give replicas 0, 1 and 2, not 0 three times), while the API server of vLLM's DP numbers them by DP rank
(its list is 0..n-1, so entry e is e).
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.launch.base import VLLM_UNIT

COMPONENTS = ("vllm", "node", "ray", "dcgm", "router")
ROUTER_METRICS_PORT = 29000
NODE_EXPORTER_PORT = 9100
RAY_METRICS_FLAG = "--metrics-export-port"


class TargetError(ValueError):
    """A plan that cannot be turned into targets (names the deployment and what is missing)."""


def host_port(address, port):
    """``address:port``, an IPv6 address in brackets."""
    address = str(address)
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"
    return f"{address}:{int(port)}"


def _joined(values):
    return ",".join(str(value) for value in values)


def unique_plans(plans):
    """The plans once per deployment, in their first order (every host of a deployment holds the same plan).

    Two different plans for one deployment name are an error: the targets would be a guess.
    """
    if not isinstance(plans, (list, tuple)):
        raise TargetError(f"monitoring targets: expected a list of plans, got {type(plans).__name__}")
    found = {}
    for plan in plans:
        if not isinstance(plan, dict) or not plan.get("deployment") or not isinstance(plan.get("nodes"), list):
            raise TargetError("monitoring targets: every plan needs 'deployment' and 'nodes' (the plan that "
                              "playbooks/plan.yml sets as vllm_cluster_plan)")
        name = plan["deployment"]
        if name in found and found[name] != plan:
            raise TargetError(f"monitoring targets: deployment {name} has two different plans in this run")
        found.setdefault(name, plan)
    return list(found.values())


def node_unit(plan, node):
    """The systemd unit a planned node runs for its deployment (the launch mode says which)."""
    units = launch.of_plan(plan).units_on(node["node_rank"], node["runs_vllm"])
    service_unit = (plan.get("service") or {}).get("unit") or VLLM_UNIT
    units = [service_unit if unit == VLLM_UNIT else unit for unit in units]
    return units[0] if units else None


def ray_metrics_port(node):
    """The port of the node's ``ray start --metrics-export-port``; None without Ray."""
    argv = node.get("ray_start_argv") or []
    for index, word in enumerate(argv[:-1]):
        if word == RAY_METRICS_FLAG:
            return int(argv[index + 1])
    return None


def _replicas(plan):
    return sorted({int(rank) for node in plan["nodes"] for rank in node.get("dp_ranks") or [0]})


def _node_labels(plan, node):
    return {"deployment": plan["deployment"], "node": node["host"], "role": node["role"],
            "rank": _joined(node.get("ranks") or []), "replica": _joined(sorted(node.get("dp_ranks") or [0], key=int))}


def _group(address, port, component, labels):
    return {"targets": [host_port(address, port)], "labels": {"component": component, **labels}}


def deployment_targets(plan, node_exporter_port=NODE_EXPORTER_PORT):
    """The target groups of one plan: its API server(s), node exporter on its hosts, Ray's metrics agents."""
    try:
        api_port = plan["ports"]["api"]
    except (KeyError, TypeError):
        raise TargetError(f"monitoring targets: the plan of deployment {plan['deployment']} has no ports.api") from None
    groups = []
    api_nodes = [node for node in plan["nodes"] if node.get("runs_vllm") and not node.get("headless")]
    for node in api_nodes:
        labels = _node_labels(plan, node)
        if len(api_nodes) == 1:  # one API server fronts every replica (vLLM's DP: the others are headless)
            labels["replica"] = _joined(_replicas(plan))
        groups.append(_group(node["address"], api_port, "vllm", labels))
    planned = {node["host"]: node for node in plan["nodes"]}
    cluster = (plan.get("cluster") or {}).get("nodes") or [{"name": n["host"], "address": n["address"]}
                                                           for n in plan["nodes"]]
    hosts = [entry["name"] for entry in cluster] + [host for host in planned if host not in
                                                    {entry["name"] for entry in cluster}]
    addresses = {entry["name"]: entry["address"] for entry in cluster}
    for host in hosts:
        node = planned.get(host)
        if node is None:
            labels = {"deployment": plan["deployment"], "node": host, "role": "idle"}
            address = addresses[host]
        else:
            labels = _node_labels(plan, node)
            unit = node_unit(plan, node)
            if unit:
                labels["vllm_unit"] = unit
            address = node["address"]
        groups.append(_group(address, node_exporter_port, "node", labels))
    for node in plan["nodes"]:
        port = ray_metrics_port(node)
        if port is not None:
            groups.append(_group(node["address"], port, "ray", _node_labels(plan, node)))
    return groups


def dcgm_groups(plan, port):
    """DCGM exporter targets of one plan: every node that holds ranks, on ``port``."""
    return [_group(node["address"], port, "dcgm", _node_labels(plan, node))
            for node in plan["nodes"] if node.get("ranks")]


def _port(value, what, none_allowed):
    """``value`` as a port number (0 too when ``none_allowed``: the exporter is absent), else a TargetError."""
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise TargetError(f"monitoring targets: the {what} port must be a number, got {value!r}") from None
    if not (0 if none_allowed else 1) <= port < 65536:
        allowed = "0 (none) or 1-65535" if none_allowed else "1-65535"
        raise TargetError(f"monitoring targets: the {what} port must be {allowed}, got {port}")
    return port


def target_groups(plans, node_exporter_port=NODE_EXPORTER_PORT, dcgm_exporter_port=0):
    """Prometheus file-SD target groups (``[{targets, labels}]``) of every deployment's plan, in plan order.

    ``plans`` may repeat a deployment's plan (one per host): each deployment is taken once. ``dcgm_exporter_port``
    (0: none) adds the DCGM exporter of every ranked node.
    """
    port = _port(node_exporter_port, "node exporter", none_allowed=False)
    dcgm = _port(dcgm_exporter_port or 0, "DCGM exporter", none_allowed=True)
    chosen = unique_plans(plans)
    return ([group for plan in chosen for group in deployment_targets(plan, port)]
            + ([group for plan in chosen for group in dcgm_groups(plan, dcgm)] if dcgm else []))


def router_groups(routers):
    """Target groups of the routers: ``routers`` is ``[{host, address, port, deployments}]`` (inventory order).

    ``address``/``port``: where the router's metrics listen (vllm_router_prometheus_address, else the host's cluster
    address; vllm_router_prometheus_port). A router without an address is refused by name.
    """
    groups = []
    for router in routers or []:
        host = router.get("host", "?")
        if not router.get("address"):
            raise TargetError(f"monitoring targets: router host {host} has no address for its metrics; expected "
                              "vllm_router_prometheus_address, vllm_cluster_fabric_address or a plan of its own")
        fronted = router.get("deployments") or []
        if isinstance(fronted, str):
            fronted = [part.strip() for part in fronted.split(",") if part.strip()]
        labels = {"node": host, "role": "router", "fronts": _joined(fronted) or "*"}
        groups.append(_group(router["address"], router.get("port") or ROUTER_METRICS_PORT, "router", labels))
    return groups
