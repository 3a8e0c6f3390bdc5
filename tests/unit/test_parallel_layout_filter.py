"""The filter vllm_ops.cluster.parallel_layout: a thin shell over the planner."""

from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.filter import parallel_layout as plugin
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan

NODE = {
    "name": "gpu-a",
    "address": "192.0.2.20",
    "gpus": {"count": 4, "name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920, "nvlink": True},
}


def layout(request):
    return plugin.FilterModule().filters()["parallel_layout"](request)


def test_the_filter_is_registered_under_its_name():
    assert set(plugin.FilterModule().filters()) == {"parallel_layout", "plan_from_inventory", "plan_table"}


def test_the_filter_returns_the_planners_plan():
    request = {"model": "llama-3.1-70b", "cluster": [NODE], "targets": {"max_model_len": 8192}}
    assert layout(request) == build_plan("llama-3.1-70b", [NODE], {"max_model_len": 8192})
    assert layout(request)["tp"] == 4


def test_null_values_count_as_unset():
    request = {
        "model": "llama-3.1-70b",
        "cluster": [NODE],
        "model_path": None,
        "overrides": {"tp": None, "pp": None, "backend": None},
        "targets": {"max_model_len": None, "gpu_memory_utilization": 0.9},
        "cpu_cores_per_node": None,
    }
    plan = layout(request)
    assert plan["tp"] == 4 and plan["targets"]["max_model_len"] == 8192


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"model": "llama-3.1-405b", "cluster": [NODE]}, "no layout fits llama-3.1-405b"),
        (
            {"model": "llama-3.1-70b", "cluster": [NODE], "overrides": {"tp": 3}},
            "must be divisible by tensor parallel size",
        ),
        ({"model": "llama-3.1-70b", "cluster": [NODE], "colour": "red"}, "unknown plan request keys"),
        ({"model": "llama-3.1-70b"}, "lacks"),
        ("llama-3.1-70b", "must be a mapping"),
    ],
)
def test_plan_errors_become_filter_errors_with_the_same_message(request_, message):
    with pytest.raises(AnsibleFilterError, match=message) as error:
        layout(request_)
    assert str(error.value).startswith("parallel_layout: ")


def test_the_plugin_documents_itself():
    # Three filters in one file: each one's documentation is the .yml of its name beside it
    # (tests/unit/test_ansible_doc.py renders them all through ansible-doc).
    import yaml

    docs = yaml.safe_load((Path(plugin.__file__).with_name("parallel_layout.yml")).read_text())
    assert docs["DOCUMENTATION"]["name"] == "parallel_layout"
    assert "_input" in docs["DOCUMENTATION"]["options"]
    assert "_value" in docs["RETURN"]
    assert yaml.safe_load(docs["EXAMPLES"])
    assert not hasattr(plugin, "DOCUMENTATION"), "ansible-doc would show it for plan_table and plan_from_inventory"


def test_extra_vars_given_as_text_are_accepted_by_the_filter():
    """`ansible-playbook -e vllm_cluster_tp=2` hands the filter strings; they mean numbers."""
    from ansible_collections.vllm_ops.cluster.plugins.filter.parallel_layout import parallel_layout

    nodes = [{"name": "gpu-a", "address": "192.0.2.10",
              "gpus": {"count": 4, "name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920, "nvlink": True}}]
    as_text = parallel_layout({"model": "llama-3.1-70b", "cluster": nodes,
                               "targets": {"max_model_len": "8192", "gpu_memory_utilization": "0.9"},
                               "overrides": {"tp": "4"}, "enforce_eager": "true"})
    typed = parallel_layout({"model": "llama-3.1-70b", "cluster": nodes,
                             "targets": {"max_model_len": 8192, "gpu_memory_utilization": 0.9},
                             "overrides": {"tp": 4}, "enforce_eager": True})
    assert as_text == typed
    assert as_text["tp"] == 4 and "--enforce-eager" in as_text["nodes"][0]["argv"]


def test_text_that_is_not_a_number_is_still_refused_by_name():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.vllm_ops.cluster.plugins.filter.parallel_layout import parallel_layout

    nodes = [{"name": "gpu-a", "address": "192.0.2.10",
              "gpus": {"count": 4, "name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920, "nvlink": True}}]
    with pytest.raises(AnsibleFilterError, match=r"overrides.tp must be an integer >= 1, got 'four'"):
        parallel_layout({"model": "llama-3.1-70b", "cluster": nodes, "overrides": {"tp": "four"}})
