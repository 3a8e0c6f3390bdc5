#!/usr/bin/python
"""Ansible module fabric_check: judge MTU, InfiniBand ports and all-pairs probes of the fabric, once."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabric_check
short_description: Judge the fabric across all nodes - MTU, InfiniBand ports, all-pairs reachability
version_added: 0.1.0
description:
  - Runs once (C(run_once)) over what every node reported and fails with one
    message that names each node, pair of nodes, port, interface and value at fault.
  - V(mtu) - every node's fabric MTU equals O(expected_mtu), or the first node's.
  - V(ib) - on nodes that list HCAs or expect InfiniBand, every declared port is
    Active and LinkUp at O(ib_rate_gbps).
  - V(pairs) - every connection and path-MTU probe of O(probe_results) (from
    C(vllm_ops.cluster.port_probe) with C(action=connect)) succeeded; the
    failures are printed as a table of source, destination, address and port,
    interface and error, followed by the likely cause when the pattern shows one.
  - The judgement is C(plugins/module_utils/verify/reachability.py).
options:
  checks:
    description: Which checks to run.
    type: list
    elements: str
    choices: [mtu, ib, pairs]
    required: true
  nodes:
    description:
      - "Per host, C({interface, mtu, ib_hcas, expect_ib, ib_ports}); C(ib_ports) is
        C(ansible_facts['vllm_ib']['ports']) from C(vllm_ops.cluster.ib_facts)."
    type: dict
    required: true
  expected_mtu:
    description: The MTU every fabric interface must have; default the first node's.
    type: int
  ib_rate_gbps:
    description: Rate every checked InfiniBand port must run at, Gb/s; unset skips the rate.
    type: float
  probe_results:
    description: Per source host, the C(results) list of C(port_probe action=connect).
    type: dict
    default: {}
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
- name: Same MTU everywhere, InfiniBand ports up at 400 Gb/s
  vllm_ops.cluster.fabric_check:
    checks: [mtu, ib]
    nodes:
      node1: {interface: eth1, mtu: 9000, ib_hcas: [mlx5_0], ib_ports: "{{ hostvars['node1']['ansible_facts']['vllm_ib']['ports'] }}"}
      node2: {interface: eth1, mtu: 9000, ib_hcas: [mlx5_0], ib_ports: "{{ hostvars['node2']['ansible_facts']['vllm_ib']['ports'] }}"}
    ib_rate_gbps: 400
  run_once: true
"""

RETURN = r"""
mtu:
  description: Result of the MTU check (ok, expected).
  returned: when checked
  type: dict
ib:
  description: Result of the InfiniBand check (ok, problems).
  returned: when checked
  type: dict
pairs:
  description: Result of the pair check (ok, checked, failures, table).
  returned: when checked
  type: dict
message:
  description: Empty when every check passes; on failure the report of every failing check is C(msg).
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.reachability import (  # noqa: E402
    FabricError,
    check_ib,
    check_mtu,
    check_pairs,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "checks": {"type": "list", "elements": "str", "choices": ["mtu", "ib", "pairs"], "required": True},
            "nodes": {"type": "dict", "required": True},
            "expected_mtu": {"type": "int"},
            "ib_rate_gbps": {"type": "float"},
            "probe_results": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params = module.params
    nodes = params["nodes"]
    interfaces = {host: (node or {}).get("interface") or "?" for host, node in nodes.items()}
    outcome: dict = {}
    try:
        if "mtu" in params["checks"]:
            outcome["mtu"] = check_mtu({host: (node or {}).get("mtu") for host, node in nodes.items()}, interfaces,
                                       params["expected_mtu"])
        if "ib" in params["checks"]:
            outcome["ib"] = check_ib(nodes, params["ib_rate_gbps"])
        if "pairs" in params["checks"]:
            outcome["pairs"] = check_pairs(params["probe_results"], interfaces, expected_sources=list(nodes))
    except FabricError as error:
        module.fail_json(msg=f"fabric_check: {error}")
    messages = [result.pop("message") for result in outcome.values()]
    message = "\n".join(text for text in messages if text)
    if message:
        module.fail_json(msg=message, **outcome)
    module.exit_json(changed=False, message="", **outcome)


if __name__ == "__main__":
    main()
