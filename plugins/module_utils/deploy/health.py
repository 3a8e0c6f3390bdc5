"""Whether a deployment is healthy, beyond its stamps: deploy.yml skips a stage only on a healthy deployment.

Three reads, each worded as one finding "host: what":

- on each node, the deployment's units (vLLM's, Ray's): none failed, none
  restarting over and over (module stage_stamp, state=check, ``health_units``);
- on each node, the processes of those units: none stopped (state T or t in
  ``/proc/<pid>/stat``, e.g. after SIGSTOP), read from the unit's cgroup;
- from the controller, as a client: one completion (``max_tokens`` 1) from
  each node that serves the API (lookup api_completion).

Pure Python, no Ansible import.
"""

from __future__ import annotations

import json
import os

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.systemd import parse_systemctl_show
from ansible_collections.vllm_ops.cluster.plugins.module_utils.render import vllm_unit

CGROUP_ROOT = "/sys/fs/cgroup"
PROC = "/proc"
STOPPED_STATES = ("T", "t")
UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "NRestarts", "ControlGroup", "MainPID")
CONTROLLER = "controller"


# --- processes of a unit -----------------------------------------------------------------------------------------

def process_state(stat_text: str) -> str:
    """The state letter of a ``/proc/<pid>/stat`` line ('123 (python3) T 1 ...' -> 'T'; '' when unreadable)."""
    _, _, rest = (stat_text or "").rpartition(")")
    fields = rest.split()
    return fields[0] if fields else ""


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def cgroup_pids(control_group: str, root: str = CGROUP_ROOT) -> list[int] | None:
    """Every process of a cgroup and its children (cgroup v2, else v1's systemd hierarchy, else the hybrid layout's
    unified one); None when no hierarchy lists a process of it."""
    if not control_group or not control_group.startswith("/"):
        return None
    for base in (root, os.path.join(root, "systemd"), os.path.join(root, "unified")):
        top = os.path.join(base, control_group.lstrip("/"))
        pids = set()
        for directory, _, files in os.walk(top):
            if "cgroup.procs" in files:
                pids.update(int(word) for word in _read(os.path.join(directory, "cgroup.procs")).split()
                            if word.isdigit())
        if pids:
            return sorted(pids)
    return None


def process_tree(main_pid: int, proc: str = PROC) -> list[int]:
    """A process and its descendants (``/proc/<pid>/task/*/children``): where no cgroup can be read."""
    if main_pid <= 0:
        return []
    seen, todo = [], [main_pid]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.append(pid)
        tasks = os.path.join(proc, str(pid), "task")
        try:
            tids = os.listdir(tasks)
        except OSError:
            continue
        for tid in tids:
            todo += [int(word) for word in _read(os.path.join(tasks, tid, "children")).split() if word.isdigit()]
    return sorted(seen)


def stopped_pids(pids, proc: str = PROC) -> list[int]:
    """The processes among pids that are stopped (state T, or t: stopped by a tracer)."""
    return [pid for pid in pids if process_state(_read(os.path.join(proc, str(pid), "stat"))) in STOPPED_STATES]


def unit_pids(values: dict, root: str = CGROUP_ROOT, proc: str = PROC) -> list[int]:
    """The processes of a unit (systemctl show's ControlGroup, else its MainPID and that one's descendants)."""
    pids = cgroup_pids(values.get("ControlGroup", ""), root)
    if pids is None:
        main_pid = values.get("MainPID", "0")
        pids = process_tree(int(main_pid) if main_pid.isdigit() else 0, proc)
    return pids


def unit_health(show_output: str, root: str = CGROUP_ROOT, proc: str = PROC) -> dict:
    """`systemctl show -p LoadState,ActiveState,SubState,NRestarts,ControlGroup,MainPID` -> the unit's health.

    {load_state, active_state, sub_state, restarts, stopped_pids}: the stopped processes of its cgroup
    (or, where that cannot be read, of its main process and that one's descendants).
    """
    values = parse_systemctl_show(show_output)
    restarts = values.get("NRestarts", "0")
    pids = unit_pids(values, root, proc)
    return {
        "load_state": values.get("LoadState", "unknown"),
        "active_state": values.get("ActiveState", "unknown"),
        "sub_state": values.get("SubState", "unknown"),
        "restarts": int(restarts) if restarts.isdigit() else 0,
        "stopped_pids": stopped_pids(pids, proc),
    }


