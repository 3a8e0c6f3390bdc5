#!/usr/bin/python
"""Ansible module vllm_argv_check: a node's vllm serve argv parsed by vLLM's own parser in the node's runtime."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_argv_check
short_description: Parse a node's vllm serve argv with vLLM's own argument parser, in the node's runtime venv
version_added: 0.6.0
description:
  - Runs O(venv)C(/bin/python) (the runtime that will run the argv) to build the
    C(vllm serve) parser exactly as the C(vllm) command does, parses O(argv),
    runs the serve subcommand's own validation and C(AsyncEngineArgs.from_cli_args).
    Nothing is started and no model is read.
  - "A rejected argv fails with one message naming the host, the flag, its value
    and vLLM's own message, for example
    C(host node3: vllm serve rejects --max-num-seqs lots: argument --max-num-seqs: invalid int value: 'lots').
    A flag spelled only as an abbreviation of a vLLM flag is rejected too."
  - Importing vLLM imports torch, so a check takes seconds. It is skipped when
    O(deployed_plan) holds O(plan_argv) for O(host) and C(bin/vllm) of O(venv)
    is not newer than that file (the runtime was not reinstalled since).
  - Only reads (the parser runs with a temporary HOME that is removed, without
    writing bytecode); the same in check mode; never reports a change.
options:
  host:
    description: The inventory name of the node; names it in the message and finds its entry in O(deployed_plan).
    type: str
    required: true
  argv:
    description: The argv to check, starting with C(vllm serve) (the plan's node argv for this run's stage).
    type: list
    elements: str
    required: true
  plan_argv:
    description: The node's argv in the plan, compared with the deployed plan's (default O(argv)).
    type: list
    elements: str
  venv:
    description: The runtime venv whose C(bin/python) parses the argv.
    type: path
    required: true
  deployed_plan:
    description: The plan the node runs (vllm_service's C(plan.json)); absent or unreadable means check.
    type: path
  force:
    description: Check even when the deployed plan holds the same argv.
    type: bool
    default: false
  timeout_s:
    description: Seconds the parser may take.
    type: int
    default: 300
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
- name: Check this node's argv with vLLM's own parser
  vllm_ops.cluster.vllm_argv_check:
    host: "{{ inventory_hostname }}"
    argv: [vllm, serve, /srv/models/tiny-llama, --max-num-seqs, "128"]
    venv: /opt/vllm-cluster/venv
    deployed_plan: /etc/vllm-cluster/plan.json
"""

RETURN = r"""
checked:
  description: Whether vLLM's parser ran (false when the deployed plan holds the same argv).
  returned: always
  type: bool
reason:
  description: Why the check was skipped, or why it ran.
  returned: always
  type: str
seconds:
  description: Wall time of the parser's process (0 when skipped).
  returned: always
  type: float
import_s:
  description: Of those, the seconds importing vLLM (and torch) took.
  returned: when checked
  type: float
vllm_version:
  description: The runtime's vLLM version that parsed the argv.
  returned: when checked
  type: str
"""

import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.argv_check import (  # noqa: E402
    PARSER_ENV,
    PARSER_ENV_DROP,
    PARSER_SCRIPT,
    deployed_argv,
    runtime_newer_than,
    skip_reason,
    verdict,
)


def read_deployed(path, host):
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return deployed_argv(handle.read(), host)
    except OSError:
        return None


def main():
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "argv": {"type": "list", "elements": "str", "required": True},
            "plan_argv": {"type": "list", "elements": "str"},
            "venv": {"type": "path", "required": True},
            "deployed_plan": {"type": "path"},
            "force": {"type": "bool", "default": False},
            "timeout_s": {"type": "int", "default": 300},
        },
        supports_check_mode=True,
    )
    params = module.params
    host, argv = params["host"], params["argv"]
    if argv[:2] != ["vllm", "serve"]:
        module.fail_json(msg=f"host {host}: the argv to check must start with 'vllm serve', got {argv[:2]}")
    python = os.path.join(params["venv"], "bin", "python")
    if not params["force"]:
        deployed = read_deployed(params["deployed_plan"], host)
        newer = runtime_newer_than(os.path.join(params["venv"], "bin", "vllm"), params["deployed_plan"] or "")
        reason = skip_reason(params["plan_argv"] or argv, deployed, newer)
        if reason:
            module.exit_json(changed=False, checked=False, reason=reason, seconds=0.0)
    if not os.access(python, os.X_OK):
        module.fail_json(msg=f"host {host}: {python} is missing or not executable; expected the vLLM runtime venv")
    home = tempfile.mkdtemp(prefix="vllm-argv-check-")
    env = {key: value for key, value in os.environ.items() if key not in PARSER_ENV_DROP}
    env.update(PARSER_ENV, HOME=home, TMPDIR=home)
    started = time.monotonic()
    try:
        completed = subprocess.run([python, "-c", PARSER_SCRIPT], input=json.dumps({"argv": argv}),
                                   capture_output=True, text=True, env=env, cwd=home,
                                   timeout=params["timeout_s"], check=False)
    except subprocess.TimeoutExpired:
        module.fail_json(msg=f"host {host}: vLLM's argument parser ({python}) did not answer within "
                             f"{params['timeout_s']} s")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    seconds = round(time.monotonic() - started, 3)
    try:
        result = json.loads(completed.stdout)
    except ValueError:
        tail = " ".join((completed.stderr or completed.stdout or "").strip().splitlines()[-3:])
        module.fail_json(msg=f"host {host}: vLLM's argument parser ({python}) exited {completed.returncode} "
                             f"without a result: {tail}", seconds=seconds)
    message = verdict(host, argv, result)
    facts = {"seconds": seconds, "import_s": result.get("import_s"), "vllm_version": result.get("vllm_version")}
    if message:
        module.fail_json(msg=message, checked=True, **facts)
    module.exit_json(changed=False, checked=True, reason="vLLM's serve parser accepts the argv", **facts)


if __name__ == "__main__":
    main()
