"""The planner's entry points: ``build_plan`` turns a request into the plan every part reads.

``build_plan(...)`` is a short pipeline over the plan package:

    request  (plan/request.py)   every input named once, with where it came from
    inputs   (plan/inputs.py)    checked, in a fixed order
    layout   (plan/layout.py)    the seed's decision tree over what vLLM accepts; Q2 replicas
    memory   (plan/memory.py)    weights, reserve and KV per GPU for each candidate
    nodes    (plan/nodes.py)     ranks on nodes, each node's argv and env (the launch mode: launch/)
    expect   (plan/expect.py)    what verify must find in vLLM's own lines
    explain  (plan/explain.py)   the decision path and the warnings

The result is one plain, JSON-serialisable dict (docs/architecture.md, "The plan
object"). When no layout fits, PlanError names the numbers.

Pure Python (3.11+); imports nothing from Ansible.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import layout
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import PlanError, gib
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.expect import expect
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.explain import (
    decision,
    strategy,
    warnings,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.inputs import prepare
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.memory import memory_section
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.nodes import (
    data_parallel,
    layout_nodes,
    rank_table,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.ray_auth import ray_auth_section
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.request import VLLM_VERSION, PlanRequest

__all__ = ["PLAN_VERSION", "VLLM_VERSION", "PlanError", "PlanRequest", "build_plan", "coerce_text_inputs",
           "plan", "plan_from_request"]

PLAN_VERSION = 1


def plan(request):
    """The plan for a PlanRequest; raises PlanError naming the input the way its user wrote it."""
    inputs = prepare(request)
    layout.check_pins(inputs)
    if inputs.device == "cpu" and inputs.enforce_eager_given is None:
        inputs.enforce_eager = inputs.pins.get("pp", 1) == 1  # eager starts faster; decided again in settle
    cand, ev, trace, default_missed = layout.choose(inputs)
    cand, ev, q2 = layout.scale_for_throughput(inputs, cand, ev)
    layout.settle(inputs, cand)
    rows = rank_table(inputs, cand)
    nodes = layout_nodes(inputs, cand, rows)
    result = {
        "plan_version": PLAN_VERSION,
        "vllm_version": inputs.vllm_version,
        "deployment": inputs.deployment,
        "served_model_name": inputs.served_model_names[0],
        "model": mc.public_view(inputs.spec),
        "cluster": _cluster(inputs),
        "targets": _targets(inputs),
        "strategy": strategy(cand),
        "backend": inputs.backend,
        "tp": cand.tp,
        "pp": cand.pp,
        "dp": cand.dp,
        "ep": cand.tp * cand.dp if cand.ep_on else 1,
        "data_parallel": data_parallel(inputs, cand),
        "enable_expert_parallel": cand.ep_on,
        "enable_eplb": inputs.eplb,
        "enforce_eager": inputs.enforce_eager,
        "kv_cache_dtype": inputs.kv_cache_dtype,
        "allow_tp_across_nodes": inputs.allow_tp_across_nodes,
        "api_guard": inputs.api_guard,
        "ray_auth": ray_auth_section(inputs.ray_auth),
        "serve_args": inputs.serve_args,
        "world_size": cand.world,
        "nodes_used": cand.nnodes,
        "nodes": nodes,
        "memory": memory_section(inputs, cand, ev),
        "ports": inputs.ports,
        "service": service(inputs.deployment, any(node.get("gpu_ids") for node in inputs.nodes)),
        "decision": decision(inputs, cand, ev, trace, default_missed, q2),
        "warnings": warnings(inputs, cand, ev, default_missed),
        "expect": expect(inputs, cand, ev, rows, nodes),
    }
    if inputs.device == "cpu":
        result["cluster"]["cpu_cores_per_node"] = inputs.cpu_cores_per_node
        result["cluster"]["cpu_kvcache_space_gib"] = inputs.cpu_kvcache_space_gib
    return result


SERVICE_UNIT = "vllm.service"
CONFIG_DIR = "/etc/vllm-cluster"


def service(deployment, shares_machines):
    """Where the deployment's vLLM lives on its nodes: the unit, and the directory of its env, plan and stage stamps.

    A deployment that owns its machines keeps the names of a one-deployment inventory (vllm.service,
    /etc/vllm-cluster). One that names its GPUs (vllm_cluster_gpu_ids: it may share machines on disjoint GPUs)
    runs as an instance of its own: vllm-<deployment>.service and /etc/vllm-cluster/deployments/<deployment>.
    """
    if not shares_machines:
        return {"unit": SERVICE_UNIT, "config_dir": CONFIG_DIR, "stage_dir": f"{CONFIG_DIR}/stages",
                "shares_machines": False}
    config_dir = f"{CONFIG_DIR}/deployments/{deployment}"
    return {"unit": f"vllm-{deployment}.service", "config_dir": config_dir, "stage_dir": f"{config_dir}/stages",
            "shares_machines": True}


def _cluster(inputs):
    return {
        "device": inputs.device,
        "gpus_per_node": inputs.gpus_per_node,
        "gpu_name": inputs.gpu_name,
        "gpu_memory_gib": gib(inputs.gpu_memory_bytes),
        "nvlink": inputs.nvlink,
        "nvlink_source": inputs.nvlink_source,
        "nodes": [{"name": node["name"], "address": node["address"]} for node in inputs.nodes],
    }


def _targets(inputs):
    return {
        "max_model_len": inputs.max_model_len,
        "gpu_memory_utilization": inputs.gpu_memory_utilization,
        "kv_tokens_target": inputs.kv_tokens_target,
        "concurrency_target": inputs.concurrency_target,
        "concurrency_target_is_default": inputs.target_is_default,
        "throughput_need_tok_s": inputs.throughput_need,
        "replica_throughput_tok_s": inputs.replica_throughput,
    }


def build_plan(
    model,
    cluster,
    targets=None,
    overrides=None,
    *,
    device="cuda",
    ports=None,
    deployment="vllm",
    model_path=None,
    allow_tp_across_nodes=False,
    cpu_kvcache_space_gib=1,
    cpu_cores_per_node=None,
    cpu_ray_support=False,
    enforce_eager=None,
    load_format=None,
    kv_cache_dtype=None,
    enable_eplb=None,
    api_host=None,
    api_guard=True,
    ray_auth="token",
    serve_args=None,
    vllm_version=VLLM_VERSION,
):
    """Plan one deployment (docs/planner.md); the arguments are plan/request.py's INPUTS. Raises PlanError."""
    return plan(PlanRequest(dict(locals())))


def plan_from_request(request):
    """``build_plan(**request)`` with a PlanError, not a TypeError, for a bad request (None values count as unset)."""
    return plan(PlanRequest.from_mapping(request))


def coerce_text_inputs(request):
    """A copy of ``request`` whose integer, number and boolean inputs given as text are converted.

    `-e vllm_cluster_tp=2` gives the string "2"; the planner itself stays strict.
    """
    if not isinstance(request, dict):
        return request
    return PlanRequest(request).with_text_converted().values
