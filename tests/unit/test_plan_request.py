"""plan/request.py: every planning input named once, and an error names it as its user wrote it."""

import inspect

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import inputs as plan_inputs
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import (
    PlanError,
    PlanRequest,
    build_plan,
    coerce_text_inputs,
    plan,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.request import (
    BY_KEY,
    INPUTS,
    REQUEST_KEYS,
)

GPUS = {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}
CLUSTER = [{"name": "gpu-a", "address": "10.0.0.1", "gpus": GPUS}]


def test_the_table_is_build_plan_s_signature_and_the_checked_sections():
    assert tuple(inspect.signature(build_plan).parameters) == REQUEST_KEYS
    top = [spec.key for spec in INPUTS if spec.section is None]
    assert set(top) | {"cluster", "targets", "overrides"} == set(REQUEST_KEYS)
    assert {spec.name for spec in INPUTS if spec.section == "targets"} == set(plan_inputs.TARGETS)
    assert {spec.name for spec in INPUTS if spec.section == "overrides"} == {"tp", "pp", "dp", "ep", "backend"}
    # build_plan's defaults are the table's.
    for name, parameter in inspect.signature(build_plan).parameters.items():
        if name in BY_KEY and parameter.default is not inspect.Parameter.empty:
            assert BY_KEY[name].default == parameter.default, name
    # Every inventory variable and flag is unique.
    for attribute in ("variable", "flag"):
        values = [getattr(spec, attribute) for spec in INPUTS if getattr(spec, attribute)]
        assert len(values) == len(set(values)), attribute


@pytest.mark.parametrize(("request_of", "expected"), [
    (lambda values: PlanRequest.from_mapping({"model": "llama-3.1-8b", "cluster": CLUSTER, **values}),
     "overrides.tp must be an integer >= 1, got 'two'"),
    (lambda values: PlanRequest.from_variables({"vllm_cluster_model": "llama-3.1-8b", "vllm_cluster_tp": "two"},
                                               CLUSTER, "gpu-a"),
     "vllm_cluster_tp on gpu-a must be an integer >= 1, got 'two'"),
    (lambda values: PlanRequest.from_flags({"model": "llama-3.1-8b", "overrides.tp": "two"}, CLUSTER),
     "--tp must be an integer >= 1, got 'two'"),
])
def test_a_bad_value_is_named_the_way_its_user_wrote_it(request_of, expected):
    with pytest.raises(PlanError) as error:
        plan(request_of({"overrides": {"tp": "two"}}))
    assert str(error.value) == expected


def test_a_broken_rule_names_the_setting_and_text_from_the_inventory_is_converted():
    variables = {"vllm_cluster_model": "llama-3.1-8b", "vllm_cluster_tp": "3", "vllm_cluster_enforce_eager": "yes",
                 "vllm_cluster_gpu_memory_utilization": "0.9", "vllm_cluster_unknown_to_the_planner": 1}
    with pytest.raises(PlanError, match=r"^vllm_cluster_tp=3 on gpu-a is invalid for llama-3.1-8b: Total number"):
        plan(PlanRequest.from_variables(variables, CLUSTER, "gpu-a"))
    result = plan(PlanRequest.from_variables(dict(variables, vllm_cluster_tp="2"), CLUSTER, "gpu-a"))
    assert (result["tp"], result["enforce_eager"], result["targets"]["gpu_memory_utilization"]) == (2, True, 0.9)
    with pytest.raises(PlanError, match="^vllm_cluster_model is not set on gpu-a"):
        PlanRequest.from_variables({}, CLUSTER, "gpu-a")
    with pytest.raises(PlanError, match=r"^vllm_cluster_backend on gpu-a must be 'mp' or 'ray', got 'slurm'"):
        plan(PlanRequest.from_variables({"vllm_cluster_model": "llama-3.1-8b", "vllm_cluster_backend": "slurm"},
                                        CLUSTER, "gpu-a"))


def test_the_inventory_and_the_request_give_the_same_plan():
    request = {"model": "llama-3.1-70b", "cluster": CLUSTER, "targets": {"max_model_len": 4096},
               "overrides": {"tp": 4}, "enforce_eager": True}
    variables = {"vllm_cluster_model": "llama-3.1-70b", "vllm_cluster_max_model_len": 4096, "vllm_cluster_tp": 4,
                 "vllm_cluster_enforce_eager": True}
    assert plan(PlanRequest.from_variables(variables, CLUSTER, "gpu-a")) == build_plan(**request)
    assert coerce_text_inputs({"overrides": {"tp": "4"}, "targets": {"concurrency_target": "1.5"}}) == {
        "overrides": {"tp": 4}, "targets": {"concurrency_target": 1.5}}
