#!/usr/bin/python
"""Ansible module stage_stamp: record a completed deploy.yml stage on a node, or check that its record holds."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: stage_stamp
short_description: Record that a deploy.yml stage completed on a node, or check that the record still holds
version_added: 0.4.0
description:
  - V(record) (the last task of each stage's role) writes
    C(<dir>/<stage>.json) with the run's input digest and the evidence the
    stage leaves on the node - fingerprints of its files (content hash, or
    size and mtime above 4 MiB), each unit's state and InvocationID, and the
    output digest of its probes.
  - V(check) reads the stamps of O(stages) and collects the same evidence
    again; a stage converged on this node has no C(reasons). deploy.yml then
    skips the stages converged on every node (plugins/module_utils/deploy/stage_stamp.py).
  - >-
    V(check) also reads the health of O(health_units) (the deployment's units): a unit failed or restarting over
    and over, or processes of its cgroup stopped (state T), is a finding in C(health_problems); deploy.yml then
    skips no stage (plugins/module_utils/deploy/health.py).
  - V(absent) removes the stamps of O(stages) before they run again, so a
    stage that fails never keeps an earlier record.
  - >-
    V(check) with O(remove_stale) removes the stamps that no longer hold on this node at once (outside check mode),
    so that V(absent) is needed only where a stage runs although its stamp held. With O(read) it returns the text
    of those files too (one module run reads the node once).
options:
  state:
    description: What to do.
    type: str
    choices: [check, record, absent]
    default: check
  stages:
    description: The stages to check or remove (V(check), V(absent)).
    type: list
    elements: str
    default: []
  stage:
    description: The stage to record (V(record)).
    type: str
  digest:
    description: The run's input digest for this node (V(check), V(record)).
    type: str
  paths:
    description: >-
      Files or directories the stage manages or reads (V(record)): a file's owner, mode and content, a directory's
      owner and mode and its entries one level deep (a child directory by its owner and mode).
    type: list
    elements: path
    default: []
  dirs:
    description: Directories whose own owner and mode must stay, whatever they hold (a home, a cache) (V(record)).
    type: list
    elements: path
    default: []
  health_units:
    description: The deployment's units whose health V(check) reads (failed, restarting, processes stopped).
    type: list
    elements: str
    default: []
  units:
    description: systemd units whose state and invocation must stay as they were (V(record)).
    type: list
    elements: str
    default: []
  probes:
    description: Commands (argv lists) whose exit status and output must stay the same (V(record)).
    type: list
    elements: list
    default: []
  remove_stale:
    description: V(check) - remove the stamps of O(stages) that exist but no longer hold (not in check mode).
    type: bool
    default: false
  read:
    description: V(check) - files whose text to return in RV(files) (a missing one is V(null)).
    type: list
    elements: path
    default: []
  dir:
    description: Where the stamps live.
    type: path
    default: /etc/vllm-cluster/stages
notes:
  - V(check) only reads and runs the same in check mode; V(record) and V(absent) report what they
    would change in check mode and write nothing.
  - A record that differs only in its time is not rewritten, so a converged re-run stays changed=0.
  - Stamps are root-only (directory 0700, files 0600), since the digest covers the inventory's variables.
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
- name: Record the runtime stage
  vllm_ops.cluster.stage_stamp:
    state: record
    stage: runtime
    digest: "{{ vllm_cluster_stage_digest }}"
    paths: [/opt/vllm-cluster/venv/pyvenv.cfg, /srv/models/tiny-llama]
    probes: [[ls, /opt/vllm-cluster/venv/lib/python3.11/site-packages]]

- name: Which stages still hold here?
  vllm_ops.cluster.stage_stamp:
    stages: [preflight, network, firewall, runtime, ray, vllm, verify]
    digest: "{{ vllm_cluster_stage_digest }}"
  register: stamps
"""

RETURN = r"""
stages:
  description: V(check) - for each stage, why it is not converged on this node ([] when it is) and when it was recorded.
  returned: state=check
  type: dict
  sample: {"runtime": {"reasons": [], "recorded_at": "2026-11-30T15:40:02Z"},
           "vllm": {"reasons": ["/etc/vllm-cluster/vllm.env is gone"], "recorded_at": "2026-11-30T15:41:10Z"}}
health:
  description: V(check) - per unit of O(health_units), its load, active and sub state, restarts and stopped pids.
  returned: state=check
  type: dict
  sample: {"vllm.service": {"load_state": "loaded", "active_state": "active", "sub_state": "running",
           "restarts": 0, "stopped_pids": [4312, 4377]}}
health_problems:
  description: V(check) - what is wrong with those units, one line each ([] when healthy).
  returned: state=check
  type: list
  elements: str
  sample: ["vllm.service processes stopped (pids 4312, 4377 in state T)"]
files:
  description: V(check) - the text of each file of O(read), V(null) where it does not exist.
  returned: state=check
  type: dict
removed:
  description: >-
    V(absent) - the stamp files removed (or that would be, in check mode); V(check) - the stale ones removed with
    O(remove_stale) (none without it, none in check mode).
  returned: state=absent or state=check
  type: list
  elements: str
"""

