"""Prometheus's targets and the plan's recording rules (plugins/module_utils/monitoring/), on real plans.

The plans are the planner's own (build_plan): the lab's tiny Llama in the layouts tests/lab runs
(lab/make_tiny_model.py's config), a Ray plan, and two deployments sharing a machine on disjoint GPUs.
"""

from __future__ import annotations

import json
import sys

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.filter.monitoring_targets import (
    monitoring_plan_rules,
    monitoring_targets,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.monitoring import plan_rules, targets
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan
from test_facts_modules import REPO

H100 = {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}
LAB_GPUS = {"count": 1, "name": "cpu", "memory_total_mib": 4096, "nvlink": False}
LAB = [{"name": f"node{k}", "address": f"10.77.1.{k}", "fabric_interface": "eth1", "gpus": dict(LAB_GPUS)}
       for k in (1, 2, 3)]


def lab_plan(overrides, deployment="lab-tiny-llama", cluster=None, **extra):
    sys.path.insert(0, str(REPO / "lab"))
    from make_tiny_model import make_config  # noqa: PLC0415

    return build_plan({"config": make_config("llama", 4, 4, 2, 32, 0)}, cluster or LAB, {"max_model_len": 512},
                      overrides, device="cpu", deployment=deployment, model_path="/srv/models/tiny-llama",
                      allow_tp_across_nodes=True, **extra)


def by(groups, component):
    return {group["labels"]["node"]: (group["targets"], group["labels"]) for group in groups
            if group["labels"]["component"] == component}


def test_the_labs_tp2_over_two_nodes_scrapes_the_heads_api_and_every_hosts_node_exporter():
    plan = lab_plan({"tp": 2})
    groups = targets.target_groups([plan], 9100)
    assert by(groups, "vllm") == {"node1": (["10.77.1.1:8000"], {
        "component": "vllm", "deployment": "lab-tiny-llama", "node": "node1", "role": "head", "rank": "0",
        "replica": "0"})}
    nodes = by(groups, "node")
    # node3 was planned from (it is in vllm_nodes) but runs no rank: its exporter is scraped, as idle.
    assert list(nodes) == ["node1", "node2", "node3"]
    assert nodes["node2"] == (["10.77.1.2:9100"], {
        "component": "node", "deployment": "lab-tiny-llama", "node": "node2", "role": "worker", "rank": "1",
        "replica": "0", "vllm_unit": "vllm.service"})
    assert nodes["node3"] == (["10.77.1.3:9100"], {"component": "node", "deployment": "lab-tiny-llama",
                                                   "node": "node3", "role": "idle"})
    assert by(groups, "ray") == {}  # backend mp: no Ray
    # What Prometheus reads: JSON, every label value a string.
    assert all(isinstance(value, str) for group in json.loads(json.dumps(groups)) for value in group["labels"].values())


def test_dense_dp_replicas_are_independent_api_servers_each_scraped_with_its_replica():
    plan = lab_plan({"tp": 1, "dp": 2})
    groups = targets.target_groups([plan])
    api = by(groups, "vllm")
    assert {node: (t, labels["replica"], labels["rank"]) for node, (t, labels) in api.items()} == {
        "node1": (["10.77.1.1:8000"], "0", "0"), "node2": (["10.77.1.2:8000"], "1", "1")}
    nodes = by(groups, "node")
    assert [(nodes[n][1]["replica"], nodes[n][1]["rank"]) for n in ("node1", "node2")] == [("0", "0"), ("1", "1")]


def test_a_ray_plan_scrapes_each_nodes_metrics_agent_on_its_metrics_export_port():
    cluster = [{"name": f"n{k}", "address": f"10.1.0.{k + 1}", "fabric_interface": "ib0", "gpus": H100}
               for k in range(2)]
    plan = build_plan("llama-3.1-405b", cluster, {"max_model_len": 8192}, {"backend": "ray"}, deployment="big",
                      ports={"ray_metrics_export": 6500})
    groups = targets.target_groups([plan], 9101)
    assert {node: t for node, (t, _) in by(groups, "ray").items()} == {"n0": ["10.1.0.1:6500"],
                                                                      "n1": ["10.1.0.2:6500"]}
    assert by(groups, "ray")["n1"][1]["rank"] == ",".join(str(rank) for rank in range(8, 16))
    # Ray's worker runs no vLLM: its unit is Ray's; the head's is vLLM's (part of ray-head).
    nodes = by(groups, "node")
    assert (nodes["n0"][1]["vllm_unit"], nodes["n1"][1]["vllm_unit"]) == ("vllm.service", "ray-worker.service")
    assert nodes["n1"][0] == ["10.1.0.2:9101"]
    assert list(by(groups, "vllm")) == ["n0"]


def test_deployments_sharing_a_machine_each_get_their_targets_and_their_own_unit():
    chat = build_plan("llama-3.1-8b", [{"name": "h-chat", "address": "192.0.2.40", "gpus": H100,
                                        "gpu_ids": [0, 1, 2, 3]}], {"max_model_len": 8192}, deployment="chat")
    coder = build_plan("llama-3.1-8b", [{"name": "h-coder", "address": "192.0.2.40", "gpus": H100,
                                         "gpu_ids": [4, 5, 6, 7]}], {"max_model_len": 8192}, deployment="coder",
                       ports={"api": 8001, "master": 29511, "dp_rpc": 29560})
    # Every host holds its deployment's plan: the filter gets one per host and takes each deployment once.
    groups = monitoring_targets([chat, coder, dict(chat)], 9100)
    assert [(g["labels"]["component"], g["labels"]["deployment"], g["targets"][0]) for g in groups] == [
        ("vllm", "chat", "192.0.2.40:8000"), ("node", "chat", "192.0.2.40:9100"),
        ("vllm", "coder", "192.0.2.40:8001"), ("node", "coder", "192.0.2.40:9100")]
    assert [g["labels"].get("vllm_unit") for g in groups if g["labels"]["component"] == "node"] == [
        "vllm-chat.service", "vllm-coder.service"]
    assert groups[0]["labels"]["replica"] == ",".join(str(r) for r in range(chat["dp"]))


def test_an_ipv6_address_is_bracketed_and_bad_input_is_named():
    assert targets.host_port("fd00::1", 9100) == "[fd00::1]:9100"
    plan = lab_plan({"tp": 1})
    with pytest.raises(AnsibleFilterError, match="node exporter port must be 1-65535, got 0"):
        monitoring_targets([plan], 0)
    with pytest.raises(AnsibleFilterError, match="expected a list of plans, got dict"):
        monitoring_targets(plan)
    with pytest.raises(AnsibleFilterError, match="every plan needs 'deployment' and 'nodes'"):
        monitoring_targets([{"deployment": "x"}])
    other = lab_plan({"tp": 2})
    with pytest.raises(AnsibleFilterError, match="deployment lab-tiny-llama has two different plans"):
        monitoring_targets([plan, other])
    assert monitoring_targets([]) == []


def test_the_plan_rules_carry_planned_replicas_and_the_ttft_target_per_deployment():
    one, two = lab_plan({"tp": 1}, deployment="a"), lab_plan({"tp": 1, "dp": 2}, deployment="b")
    rules = monitoring_plan_rules([one, two, one], 2, {"b": 0.5})
    (group,) = rules["groups"]
    assert group["name"] == "vllm-cluster-plan"
    assert [(r["record"], r["expr"], r["labels"]["deployment"]) for r in group["rules"]] == [
        (plan_rules.REPLICAS_PLANNED, "vector(1)", "a"), (plan_rules.TTFT_TARGET, "vector(2.0)", "a"),
        (plan_rules.REPLICAS_PLANNED, "vector(2)", "b"), (plan_rules.TTFT_TARGET, "vector(0.5)", "b")]
    with pytest.raises(AnsibleFilterError, match=r"names c, which no plan of this run has; the deployments: a, b"):
        monitoring_plan_rules([one, two], 2, {"c": 1})
    with pytest.raises(AnsibleFilterError, match=r"vllm_monitoring_ttft_p99_seconds must be a number of seconds "
                                                  r"above 0, got -1"):
        monitoring_plan_rules([one], -1)


def test_routers_are_targets_of_their_own_that_name_what_they_front():
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.monitoring.targets import (
        TargetError,
        router_groups,
    )

    groups = router_groups([{"host": "gw1", "address": "10.0.0.5", "port": 29001, "deployments": ["chat", "embed"]},
                            {"host": "gw2", "address": "fd00::6", "deployments": "chat"}])
    assert groups == [
        {"targets": ["10.0.0.5:29001"], "labels": {"component": "router", "node": "gw1", "role": "router",
                                                   "fronts": "chat,embed"}},
        {"targets": ["[fd00::6]:29000"], "labels": {"component": "router", "node": "gw2", "role": "router",
                                                   "fronts": "chat"}}]
    with pytest.raises(TargetError, match="router host gw3 has no address for its metrics"):
        router_groups([{"host": "gw3", "address": None}])


def test_dcgm_exporter_targets_only_when_its_port_is_given_on_every_ranked_node():
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.monitoring.targets import (
        TargetError,
        target_groups,
    )

    plan = lab_plan({"tp": 2})  # node1 and node2 hold ranks, node3 is idle
    assert not [g for g in target_groups([plan]) if g["labels"]["component"] == "dcgm"]
    dcgm = {g["labels"]["node"]: g for g in target_groups([plan], 9100, 9400) if g["labels"]["component"] == "dcgm"}
    assert sorted(dcgm) == ["node1", "node2"]
    node1 = next(n for n in plan["nodes"] if n["host"] == "node1")
    assert dcgm["node1"]["targets"] == [f"{node1['address']}:9400"]
    assert dcgm["node1"]["labels"]["deployment"] == plan["deployment"] and dcgm["node1"]["labels"]["rank"] == "0"
    with pytest.raises(TargetError, match="DCGM exporter port must be 0 \\(none\\) or 1-65535, got 70000"):
        target_groups([plan], 9100, 70000)
