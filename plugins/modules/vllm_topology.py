#!/usr/bin/python
"""Ansible module vllm_topology: the topology vLLM reports in its journal, and its check against the plan."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_topology
short_description: Read the topology vLLM reports from its journal; compare it with the plan
version_added: 0.1.0
description:
  - O(operation=collect) (on each node) reads the journal of the vLLM unit since its last start
    (C(journalctl _SYSTEMD_INVOCATION_ID=<the unit's InvocationID>)), parses vLLM's own start-up lines
    with C(plugins/module_utils/verify/vllm_logs.py) (per-worker C(world_size=... rank=... local_rank=...),
    C(rank ... is assigned as ...), C(KV cache size), process prefixes, headless launch lines,
    C([EP Rank r/N]), start-up errors) and sets the fact C(vllm_topology).
  - With O(plan), it first waits (bounded by O(wait_timeout)) until the journal holds what the plan
    says this node prints - its worker lines, its engines' KV lines and, on the head, the API server's
    start line - or the unit stops being active, or an error appears.
  - With O(ray.enabled) on the Ray head it also reads C(ray list actors --detail --format json
    --filter class_name=RayWorkerProc) joined with C(ray list nodes --format json) - which TP/PP ranks
    run on which node.
  - O(operation=compare) (once, usually delegated to the controller) compares O(observed) (the
    C(vllm_topology) facts of every node) with O(plan) using C(plugins/module_utils/verify/topology_check.py)
    and returns the rows and a table of expected and found values per node. It never fails on a
    mismatch itself; the caller prints the table and fails (role C(vllm_verify)).
options:
  operation:
    description: V(collect) on a node, V(compare) once for the deployment.
    type: str
    choices: [collect, compare]
    default: collect
  unit:
    description: The systemd unit that runs vLLM on this node.
    type: str
    default: vllm.service
  plan:
    description:
      - The deployment plan (C(vllm_cluster_plan)). O(operation=collect) uses it to know what to wait
        for; O(operation=compare) requires it.
    type: dict
  host:
    description: This node's name in the plan (the inventory hostname). Required with O(plan) and V(collect).
    type: str
  wait_timeout:
    description: Seconds to wait for the expected lines (V(collect) with O(plan)); 0 reads once.
    type: int
    default: 0
  poll_interval:
    description: Seconds between journal reads while waiting.
    type: float
    default: 2.0
  restarts_allowed:
    description:
      - While waiting, follow this many restarts by systemd (C(Restart=always)) to the next start before
        reporting the failed start as an error. The errors of every replaced start are kept in
        C(earlier_starts).
    type: int
    default: 0
  startup_profile:
    description:
      - The stall bounds of vLLM's start-up phases (C(plugins/module_utils/parsers/vllm_phases.py)) - V(gpu) for
        real GPU nodes, V(lab) for the CPU lab. Used with O(plan) to judge C(wait.state).
    type: str
    choices: [gpu, lab]
    default: gpu
  stall_timeout:
    description:
      - Seconds a start may stay in one phase before C(wait.state) is V(stalled); V(0) takes each phase's bound
        from O(startup_profile).
    type: int
    default: 0
  error_grace:
    description:
      - Seconds the journal may stay silent after an error line before the start counts as failed (with O(plan)).
        An error followed by more lines is not a failure by itself (vLLM survives some, such as a cache file it
        could not write); a start that comes up with errors is up, and its errors become a warning and
        C(tolerated_errors).
    type: int
    default: 60
  resume:
    description:
      - The C(wait) of the previous round's fact, when the wait runs in rounds (one module run each) - the start
        followed (C(invocation_id)), the starts systemd replaced so far (C(earlier_starts)), and the phase and
        since when an earlier round saw it (C(phase), C(since_epoch)).
    type: dict
  tail:
    description: Keep this many last journal lines in the fact (C(journal_tail)) for diagnosis.
    type: int
    default: 25
  ray:
    description: Read Ray's state API on this node (the Ray head).
    type: dict
    suboptions:
      enabled:
        description: Read the Ray state API.
        type: bool
        default: false
      binary:
        description: The C(ray) command (absolute path, or a name in E(PATH)).
        type: str
        default: ray
      address:
        description: Ray's dashboard / state API address, V(http://HOST:8265); default is Ray's own lookup.
        type: str
      timeout:
        description: Seconds each C(ray list) call may take.
        type: int
        default: 60
  observed:
    description: V(compare) - the C(vllm_topology) fact of every node, keyed by inventory hostname.
    type: dict
  gpus:
    description: V(compare) on CUDA - the C(vllm_gpu.gpus) list of every node, keyed by inventory hostname.
    type: dict
  memory_tolerance:
    description: V(compare) on CUDA - allowed deviation of a GPU's used memory from the mean, as a fraction.
    type: float
    default: 0.10
notes:
  - Only reads; check mode reads the same journal and reports the same facts.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
author:
  - vllm-cluster developers (@vllm-ops)
"""