import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.health import (  # noqa: E402
    UNIT_PROPERTIES,
    node_problems,
    unit_health,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.stage_stamp import (  # noqa: E402
    STAGES,
    StampError,
    collect_again,
    collect_evidence,
    differences,
    same_record,
    stamp_document,
)

PROBE_TIMEOUT_S = 60


def run(argv):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: no answer within {PROBE_TIMEOUT_S} s"
    return proc.returncode, proc.stdout, proc.stderr


def read_text(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def read_stamp(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"format": "unreadable"}


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["check", "record", "absent"], "default": "check"},
            "stages": {"type": "list", "elements": "str", "default": []},
            "stage": {"type": "str"},
            "digest": {"type": "str"},
            "paths": {"type": "list", "elements": "path", "default": []},
            "dirs": {"type": "list", "elements": "path", "default": []},
            "health_units": {"type": "list", "elements": "str", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "probes": {"type": "list", "elements": "list", "default": []},
            "remove_stale": {"type": "bool", "default": False},
            "read": {"type": "list", "elements": "path", "default": []},
            "dir": {"type": "path", "default": "/etc/vllm-cluster/stages"},
        },
        required_if=[("state", "record", ("stage", "digest")), ("state", "check", ("digest",))],
        supports_check_mode=True,
    )
    params = module.params
    host = socket.gethostname()
    unknown = [stage for stage in params["stages"] + [params["stage"] or STAGES[0]] if stage not in STAGES]
    if unknown:
        module.fail_json(msg=f"host {host}: unknown stage(s) {', '.join(unknown)}; the stages are {', '.join(STAGES)}")

    def stamp_path(stage):
        return os.path.join(params["dir"], f"{stage}.json")

    if params["state"] == "check":
        # Every stage's evidence and every unit's health at once: each is a few reads and subprocesses, and the
        # no-op re-run of deploy.yml waits for this one module run on every node.
        def check_stage(stage):
            stamp = read_stamp(stamp_path(stage))
            current = None
            if stamp and stamp.get("digest") == params["digest"]:
                try:
                    current = collect_again(stamp, run)
                except (StampError, OSError) as error:
                    return stage, {"reasons": [f"evidence unreadable: {error}"],
                                   "recorded_at": stamp.get("recorded_at")}
            return stage, {"reasons": differences(stamp, params["digest"], current),
                           "recorded_at": (stamp or {}).get("recorded_at"), "exists": stamp is not None}

        def read_unit(unit):
            return (unit, *run(["systemctl", "show", "-p", ",".join(UNIT_PROPERTIES), "--", unit]))

        with ThreadPoolExecutor(max_workers=8) as pool:
            checks = pool.map(check_stage, params["stages"])
            shown = pool.map(read_unit, params["health_units"])
            report = {stage: entry for stage, entry in checks}
            shown = list(shown)
        units = {}
        for unit, rc, out, err in shown:
            if rc != 0:
                module.fail_json(msg=f"host {host}: systemctl show {unit} exited {rc}: {err.strip()}")
            units[unit] = unit_health(out)
        # A stamp that no longer holds is of no use to any later run; removed now, the stage's own run has none to
        # clear (a stage that fails keeps no record). Not a change: the node's deployment is as it was.
        stale = [stamp_path(stage) for stage, entry in report.items() if entry.pop("exists") and entry["reasons"]]
        removed = []
        if params["remove_stale"] and not module.check_mode:
            for path in stale:
                try:
                    os.remove(path)
                    removed.append(path)
                except FileNotFoundError:
                    pass
        module.exit_json(changed=False, stages=report, health=units, health_problems=node_problems(units),
                         files={path: read_text(path) for path in params["read"]}, removed=removed)

    if params["state"] == "absent":
        removed = [stamp_path(stage) for stage in params["stages"] if os.path.lexists(stamp_path(stage))]
        if not module.check_mode:
            for path in removed:
                os.remove(path)
        module.exit_json(changed=bool(removed), removed=removed)

    try:
        evidence = collect_evidence(params["paths"], params["units"], params["probes"], run, dirs=params["dirs"])
    except (StampError, OSError) as error:
        module.fail_json(msg=f"host {host}: cannot record stage {params['stage']}: {error}")
    document = stamp_document(params["stage"], params["digest"], evidence,
                              time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    path = stamp_path(params["stage"])
    if same_record(read_stamp(path), document):
        module.exit_json(changed=False, path=path)
    if not module.check_mode:
        # Root only: the digest covers the inventory's variables, the API key among them.
        os.makedirs(params["dir"], mode=0o700, exist_ok=True)
        os.chmod(params["dir"], 0o700)
        temporary = f"{path}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(temporary, path)
    module.exit_json(changed=True, path=path)


if __name__ == "__main__":
    main()
