#!/usr/bin/python
"""Ansible module model_transfer: documentation only; the work is done by the action plugin of the same name."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_transfer
short_description: Run a long model transfer on the node as a transient unit, printing its progress until it ends
version_added: 0.1.0
description:
  - Starts O(argv) on the node with C(systemd-run) as the transient unit O(unit) (low CPU and I/O priority), then
    watches it from the controller - every O(interval) seconds one line with the bytes under O(dest) against
    O(total_bytes), the rate and the ETA - until it ends. A transfer does not depend on the SSH connection - a play
    stopped half-way leaves it running, and the next run watches it instead of starting a second one.
  - The transfer must resume by itself (C(model_fetch.py) keeps complete files and partial ones, C(rsync
    --partial-dir) too); a failure keeps what arrived and fails naming the host, the transfer, the unit's result,
    the fetcher's own error (O(status_file)) and the journal's last lines.
  - An action plugin (plugins/action/model_transfer.py); the logic is plugins/module_utils/model/transfer.py.
    Check mode starts nothing and reports a change.
options:
  argv:
    description: The transfer's command line. Never put a secret in it (systemd and C(ps) show it); pass a file.
    type: list
    elements: str
    required: true
  dest:
    description: The directory the bytes arrive in (its size is the progress).
    type: path
    required: true
  total_bytes:
    description: The bytes the transfer ends with (the model's size), for the share, the rate and the ETA.
    type: int
    default: 0
  unit:
    description: The transient unit's name - C(vllm-model-<word>).
    type: str
    required: true
  what:
    description: What the progress lines and errors call the transfer, e.g. C(fetch from the hub).
    type: str
  env:
    description: Environment of the transfer (e.g. C(HF_ENDPOINT)); no secrets - systemd shows it.
    type: dict
    default: {}
  interval:
    description: Seconds between progress lines.
    type: float
    default: 30
  timeout:
    description: Seconds after which the transfer is stopped and the task fails (what arrived is kept).
    type: float
    default: 86400
  status_file:
    description: A JSON file the transfer writes (C(model_fetch.py --status-file)); returned in RV(status).
    type: path
author:
  - vllm-cluster developers (@vllm-ops)
"""

EXAMPLES = r"""
- name: Fetch the model from the mirror
  vllm_ops.cluster.model_transfer:
    unit: vllm-model-fetch
    what: fetch from the hub
    argv: [python3, /opt/vllm-cluster/bin/model_fetch.py, org/model, "{{ commit }}", /srv/models/model,
           --status-file, /run/vllm-cluster/model-fetch.json]
    env: {HF_ENDPOINT: "http://mirror.example:8090"}
    dest: /srv/models/model
    total_bytes: 140000000000
    status_file: /run/vllm-cluster/model-fetch.json
"""

RETURN = r"""
elapsed_s:
  description: Seconds this run watched the transfer.
  type: float
  returned: success
bytes:
  description: The bytes under O(dest) at the end.
  type: int
  returned: success
attached:
  description: Whether an earlier run's transfer was still running and this run watched it.
  type: bool
  returned: success
status:
  description: O(status_file)'s JSON at the end (for C(model_fetch.py), its C(result) line), or null.
  type: dict
  returned: success
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def main():
    # The action plugin does the work; this spec mirrors DOCUMENTATION for ansible-doc and the sanity test.
    module = AnsibleModule(argument_spec={
        "argv": {"type": "list", "elements": "str", "required": True},
        "dest": {"type": "path", "required": True},
        "total_bytes": {"type": "int", "default": 0},
        "unit": {"type": "str", "required": True},
        "what": {"type": "str"},
        "env": {"type": "dict", "default": {}},
        "interval": {"type": "float", "default": 30},
        "timeout": {"type": "float", "default": 86400},
        "status_file": {"type": "path"},
    }, supports_check_mode=True)
    module.fail_json(msg="model_transfer runs as an action plugin on the controller; call it from a play")


if __name__ == "__main__":
    main()
