#!/usr/bin/python
"""Ansible module cpu_facts: CPU cores, NUMA nodes and memory from the kernel's files."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cpu_facts
short_description: Gather CPU, NUMA and memory facts for vLLM's CPU platform
version_added: 0.1.0
description:
  - Reads C(/proc/cpuinfo), C(/proc/meminfo), C(/proc/self/status),
    C(/sys/devices/system/node/node*/{cpulist,meminfo}),
    C(/sys/devices/system/cpu/cpu*/topology) and the cgroup memory limit, and
    sets the fact C(vllm_cpu) - logical CPUs, physical cores, sockets, threads
    per core, the CPU flags vLLM's CPU kernels depend on, memory, and one
    entry per NUMA node with its CPUs and memory.
  - Needs no external tool; fails, naming the host and the file, when
    C(/proc/cpuinfo) or C(/proc/meminfo) cannot be read or parsed.
options:
  root:
    description:
      - Directory the kernel files are read under; V(/) on a live host.
    type: path
    default: /
notes:
  - Only reads; check mode reports the same facts.
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
- name: Gather CPU facts
  vllm_ops.cluster.cpu_facts:

- name: One OpenMP thread per physical core for the CPU backend
  ansible.builtin.debug:
    msg: "{{ ansible_facts['vllm_cpu']['physical_cores'] }} cores on {{ ansible_facts['vllm_cpu']['numa_node_count'] }} NUMA node(s)"
"""

RETURN = r"""
ansible_facts:
  description: The facts set by this module.
  returned: always
  type: dict
  contains:
    vllm_cpu:
      description: CPU and memory summary.
      returned: always
      type: dict
      contains:
        present:
          description: Always true (every host has a CPU).
          type: bool
          sample: true
        logical_cpus:
          description: Logical CPUs (hardware threads) the kernel lists.
          type: int
          sample: 224
        physical_cores:
          description: Distinct (socket, core) pairs.
          type: int
          sample: 112
        sockets:
          description: CPU packages.
          type: int
          sample: 2
        threads_per_core:
          description: Hardware threads per core.
          type: int
          sample: 2
        flags:
          description: CPU features relevant to vLLM's CPU kernels (avx2, avx512f, avx512_bf16, amx_bf16, ...).
          type: list
          elements: str
          sample: ["avx2", "avx512f"]
        memory_total_mib:
          description: MemTotal, MiB.
          type: int
          sample: 2063718
        memory_available_mib:
          description: MemAvailable, MiB.
          type: int
          sample: 1990000
        cgroup_memory_limit_mib:
          description: Memory limit of this host's root cgroup (a container's limit), MiB; null when unlimited.
          type: int
          sample: null
        allowed_cpus:
          description: CPUs this process may run on (Cpus_allowed_list), as a cpulist.
          type: str
          sample: 0-223
        numa_node_count:
          description: NUMA nodes.
          type: int
          sample: 2
        numa_nodes:
          description: One entry per NUMA node (node, cpulist, cpus, memory_total_mib).
          type: list
          elements: dict
"""

import socket  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.cpuinfo import (  # noqa: E402
    CpuInfoParseError,
    read_cpu_sources,
    summarize_cpu,
)


def main():
    module = AnsibleModule(
        argument_spec={"root": {"type": "path", "default": "/"}},
        supports_check_mode=True,
    )
    root = module.params["root"]
    try:
        facts = summarize_cpu(read_cpu_sources(root))
    except CpuInfoParseError as error:
        module.fail_json(msg=f"host {socket.gethostname()}: cannot read CPU facts under {root}: {error}")
    module.exit_json(changed=False, ansible_facts={"vllm_cpu": facts})


if __name__ == "__main__":
    main()
