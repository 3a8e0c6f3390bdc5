"""The doctor's evidence: what Ansible registered on every node, read as a cluster.

``evidence_from_registered`` turns the registered results of ``doctor_gather``,
``gpu_facts`` and ``ib_facts`` into the evidence dict (its shape is documented
in ``docs/doctor.md``); ``Cluster`` and ``Node`` read it for the observations:
a node's units, journals, env files, ports and interfaces, the head, the units
and ports the plan expects on each node. ``make_hit`` is the shape of one line
of evidence that observations and log rules return.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.router_view import routers_from_saved
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.systemd import parse_exec_start
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import flag_value

VLLM_UNIT = "vllm.service"
# The units of the launch modes' own clusters (Ray's), installed by the plan or by hand (playbooks/ray.yml).
RAY_UNITS = launch.CLUSTER_UNITS
# Ports a deployment opens on its head only; every other plan port (Ray's per-node
# ports) is opened on every node of a Ray cluster.
HEAD_ONLY_PORTS = ("api", "master", "dp_rpc", "ray_gcs", "ray_dashboard", "ray_client")


def _registered_failure(result):
    if not isinstance(result, dict):
        return "no result"
    if result.get("unreachable"):
        return result.get("msg") or "unreachable"
    if result.get("skipped"):
        return "skipped"
    if result.get("failed"):
        return result.get("msg") or "failed"
    return None


def api_error_message(body):
    """The message of an OpenAI-style error body ({"error": {"message": ...}} or {"message": ...}), else None."""
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    message = error.get("message") if isinstance(error, dict) else body.get("message")
    if not isinstance(message, str) or not message.strip():
        return None
    message = " ".join(message.split())
    return message if len(message) <= 300 else message[:297] + "..."


def client_from_registered(url, results):
    """What a client saw: the controller's probes of the API ({url, probes: [{probe, ok, status, error, elapsed_s}]}).

    ``results`` are the uri results registered by roles/doctor/tasks/diagnose.yml (status, msg, elapsed, json and
    the probe it ran); a skipped probe is left out. An answer is good when the status is 200 and, for a
    completion, the body holds a choice; its error says what came back instead.
    """
    probes = []
    for result in results or []:
        if not isinstance(result, dict) or result.get("skipped"):
            continue
        probe = result.get("__doctor_probe") or {}
        label = f"{probe.get('method', 'GET')} {probe.get('path', '?')}"
        status = result.get("status")
        body = result.get("json")
        ok = status == 200
        error = None
        if not ok:
            error = str(result.get("msg") or f"status {status}")
            said = api_error_message(body)
            if said:
                error = f"{error}; the API said: {said}"
        elif probe.get("path", "").endswith("/completions") and not (isinstance(body, dict) and body.get("choices")):
            ok, error = False, "status 200 without a completion in the body"
        probes.append({"probe": label, "ok": ok, "status": status, "error": error,
                       "elapsed_s": result.get("elapsed")})
    return {"url": url, "probes": probes} if probes else {}


def evidence_from_registered(plan, hosts, client=None):
    """The evidence dict from what Ansible registered per host: {host, gather, gpu, ib}; and what a client saw.

    A host whose every result is unreachable is recorded as unreachable; a fact
    module that failed (nvidia-smi broken, say) leaves {"error": msg} so the
    catalog can still match the node's journals.
    """
    nodes = {}
    for item in hosts or []:
        name = item.get("host")
        gather, gpu, ib = item.get("gather") or {}, item.get("gpu") or {}, item.get("ib") or {}
        unreachable = [r for r in (gather, gpu, ib) if isinstance(r, dict) and r.get("unreachable")]
        node = {"reachable": not unreachable, "error": _registered_failure(unreachable[0]) if unreachable else None}
        node["gather"] = gather.get("evidence") or {}
        if _registered_failure(gather) and not unreachable:
            node["gather"] = {"errors": [{"command": "doctor_gather", "error": _registered_failure(gather)}]}
        node["gpu"] = (gpu.get("ansible_facts") or {}).get("vllm_gpu") or {"error": _registered_failure(gpu)}
        node["ib"] = (ib.get("ansible_facts") or {}).get("vllm_ib") or {"error": _registered_failure(ib)}
        nodes[name] = node
    return {"plan": plan or {}, "nodes": nodes, "client": client or {}}


class Node:
    """One node's evidence: gathered by doctor_gather plus its GPU and IB facts."""

    def __init__(self, name, raw, plan_node):
        self.name = name
        raw = raw or {}
        self.reachable = raw.get("reachable", True)
        self.error = raw.get("error")
        self.gather = raw.get("gather") or {}
        self.gpu = raw.get("gpu") or {}
        self.ib = raw.get("ib") or {}
        self.plan = plan_node or {}

    @property
    def units(self):
        return self.gather.get("units") or {}

    def unit(self, name):
        return self.units.get(name) or {}

    def installed(self, name):
        unit = self.unit(name)
        return bool(unit) and unit.get("LoadState") not in (None, "", "not-found")

    def journal(self, unit):
        return (self.gather.get("journal") or {}).get(unit) or []

    @property
    def env(self):
        """Every env file's variables, later files winning, as systemd reads them in order."""
        merged = {}
        for path in self.gather.get("env_file_order") or sorted(self.gather.get("env_files") or {}):
            info = (self.gather.get("env_files") or {}).get(path) or {}
            for key, value in (info.get("vars") or {}).items():
                merged[key] = (value, path, (info.get("lines") or {}).get(key, [None, f"{key}={value}"]))
        return merged

    @property
    def deployment_pids(self):
        pids = set()
        for info in (self.gather.get("unit_pids") or {}).values():
            pids.update(int(pid) for pid in info)
        return pids

    def pid_unit(self, pid):
        for unit, pids in (self.gather.get("unit_pids") or {}).items():
            if pid in {int(p) for p in pids}:
                return unit
        return None

    @property
    def interfaces(self):
        return self.gather.get("interfaces") or {}

    def local_addresses(self):
        return {address.split("/")[0] for info in self.interfaces.values() for address in info.get("addresses", [])}

    @property
    def runs_vllm(self):
        if self.plan:
            return bool(self.plan.get("runs_vllm"))
        return self.installed(VLLM_UNIT)

    # --- the compared facts (docs/doctor.md "Compared facts"); {} in older evidence ---
    @property
    def routes(self):
        """address -> outgoing interface (None: no route)."""
        return self.gather.get("routes") or {}

    @property
    def route_details(self):
        """address -> {dev, gateway, prefsrc} or {error}."""
        return self.gather.get("route_details") or {}

    @property
    def dropins(self):
        """unit -> {drop-in path: {lines} or {error}}."""
        return self.gather.get("dropins") or {}

    @property
    def unit_environment(self):
        """unit -> {name: value} of its Environment= (secrets redacted)."""
        return self.gather.get("unit_environment") or {}

    @property
    def processes(self):
        """unit -> [{pid, comm, state, samples, ppid, wchan}]."""
        return self.gather.get("processes") or {}

    @property
    def process_limits(self):
        """unit -> {pid, open_files: [soft, hard], locked_memory: [soft, hard]} of its running main process."""
        return self.gather.get("process_limits") or {}

    @property
    def access(self):
        """{user, uid, gids, paths: [{purpose, path, need, ok, denied, owner, group, mode, ...}]}."""
        return self.gather.get("access") or {}

    @property
    def disk(self):
        """[{path, purpose, free_bytes, total_bytes, free_inodes, total_inodes}]."""
        return self.gather.get("disk") or []

    @property
    def api_key(self):
        """{path, exists, has_key, compared, inventory_has_key, matches}: the key file against the inventory's key."""
        return self.gather.get("api_key") or {}

    @property
    def expected(self):
        """What the doctor role told the node to expect: {limits: {unit: {property: value}}, mtu}."""
        return self.gather.get("expected") or {}


