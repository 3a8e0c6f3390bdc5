#!/usr/bin/python
"""Ansible module node_firewall_policy: the nftables table that keeps a deployment's internal ports inside it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_firewall_policy
short_description: Build the nftables ruleset that limits a vLLM deployment's internal ports to its own nodes
version_added: 0.1.0
description:
  - Reads the plan and returns the text of one nftables table (C(nft -f) loads it atomically, replacing
    the previous version of the same table) and the facts behind it. Changes nothing on the node;
    the node_firewall role writes and loads the text.
  - "The table's input chain (policy accept: SSH and other services are left alone) lets replies and
    loopback through, opens the API port to O(api_cidrs) and to the cluster, lets every packet from a
    cluster node through, and drops the protected ports (the plan's master/dp_rpc ports, Ray's ports, the
    ephemeral range) for everyone else."
  - The cluster's own nodes are, with O(scope=deployment), every host the plan was made for
    (C(plan.cluster.nodes), their fabric addresses); with O(scope=plan), only the nodes that run ranks
    (C(plan.nodes)). The logic is C(plugins/module_utils/render/nft_policy.py).
options:
  plan:
    description: The deployment plan (C(vllm_cluster_plan)).
    required: true
    type: dict
  machine_plans:
    description:
      - The plans of the other deployments on this machine (deployments sharing it on disjoint GPUs,
        C(vllm_cluster_gpu_ids)); the machine has one table, so their API ports, cluster nodes and protected
        ports are added. The plan itself may be in the list (it is counted once).
    type: list
    elements: dict
    default: []
  table:
    description: Name of the nftables table (family inet) the project owns.
    type: str
    default: vllm_cluster
  scope:
    description: Which nodes are the cluster's own - every host of the deployment, or the plan's ranked nodes only.
    type: str
    choices: [deployment, plan]
    default: deployment
  api_cidrs:
    description: Networks (IPv4 or IPv6 CIDRs or addresses) that may reach the API port.
    type: list
    elements: str
    default: []
  include_ray_defaults:
    description: Protect Ray's default ports even when the plan has none (backend mp).
    type: bool
    default: true
  ephemeral_range:
    description: First and last port of the kernel's ephemeral range (Gloo, NCCL bootstrap, ZMQ); empty to leave it open.
    type: list
    elements: int
    default: [32768, 60999]
  extra_protected_ports:
    description: More ports or C(first-last) ranges only cluster nodes may reach.
    type: list
    elements: str
    default: []
  extra_cluster_addresses:
    description: More addresses or CIDRs treated as cluster nodes (a monitoring host that scrapes Ray, say).
    type: list
    elements: str
    default: []
  client_ports:
    description:
      - Ports open like the API port, to O(api_cidrs) and the cluster (the router's client port on a router host).
      - A client port that is also an API port, or falls inside a protected range, is refused.
    type: list
    elements: int
    default: []
  api_from_cidrs:
    description:
      - Whether O(api_cidrs) reach the vLLM API ports. V(false) keeps them to the cluster's own addresses (the
        router's hosts among them, see O(extra_cluster_addresses)), and clients go through the router.
    type: bool
    default: true
  admin_addresses:
    description:
      - The controller's addresses or CIDRs (verify, the doctor and deploy's converged check ask the API from
        there). They reach the vLLM API ports, and no other port, whatever O(api_from_cidrs) says.
    type: list
    elements: str
    default: []
notes:
  - Only reads its arguments; check mode gives the same answer.
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
- name: Build the firewall table from the plan
  vllm_ops.cluster.node_firewall_policy:
    plan: "{{ vllm_cluster_plan }}"
    api_cidrs: [10.0.0.0/8]
  register: firewall_policy

- name: Write it
  ansible.builtin.copy:
    content: "{{ firewall_policy.ruleset }}"
    dest: /etc/vllm-cluster/firewall.nft
    mode: "0644"
    validate: nft -c -f %s
"""

RETURN = r"""
ruleset:
  description: The nftables script (declare, delete and re-create the table, in one transaction).
  returned: success
  type: str
scope:
  description: The scope the cluster's nodes were taken from.
  returned: success
  type: str
  sample: deployment
cluster_nodes:
  description: The cluster's own nodes, C(name) and C(address).
  returned: success
  type: list
  elements: dict
table:
  description: The table's name (family inet).
  returned: success
  type: str
  sample: vllm_cluster
api_ports:
  description: Every API port the table opens (one per deployment on the machine).
  returned: success
  type: list
  elements: int
  sample: [8000, 8001]
deployments:
  description: The deployments the table covers, this plan's first.
  returned: success
  type: list
  elements: str
  sample: [chat, embed]
api_port:
  description: The API port from the plan.
  returned: success
  type: int
  sample: 8000
api_cidrs:
  description: The networks the API port is open to (besides the cluster).
  returned: success
  type: list
  sample: ["10.0.0.0/8"]
api_from_cidrs:
  description: Whether the API CIDRs reach the vLLM API ports (false - the cluster and the router's hosts only).
  returned: success
  type: bool
  sample: true
admin_addresses:
  description: The controller's addresses that reach the vLLM API ports.
  returned: success
  type: list
  sample: ["10.231.1.1"]
client_ports:
  description: Ports open like the API (the router's client port on a router host).
  returned: success
  type: list
  elements: int
  sample: [8080]
cluster_addresses:
  description: The addresses treated as the cluster's own nodes.
  returned: success
  type: list
  sample: ["10.232.0.11", "10.232.0.12"]
protected_ports:
  description: Ports and ranges that only cluster nodes reach.
  returned: success
  type: list
  sample: ["6379-6384", "8265", "10001-10999", "29501", "29550", "32768-60999", "52365"]
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.render.nft_policy import (  # noqa: E402
    FirewallError,
    build_policy,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "plan": {"type": "dict", "required": True},
            "machine_plans": {"type": "list", "elements": "dict", "default": []},
            "table": {"type": "str", "default": "vllm_cluster"},
            "api_cidrs": {"type": "list", "elements": "str", "default": []},
            "scope": {"type": "str", "choices": ["deployment", "plan"], "default": "deployment"},
            "include_ray_defaults": {"type": "bool", "default": True},
            "ephemeral_range": {"type": "list", "elements": "int", "default": [32768, 60999]},
            "extra_protected_ports": {"type": "list", "elements": "str", "default": []},
            "extra_cluster_addresses": {"type": "list", "elements": "str", "default": []},
            "client_ports": {"type": "list", "elements": "int", "default": []},
            "api_from_cidrs": {"type": "bool", "default": True},
            "admin_addresses": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        policy = build_policy(
            table=params["table"], plan=params["plan"], api_cidrs=params["api_cidrs"], scope=params["scope"],
            include_ray_defaults=params["include_ray_defaults"], ephemeral_range=params["ephemeral_range"],
            extra_protected_ports=params["extra_protected_ports"],
            extra_cluster_addresses=params["extra_cluster_addresses"], machine_plans=params["machine_plans"],
            client_ports=params["client_ports"], api_from_cidrs=params["api_from_cidrs"],
            admin_addresses=params["admin_addresses"])
    except FirewallError as error:
        module.fail_json(msg=f"node_firewall_policy: {error}")
    module.exit_json(changed=False, **policy)


if __name__ == "__main__":
    main()