EXAMPLES = r"""
- name: Read what vLLM reports on each node, waiting up to 5 minutes for its start-up lines
  vllm_ops.cluster.vllm_topology:
    plan: "{{ vllm_cluster_plan }}"
    host: "{{ inventory_hostname }}"
    wait_timeout: 300

- name: Compare every node's report with the plan
  vllm_ops.cluster.vllm_topology:
    operation: compare
    plan: "{{ vllm_cluster_plan }}"
    observed: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, ['ansible_facts', 'vllm_topology']))) }}"
  delegate_to: localhost
  run_once: true
  register: verdict

- name: Print it
  ansible.builtin.debug:
    msg: "{{ verdict.table.split('\n') }}"
"""

RETURN = r"""
ansible_facts:
  description: V(collect) - the fact set on the node.
  returned: operation is collect
  type: dict
  contains:
    vllm_topology:
      description:
        - What vLLM reported since the unit's last start. Keys from C(vllm_logs.parse_log) -
          C(workers) (world_size, rank, local_rank, backend, pid per worker line), C(assignments)
          (dp, pp, pcp, tp, etp, ep, eplb per C(is assigned as) line), C(worker_processes) (final
          process name per worker pid), C(engines) (KV tokens, max concurrency per engine),
          C(dp_leaders), C(headless), C(expert_parallel), C(kv_memory), C(weights), C(server_url),
          C(configured) (sizes from C(non-default args)), C(errors), C(version), C(lines).
        - C(tolerated_errors) - the error lines of a start that came up all the same (see O(error_grace)); their
          lines are no longer in C(errors).
        - C(startup_phase) - where vLLM's start-up got to (C(plugins/module_utils/parsers/vllm_phases.py), the
          doctor's reader) - C(phase) (the last phase reached by the least advanced rank, or before any rank the
          furthest process), C(finished), C(current) (the phase it is in now), C(title), C(line) (the journal line
          that showed it), C(since) (that line's journal time, UTC), C(text), C(complete), C(furthest) and
          C(processes) (each process and rank with its phase); null before vLLM's first phase line.
        - C(wait) (with O(plan)) - this round's verdict (C(plugins/module_utils/verify/start_wait.py)) - C(state)
          (V(up), V(waiting), V(stalled) - no new phase within C(bound_s) - or V(failed)), C(phase), C(title),
          C(since) (HH:MM:SS UTC), C(since_epoch), C(elapsed_s), C(bound_s), C(progress) (one line for the play's
          output), C(ended) (why the round ended), C(invocation_id), C(earlier_starts) and C(error_quiet) (for
          O(resume)).
        - Plus C(unit) (load/active/sub state, invocation id, main pid, restarts, C(state_since) and
          C(state_since_epoch) - when it entered its state -, C(started_epoch)), C(waited_s),
          C(ready) (whether the wait ended because everything expected was there), C(journal_tail),
          C(earlier_starts) (starts systemd replaced while waiting, with their errors),
          and C(ray) (the joined Ray placement) or C(ray_error).
      type: dict
ok:
  description: V(compare) - no mismatch.
  returned: operation is compare
  type: bool
rows:
  description: V(compare) - one row per check, C({node, check, expected, found, ok}).
  returned: operation is compare
  type: list
  elements: dict
mismatches:
  description: V(compare) - the rows that failed.
  returned: operation is compare
  type: list
  elements: dict
table:
  description: V(compare) - the rows as an aligned text table (NODE, CHECK, EXPECTED, FOUND, RESULT).
  returned: operation is compare
  type: str
topology:
  description: V(compare) - the verified layout in short form (ranks, processes, engines per node).
  returned: operation is compare
  type: dict
"""