def unit_problem(unit: str, health: dict) -> str | None:
    """What is wrong with one unit of the deployment, or None (a unit that is not loaded here is not ours)."""
    if health.get("load_state") in ("not-found", "unknown"):
        return None
    active, sub = health.get("active_state"), health.get("sub_state")
    if active == "failed":
        return f"{unit} failed ({sub})"
    restarting = active == "activating" or sub == "auto-restart"
    if restarting and health.get("restarts", 0) > 0:
        return f"{unit} restarting ({active}/{sub}, {health['restarts']} restarts)"
    stopped = health.get("stopped_pids") or []
    if stopped:
        shown = ", ".join(str(pid) for pid in stopped[:8]) + (" ..." if len(stopped) > 8 else "")
        return f"{unit} processes stopped (pids {shown} in state T)"
    return None


def node_problems(units: dict) -> list[str]:
    """{unit: unit_health(...)} of one node -> what is wrong there, one line per unit."""
    return [problem for unit, health in units.items() if (problem := unit_problem(unit, health))]


def units_to_check(plan, host: str) -> list[str]:
    """The deployment's units on host: vLLM's unit where the node runs vLLM, and Ray's where the plan uses Ray."""
    plan = plan or {}
    node = next((node for node in plan.get("nodes", []) if node.get("host") == host), None)
    if node is None:
        return []
    units = []
    if node.get("runs_vllm", True):
        units.append((plan.get("service") or {}).get("unit") or "vllm.service")
    if launch.of_plan(plan).stage_role == "ray_cluster":
        units.append("ray-head.service" if node.get("node_rank") == 0 else "ray-worker.service")
    return units


# --- the controller's completion ---------------------------------------------------------------------------------

def _client_host(argv, address: str) -> str:
    """Where a client reaches the API: the one address vLLM binds (--host), else the node's address."""
    return vllm_unit.api_probe_host(argv or [], default=address)


def _served_name(plan, argv):
    return plan.get("served_model_name") or vllm_unit.served_model_name(argv or [])


def api_targets(plan, addresses: dict | None = None) -> list[dict]:
    """[{host, url, model}]: each node that serves the API (the head, or every independent replica), as a client
    reaches it: the address vLLM binds (--host), else the node's address (addresses: {host: ansible_host}), else
    its inventory name."""
    plan = plan or {}
    port = (plan.get("ports") or {}).get("api", 8000)
    targets = []
    for node in plan.get("nodes", []):
        if not node.get("runs_vllm", True) or node.get("headless"):
            continue
        argv = node.get("argv") or []
        host = node["host"]
        address = (addresses or {}).get(host) or host
        targets.append({"host": host, "url": f"http://{_client_host(argv, address)}:{port}/v1/completions",
                        "model": _served_name(plan, argv)})
    return targets


def completion_request(target: dict, api_key: str = "") -> tuple[str, bytes, dict]:
    """(url, body, headers) of the probe: one token, temperature 0."""
    body = json.dumps({"model": target["model"], "prompt": "Hello", "max_tokens": 1, "temperature": 0}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return target["url"], body, headers


def completion_problem(target: dict, timeout_s: float, status: int | None = None, body: str = "",
                       error: str = "", timed_out: bool = False) -> str | None:
    """The controller's finding for one probe, or None when the API answered a completion."""
    where = f"{CONTROLLER}: POST {target['url']}"
    if timed_out:
        return f"{where} timed out after {timeout_s:g} s"
    if error:
        return f"{where} failed: {error}"
    if status != 200:
        excerpt = " ".join((body or "").split())[:200]
        return f"{where} answered HTTP {status}" + (f": {excerpt}" if excerpt else "")
    try:
        choices = json.loads(body).get("choices")
    except (ValueError, AttributeError):
        choices = None
    if not choices:
        return f"{where} answered HTTP 200 without a completion"
    return None


# --- the verdict ---------------------------------------------------------------------------------------------------

def problems(node_health: dict, client: list | None = None) -> list[str]:
    """Every finding, "host: what": the nodes' (node_health: {host: [problem, ...]}) in host order, then the
    controller's (client: [problem, ...])."""
    found = [f"{host}: {problem}" for host in sorted(node_health) for problem in node_health[host] or []]
    return found + list(client or [])
