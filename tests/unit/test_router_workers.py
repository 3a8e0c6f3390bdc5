"""vllm-router's workers from the plans (plugins/module_utils/router/workers.py), on the planner's own plans.

The plans are build_plan's: the lab's tiny Llama in the layouts tests/lab runs (test_monitoring_targets.lab_plan),
two deployments sharing an H100 machine, and a Ray plan of a 405B model over two H100 nodes.
"""

from __future__ import annotations

import copy

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.filter.router import router_workers as router_workers_filter
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.workers import (
    RouterError,
    router_workers,
    url,
)
from test_monitoring_targets import H100, LAB, lab_plan


def urls(workers):
    return [worker["url"] for worker in workers]


def test_three_single_node_deployments_of_one_model_are_three_workers():
    # The acceptance layout: TP=1 on node1, node2 and node3, one model behind the router.
    plans = [lab_plan({"tp": 1}, deployment=f"r{k}", cluster=[LAB[k - 1]], serve_args={"served-model-name": "tiny"})
             for k in (1, 2, 3)]
    workers = router_workers(plans)
    assert urls(workers) == ["http://10.77.1.1:8000", "http://10.77.1.2:8000", "http://10.77.1.3:8000"]
    assert [(w["deployment"], w["host"], w["served_model_name"], w["replicas"]) for w in workers] == [
        ("r1", "node1", "tiny", [0]), ("r2", "node2", "tiny", [0]), ("r3", "node3", "tiny", [0])]


def test_dense_dp_replicas_are_independent_servers_each_a_worker_of_its_own_replica():
    plan = lab_plan({"tp": 1, "dp": 3})
    assert plan["data_parallel"]["mode"] == "independent"
    workers = router_workers([plan, plan, plan])  # one plan per host: the deployment is taken once
    assert [(w["url"], w["host"], w["replicas"]) for w in workers] == [
        ("http://10.77.1.1:8000", "node1", [0]), ("http://10.77.1.2:8000", "node2", [1]),
        ("http://10.77.1.3:8000", "node3", [2])]


