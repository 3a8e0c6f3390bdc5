"""The doctor: failure signatures kept as data, matched against what the nodes show.

Symptom -> checks -> cause -> fix lives in a YAML catalog
(``roles/doctor/files/signatures.yml``), never in code branches. This module

- validates that catalog (``load_catalog``);
- turns the gathered evidence of every node, the plan and the GPU/IB facts into
  named *observations* (``OBSERVATIONS``): generic, reusable checks such as
  "a plan port is held by a process outside the deployment's units";
- matches each signature's rules (log patterns and observations) and ranks
  the findings, most likely cause first (``diagnose``);
- renders the report for a terminal and for ``results/<deployment>/doctor.md``.

Pure Python 3.11, no Ansible import. The evidence shape is documented in
``docs/doctor.md``.
"""

from __future__ import annotations

import json
import re
import string

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
    RAY_UNITS,
    VLLM_UNIT,
    Cluster,
    Node,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.net import rule_ports, source_accepted
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.systemd import (
    READY_PATTERNS,
    parse_exec_start,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import flag_value, is_ip
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import history as plan_history
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify import vllm_logs

CATALOG_VERSION = 1
FAMILIES = ("startup", "communication", "performance")
SEVERITIES = ("fault", "warning")
LOG_SOURCES = ("vllm", "ray", "any")
SOCKET_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
MAX_EVIDENCE_PER_FINDING = 8
_ID = re.compile(r"^[a-z][a-z0-9_]{1,63}$")


class CatalogError(ValueError):
    """The signature catalog is malformed; the message names the signature and the field."""


# --------------------------------------------------------------------------- catalog


def _require(condition, where, message):
    if not condition:
        raise CatalogError(f"{where}: {message}")


def _text_field(sig, key, where, required=True):
    value = sig.get(key)
    if value is None and not required:
        return None
    _require(isinstance(value, str) and value.strip(), where, f"'{key}' must be a non-empty string, got {value!r}")
    return value.strip()


def _check_rule(rule, where):
    _require(isinstance(rule, dict), where, f"each rule must be a mapping, got {rule!r}")
    kinds = [key for key in ("log", "observation") if key in rule]
    _require(len(kinds) == 1, where, f"a rule has exactly one of 'log' or 'observation', got {sorted(rule)}")
    unknown = set(rule) - {"log", "observation", "params", "requires"}
    _require(not unknown, where, f"unknown rule keys {sorted(unknown)}")
    checked = {"requires": []}
    requires = rule.get("requires", [])
    _require(
        isinstance(requires, list) and all(isinstance(name, str) for name in requires),
        where,
        f"'requires' must be a list of observation names, got {requires!r}",
    )
    for name in requires:
        _require(name in OBSERVATIONS, where, f"'requires' names the unknown observation {name!r}")
    checked["requires"] = list(requires)
    if "log" in rule:
        log = rule["log"]
        _require(isinstance(log, dict), where, f"'log' must be a mapping with 'pattern', got {log!r}")
        pattern = log.get("pattern")
        _require(isinstance(pattern, str) and pattern, where, "'log.pattern' must be a regular expression")
        try:
            compiled = re.compile(pattern)
        except re.error as error:
            raise CatalogError(f"{where}: 'log.pattern' {pattern!r} is not a valid regular expression: {error}") from None
        sources = log.get("sources", ["any"])
        _require(
            isinstance(sources, list) and sources and all(source in LOG_SOURCES for source in sources),
            where,
            f"'log.sources' must be a list of {list(LOG_SOURCES)}, got {sources!r}",
        )
        after = log.get("after", 0)
        _require(
            isinstance(after, int) and not isinstance(after, bool) and 0 <= after <= 20,
            where,
            f"'log.after' (lines quoted after the match) must be an integer 0-20, got {after!r}",
        )
        unknown = set(log) - {"pattern", "sources", "after"}
        _require(not unknown, where, f"unknown log keys {sorted(unknown)}")
        checked["log"] = {"pattern": pattern, "regex": compiled, "sources": list(sources), "after": after}
    else:
        name = rule["observation"]
        _require(name in OBSERVATIONS, where, f"unknown observation {name!r}; known: {sorted(OBSERVATIONS)}")
        params = rule.get("params", {})
        _require(isinstance(params, dict), where, f"'params' must be a mapping, got {params!r}")
        checked["observation"] = name
        checked["params"] = dict(params)
    return checked


def load_catalog(data):
    """Validate the catalog data (as YAML loads it) and return it with compiled patterns.

    Raises CatalogError naming the signature and field at the first problem.
    """
    _require(isinstance(data, dict), "catalog", f"must be a mapping, got {type(data).__name__}")
    _require(
        data.get("catalog_version") == CATALOG_VERSION,
        "catalog",
        f"catalog_version must be {CATALOG_VERSION}, got {data.get('catalog_version')!r}",
    )
    signatures = data.get("signatures")
    _require(isinstance(signatures, list) and signatures, "catalog", "'signatures' must be a non-empty list")
    checked = []
    seen = set()
    for index, sig in enumerate(signatures):
        where = f"signature #{index + 1}"
        _require(isinstance(sig, dict), where, f"must be a mapping, got {sig!r}")
        sig_id = sig.get("id")
        _require(isinstance(sig_id, str) and _ID.match(sig_id), where, f"'id' must match {_ID.pattern}, got {sig_id!r}")
        where = f"signature {sig_id}"
        _require(sig_id not in seen, where, "the id is used twice")
        seen.add(sig_id)
        allowed = {
            "id", "family", "seed_branch", "severity", "priority", "title", "symptom", "checks",
            "cause", "fix", "match", "explains", "references", "defaults",
        }
        unknown = set(sig) - allowed
        _require(not unknown, where, f"unknown keys {sorted(unknown)}")
        family = sig.get("family")
        _require(family in FAMILIES, where, f"'family' must be one of {list(FAMILIES)}, got {family!r}")
        severity = sig.get("severity", "fault")
        _require(severity in SEVERITIES, where, f"'severity' must be one of {list(SEVERITIES)}, got {severity!r}")
        priority = sig.get("priority")
        _require(
            isinstance(priority, int) and not isinstance(priority, bool) and 1 <= priority <= 100,
            where,
            f"'priority' must be an integer 1-100, got {priority!r}",
        )
        checks = sig.get("checks")
        _require(
            isinstance(checks, list) and checks and all(isinstance(c, str) and c.strip() for c in checks),
            where,
            "'checks' must be a non-empty list of strings",
        )
        match = sig.get("match")
        _require(isinstance(match, dict) and set(match) == {"any"}, where, "'match' must be a mapping with only 'any'")
        rules = match["any"]
        _require(isinstance(rules, list) and rules, where, "'match.any' must be a non-empty list of rules")
        explains = sig.get("explains", [])
        _require(
            isinstance(explains, list) and all(isinstance(name, str) for name in explains),
            where,
            f"'explains' must be a list of signature ids, got {explains!r}",
        )
        defaults = sig.get("defaults", {})
        _require(
            isinstance(defaults, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in defaults.items()),
            where,
            f"'defaults' must map placeholder names to strings, got {defaults!r}",
        )
        references = sig.get("references", [])
        _require(
            isinstance(references, list) and all(isinstance(ref, str) for ref in references),
            where,
            "'references' must be a list of strings",
        )
        checked.append(
            {
                "id": sig_id,
                "family": family,
                "seed_branch": _text_field(sig, "seed_branch", where, required=False),
                "severity": severity,
                "priority": priority,
                "title": _text_field(sig, "title", where),
                "symptom": _text_field(sig, "symptom", where),
                "checks": [c.strip() for c in checks],
                "cause": _text_field(sig, "cause", where),
                "fix": _text_field(sig, "fix", where),
                "rules": [_check_rule(rule, f"{where}, rule #{n + 1}") for n, rule in enumerate(rules)],
                "explains": list(explains),
                "references": list(references),
                "defaults": dict(defaults),
            }
        )
    for sig in checked:
        for name in sig["explains"]:
            _require(name in seen, f"signature {sig['id']}", f"'explains' names the unknown signature {name!r}")
            _require(name != sig["id"], f"signature {sig['id']}", "a signature cannot explain itself")
    return {"catalog_version": CATALOG_VERSION, "signatures": checked}


def load_catalog_file(path):
    import yaml  # the controller has PyYAML (Ansible needs it); only this loader uses it

    with open(path, encoding="utf-8") as handle:
        return load_catalog(yaml.safe_load(handle))


# --------------------------------------------------------------------------- observations

# Each observation takes the cluster and the rule's params and returns hits:
# {"node": name or None, "source": where the line comes from, "line": the evidence
# quoted, "values": {placeholder: value}}. Observations check; the catalog decides
# what a hit means.


def _hit(node, source, line, **values):
    return {"node": node.name if isinstance(node, Node) else node, "source": source, "line": line, "values": values}


def _units_param(params, default):
    units = params.get("units", default)
    return [units] if isinstance(units, str) else list(units)


def obs_node_unreachable(cluster, params):
    return [
        _hit(node, "ansible", f"{node.name}: {node.error or 'unreachable over SSH'}")
        for node in cluster.nodes
        if not node.reachable
    ]


def obs_port_held_by_foreign_process(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        ports = cluster.ports_for(node)
        by_port = {}
        for sock in node.gather.get("listening") or []:
            by_port.setdefault(sock["port"], []).append(sock)
        for name, port in sorted(ports.items(), key=lambda item: item[1]):
            for sock in by_port.get(port, []):
                owners = [proc for proc in sock.get("processes", []) if proc.get("pid") not in node.deployment_pids]
                ours = [proc for proc in sock.get("processes", []) if proc.get("pid") in node.deployment_pids]
                if owners and not ours:
                    proc = owners[0]
                    hits.append(
                        _hit(
                            node,
                            "ss -ltnp",
                            f"{sock['line']}  <- port {port} ({name}) held by {proc['name']} pid {proc['pid']}, "
                            "outside the deployment's units",
                            port=port, port_name=name, process=proc["name"], pid=proc["pid"],
                        )
                    )
    return hits


def obs_gpu_held_by_foreign_process(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        for proc in node.gpu.get("processes") or []:
            pid = proc.get("pid")
            if pid is None or pid in node.deployment_pids:
                continue
            memory = proc.get("used_memory_mib")
            hits.append(
                _hit(
                    node,
                    "nvidia-smi",
                    f"GPU{proc.get('gpu')}: pid {pid} ({proc.get('name')}) uses "
                    f"{memory if memory is not None else '?'} MiB and belongs to no deployment unit",
                    gpu=proc.get("gpu"), pid=pid, process=proc.get("name"), memory_mib=memory,
                )
            )
    return hits


def _unit_line(node, unit):
    info = node.unit(unit)
    state = f"{info.get('ActiveState', '?')} ({info.get('SubState', '?')})"
    extra = []
    if info.get("Result") not in (None, "", "success"):
        extra.append(f"result {info.get('Result')}")
    if info.get("ExecMainStatus") not in (None, "", "0"):
        extra.append(f"exit status {info.get('ExecMainStatus')}")
    if info.get("NRestarts") not in (None, "", "0"):
        extra.append(f"{info.get('NRestarts')} restarts")
    if info.get("UnitFileState"):
        extra.append(info["UnitFileState"])
    return f"systemctl: {unit} {state}" + (f", {', '.join(extra)}" if extra else "")


def _last_error_line(lines, unit=None):
    if unit == VLLM_UNIT:
        errors = vllm_logs.parse_log("\n".join(lines)).get("errors") or []
        if errors:
            return errors[-1]["line"]
    for line in reversed(lines):
        text = line.strip()
        if re.search(r"(Error|Exception|error:|FAILED|failed)", text) and not text.startswith("File "):
            return text
    return None


def _stopped_on_request(node, unit):
    """systemd logged a stop job for this invocation: someone (or something) stopped the unit.

    Ray's `ray start --block` exits 1 on SIGTERM, so a stopped Ray unit ends "failed";
    the stop job in its journal tells it from a crash.
    """
    return any(line.startswith(f"Stopping {unit}") for line in node.journal(unit))


def obs_unit_failed(cluster, params):
    wanted = _units_param(params, [VLLM_UNIT, *RAY_UNITS])
    hits = []
    for node in cluster.reachable_nodes():
        for unit in cluster.expected_units(node):
            if unit not in wanted or not node.installed(unit):
                continue
            info = node.unit(unit)
            failing = (info.get("ActiveState") == "failed" and not _stopped_on_request(node, unit)) or (
                info.get("ActiveState") == "activating" and info.get("SubState") == "auto-restart"
            )
            if failing:
                last = _last_error_line(node.journal(unit), unit)
                line = _unit_line(node, unit) + (f"; last error: {last}" if last else "")
                hits.append(_hit(node, "systemctl", line, unit=unit, last_error=last or "none logged"))
    return hits


def obs_unit_stopped(cluster, params):
    wanted = _units_param(params, [VLLM_UNIT, *RAY_UNITS])
    hits = []
    for node in cluster.reachable_nodes():
        for unit in cluster.expected_units(node):
            if unit not in wanted or not node.installed(unit):
                continue
            info = node.unit(unit)
            stopped = info.get("ActiveState") in ("inactive", "deactivating") and info.get("Result", "success") == "success"
            if stopped or (info.get("ActiveState") == "failed" and _stopped_on_request(node, unit)):
                line = _unit_line(node, unit)
                stop = next((x for x in node.journal(unit) if x.startswith(f"Stopping {unit}")), None)
                hits.append(_hit(node, "systemctl", line + (f"; journal: {stop}" if stop else ""), unit=unit))
    return hits


def obs_unit_missing(cluster, params):
    wanted = _units_param(params, [VLLM_UNIT, *RAY_UNITS])
    hits = []
    for node in cluster.reachable_nodes():
        for unit in cluster.expected_units(node):
            # Only systemd's own "not-found" counts: a node where systemctl cannot answer proves nothing.
            if unit in wanted and node.unit(unit).get("LoadState") == "not-found":
                hits.append(_hit(node, "systemctl", f"systemctl: {unit} is not installed (LoadState=not-found)",
                                 unit=unit))
    return hits


def obs_ray_node_not_alive(cluster, params):
    """Ray nodes (by their --node-ip-address) that the head's state API does not list as ALIVE."""
    head = cluster.head
    ray_info = head.gather.get("ray") if head else None
    listed = (ray_info or {}).get("nodes")
    if not isinstance(listed, list):
        return []
    alive = {entry.get("node_ip") for entry in listed if entry.get("state") == "ALIVE"}
    dead = {entry.get("node_ip"): entry for entry in listed if entry.get("state") != "ALIVE"}
    hits = []
    for node in cluster.nodes:
        argv = cluster.ray_argv(node) if node.reachable else []
        address = flag_value(argv, "--node-ip-address") or node.plan.get("address")
        if not argv and not (cluster.plan.get("backend") == "ray" and node.plan):
            continue
        if address and address not in alive:
            state = dead.get(address, {}).get("state", "absent")
            hits.append(
                _hit(
                    node,
                    f"ray list nodes (on {head.name})",
                    f"Ray node {node.name} ({address}) is {state} in the head's node list "
                    f"({len(alive)} ALIVE: {', '.join(sorted(a for a in alive if a)) or 'none'})",
                    address=address, ray_state=state,
                )
            )
    return hits


def obs_version_mismatch(cluster, params):
    """A package (or Python) of the runtime venv differs between nodes."""
    package = params.get("package", "ray")
    versions = {}
    for node in cluster.reachable_nodes():
        venv = node.gather.get("venv") or {}
        if not venv.get("exists"):
            continue
        value = venv.get("python_version") if package == "python" else (venv.get("packages") or {}).get(package)
        if value:
            versions[node.name] = value
    if len(set(versions.values())) < 2:
        return []
    counts = {}
    for value in versions.values():
        counts[value] = counts.get(value, 0) + 1
    majority = max(counts, key=lambda value: (counts[value], value))
    summary = ", ".join(f"{name}={value}" for name, value in versions.items())
    label = "Python" if package == "python" else package
    return [
        _hit(
            name,
            "runtime venv",
            f"{name}: {label} {value} in the runtime venv; the other nodes have {majority} ({summary})",
            package=label, version=value, expected=majority, versions=summary,
        )
        for name, value in versions.items()
        if value != majority
    ]


def _nccl_ifname_matches(value, expected):
    """NCCL_SOCKET_IFNAME semantics: prefixes, '=' for exact names, '^' to exclude."""
    exact = value.startswith("=")
    body = value.lstrip("=")
    exclude = body.startswith("^")
    names = [name for name in body.lstrip("^").split(",") if name]
    if exclude:
        return not any(expected == name if exact else expected.startswith(name) for name in names)
    return any(expected == name if exact else expected.startswith(name) for name in names)


def obs_socket_ifname_mismatch(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        env = node.env
        expected = cluster.fabric_interface(node)
        route_dev = None
        head = cluster.head
        if head is not None and head.plan.get("address"):
            route_dev = (node.gather.get("routes") or {}).get(head.plan["address"])
        for var in SOCKET_IFNAME_VARS:
            if var not in env:
                continue
            value, path, (number, text) = env[var]
            want = expected or route_dev
            problems = []
            if var == "NCCL_SOCKET_IFNAME":
                if want and not _nccl_ifname_matches(value, want):
                    problems.append(f"selects no interface named like {want}")
            else:
                if "," in value or value.startswith("^"):
                    problems.append("Gloo and torch take one concrete interface name, not a list")
                elif want and value != want:
                    problems.append(f"expected {want}")
                elif node.interfaces and value not in node.interfaces:
                    problems.append(f"no interface {value} on this node ({', '.join(sorted(node.interfaces))})")
            if problems:
                hits.append(
                    _hit(
                        node,
                        f"{path}:{number}",
                        f"{text.strip()}  <- {'; '.join(problems)} (the fabric interface"
                        f"{' from the inventory' if expected else ' that routes to the head'})",
                        var=var, value=value, expected=want or "?", path=path,
                    )
                )
    return hits


def obs_host_ip_mismatch(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        env = node.env
        planned = node.plan.get("address")
        local = node.local_addresses()
        if "VLLM_HOST_IP" in env:
            value, path, (number, text) = env["VLLM_HOST_IP"]
            problems = []
            if planned and is_ip(planned) and value != planned:
                problems.append(f"the plan gives this node {planned}")
            if local and value not in local:
                problems.append("no interface of this node has that address")
            if problems:
                hits.append(
                    _hit(node, f"{path}:{number}", f"{text.strip()}  <- {'; '.join(problems)}",
                         value=value, expected=planned or "?")
                )
        ray_ip = flag_value(cluster.ray_argv(node), "--node-ip-address")
        host_ip = env.get("VLLM_HOST_IP", (None,))[0]
        if ray_ip and host_ip and ray_ip != host_ip:
            hits.append(
                _hit(node, "ray unit ExecStart",
                     f"ray start --node-ip-address {ray_ip} but VLLM_HOST_IP={host_ip}: vLLM and Ray name "
                     "this node differently",
                     value=host_ip, expected=ray_ip)
            )
    return hits


def obs_model_missing(cluster, params):
    path = (cluster.plan.get("model") or {}).get("path")
    hits = []
    for node in cluster.reachable_nodes():
        model = node.gather.get("model") or {}
        node_path = model.get("path") or path
        if not node_path or not str(node_path).startswith("/") or not node.runs_vllm:
            continue
        if not model:
            continue
        if not model.get("exists"):
            hits.append(_hit(node, "filesystem", f"{node_path}: no such file or directory on {node.name}",
                             path=node_path))
        elif not model.get("config_json"):
            hits.append(_hit(node, "filesystem", f"{node_path} exists on {node.name} but has no config.json",
                             path=node_path))
    return hits


def obs_rendezvous_probe(cluster, params):
    """A node's TCP probe of a head port: results in params['results'] (default timeout/unreachable)."""
    wanted = set(params.get("results", ["timeout", "unreachable"]))
    hits = []
    head = cluster.head
    for node in cluster.reachable_nodes():
        for probe in node.gather.get("probes") or []:
            if probe.get("result") not in wanted:
                continue
            if probe.get("result") == "refused" and head is not None and _still_starting(head, probe.get("name")):
                continue  # the head's unit is up but has not opened the port yet: a start, not a fault
            listening = ""
            if head is not None and head.reachable:
                if any(sock["port"] == probe.get("port") for sock in head.gather.get("listening") or []):
                    listening = f"; {head.name} listens on {probe.get('port')}"
                else:
                    listening = f"; nothing listens on {probe.get('port')} at {head.name}"
            hits.append(
                _hit(
                    node,
                    "tcp probe",
                    f"{node.name} -> {probe.get('address')}:{probe.get('port')} ({probe.get('name')}): "
                    f"{probe.get('result')} after {probe.get('elapsed_ms', '?')} ms{listening}",
                    address=probe.get("address"), port=probe.get("port"), port_name=probe.get("name"),
                    result=probe.get("result"),
                )
            )
    return hits


def _still_starting(head, probe_name):
    unit = "ray-head.service" if probe_name == "ray_gcs" else VLLM_UNIT
    info = head.unit(unit)
    if info.get("ActiveState") not in ("active", "activating") or info.get("SubState") == "auto-restart":
        return False
    ready = [re.compile(pattern) for pattern in READY_PATTERNS]
    return not any(r.search(line) for r in ready for line in head.journal(unit))


def obs_firewall_drops_port(cluster, params):
    """Drop/reject rules on a node for a port another node's probe of that node could not reach.

    A rule alone proves nothing: a hardened node drops the internal ports for
    sources outside the cluster on purpose (after accepting the cluster's own
    nodes). A rule is quoted only when a probe over the fabric (timeout or
    unreachable) shows the port is blocked for a node of the cluster.
    """
    wanted = set(params.get("results", ["timeout", "unreachable"]))
    blocked = {}  # target node name -> {port: port name}
    probers = {}  # target node name -> addresses of the nodes whose probe failed
    for prober in cluster.reachable_nodes():
        for probe in prober.gather.get("probes") or []:
            if probe.get("result") not in wanted or not isinstance(probe.get("port"), int):
                continue
            for target in cluster.reachable_nodes():
                if target is not prober and probe.get("address") in target.local_addresses() | {
                    target.plan.get("address")
                }:
                    blocked.setdefault(target.name, {})[probe["port"]] = probe.get("name") or "port"
                    probers.setdefault(target.name, set()).update(
                        {prober.plan.get("address")} | prober.local_addresses() - {None})
    hits = []
    for node in cluster.reachable_nodes():
        ports = blocked.get(node.name) or {}
        firewall = node.gather.get("firewall") or {}
        accepted = firewall.get("accepted_sources") or {}
        for rule in firewall.get("rules", []):
            named = sorted(rule_ports(rule) & set(ports))
            # A rule its chain never lets the probing nodes reach (they are accepted before it) is not the cause.
            if named and any(source_accepted(address, accepted.get(rule, []))
                             for address in probers.get(node.name, ()) if address):
                continue
            if named:
                hits.append(
                    _hit(node, (node.gather.get("firewall") or {}).get("tool", "firewall"),
                         f"{rule}  <- drops deployment port {', '.join(f'{p} ({ports[p]})' for p in named)}",
                         port=named[0], port_name=ports[named[0]])
                )
    return hits


def obs_shm_small(cluster, params):
    minimum = float(params.get("min_gib", 1.0)) * 1024**3
    hits = []
    for node in cluster.reachable_nodes():
        shm = node.gather.get("shm") or {}
        total = shm.get("total_bytes")
        if total is None:
            if shm.get("error"):
                hits.append(_hit(node, "/dev/shm", f"/dev/shm: {shm['error']}", size_gib=0))
            continue
        if total < minimum:
            hits.append(
                _hit(node, "statvfs /dev/shm",
                     f"/dev/shm is {total / 1024**3:.2f} GiB on {node.name}; at least {minimum / 1024**3:g} GiB expected",
                     size_gib=round(total / 1024**3, 2))
            )
    return hits


def _ib_declared(node):
    """IB is declared by the plan (the inventory's HCAs); the node's own env files only without a plan."""
    if node.plan.get("env"):
        env = node.plan["env"]
        hca, disabled = env.get("NCCL_IB_HCA"), env.get("NCCL_IB_DISABLE") == "1"
    else:
        env = node.env
        hca = env.get("NCCL_IB_HCA", (None,))[0]
        disabled = env.get("NCCL_IB_DISABLE", ("0",))[0] == "1"
    return bool(hca) and not disabled, hca


def obs_ib_declared(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        declared, hca = _ib_declared(node)
        if declared:
            hits.append(_hit(node, "env", f"NCCL_IB_HCA={hca} on {node.name}", hca=hca))
    return hits


def obs_ib_port_down(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        declared, hca = _ib_declared(node)
        if not declared:
            continue
        if "present" not in node.ib:
            continue  # ib_facts did not run or failed: nothing to compare
        names = [name.split(":")[0] for name in hca.lstrip("=^").split(",") if name]
        ports = node.ib.get("ports") or []
        for name in names:
            mine = [port for port in ports if port.get("ca") == name]
            if not mine:
                hits.append(_hit(node, "ibstat", f"{name} is declared in NCCL_IB_HCA but ibstat does not show it",
                                 hca=name, state="absent"))
            for port in mine:
                if port.get("state") != "Active":
                    hits.append(
                        _hit(node, "ibstat",
                             f"{port.get('name')}: State {port.get('state')}, Physical state "
                             f"{port.get('physical_state')} (declared in NCCL_IB_HCA)",
                             hca=port.get("name"), state=port.get("state"))
                    )
    return hits


def obs_memlock_limited(cluster, params):
    minimum = params.get("min_bytes")
    hits = []
    for node in cluster.reachable_nodes():
        declared, _ = _ib_declared(node)
        if params.get("only_with_ib", True) and not declared:
            continue
        for unit in cluster.expected_units(node):
            if not node.installed(unit):
                continue
            limit = node.unit(unit).get("LimitMEMLOCK")
            if limit in (None, "", "infinity"):
                continue
            if limit.isdigit() and minimum is not None and int(limit) >= int(minimum):
                continue
            hits.append(_hit(node, "systemctl", f"{unit}: LimitMEMLOCK={limit} (RDMA needs pinned memory)",
                             unit=unit, limit=limit))
    return hits


def obs_driver_mismatch(cluster, params):
    versions = {
        node.name: node.gpu.get("driver_version")
        for node in cluster.reachable_nodes()
        if node.gpu.get("present") and node.gpu.get("driver_version")
    }
    if len(set(versions.values())) < 2:
        return []
    summary = ", ".join(f"{name}={value}" for name, value in versions.items())
    return [_hit(name, "nvidia-smi", f"{name}: driver {value} ({summary})", driver=value, versions=summary)
            for name, value in versions.items()]


def obs_fabric_manager_not_ready(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        if not node.gpu.get("nvswitch"):
            continue
        state = node.gpu.get("fabric_state")
        unit = node.unit("nvidia-fabricmanager.service")
        if state not in (None, "Completed", "N/A"):
            hits.append(_hit(node, "nvidia-smi -q", f"GPU fabric state {state} (NVSwitch system; expected Completed)",
                             state=state))
        elif unit and unit.get("LoadState") == "loaded" and unit.get("ActiveState") != "active":
            hits.append(_hit(node, "systemctl", _unit_line(node, "nvidia-fabricmanager.service"),
                             state=unit.get("ActiveState")))
    return hits


def obs_env_differs(cluster, params):
    """The node's env files against the plan's env for that node (a hand edit, a stale file)."""
    watched_extra = params.get("extra", ["NCCL_IB_HCA", "NCCL_P2P_DISABLE", "NCCL_NET", "NCCL_SOCKET_IFNAME",
                                         "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "VLLM_HOST_IP"])
    hits = []
    for node in cluster.reachable_nodes():
        planned = cluster.plan_env(node)
        if not planned or not node.runs_vllm:
            continue
        env = node.env
        differences = []
        lines = []
        for key in sorted(set(planned) | {k for k in watched_extra if k in env}):
            want = planned.get(key)
            have = env.get(key, (None,))[0]
            if want is not None and have is None:
                differences.append(f"{key} missing (plan: {want})")
            elif have != want and have != "<redacted>":
                differences.append(f"{key}={have} (plan: {want if want is not None else 'not set'})")
                lines.append(f"{env[key][1]}:{env[key][2][0]}: {env[key][2][1].strip()}")
        if differences:
            hits.append(
                _hit(node, "env files", f"{node.name}: {'; '.join(differences)}"
                     + (f" [{'; '.join(lines)}]" if lines else ""),
                     differences="; ".join(differences))
            )
    return hits


def _plan_argv_tail(node):
    argv = node.plan.get("argv") or []
    return argv[1:] if argv and argv[0] == "vllm" else argv


def obs_unit_argv_differs(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        if not node.runs_vllm or not node.installed(VLLM_UNIT) or not node.plan.get("argv"):
            continue
        running = parse_exec_start(node.unit(VLLM_UNIT).get("ExecStart"))
        if not running:
            continue
        planned = _plan_argv_tail(node)
        tail = running[1:]
        if tail == planned:
            continue
        differences = _argv_differences(planned, tail)
        dropins = node.unit(VLLM_UNIT).get("DropInPaths") or ""
        where = f" (drop-ins: {dropins})" if dropins else ""
        hits.append(
            _hit(node, "systemctl show -p ExecStart",
                 f"{VLLM_UNIT} runs {' '.join(running[1:])}; differs from the plan: {differences}{where}",
                 differences=differences, dropins=dropins or "none")
        )
    return hits


def _argv_differences(planned, running):
    want, want_pos = plan_history.argv_flags(planned)
    have, have_pos = plan_history.argv_flags(running)
    parts = []
    if want_pos != have_pos:
        parts.append(f"arguments {' '.join(have_pos)} (plan: {' '.join(want_pos)})")
    for key in sorted(set(want) | set(have)):
        if want.get(key) != have.get(key):
            have_text, want_text = plan_history.flag_text(have.get(key)), plan_history.flag_text(want.get(key))
            parts.append(f"{key} {have_text} (plan: {want_text})")
    return "; ".join(parts) or "order of arguments"


def obs_tp_across_nodes(cluster, params):
    plan = cluster.plan
    per_node = (plan.get("cluster") or {}).get("gpus_per_node")
    if plan.get("tp") and per_node and plan["tp"] > per_node:
        return [_hit(None, "plan", f"TP={plan['tp']} spans nodes of {per_node} GPUs each "
                     "(allow_tp_across_nodes): every layer's all-reduce crosses the network",
                     tp=plan["tp"], gpus_per_node=per_node)]
    return []


def obs_env_flag(cluster, params):
    """An env variable set to a value on a node: params name, value."""
    name, wanted = params.get("name"), str(params.get("value", "1"))
    hits = []
    for node in cluster.reachable_nodes():
        entry = node.env.get(name)
        if entry and entry[0] == wanted:
            value, path, (number, text) = entry
            hits.append(_hit(node, f"{path}:{number}", text.strip(), name=name, value=value))
    return hits


def obs_gpu_facts_failed(cluster, params):
    """nvidia-smi failed on a node of a CUDA deployment (gpu_facts recorded its error)."""
    if (cluster.plan.get("cluster") or {}).get("device", "cuda") != "cuda":
        return []
    return [
        _hit(node, "gpu_facts", node.gpu["error"], error=node.gpu["error"])
        for node in cluster.reachable_nodes()
        if node.gpu.get("error") and node.gpu["error"] not in ("skipped", "no result")
    ]


def obs_gpu_count_below_plan(cluster, params):
    if (cluster.plan.get("cluster") or {}).get("device") != "cuda":
        return []
    hits = []
    for node in cluster.reachable_nodes():
        needed = len(node.plan.get("local_gpus") or [])
        count = node.gpu.get("count")
        if node.gpu and count is not None and needed and count < needed:
            hits.append(_hit(node, "nvidia-smi", f"{node.name} shows {count} GPU(s); the plan places {needed} ranks there",
                             count=count, needed=needed))
    return hits


OBSERVATIONS = {
    "node_unreachable": obs_node_unreachable,
    "port_held_by_foreign_process": obs_port_held_by_foreign_process,
    "gpu_held_by_foreign_process": obs_gpu_held_by_foreign_process,
    "unit_failed": obs_unit_failed,
    "unit_stopped": obs_unit_stopped,
    "unit_missing": obs_unit_missing,
    "ray_node_not_alive": obs_ray_node_not_alive,
    "version_mismatch": obs_version_mismatch,
    "socket_ifname_mismatch": obs_socket_ifname_mismatch,
    "host_ip_mismatch": obs_host_ip_mismatch,
    "model_missing": obs_model_missing,
    "rendezvous_probe": obs_rendezvous_probe,
    "firewall_drops_port": obs_firewall_drops_port,
    "shm_small": obs_shm_small,
    "ib_declared": obs_ib_declared,
    "ib_port_down": obs_ib_port_down,
    "memlock_limited": obs_memlock_limited,
    "driver_mismatch": obs_driver_mismatch,
    "fabric_manager_not_ready": obs_fabric_manager_not_ready,
    "unit_argv_differs": obs_unit_argv_differs,
    "env_differs": obs_env_differs,
    "tp_across_nodes": obs_tp_across_nodes,
    "env_flag": obs_env_flag,
    "gpu_count_below_plan": obs_gpu_count_below_plan,
    "gpu_facts_failed": obs_gpu_facts_failed,
}


# --------------------------------------------------------------------------- matching and ranking


def _log_streams(node, sources):
    units = []
    if "any" in sources or "vllm" in sources:
        units.append(VLLM_UNIT)
    if "any" in sources or "ray" in sources:
        units.extend(RAY_UNITS)
    for unit in units:
        yield unit, node.journal(unit)
    if "any" in sources:
        yield from (node.gather.get("extra_logs") or {}).items()


def _match_log(cluster, log):
    hits = []
    seen = set()
    for node in cluster.reachable_nodes():
        for stream, lines in _log_streams(node, log["sources"]):
            for index, line in enumerate(lines):
                match = log["regex"].search(line)
                if not match:
                    continue
                key = (node.name, stream, line.strip())
                if key in seen:
                    continue
                seen.add(key)
                quoted = line.strip()
                if log.get("after"):
                    following = [text.strip() for text in lines[index + 1: index + 1 + log["after"]] if text.strip()]
                    quoted = " | ".join([quoted, *following])
                values = {k: v for k, v in match.groupdict().items() if v is not None}
                hits.append(_hit(node, f"journal {stream}", quoted, **values))
    return hits


class _SafeValues(dict):
    def __missing__(self, key):
        return "{" + key + "}"


def _render(template, values):
    return string.Formatter().vformat(template, (), _SafeValues(values))


def _observe(cluster, name, params, cache):
    key = (name, json.dumps(params, sort_keys=True, default=str))
    if key not in cache:
        cache[key] = OBSERVATIONS[name](cluster, params)
    return cache[key]


def _signature_hits(cluster, sig, cache):
    """Hits of every rule of one signature; a rule with 'requires' counts only on nodes where they hold."""
    hits = []
    kinds = set()
    for rule in sig["rules"]:
        if "log" in rule:
            found = _match_log(cluster, rule["log"])
            kind = "log"
        else:
            found = _observe(cluster, rule["observation"], rule["params"], cache)
            kind = rule["observation"]
        for requirement in rule["requires"]:
            allowed = {hit["node"] for hit in _observe(cluster, requirement, {}, cache)}
            found = [hit for hit in found if hit["node"] in allowed or None in allowed]
        if found:
            kinds.add(kind)
            hits.extend(found)
    return hits, kinds


def diagnose(catalog, evidence):
    """Match every signature against the evidence; return the report, most likely cause first.

    Ranking: the signature's priority (how specific a root cause it names),
    lowered below any matched signature that 'explains' it (a consequence
    comes after its cause), then the number of independent kinds of evidence
    (log and observations), then the nodes involved, then catalog order.
    """
    cluster = Cluster(evidence)
    cache = {}
    matched = []
    for order, sig in enumerate(catalog["signatures"]):
        hits, kinds = _signature_hits(cluster, sig, cache)
        if hits:
            matched.append((order, sig, hits, kinds))
    ids = {sig["id"] for _, sig, _, _ in matched}
    explained_by = {}
    for _, sig, _, _ in matched:
        for name in sig["explains"]:
            if name in ids:
                explained_by.setdefault(name, []).append(sig)
    findings = []
    for order, sig, hits, kinds in matched:
        causes = explained_by.get(sig["id"], [])
        effective = sig["priority"]
        if causes:
            effective = min(effective, min(cause["priority"] for cause in causes) - 1)
        nodes = sorted({hit["node"] for hit in hits if hit["node"]}, key=_node_order(cluster))
        values = {"nodes": ", ".join(nodes) or "the cluster", "node": nodes[0] if nodes else "the cluster"}
        for hit in hits:
            for key, value in hit["values"].items():
                values.setdefault(key, value)
        for key, value in _plan_values(cluster).items():
            values.setdefault(key, value)
        for key, template in sig["defaults"].items():
            values.setdefault(key, _render(template, values))
        findings.append(
            {
                "id": sig["id"],
                "title": _render(sig["title"], values),
                "family": sig["family"],
                "seed_branch": sig["seed_branch"],
                "severity": sig["severity"],
                "priority": sig["priority"],
                "rank_priority": effective,
                "nodes": nodes,
                "symptom": sig["symptom"],
                "checks": sig["checks"],
                "cause": _render(sig["cause"], values),
                "fix": _render(sig["fix"], values),
                "evidence": [
                    {"node": hit["node"], "source": hit["source"], "line": hit["line"]}
                    for hit in hits
                ],
                "evidence_kinds": sorted(kinds),
                "explained_by": [cause["id"] for cause in causes],
                "references": sig["references"],
                "_order": order,
            }
        )
    findings.sort(
        key=lambda f: (
            0 if f["severity"] == "fault" else 1,
            -f["rank_priority"],
            -len(f["evidence_kinds"]),
            -len(f["nodes"]),
            f["_order"],
        )
    )
    for finding in findings:
        del finding["_order"]
    faults = [f for f in findings if f["severity"] == "fault"]
    return {
        "faults": len(faults),
        "warnings": len(findings) - len(faults),
        "findings": findings,
        "nodes": [node.name for node in cluster.nodes],
        "unreachable": [node.name for node in cluster.nodes if not node.reachable],
        "deployment": cluster.plan.get("deployment"),
        "strategy": cluster.plan.get("strategy"),
        "backend": cluster.plan.get("backend"),
        "signatures_checked": len(catalog["signatures"]),
        "last_change": last_change(cluster),
    }


def last_change(cluster):
    """Per node that keeps a plan.previous.json: when its plan last changed and what changed."""
    changes = []
    for node in cluster.nodes:
        plans = node.gather.get("plans") or {}
        previous, current = plans.get("previous"), plans.get("current")
        if not previous:
            continue
        if current:
            lines = plan_history.plan_changes(previous.get("plan"), current.get("plan"), node.name)
        else:
            lines = ["vLLM was torn down (no plan.json); plan.previous.json is the plan that ran last: "
                     + plan_history.layout_text(previous.get("plan") or {})]
        changes.append({
            "node": node.name,
            "previous_modified": previous.get("modified"),
            "current_modified": (current or {}).get("modified"),
            "changes": lines or ["nothing that decides what runs (layout, nodes, ports, model, argv, env)"],
        })
    return changes


def _change_lines(report):
    lines = []
    for entry in report.get("last_change") or []:
        when = entry.get("current_modified") or "none"
        lines.append(f"{entry['node']}: plan.previous.json ({entry.get('previous_modified')}) -> plan.json ({when})")
        lines += [f"  {change}" for change in entry["changes"]]
    return lines


def _node_order(cluster):
    order = {node.name: index for index, node in enumerate(cluster.nodes)}
    return lambda name: (order.get(name, len(order)), name)


def _plan_values(cluster):
    plan = cluster.plan
    model = plan.get("model") or {}
    values = {
        "tp": plan.get("tp"), "pp": plan.get("pp"), "dp": plan.get("dp"), "world_size": plan.get("world_size"),
        "model_path": model.get("path"), "heads": model.get("heads"), "backend": plan.get("backend"),
        "head_node": cluster.head.name if cluster.head else None,
        "head_address": cluster.head.plan.get("address") if cluster.head else None,
    }
    ports = plan.get("ports") or {}
    for name, port in ports.items():
        values.setdefault(f"port_{name}", port)
    return {key: value for key, value in values.items() if value is not None}


# --------------------------------------------------------------------------- report


def render_report(report, evidence_lines=MAX_EVIDENCE_PER_FINDING):
    """The report as text lines, most likely cause first, evidence quoted."""
    lines = []
    where = f"deployment {report.get('deployment') or '?'}"
    if report.get("strategy"):
        where += f" ({report['strategy']}, backend {report.get('backend')})"
    lines.append(
        f"vllm-cluster doctor: {where}, nodes {', '.join(report.get('nodes') or []) or 'none'}; "
        f"{report['signatures_checked']} signatures checked"
    )
    changed = _change_lines(report)
    if changed:
        changed = ["", "What the last deploy changed (each node's plan.previous.json against its plan.json):"] + [
            "  " + line for line in changed]
    if not report["findings"]:
        lines.append("No fault found: every signature was checked against every node's units, journals, ports, "
                     "env files, NICs, Ray state and facts.")
        return lines + changed
    lines.append(f"{report['faults']} fault(s), {report['warnings']} warning(s); most likely cause first.")
    for number, finding in enumerate(report["findings"], start=1):
        lines.append("")
        tag = finding["severity"].upper()
        nodes = ", ".join(finding["nodes"]) or "cluster"
        lines.append(f"{number}. [{tag}] {finding['title']}  ({finding['id']}; {finding['family']}; {nodes})")
        if finding["explained_by"]:
            lines.append(f"   consequence of: {', '.join(finding['explained_by'])}")
        lines.append(f"   cause: {finding['cause']}")
        lines.append("   evidence:")
        shown = finding["evidence"][:evidence_lines]
        for item in shown:
            node = f"{item['node']} " if item["node"] else ""
            lines.append(f"     {node}[{item['source']}] {item['line']}")
        if len(finding["evidence"]) > len(shown):
            lines.append(f"     ... {len(finding['evidence']) - len(shown)} more line(s) in doctor.json")
        lines.append(f"   fix: {finding['fix']}")
    return lines + changed


def render_markdown(report):
    """results/<deployment>/doctor.md."""
    out = [f"# Doctor report: {report.get('deployment') or 'deployment'}", ""]
    out.append(
        f"{report['faults']} fault(s), {report['warnings']} warning(s), "
        f"{report['signatures_checked']} signatures checked on {', '.join(report.get('nodes') or []) or 'no node'}."
    )
    changed = _change_lines(report)
    if changed:
        changed = ["", "## What the last deploy changed", "",
                   "Each node's `plan.previous.json` against its `plan.json` (kept by vllm_service):", "", "```",
                   *changed, "```"]
    if not report["findings"]:
        out += ["", "No fault found."]
        return "\n".join(out + changed) + "\n"
    out += ["", "| # | severity | finding | nodes | family |", "| --- | --- | --- | --- | --- |"]
    for number, finding in enumerate(report["findings"], start=1):
        out.append(
            f"| {number} | {finding['severity']} | {finding['title']} (`{finding['id']}`) | "
            f"{', '.join(finding['nodes']) or 'cluster'} | {finding['family']} |"
        )
    for number, finding in enumerate(report["findings"], start=1):
        out += ["", f"## {number}. {finding['title']}", ""]
        if finding["explained_by"]:
            out += [f"Consequence of: {', '.join(finding['explained_by'])}.", ""]
        out += [f"**Symptom.** {finding['symptom']}", "", f"**Cause.** {finding['cause']}", ""]
        out += ["**Checks.**", ""] + [f"- {check}" for check in finding["checks"]] + [""]
        out += ["**Evidence.**", "", "```"]
        for item in finding["evidence"][: MAX_EVIDENCE_PER_FINDING * 2]:
            node = f"{item['node']} " if item["node"] else ""
            out.append(f"{node}[{item['source']}] {item['line']}")
        out += ["```", "", f"**Fix.** {finding['fix']}"]
        if finding["references"]:
            out += ["", "References: " + "; ".join(finding["references"])]
    return "\n".join(out + changed) + "\n"
