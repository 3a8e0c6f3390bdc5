#!/usr/bin/python
"""Ansible module managed_files: a node's configuration files and directories, written in one module run."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: managed_files
short_description: Write a set of configuration files and directories on a node in one run, with backups and diffs
version_added: 0.5.0
description:
  - One module run for what would otherwise be a task per file (M(ansible.builtin.template),
    M(ansible.builtin.copy), M(ansible.builtin.file)); the content is rendered on the controller
    (for example with the P(ansible.builtin.template#lookup) lookup).
  - A file that differs (content, mode, owner or group) is written to a temporary file beside it
    with its final mode and owner already set, then renamed over it. A file marked O(files[].secret)
    takes its text from O(secrets), which is never logged, shown in a diff or returned.
  - O(files[].backup) keeps a copy of the file being replaced and returns its path (the rollback of
    vllm_service puts it back).
options:
  directories:
    description: Directories to create (parents too) or to set mode and owner on.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: path, required: true}
      mode: {description: Octal mode such as V('0755')., type: str, default: '0755'}
      owner: {description: Owner., type: str, default: root}
      group: {description: Group., type: str, default: root}
  secrets:
    description:
      - The text of the files marked O(files[].secret), by destination. A top-level C(no_log) option, so
        Ansible never logs it (a C(no_log) suboption inside a list is still written to the node's journal
        in the module's "Invoked with" line).
    type: dict
    default: {}
  files:
    description: The files, written in this order after the directories.
    type: list
    elements: dict
    default: []
    suboptions:
      dest: {description: Absolute path., type: path, required: true}
      state:
        description: V(absent) removes the file.
        type: str
        choices: [present, absent]
        default: present
      content: {description: The file's text., type: str}
      secret:
        description:
          - The file's text is O(secrets)[O(files[].dest)] (never logged or diffed) instead of O(files[].content).
        type: bool
        default: false
      mode: {description: Octal mode such as V('0644')., type: str, default: '0644'}
      owner: {description: Owner., type: str, default: root}
      group: {description: Group., type: str, default: root}
      backup: {description: Keep a copy of the file this run replaces., type: bool, default: false}
      diff: {description: Show the content change in C(--diff) output., type: bool, default: true}
notes:
  - In check mode nothing is written; the result says what would change.
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
- name: Write vLLM's unit and environment
  vllm_ops.cluster.managed_files:
    directories:
      - {path: /etc/vllm-cluster}
    files:
      - {dest: /etc/vllm-cluster/vllm.env, content: "{{ lookup('ansible.builtin.template', 'vllm.env.j2') }}",
         mode: '0600', backup: true}
      - {dest: /etc/vllm-cluster/api-key.env, secret: true, mode: '0600'}
      - {dest: /etc/vllm-cluster/old.env, state: absent}
    secrets:
      /etc/vllm-cluster/api-key.env: "VLLM_API_KEY={{ key }}\n"
  register: written
"""

RETURN = r"""
files:
  description: Per file - whether it changed, why (created, content, mode, owner, removed) and the backup's path.
  returned: always
  type: dict
  sample: {"/etc/vllm-cluster/vllm.env": {"changed": true, "state": "present", "reasons": ["content"],
           "backup_file": "/etc/vllm-cluster/vllm.env.4242.2026-11-30@19:30:00~"}}
directories:
  description: Per directory - whether it was created or its mode or owner set.
  returned: always
  type: dict
"""

import socket  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.managed_files import (  # noqa: E402
    ManagedFilesError,
    apply,
    normalize,
)

OWNERSHIP = {"owner": {"type": "str", "default": "root"}, "group": {"type": "str", "default": "root"}}


def main():
    module = AnsibleModule(
        argument_spec={
            "secrets": {"type": "dict", "default": {}, "no_log": True},
            "directories": {"type": "list", "elements": "dict", "default": [], "options": {
                "path": {"type": "path", "required": True},
                "mode": {"type": "str", "default": "0755"},
                **OWNERSHIP,
            }},
            "files": {"type": "list", "elements": "dict", "default": [], "options": {
                "dest": {"type": "path", "required": True},
                "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
                "content": {"type": "str"},
                "secret": {"type": "bool", "default": False},
                "mode": {"type": "str", "default": "0644"},
                "backup": {"type": "bool", "default": False},
                "diff": {"type": "bool", "default": True},
                **OWNERSHIP,
            }},
        },
        supports_check_mode=True,
    )

    def selinux_context(temporary, dest):
        if module.selinux_enabled():
            module.set_context_if_different(temporary, module.selinux_default_context(dest), False)

    host = socket.gethostname()
    try:
        files, directories = normalize(module.params["files"], module.params["directories"], module.params["secrets"])
        result = apply(files, directories, module.check_mode, module.backup_local, selinux_context)
    except ManagedFilesError as error:
        module.fail_json(msg=f"host {host}: {error}")
    except OSError as error:
        module.fail_json(msg=f"host {host}: {error.filename or ''}: {error.strerror or error}")
    if not module._diff:
        result.pop("diff")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
