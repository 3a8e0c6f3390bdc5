#!/usr/bin/python
"""Ansible module gpu_facts: NVIDIA GPU facts from nvidia-smi."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts from nvidia-smi
version_added: 0.1.0
description:
  - Runs C(nvidia-smi -q -x), C(nvidia-smi topo -m) and C(nvidia-smi nvlink -s) and
    sets the fact C(vllm_gpu) - GPU count, model, memory, driver and CUDA
    version, compute capability, persistence and MIG mode, ECC errors,
    processes on each GPU, and the NVLink / NVSwitch / PCIe link matrix.
  - A host without NVIDIA GPUs and without nvidia-smi gets C(vllm_gpu.present=false);
    that is not a failure unless O(required=true).
  - Fails, naming the host, the command, its exit code and the first line of
    its error, when nvidia-smi fails or prints something that cannot be
    parsed, and when GPU devices exist but nvidia-smi is missing.
options:
  binary:
    description:
      - Path or name of C(nvidia-smi). A name is looked up in E(PATH) and in
        C(/usr/local/nvidia/bin), where GPU container images put it.
    type: str
    default: nvidia-smi
  required:
    description:
      - Fail when nvidia-smi is missing or reports no GPU.
    type: bool
    default: false
  collect:
    description:
      - Queries to run besides C(nvidia-smi -q -x).
      - V(topology) runs C(nvidia-smi topo -m) (link matrix, CPU and NUMA affinity, nearest NICs).
      - V(nvlink) runs C(nvidia-smi nvlink -s) (active links and their speed per GPU).
    type: list
    elements: str
    choices: [topology, nvlink]
    default: [topology, nvlink]
  timeout:
    description:
      - Seconds each nvidia-smi call may take; a wedged GPU can make nvidia-smi hang.
    type: int
    default: 60
  hardware_globs:
    description:
      - Paths whose presence shows that NVIDIA GPUs exist even when nvidia-smi is missing.
    type: list
    elements: str
    default: ['/dev/nvidia[0-9]*', '/proc/driver/nvidia/gpus/*']
notes:
  - Only reads; check mode runs the same queries and reports the same facts.
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
- name: Gather GPU facts
  vllm_ops.cluster.gpu_facts:

- name: Require GPUs on inference nodes
  vllm_ops.cluster.gpu_facts:
    required: true

- name: Use the driver container's nvidia-smi, skip the NVLink query
  vllm_ops.cluster.gpu_facts:
    binary: /run/nvidia/driver/usr/bin/nvidia-smi
    collect: [topology]

- name: Stop when a GPU has uncorrectable ECC errors
  ansible.builtin.assert:
    that:
      - not ansible_facts['vllm_gpu']['ecc_uncorrectable_volatile']
    fail_msg: "{{ inventory_hostname }}: {{ ansible_facts['vllm_gpu']['warnings'] | join('; ') }}"
"""

RETURN = r"""
ansible_facts:
  description: The facts set by this module.
  returned: always
  type: dict
  contains:
    vllm_gpu:
      description:
        - GPU summary; every key is described in the docstring of C(summarize_gpus) in C(plugins/module_utils/facts/nvidia_smi.py).
      returned: always
      type: dict
      contains:
        present:
          description: Whether the host has at least one NVIDIA GPU.
          type: bool
          sample: true
        count:
          description: Number of GPUs nvidia-smi describes.
          type: int
          sample: 2
        name:
          description: GPU model; null when the host mixes models (see C(names)).
          type: str
          sample: NVIDIA H200
        memory_total_mib:
          description: Memory of the smallest GPU, MiB.
          type: int
          sample: 143771
        memory_cuda_total_mib:
          description:
            - The total CUDA reports for the smallest GPU (FB total minus the driver's reserve), MiB.
            - vLLM budgets C(gpu_memory_utilization) times this; the planner uses it when present.
          type: int
          sample: 143155
        driver_version:
          description: NVIDIA driver version.
          type: str
          sample: 580.159.04
        cuda_version:
          description: Highest CUDA version the driver supports.
          type: str
          sample: "13.0"
        compute_capability:
          description: Lowest CUDA compute capability among the GPUs, as text.
          type: str
          sample: "9.0"
        persistence_mode:
          description: True when persistence mode is on for every GPU.
          type: bool
          sample: true
        mig_mode:
          description: True when any GPU runs in MIG mode.
          type: bool
          sample: false
        ecc_uncorrectable_volatile:
          description: Uncorrectable ECC errors since the last driver load, all GPUs; null when not reported.
          type: int
          sample: 0
        nvlink:
          description: True when every GPU pair is joined by NVLink (NV#); null when the topology was not queried.
          type: bool
          sample: true
        nvswitch:
          description: True when the GPUs are registered with an NVSwitch fabric or the NVLink counts require a switch.
          type: bool
          sample: true
        gpus:
          description: One entry per GPU (index, uuid, pci_bus_id, memory, ECC, MIG devices, processes, affinity, ...).
          type: list
          elements: dict
        links:
          description: C(nvidia-smi topo -m) matrix, C(links['GPU0']['GPU1']) is V(NV18), V(PIX), V(SYS), ...
          type: dict
          sample: {"GPU0": {"GPU0": "X", "GPU1": "NV18"}, "GPU1": {"GPU0": "NV18", "GPU1": "X"}}
        processes:
          description: Processes using the GPUs (gpu, pid, name, used_memory_mib, ...).
          type: list
          elements: dict
        warnings:
          description: Conditions an operator should look at (pending resets, ECC errors, fabric not ready, ...).
          type: list
          elements: str
"""

