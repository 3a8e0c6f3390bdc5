#!/usr/bin/python
"""Ansible module unit_dropins: remove the drop-ins of a deployment unit that vllm-cluster did not write."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: unit_dropins
short_description: Remove a unit's foreign drop-ins (those vllm-cluster did not write and the inventory does not want)
version_added: 0.5.0
description:
  - Looks in the unit's own drop-in directories (C(/etc/systemd/system/<unit>.d/), C(/run/systemd/system/<unit>.d/))
    and removes every file there that is not in O(ours) and not declared in O(wanted); then runs
    C(systemctl daemon-reload). The rule of what is foreign is the doctor's too (its C(unit_overridden)).
  - Machine-wide drop-ins (C(service.d/)) and the vendor's directories are never touched.
  - Each removal is a warning that names the host, the file and its settings; C(--diff) shows the file's content as
    removed.
options:
  unit:
    description: The unit, such as V(vllm.service).
    type: str
    required: true
  wanted:
    description: Drop-ins to keep, by file name (V(override.conf)) or full path.
    type: list
    elements: str
    default: []
  ours:
    description: Full paths of drop-ins the deployment writes itself (kept).
    type: list
    elements: path
    default: []
  variable:
    description: The inventory variable that declares wanted drop-ins, as the messages name it.
    type: str
    default: wanted
  label:
    description: The host as the messages name it (the inventory name); the node's host name by default.
    type: str
  roots:
    description: The directories whose C(<unit>.d/) are searched (tests point them elsewhere).
    type: list
    elements: path
    default: [/etc/systemd/system, /run/systemd/system]
  daemon_reload:
    description: Run C(systemctl daemon-reload) after a removal.
    type: bool
    default: true
notes:
  - In check mode nothing is removed; the result says what would be, with C(changed=true).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - vllm-cluster developers (@vllm-ops)
"""

EXAMPLES = r"""
- name: Remove vllm.service's foreign drop-ins
  vllm_ops.cluster.unit_dropins:
    unit: vllm.service
    wanted: "{{ vllm_service_dropins_wanted }}"
    variable: vllm_service_dropins_wanted
    label: "{{ inventory_hostname }}"
  register: removed
"""

RETURN = r"""
removed:
  description: Each foreign drop-in removed (in check mode - that would be), its content and the message naming it.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/etc/systemd/system/vllm.service.d/override.conf", "content": "[Service]\nCPUQuota=3%\n",
            "message": "node2: removed /etc/systemd/system/vllm.service.d/override.conf ([Service] CPUQuota=3%):
                        not written by vllm-cluster and not in vllm_service_dropins_wanted"}]
kept:
  description: The unit's drop-ins kept because O(wanted) names them.
  returned: always
  type: list
  elements: str
msg:
  description: The removal messages joined, or that the unit has no foreign drop-in.
  returned: always
  type: str
"""

import socket  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.unit_dropins import (  # noqa: E402
    remove_foreign_dropins,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "wanted": {"type": "list", "elements": "str", "default": []},
            "ours": {"type": "list", "elements": "path", "default": []},
            "variable": {"type": "str", "default": "wanted"},
            "label": {"type": "str"},
            "roots": {"type": "list", "elements": "path", "default": ["/etc/systemd/system", "/run/systemd/system"]},
            "daemon_reload": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    host = params["label"] or socket.gethostname()
    try:
        result = remove_foreign_dropins(params["unit"], params["wanted"], params["ours"], host, params["variable"],
                                        module.check_mode, tuple(params["roots"]))
    except OSError as error:
        module.fail_json(msg=f"host {host}: cannot remove a drop-in of {params['unit']}: "
                             f"{error.filename or ''}: {error.strerror or error}")
    for entry in result["removed"]:
        module.warn(entry["message"])
    if result["removed"] and not module.check_mode and params["daemon_reload"]:
        rc, _, err = module.run_command(["systemctl", "daemon-reload"])
        if rc != 0:
            module.fail_json(msg=f"host {host}: systemctl daemon-reload failed after removing {params['unit']}'s "
                                 f"foreign drop-ins: {err.strip()}", **result)
    if not module._diff:
        result.pop("diff")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