def saved_hosts(data):
    """``[{host, gather, gpu, ib}]`` of a saved evidence file (``hosts`` names, one entry per node in the others)."""
    names = data.get("hosts") or []
    lists = [data.get(key) or [{}] * len(names) for key in ("gather", "gpu", "ib")]
    if any(len(values) != len(names) for values in lists):
        raise ValueError("evidence: hosts, gather, gpu and ib must have one entry per node")
    return [{"host": n, "gather": g, "gpu": p, "ib": i} for n, g, p, i in zip(names, *lists, strict=True)]


def evidence_from_saved(data):
    """The evidence dict from a saved doctor-evidence.json (what roles/doctor/tasks/diagnose.yml writes, with
    ``metrics`` when Prometheus was read, ``routers`` when the inventory has router hosts): the doctor's CLI and
    every replay of a capture read it here."""
    client = data.get("client") or {}
    evidence = evidence_from_registered(data.get("plan"), saved_hosts(data),
                                        client_from_registered(client.get("url"), client.get("results")))
    evidence["metrics"] = data.get("metrics") or {}
    evidence["routers"] = routers_from_saved(data.get("routers"))
    return evidence


class Cluster:
    """The plan plus every node, with the derived views observations share."""

    def __init__(self, evidence):
        self.plan = evidence.get("plan") or {}
        plan_nodes = {node.get("host"): node for node in self.plan.get("nodes", [])}
        raw_nodes = evidence.get("nodes") or {}
        order = [node.get("host") for node in self.plan.get("nodes", []) if node.get("host") in raw_nodes]
        order += [name for name in raw_nodes if name not in order]
        self.nodes = [Node(name, raw_nodes[name], plan_nodes.get(name)) for name in order]
        # The API as a client sees it, probed from the controller (client_from_registered); {} when not probed.
        self.client = evidence.get("client") or {}
        # What Prometheus knows of the deployment (metrics.gather); {} when no Prometheus was named.
        self.metrics = evidence.get("metrics") or {}
        # Each router host's view of its workers (router_view.routers_from_saved); [] without router hosts.
        self.routers = evidence.get("routers") or []

    def reachable_nodes(self):
        return [node for node in self.nodes if node.reachable]

    @property
    def head(self):
        for node in self.nodes:
            if node.plan.get("node_rank") == 0 or node.plan.get("role") == "head":
                return node
        return self.nodes[0] if self.nodes else None

    def expected_units(self, node):
        """Units this node must run: vllm where the plan runs it, Ray where Ray is installed or planned."""
        units = []
        if node.runs_vllm:
            units.append(VLLM_UNIT)
        # A node outside the plan (node3 beside a 2-node Ray plan) is no member of its Ray cluster.
        planned = launch.of_plan(self.plan).cluster_units_on(0 if node is self.head else 1) if node.plan else []
        for unit in RAY_UNITS:
            if unit in planned or node.installed(unit):
                units.append(unit)
        return units

    def ray_argv(self, node):
        for unit in RAY_UNITS:
            if node.installed(unit):
                return parse_exec_start(node.unit(unit).get("ExecStart"))
        return []

    def ports_for(self, node):
        """{name: port} the deployment listens on at this node."""
        ports = {}
        plan_ports = self.plan.get("ports") or {}
        for name, port in plan_ports.items():
            if name in ("ray_min_worker", "ray_max_worker") or not isinstance(port, int):
                continue
            if name not in launch.of_plan(self.plan).ports and not any(node.installed(u) for u in RAY_UNITS):
                continue
            if name in HEAD_ONLY_PORTS and node is not self.head:
                continue
            if name in ("api", "master", "dp_rpc") and not node.runs_vllm:
                continue
            ports[name] = port
        argv = self.ray_argv(node)
        for flag, name in _RAY_PORT_FLAGS.items():
            value = flag_value(argv, flag)
            if value and value.isdigit():
                ports.setdefault(name, int(value))
        return ports

    def plan_env(self, node):
        return node.plan.get("env") or {}

    def fabric_interface(self, node):
        return node.plan.get("fabric_interface") or None

    def fabric_device(self, node):
        """The node's fabric interface: the plan's, else its route to the head, else the one that holds its address."""
        name = self.fabric_interface(node)
        if name:
            return name
        head = self.head
        if head is not None and head is not node and head.plan.get("address"):
            name = node.routes.get(head.plan["address"])
            if name:
                return name
        planned = node.plan.get("address")
        for ifname, info in node.interfaces.items():
            if planned and any(address.split("/")[0] == planned for address in info.get("addresses", [])):
                return ifname
        return None


_RAY_PORT_FLAGS = {
    "--port": "ray_gcs",
    "--dashboard-port": "ray_dashboard",
    "--ray-client-server-port": "ray_client",
    "--node-manager-port": "ray_node_manager",
    "--object-manager-port": "ray_object_manager",
    "--runtime-env-agent-port": "ray_runtime_env_agent",
    "--dashboard-agent-grpc-port": "ray_dashboard_agent_grpc",
    "--dashboard-agent-listen-port": "ray_dashboard_agent_listen",
    "--metrics-export-port": "ray_metrics_export",
}


def make_hit(node, source, line, **values):
    """One line of evidence, as observations and log rules return it; values fill placeholders."""
    return {"node": node.name if isinstance(node, Node) else node, "source": source, "line": line, "values": values}