def moe_dp_plan():
    """A MoE model's DP without EP over two one-GPU nodes: vLLM's internal DP, node2 headless."""
    model = {"config": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 128,
                        "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512, "num_local_experts": 4,
                        "num_experts_per_tok": 2, "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}}
    cluster = [{"name": f"node{k}", "address": f"10.77.1.{k}", "gpus": dict(H100, count=1)} for k in (1, 2)]
    return build_plan(model, cluster, {"max_model_len": 512}, {"dp": 2, "ep": 1}, deployment="moe", model_path="/m")


def test_moe_internal_dp_has_one_front_end_its_head_which_fronts_every_replica():
    plan = moe_dp_plan()
    assert plan["data_parallel"]["mode"] == "vllm"
    assert [node["headless"] for node in plan["nodes"]] == [False, True]
    (worker,) = router_workers([plan, plan])
    assert worker["url"] == "http://10.77.1.1:8000" and worker["host"] == "node1" and worker["replicas"] == [0, 1]


def test_tp_over_two_nodes_is_one_worker_the_head():
    assert urls(router_workers([lab_plan({"tp": 2})])) == ["http://10.77.1.1:8000"]


def hybrid_lb(plan):
    """The MoE DP plan as vLLM's hybrid load balancing runs it: every node serves its local ranks (not headless)."""
    plan = copy.deepcopy(plan)
    for node in plan["nodes"]:
        argv = [word for word in node["argv"] if word != "--headless"]
        node["argv"] = argv + ["--data-parallel-hybrid-lb"]
        node["headless"] = False
    return plan


def test_hybrid_lb_makes_every_node_a_worker_for_its_own_replicas():
    workers = router_workers([hybrid_lb(moe_dp_plan())])
    assert [(w["url"], w["replicas"]) for w in workers] == [("http://10.77.1.1:8000", [0]),
                                                            ("http://10.77.1.2:8000", [1])]


def test_hybrid_lb_with_headless_is_refused_naming_the_host():
    plan = hybrid_lb(moe_dp_plan())
    plan["nodes"][1]["argv"].append("--headless")
    plan["nodes"][1]["headless"] = True
    plan["nodes"][1]["runs_vllm"] = True
    with pytest.raises(RouterError, match=r"host node2 \(deployment moe\): its argv has "
                                          r"--data-parallel-hybrid-lb and --headless"):
        router_workers([plan])


def test_a_bound_address_is_used_and_a_loopback_one_is_refused():
    plan = lab_plan({"tp": 1}, api_host="10.77.1.101")
    assert urls(router_workers([plan])) == ["http://10.77.1.101:8000"]
    assert urls(router_workers([lab_plan({"tp": 1}, api_host="0.0.0.0")])) == ["http://10.77.1.1:8000"]
    with pytest.raises(RouterError, match=r"host node1 \(deployment lab-tiny-llama\): vLLM's API binds 127.0.0.1 "
                                          r"\(vllm_cluster_api_host\), which the router cannot reach"):
        router_workers([lab_plan({"tp": 1}, api_host="127.0.0.1")])


def test_ipv6_addresses_are_bracketed():
    assert url("fd00::1", 8000) == "http://[fd00::1]:8000"


def test_deployments_sharing_a_machine_are_two_workers_on_their_own_ports():
    def half(gpu_ids, deployment, **extra):  # one H100 machine, 4 + 4 GPUs, one model in both halves
        return build_plan("llama-3.1-8b", [{"name": f"h-{deployment}", "address": "192.0.2.40", "gpus": H100,
                                            "gpu_ids": gpu_ids}], {"max_model_len": 8192}, deployment=deployment,
                          serve_args={"served-model-name": "llama-8b"}, **extra)

    low = half([0, 1, 2, 3], "low")
    high = half([4, 5, 6, 7], "high", ports={"api": 8001, "master": 29511, "dp_rpc": 29560})
    assert low["service"]["shares_machines"] and high["service"]["shares_machines"]
    assert urls(router_workers([low, high])) == ["http://192.0.2.40:8000", "http://192.0.2.40:8001"]
    with pytest.raises(RouterError, match=r"host h-high \(deployment high\): worker http://192.0.2.40:8000 is also "
                                          r"host h-low's \(deployment low\)"):
        router_workers([low, half([4, 5, 6, 7], "high")])


def test_deployments_of_different_models_are_refused_and_a_selection_fronts_one():
    a = lab_plan({"tp": 2}, deployment="lab-a")
    b = lab_plan({"tp": 1}, deployment="lab-b", cluster=[LAB[2]])
    with pytest.raises(RouterError, match=r"serve different models \(lab-a: lab-a; lab-b: lab-b\).*set "
                                          r"vllm_router_deployments"):
        router_workers([a, b])
    assert urls(router_workers([a, b], ["lab-b"])) == ["http://10.77.1.3:8000"]
    assert urls(router_workers([a, b], "lab-a")) == ["http://10.77.1.1:8000"]


def test_an_unknown_deployment_name_lists_the_known_ones():
    with pytest.raises(RouterError, match=r"vllm_router_deployments names chat, which no plan of this run has; "
                                          r"expected some of: lab-tiny-llama"):
        router_workers([lab_plan({"tp": 1})], ["chat"])


def test_two_different_plans_for_one_deployment_fail():
    with pytest.raises(RouterError, match="deployment lab-tiny-llama has two different plans"):
        router_workers([lab_plan({"tp": 1}), lab_plan({"tp": 2})])


def test_an_argv_port_that_differs_from_the_plan_is_refused():
    plan = lab_plan({"tp": 1})
    plan["ports"]["api"] = 8100
    with pytest.raises(RouterError, match=r"host node1 .*--port 8000 but the plan's ports.api is 8100"):
        router_workers([plan])


def test_a_ray_plan_is_one_worker_the_head_that_runs_vllm():
    cluster = [{"name": f"n{k}", "address": f"10.1.0.{k + 1}", "fabric_interface": "ib0", "gpus": H100}
               for k in range(2)]
    plan = build_plan("llama-3.1-405b", cluster, {"max_model_len": 8192}, {"backend": "ray"}, deployment="big")
    assert urls(router_workers([plan])) == ["http://10.1.0.1:8000"]


def test_the_filter_turns_errors_into_filter_errors():
    with pytest.raises(AnsibleFilterError, match="expected a list of plans"):
        router_workers_filter("not plans")
    assert urls(router_workers_filter([lab_plan({"tp": 1})])) == ["http://10.77.1.1:8000"]
