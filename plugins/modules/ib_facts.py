#!/usr/bin/python
"""Ansible module ib_facts: InfiniBand / RoCE adapter facts from ibstat."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ib_facts
short_description: Gather InfiniBand and RoCE adapter facts from ibstat
version_added: 0.1.0
description:
  - Runs C(ibstat) and, when it is installed, C(ibdev2netdev), and sets the
    fact C(vllm_ib) - per adapter (CA) and port the state, physical state,
    rate, link layer (InfiniBand or Ethernet for RoCE), LIDs and GUIDs, the
    network interface of each port, and lists of active and down ports.
  - A host without adapters (nothing under C(/sys/class/infiniband)) and
    without ibstat gets C(vllm_ib.present=false); that is not a failure unless
    O(required=true).
  - Fails, naming the host, the command, its exit code and the first line of
    its error, when ibstat fails or prints something that cannot be parsed,
    and when adapters exist but ibstat is missing.
options:
  binary:
    description:
      - Path or name of C(ibstat) (package infiniband-diags).
    type: str
    default: ibstat
  ibdev2netdev_binary:
    description:
      - Path or name of C(ibdev2netdev), used when found to map ports to network interfaces.
    type: str
    default: ibdev2netdev
  required:
    description:
      - Fail when ibstat is missing or reports no port.
    type: bool
    default: false
  timeout:
    description:
      - Seconds each command may take.
    type: int
    default: 60
  hardware_globs:
    description:
      - Paths whose presence shows that InfiniBand or RoCE adapters exist even when ibstat is missing.
    type: list
    elements: str
    default: ['/sys/class/infiniband/*']
notes:
  - Only reads; check mode runs the same commands and reports the same facts.
  - On a host that has infiniband-diags installed but no adapter, ibstat fails
    (C(ibpanic ... can't list IB device names)) and so does this module; skip it
    there or remove the package.
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
- name: Gather InfiniBand / RoCE facts
  vllm_ops.cluster.ib_facts:

- name: Require an active fabric port on every multi-node host
  vllm_ops.cluster.ib_facts:
    required: true

- name: Show the adapters NCCL can use
  ansible.builtin.debug:
    msg: "NCCL_IB_HCA candidates: {{ ansible_facts['vllm_ib']['active_cas'] | join(',') }}"
"""

RETURN = r"""
ansible_facts:
  description: The facts set by this module.
  returned: always
  type: dict
  contains:
    vllm_ib:
      description: Adapter summary.
      returned: always
      type: dict
      contains:
        present:
          description: Whether any adapter port was found.
          type: bool
          sample: true
        ca_count:
          description: Number of adapters (CAs).
          type: int
          sample: 9
        ports:
          description: One entry per port (ca, port, state, physical_state, rate_gbps, link_layer, port_guid, netdev, ...).
          type: list
          elements: dict
        active_ports:
          description: Ports in state Active, as C(ca/port).
          type: list
          elements: str
          sample: ["mlx5_0/1", "mlx5_1/1"]
        down_ports:
          description: Ports in any other state.
          type: list
          elements: str
          sample: ["mlx5_2/1"]
        active_cas:
          description: Adapters with an active port (candidates for NCCL_IB_HCA).
          type: list
          elements: str
          sample: ["mlx5_0", "mlx5_1"]
        rates_gbps:
          description: Distinct rates of the active ports, Gb/s.
          type: list
          elements: float
          sample: [400]
        link_layers:
          description: Number of ports per link layer.
          type: dict
          sample: {"InfiniBand": 8, "Ethernet": 1}
        warnings:
          description: Ports that are not active and what to check.
          type: list
          elements: str
"""

import glob  # noqa: E402
import socket  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.ibstat import (  # noqa: E402
    IbParseError,
    absent_summary,
    parse_ibdev2netdev,
    parse_ibstat,
    summarize_ib,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.tools import (  # noqa: E402
    parse_or_fail,
    resolve_binary,
    run_tool,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "binary": {"type": "str", "default": "ibstat"},
            "ibdev2netdev_binary": {"type": "str", "default": "ibdev2netdev"},
            "required": {"type": "bool", "default": False},
            "timeout": {"type": "int", "default": 60},
            "hardware_globs": {"type": "list", "elements": "str", "default": ["/sys/class/infiniband/*"]},
        },
        supports_check_mode=True,
    )
    params = module.params
    host = socket.gethostname()
    evidence = sorted(path for pattern in params["hardware_globs"] for path in glob.glob(pattern))
    binary = resolve_binary(module, params["binary"])

    if binary is None:
        if evidence:
            module.fail_json(
                msg=f"host {host}: InfiniBand/RoCE adapters exist ({evidence[0]}) but '{params['binary']}' "
                "was not found; install infiniband-diags or set binary to the path of ibstat"
            )
        if params["required"]:
            module.fail_json(
                msg=f"host {host}: no InfiniBand/RoCE adapter and no '{params['binary']}' found, but required=true; "
                "expected a host with an adapter and infiniband-diags installed"
            )
        module.exit_json(changed=False, ansible_facts={"vllm_ib": absent_summary()})

    argv = [binary]
    parsed = parse_or_fail(module, parse_ibstat, argv, run_tool(module, argv, params["timeout"]), errors=IbParseError)
    netdevs = None
    netdev_binary = resolve_binary(module, params["ibdev2netdev_binary"])
    if netdev_binary is not None:
        netdev_argv = [netdev_binary]
        netdevs = parse_or_fail(
            module, parse_ibdev2netdev, netdev_argv, run_tool(module, netdev_argv, params["timeout"]),
            errors=IbParseError,
        )

    facts = summarize_ib(parsed, netdevs)
    if params["required"] and not facts["present"]:
        module.fail_json(msg=f"host {host}: ibstat reports no adapter port, but required=true; expected at least one")
    module.exit_json(changed=False, ansible_facts={"vllm_ib": facts})


if __name__ == "__main__":
    main()