import json  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import vllm_phases  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify import (
    start_wait,  # noqa: E402
    topology_check,  # noqa: E402
    vllm_logs,  # noqa: E402
)

UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "InvocationID", "MainPID", "NRestarts",
                   "ExecMainStartTimestamp", "ExecMainStartTimestampMonotonic", "StateChangeTimestamp",
                   "StateChangeTimestampMonotonic")
RUNNING_STATES = ("active", "activating", "reloading")


def unit_state(module, unit):
    systemctl = module.get_bin_path("systemctl", required=True)
    argv = [systemctl, "show", unit, "--no-pager"] + [f"--property={name}" for name in UNIT_PROPERTIES]
    rc, out, err = module.run_command(argv, check_rc=False, environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.fail_json(msg=f"host {socket.gethostname()}: '{' '.join(argv)}' exited with {rc}: {err.strip()}")
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {
        "name": unit,
        "load_state": values.get("LoadState") or None,
        "active_state": values.get("ActiveState") or None,
        "sub_state": values.get("SubState") or None,
        "invocation_id": values.get("InvocationID") or None,
        "main_pid": int(values.get("MainPID") or 0),
        "restarts": int(values.get("NRestarts") or 0),
        "started": values.get("ExecMainStartTimestamp") or None,
        "started_epoch": _epoch_of_monotonic(values.get("ExecMainStartTimestampMonotonic")),
        "state_since": values.get("StateChangeTimestamp") or None,
        "state_since_epoch": _epoch_of_monotonic(values.get("StateChangeTimestampMonotonic")),
    }


def _epoch_of_monotonic(microseconds):
    """systemd's CLOCK_MONOTONIC timestamp (microseconds) as seconds since the epoch; None when unset (0)."""
    try:
        value = int(microseconds or 0)
    except ValueError:
        return None
    if value <= 0:
        return None
    return round(time.time() - (time.monotonic() - value / 1e6), 3)


def read_journal(module, invocation_id):
    if not invocation_id:
        return ""
    journalctl = module.get_bin_path("journalctl", required=True)
    argv = [journalctl, f"_SYSTEMD_INVOCATION_ID={invocation_id}", "--output=cat", "--no-pager", "--quiet"]
    rc, out, err = module.run_command(argv, check_rc=False, environ_update={"LC_ALL": "C.UTF-8"})
    if rc != 0:
        module.fail_json(msg=f"host {socket.gethostname()}: '{' '.join(argv)}' exited with {rc}: {err.strip()}")
    return out


def read_journal_entries(module, invocation_id):
    """(lines, journal times in seconds) of one invocation, from ``journalctl -o json``; ([], []) when unreadable."""
    if not invocation_id:
        return [], []
    journalctl = module.get_bin_path("journalctl", required=True)
    argv = [journalctl, f"_SYSTEMD_INVOCATION_ID={invocation_id}", "--output=json", "--no-pager", "--quiet"]
    rc, out, _ = module.run_command(argv, check_rc=False, environ_update={"LC_ALL": "C.UTF-8"})
    lines, times = [], []
    if rc != 0:
        return lines, times
    for record in out.splitlines():
        try:
            entry = json.loads(record)
        except ValueError:
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # journald keeps a message that is not UTF-8 as bytes
            message = bytes(value for value in message if isinstance(value, int)).decode("utf-8", "replace")
        if message is None:
            continue
        try:
            when = int(entry.get("__REALTIME_TIMESTAMP")) / 1e6
        except (TypeError, ValueError):
            when = None
        for part in str(message).splitlines() or [""]:
            lines.append(part)
            times.append(when)
    return lines, times


def startup_phase(lines, times=None):
    """Where the start-up got to, as the doctor reads it (vllm_phases); None before vLLM's first phase line."""
    report = vllm_phases.read_phases(lines, times)
    entry = report["current"]
    if entry is None:
        return None
    return {
        "phase": entry["phase"], "finished": entry["finished"], "current": entry["current"],
        "title": vllm_phases.phase(entry["current"])["title"], "line": entry["line"], "since": entry["time"],
        "since_epoch": entry["epoch"],
        "text": vllm_phases.describe(entry), "complete": report["complete"],
        "furthest": vllm_phases.describe(report["furthest"]),
        "processes": [{key: item[key] for key in ("process", "rank", "phase", "finished", "current", "time", "line")}
                      for item in report["processes"]],
    }


def complete(topology, targets):
    return (
        len(topology["workers"]) >= targets["workers"]
        and len(topology["engines"]) >= targets["engines"]
        and (topology["server_url"] is not None or not targets["server"])
    )


def collect(module):
    params = module.params
    plan, host = params["plan"], params["host"]
    if plan is not None and not host:
        module.fail_json(msg=f"host {socket.gethostname()}: vllm_topology needs 'host' (the node's name in the plan)")
    targets = topology_check.readiness_targets(plan, host) if plan is not None else None
    deadline = time.monotonic() + max(0, params["wait_timeout"])
    started = time.monotonic()
    ready = False
    resume = params["resume"] or {}
    # The start we follow (systemd gives every (re)start a new InvocationID): an earlier round's, else the current.
    watched = resume.get("invocation_id") or None
    earlier = list(resume.get("earlier_starts") or [])  # why the starts that systemd replaced while we waited failed
    crashed = []
    quiet = resume.get("error_quiet")  # since when the journal is silent after an error line (start_wait)
    silent_error = None
    ended = "deadline"
    while True:
        unit = unit_state(module, params["unit"])
        watched = watched or unit["invocation_id"]
        if watched and unit["invocation_id"] and unit["invocation_id"] != watched:
            # systemd restarted vLLM (Restart=always): that start ended. Say why; follow the new
            # start while restarts_allowed lasts, else stop waiting.
            errors = vllm_logs.parse_log(read_journal(module, watched))["errors"] or [
                {"process": None, "pid": None, "line": "vLLM exited and systemd restarted it"}
            ]
            earlier.append({"invocation_id": watched, "errors": errors})
            watched = unit["invocation_id"]
            if len(earlier) > params["restarts_allowed"]:
                crashed = [{**e, "line": f"(a start that failed; systemd restarted it) {e['line']}"} for e in errors]
        text = read_journal(module, unit["invocation_id"])
        topology = vllm_logs.parse_log(text)
        if targets is None:
            break
        if crashed:
            ended = "failed"
            break
        if complete(topology, targets):
            ready = True
            ended = "ready"
            break
        # The API server starts last: once it is up, no more start-up lines will come.
        if topology["server_url"] is not None and targets["server"]:
            ended = "server"
            break
        may_restart = len(earlier) < params["restarts_allowed"]
        # An error line ends the wait only when nothing follows it: vLLM survives some (a cache write on a full disk).
        quiet, fatal = start_wait.error_silence(topology["lines"], bool(topology["errors"]), time.time(), quiet,
                                                params["error_grace"])
        failing = unit["sub_state"] == "auto-restart" or fatal
        if unit["active_state"] not in RUNNING_STATES or (failing and not may_restart):
            ended = "failed"
            if fatal:
                silent_error = {"since_epoch": quiet["since_epoch"], "line": topology["errors"][-1]["line"]}
            break
        if time.monotonic() >= deadline:
            break
        time.sleep(params["poll_interval"])
    # A start that came up (API server up, every rank line) although it logged errors: they are warnings.
    topology["tolerated_errors"] = []
    if ended in ("ready", "server") and topology["errors"] and not crashed:
        topology["tolerated_errors"], topology["errors"] = topology["errors"], []
        module.warn(f"host {host or socket.gethostname()}: vLLM came up although its start logged "
                    f"{len(topology['tolerated_errors'])} error line(s); the first: "
                    f"{topology['tolerated_errors'][0]['line']}")
    topology["errors"] = crashed + topology["errors"]
    topology["earlier_starts"] = earlier
    topology["unit"] = unit
    topology["ready"] = ready
    topology["waited_s"] = round(time.monotonic() - started, 1)
    topology["expected_here"] = targets
    topology["journal_tail"] = text.splitlines()[-params["tail"]:] if params["tail"] > 0 else []
    lines, times = read_journal_entries(module, unit["invocation_id"])
    # The phase is read from the lines the verdict was judged on: lines logged since (the API server's, when the
    # round ended at its deadline just as vLLM came up) belong to the next round, else the round would report a
    # start as up that its own topology has not seen come up.
    judged = len(text.splitlines())
    lines, times = lines[:judged], times[:judged]
    topology["startup_phase"] = startup_phase(lines, times) if lines else startup_phase(text.splitlines())
    if targets is not None:
        report = start_wait.round_report(
            params["host"], topology["startup_phase"], time.time(), ended=ended, unit=unit,
            unit_started_epoch=unit["started_epoch"], unit_changed_epoch=unit["state_since_epoch"],
            profile=params["startup_profile"], stall_timeout_s=params["stall_timeout"], resume=resume,
            silent_error=silent_error,
        )
        topology["wait"] = {**report, "invocation_id": watched, "earlier_starts": earlier, "ended": ended,
                            "error_quiet": quiet}
    ray = params["ray"] or {}
    if ray.get("enabled"):
        topology.update(read_ray(module, ray))
    module.exit_json(changed=False, ansible_facts={"vllm_topology": topology})


def read_ray(module, ray):
    binary = ray["binary"]
    if "/" not in binary:
        binary = module.get_bin_path(binary)
    if not binary:
        return {"ray": None, "ray_error": f"'{ray['binary']}' not found"}
    address = ["--address", ray["address"]] if ray.get("address") else []
    timeout = module.get_bin_path("timeout")
    outputs = {}
    for name, argv in (
        ("actors", [binary, "list", "actors", "--detail", "--format", "json", "--limit", "10000",
                    "--filter", "class_name=RayWorkerProc", *address]),
        ("nodes", [binary, "list", "nodes", "--format", "json", "--limit", "10000", *address]),
    ):
        full = [timeout, str(ray["timeout"]), *argv] if timeout else argv
        rc, out, err = module.run_command(full, check_rc=False, environ_update={"RAY_USAGE_STATS_ENABLED": "0"})
        if rc != 0:
            return {"ray": None, "ray_error": f"'{' '.join(argv)}' exited with {rc}: {(err or out).strip()[-300:]}"}
        outputs[name] = out
    try:
        return {"ray": vllm_logs.ray_placement(outputs["actors"], outputs["nodes"]), "ray_error": None}
    except vllm_logs.RayStateError as exc:
        return {"ray": None, "ray_error": str(exc)}


def compare(module):
    params = module.params
    if params["plan"] is None or params["observed"] is None:
        module.fail_json(msg="vllm_topology operation=compare needs 'plan' and 'observed'")
    try:
        verdict = topology_check.check(
            params["plan"], params["observed"], gpus=params["gpus"], memory_tolerance=params["memory_tolerance"]
        )
    except topology_check.TopologyCheckError as exc:
        module.fail_json(msg=f"vllm_topology: {exc}")
    module.exit_json(changed=False, **verdict)


def main():
    module = AnsibleModule(
        argument_spec={
            "operation": {"type": "str", "choices": ["collect", "compare"], "default": "collect"},
            "unit": {"type": "str", "default": "vllm.service"},
            "plan": {"type": "dict"},
            "host": {"type": "str"},
            "wait_timeout": {"type": "int", "default": 0},
            "poll_interval": {"type": "float", "default": 2.0},
            "restarts_allowed": {"type": "int", "default": 0},
            "tail": {"type": "int", "default": 25},
            "startup_profile": {"type": "str", "choices": sorted(vllm_phases.PROFILES),
                                "default": vllm_phases.DEFAULT_PROFILE},
            "stall_timeout": {"type": "int", "default": 0},
            "error_grace": {"type": "int", "default": 60},
            "resume": {"type": "dict"},
            "ray": {
                "type": "dict",
                "options": {
                    "enabled": {"type": "bool", "default": False},
                    "binary": {"type": "str", "default": "ray"},
                    "address": {"type": "str"},
                    "timeout": {"type": "int", "default": 60},
                },
            },
            "observed": {"type": "dict"},
            "gpus": {"type": "dict"},
            "memory_tolerance": {"type": "float", "default": 0.10},
        },
        supports_check_mode=True,
    )
    if module.params["operation"] == "compare":
        compare(module)
    else:
        collect(module)


if __name__ == "__main__":
    main()
