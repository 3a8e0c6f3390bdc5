#!/usr/bin/python
"""Ansible module fabric_env: the network environment of a node, derived from its fabric interface."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabric_env
short_description: Derive VLLM_HOST_IP, NCCL/Gloo interface and IB variables from one fabric interface
version_added: 0.1.0
description:
  - Checks that the node's fabric interface exists, is up and has an IPv4
    address, then returns the environment that pins vLLM, Ray, NCCL, Gloo and
    torch to that interface and address - C(VLLM_HOST_IP), C(NCCL_SOCKET_IFNAME),
    C(GLOO_SOCKET_IFNAME), C(TP_SOCKET_IFNAME), and C(NCCL_IB_HCA) (or
    C(NCCL_IB_DISABLE=1) without HCAs) - with C(network_env()) of
    C(plugins/module_utils/plan/network_env.py), the same function the planner uses.
  - Reads only its arguments (Ansible's network facts of the node); it sets nothing.
  - Fails naming the host, the interface and the interfaces that exist when the
    interface is missing, and the key when O(extra_env) tries to override a derived variable.
options:
  interface:
    description: Name of the fabric interface (C(vllm_cluster_fabric_interface)).
    type: str
    required: true
  interfaces:
    description: The interfaces of the node, C(ansible_facts['interfaces']).
    type: list
    elements: str
    required: true
  interface_facts:
    description: The facts of the interface, C(ansible_facts[interface]); omit when it has none.
    type: dict
  declared_address:
    description:
      - The address the inventory declares for planning (C(vllm_cluster_fabric_address));
        when set it must equal the interface's address.
    type: str
  ib_hcas:
    description: InfiniBand HCAs NCCL may use (C(mlx5_0) or C(mlx5_0:1)); none disables NCCL's IB transport.
    type: list
    elements: str
    default: []
  extra_env:
    description: More variables for the same file (C(NCCL_IB_GID_INDEX), C(NCCL_DEBUG), ...); may not override derived ones.
    type: dict
    default: {}
  host:
    description: Inventory name of the node, for messages.
    type: str
notes:
  - Pure computation; check mode gives the same result.
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
- name: Derive the network environment from the fabric interface
  vllm_ops.cluster.fabric_env:
    host: "{{ inventory_hostname }}"
    interface: "{{ vllm_cluster_fabric_interface }}"
    interfaces: "{{ ansible_facts['interfaces'] }}"
    interface_facts: "{{ ansible_facts[vllm_cluster_fabric_interface | replace('-', '_')] | default(omit) }}"
    ib_hcas: "{{ vllm_cluster_ib_hcas | default([]) }}"
  register: fabric
"""

RETURN = r"""
env:
  description: The variables, sorted by name.
  returned: success
  type: dict
  sample: {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth1",
           "TP_SOCKET_IFNAME": "eth1", "VLLM_HOST_IP": "10.232.0.11"}
address:
  description: IPv4 address of the fabric interface.
  returned: success
  type: str
  sample: 10.232.0.11
mtu:
  description: MTU of the fabric interface.
  returned: success
  type: int
  sample: 9000
"""

import socket  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.network_env import (  # noqa: E402
    NetworkEnvError,
    network_env,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.reachability import (  # noqa: E402
    FabricError,
    fabric_address,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "interface": {"type": "str", "required": True},
            "interfaces": {"type": "list", "elements": "str", "required": True},
            "interface_facts": {"type": "dict"},
            "declared_address": {"type": "str"},
            "ib_hcas": {"type": "list", "elements": "str", "default": []},
            "extra_env": {"type": "dict", "default": {}},
            "host": {"type": "str"},
        },
        supports_check_mode=True,
    )
    params = module.params
    host = params["host"] or socket.gethostname()
    try:
        found = fabric_address(host, params["interface"], params["interfaces"], params["interface_facts"])
        env = network_env(params["interface"], found["address"], params["ib_hcas"] or None)
    except (FabricError, NetworkEnvError) as error:
        text = str(error)
        module.fail_json(msg=text if text.startswith(f"{host}:") else f"{host}: {text}")
    declared = params["declared_address"]
    if declared and declared != found["address"]:
        module.fail_json(msg=f"{host}: vllm_cluster_fabric_address is {declared} but {params['interface']} has "
                             f"{found['address']}; expected the same address (the plan would point peers at the wrong one)")
    overridden = sorted(set(params["extra_env"]) & set(env))
    if overridden:
        module.fail_json(msg=f"{host}: extra_env sets {', '.join(overridden)}, which are derived from the fabric "
                             f"interface {params['interface']}; set the interface or ib_hcas instead")
    env.update({str(key): str(value) for key, value in params["extra_env"].items()})
    module.exit_json(changed=False, env=dict(sorted(env.items())), address=found["address"], mtu=found["mtu"])


if __name__ == "__main__":
    main()
