#!/usr/bin/python
"""Ansible module host_state: paths, users, systemd units and systemd's version of a node, read in one run."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_state
short_description: Read paths, users, systemd units and systemd's version of a node in one module run
version_added: 0.5.0
description:
  - The reads a role makes before it changes anything (M(ansible.builtin.stat),
    M(ansible.builtin.getent), C(systemctl is-active), C(systemctl --version)) in one
    module run instead of one task each. Only reads; runs the same in check mode.
options:
  paths:
    description: Paths to look at (exists, kind, executable).
    type: list
    elements: path
    default: []
  checksums:
    description: Paths whose sha256 is wanted too (regular files only; also looked at as O(paths)).
    type: list
    elements: path
    default: []
  users:
    description: User names to look up in the passwd database.
    type: list
    elements: str
    default: []
  units:
    description: systemd units whose load, active and unit-file state, and stopped processes, are wanted.
    type: list
    elements: str
    default: []
  free_space:
    description:
      - Paths whose filesystem's free space is wanted (the nearest existing directory's, for a path not created yet).
    type: list
    elements: path
    default: []
  dropins:
    description:
      - Units whose own drop-in files are wanted (C(/etc/systemd/system/<unit>.d/), C(/run/systemd/system/<unit>.d/)),
        loaded or not; M(vllm_ops.cluster.unit_dropins) removes the foreign ones.
    type: list
    elements: str
    default: []
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
- name: Read the runtime, the service user and the unit
  vllm_ops.cluster.host_state:
    paths: [/opt/vllm-cluster/venv/bin/vllm]
    checksums: [/etc/vllm-cluster/network.env]
    users: [vllm]
    units: [vllm.service]
  register: node
"""

RETURN = r"""
paths:
  description: Per path - exists, kind (file, directory, link, other or null), executable, sha256 (or null).
  returned: always
  type: dict
  sample: {"/opt/vllm-cluster/venv/bin/vllm": {"exists": true, "kind": "file", "executable": true, "sha256": null}}
users:
  description: Per user - uid, gid, home, shell; null for a user that does not exist.
  returned: always
  type: dict
units:
  description: >-
    Per unit - load_state, active_state, sub_state, unit_file_state, fragment_path, and stopped_pids (its
    processes in state T, e.g. after SIGSTOP: running, yet answering nothing).
  returned: always
  type: dict
  sample: {"vllm.service": {"load_state": "loaded", "active_state": "active", "sub_state": "running",
           "unit_file_state": "enabled", "fragment_path": "/etc/systemd/system/vllm.service", "stopped_pids": []}}
free_space:
  description: >-
    Per path of O(free_space) - checked (the directory read), device, free_bytes, total_bytes, free_inodes,
    total_inodes.
  returned: always
  type: dict
  sample: {"/var/lib/vllm-cluster/.cache": {"checked": "/var/lib/vllm-cluster", "device": 2049,
           "free_bytes": 52613349376, "total_bytes": 105089261568, "free_inodes": 6422528, "total_inodes": 6553600}}
dropins:
  description: Per unit of O(dropins) - the paths of its drop-in files, sorted (none - an empty list).
  returned: always
  type: dict
  sample: {"vllm.service": ["/etc/systemd/system/vllm.service.d/override.conf"]}
systemd_version:
  description: systemd's major version (0 when systemctl is missing or unreadable).
  returned: always
  type: int
"""

import socket  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.host_state import (  # noqa: E402
    UNIT_PROPERTIES,
    free_space,
    path_state,
    systemd_major,
    unit_state,
    user_state,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.unit_dropins import present_dropins  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "path", "default": []},
            "checksums": {"type": "list", "elements": "path", "default": []},
            "users": {"type": "list", "elements": "str", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "free_space": {"type": "list", "elements": "path", "default": []},
            "dropins": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    host = socket.gethostname()
    try:
        paths = {path: path_state(path, path in params["checksums"])
                 for path in dict.fromkeys(params["paths"] + params["checksums"])}
        space = {path: free_space(path) for path in params["free_space"]}
        dropins = {unit: present_dropins(unit) for unit in params["dropins"]}
    except OSError as error:
        module.fail_json(msg=f"host {host}: cannot read {error.filename}: {error.strerror}")
    users = {name: user_state(name) for name in params["users"]}
    systemctl = module.get_bin_path("systemctl")
    units, version = {}, 0
    if systemctl:
        properties = [arg for name in UNIT_PROPERTIES for arg in ("-p", name)]
        for unit in params["units"]:
            rc, out, err = module.run_command([systemctl, "show", *properties, unit], check_rc=False)
            if rc != 0:
                module.fail_json(msg=f"host {host}: 'systemctl show {unit}' exited with {rc}: {err.strip()}")
            units[unit] = unit_state(out)
        rc, out, _ = module.run_command([systemctl, "--version"], check_rc=False)
        version = systemd_major(out) if rc == 0 else 0
    elif params["units"]:
        module.fail_json(msg=f"host {host}: systemctl not found; cannot read the units {', '.join(params['units'])}")
    module.exit_json(changed=False, paths=paths, users=users, units=units, free_space=space, dropins=dropins,
                     systemd_version=version)


if __name__ == "__main__":
    main()