import glob  # noqa: E402
import socket  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi import (  # noqa: E402
    NvidiaSmiParseError,
    absent_summary,
    summarize_gpus,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi_query import parse_query_xml  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi_topo import (  # noqa: E402
    parse_nvlink_status,
    parse_topo_matrix,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.tools import (  # noqa: E402
    parse_or_fail,
    resolve_binary,
    run_tool,
)

EXTRA_SEARCH_DIRS = ["/usr/local/nvidia/bin", "/usr/bin", "/usr/local/bin"]


def main():
    module = AnsibleModule(
        argument_spec={
            "binary": {"type": "str", "default": "nvidia-smi"},
            "required": {"type": "bool", "default": False},
            "collect": {
                "type": "list",
                "elements": "str",
                "choices": ["topology", "nvlink"],
                "default": ["topology", "nvlink"],
            },
            "timeout": {"type": "int", "default": 60},
            "hardware_globs": {
                "type": "list",
                "elements": "str",
                "default": ["/dev/nvidia[0-9]*", "/proc/driver/nvidia/gpus/*"],
            },
        },
        supports_check_mode=True,
    )
    params = module.params
    host = socket.gethostname()
    evidence = sorted(path for pattern in params["hardware_globs"] for path in glob.glob(pattern))
    binary = resolve_binary(module, params["binary"], opt_dirs=EXTRA_SEARCH_DIRS)

    if binary is None:
        if evidence:
            module.fail_json(
                msg=f"host {host}: NVIDIA GPU devices exist ({evidence[0]}) but '{params['binary']}' was not found; "
                "install the NVIDIA utilities or set binary to the path of nvidia-smi"
            )
        if params["required"]:
            module.fail_json(
                msg=f"host {host}: no NVIDIA GPU and no '{params['binary']}' found, but required=true; "
                "expected a GPU host with nvidia-smi installed"
            )
        module.exit_json(changed=False, ansible_facts={"vllm_gpu": absent_summary()})

    query_argv = [binary, "-q", "-x"]
    parsed = parse_or_fail(
        module, parse_query_xml, query_argv, run_tool(module, query_argv, params["timeout"]),
        errors=NvidiaSmiParseError,
    )
    topo = nvlink = None
    if parsed["gpus"] and "topology" in params["collect"]:
        topo_argv = [binary, "topo", "-m"]
        topo = parse_or_fail(
            module, parse_topo_matrix, topo_argv, run_tool(module, topo_argv, params["timeout"]),
            errors=NvidiaSmiParseError,
        )
    if parsed["gpus"] and "nvlink" in params["collect"]:
        nvlink_argv = [binary, "nvlink", "-s"]
        nvlink = parse_or_fail(
            module, parse_nvlink_status, nvlink_argv, run_tool(module, nvlink_argv, params["timeout"]),
            errors=NvidiaSmiParseError,
        )

    facts = summarize_gpus(parsed, topo=topo, nvlink_status=nvlink)
    if params["required"] and not facts["present"]:
        module.fail_json(msg=f"host {host}: nvidia-smi reports no GPU, but required=true; expected at least one GPU")
    module.exit_json(changed=False, ansible_facts={"vllm_gpu": facts})


if __name__ == "__main__":
    main()
