"""plugins/module_utils/router/front.py and filter router_front_url: where a deployment's load goes (benchmark.yml).

The plans are the planner's own for the lab (test_monitoring_targets.lab_plan): a dense
DP=3 deployment of independent servers has three API servers and needs the router; a TP=2 deployment over two nodes
has one (its head). What could make these fail: counting headless nodes as API servers, a router whose
vllm_router_deployments excludes the deployment still chosen, an address taken from the wrong plan.
"""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.filter.router_front import router_front_url
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router import front
from test_monitoring_targets import lab_plan


@pytest.fixture(scope="module")
def replicas():
    return lab_plan({"tp": 1, "dp": 3})


@pytest.fixture(scope="module")
def tp2():
    return lab_plan({"tp": 2})


def test_independent_replicas_need_a_front_and_one_head_does_not(replicas, tp2):
    assert front.api_servers(replicas) == ["node1", "node2", "node3"]
    assert front.needs_front(replicas)
    assert front.api_servers(tp2) == ["node1"]  # node2 is headless
    assert not front.needs_front(tp2)


def test_the_first_router_that_fronts_the_deployment_is_chosen(replicas):
    name = replicas["deployment"]
    routers = [{"host": "r0", "address": "10.0.0.9", "port": 8080, "deployments": ["other"]},
               {"host": "r1", "address": "10.0.0.10", "port": 8081, "deployments": [name]},
               {"host": "r2", "address": "10.0.0.11", "port": 8080, "deployments": []}]
    assert front.front_url(replicas, routers) == "http://10.0.0.10:8081"
    assert front.front_url(replicas, routers[:1]) is None
    assert front.front_url(replicas, routers[2:]) == "http://10.0.0.11:8080"
    with pytest.raises(front.RouterError, match="host r3 .* fronts deployment .* but has no address"):
        front.front_url(replicas, [{"host": "r3", "address": None, "deployments": []}])


def test_the_filter_reads_the_router_host_from_the_inventory(replicas):
    # The lab's layout: the router on node1, a node of the deployment (its address from its plan).
    hostvars = {"node1": {"vllm_cluster_plan": replicas, "vllm_router_port": 8080}}
    address = next(n["address"] for n in replicas["cluster"]["nodes"] if n["name"] == "node1")
    assert router_front_url(replicas, {"vllm_router": ["node1"]}, hostvars) == f"http://{address}:8080"
    assert router_front_url(replicas, {}, hostvars) == ""
    with pytest.raises(AnsibleFilterError, match=r"host gw \(group vllm_router\) fronts deployment lab-tiny-llama but has no address"):
        router_front_url(replicas, {"vllm_router": ["gw"]}, {"gw": {}})
