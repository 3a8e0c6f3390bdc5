#!/usr/bin/python
"""Ansible module parity_check: compare facts across nodes and fail with one message naming every odd node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: parity_check
short_description: Compare values across the nodes of a replica and name every node that differs
version_added: 0.1.0
description:
  - "Takes C({host: {key: value}}) for all nodes, typically built from C(hostvars)
    in a task with C(run_once), and compares each key across the hosts (parity),
    or against a prescribed value (O(expected))."
  - Fails with one message that names, for each failing key, every node that
    differs and its value, and the value the others have or the expectation.
  - A host that does not report an expected key is not checked for it (the
    check does not apply there); a host that does not report a parity key differs.
  - The comparison is C(plugins/module_utils/verify/parity.py); this module only reads its input.
options:
  values:
    description: "Values per host, C({host: {key: value}})."
    type: dict
    required: true
  keys:
    description: Keys to compare, in report order; default every key any host reports.
    type: list
    elements: str
  expected:
    description: "Keys whose value is prescribed, C({key: value}); the others must only agree."
    type: dict
    default: {}
  labels:
    description: "Human names of keys for the message, C({key: label})."
    type: dict
    default: {}
  hints:
    description: "What to do about a key, appended to its line, C({key: hint})."
    type: dict
    default: {}
  subject:
    description: What the hosts are, for the message (C(the 3 nodes of vllm_nodes)).
    type: str
    default: the nodes
notes:
  - Only reads its arguments; check mode gives the same verdict.
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
# Each node first sets __report: {driver_version: ..., count: ..., persistence_mode: ...}.
- name: Driver and GPU parity, persistence mode on, across the replica
  vllm_ops.cluster.parity_check:
    values: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, '__report'))) }}"
    keys: [driver_version, count, persistence_mode]
    expected: {persistence_mode: true}
    labels: {driver_version: driver version, count: GPU count}
    subject: "the {{ ansible_play_hosts | length }} nodes of vllm_nodes"
  run_once: true
  any_errors_fatal: true
"""

RETURN = r"""
differing:
  description: Each failing key with every host's value (null where a host did not report it).
  returned: always
  type: dict
  sample: {"driver_version": {"node1": "580.159.04", "node2": "575.57.08", "node3": "580.159.04"}}
reference:
  description: For each failing key, the expected value or the one most hosts have.
  returned: always
  type: dict
  sample: {"driver_version": "580.159.04"}
odd_hosts:
  description: For each failing key, the hosts that differ from the reference.
  returned: always
  type: dict
  sample: {"driver_version": ["node2"]}
message:
  description: Empty when every key passes; on failure the report is C(msg).
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.parity import ParityError, compare  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec={
            "values": {"type": "dict", "required": True},
            "keys": {"type": "list", "elements": "str", "no_log": False},
            "expected": {"type": "dict", "default": {}},
            "labels": {"type": "dict", "default": {}},
            "hints": {"type": "dict", "default": {}},
            "subject": {"type": "str", "default": "the nodes"},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = compare(params["values"], keys=params["keys"], expected=params["expected"],
                         labels=params["labels"], hints=params["hints"], subject=params["subject"])
    except ParityError as error:
        module.fail_json(msg=f"parity_check: {error}")
    outcome = {key: result[key] for key in ("differing", "reference", "odd_hosts")}
    if not result["ok"]:
        module.fail_json(msg=result["message"], **outcome)
    module.exit_json(changed=False, message="", **outcome)


if __name__ == "__main__":
    main()
