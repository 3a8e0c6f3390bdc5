"""plugins/module_utils/verify/parity.py: cross-node comparison and its one message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.parity import (
    MISSING,
    ParityError,
    compare,
    format_value,
)
from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
H200 = {"driver_version": "580.159.04", "cuda_version": "13.0", "name": "NVIDIA H200", "count": 2,
        "memory_total_mib": 143771}


def nodes(**overrides: dict) -> dict:
    """Three identical H200 nodes, with per-node overrides."""
    return {host: {**H200, **overrides.get(host, {})} for host in ("node1", "node2", "node3")}


def test_identical_nodes_pass_with_an_empty_message():
    result = compare(nodes())
    assert result == {"ok": True, "differing": {}, "reference": {}, "odd_hosts": {}, "message": ""}


def test_one_driver_off_names_that_node_its_value_and_the_majority():
    result = compare(nodes(node2={"driver_version": "575.57.08"}), subject="the 3 nodes of vllm_nodes")
    assert not result["ok"]
    assert result["differing"] == {"driver_version": {"node1": "580.159.04", "node2": "575.57.08",
                                                      "node3": "580.159.04"}}
    assert result["reference"] == {"driver_version": "580.159.04"}
    assert result["odd_hosts"] == {"driver_version": ["node2"]}
    assert result["message"] == (
        "1 check failed across the 3 nodes of vllm_nodes (nodes at fault: node2):\n"
        "- driver_version differs: node2 has 575.57.08, while node1, node3 have 580.159.04"
    )


def test_majority_not_first_host_is_the_reference():
    result = compare(nodes(node1={"count": 1}))
    assert result["reference"] == {"count": 2}
    assert result["odd_hosts"] == {"count": ["node1"]}
    assert "node1 has 1, while node2, node3 have 2" in result["message"]


def test_a_tie_takes_the_earliest_host_as_reference():
    result = compare({"a": {"count": 2}, "b": {"count": 1}})
    assert result["reference"] == {"count": 2} and result["odd_hosts"] == {"count": ["b"]}
    assert "count differs: b has 1, while a has 2" in result["message"]


def test_three_values_name_every_group():
    result = compare(nodes(node2={"count": 1}, node3={"count": 4}))
    assert result["odd_hosts"] == {"count": ["node2", "node3"]}
    assert "count differs: node2 has 1; node3 has 4, while node1 has 2" in result["message"]


def test_several_keys_give_one_message_with_one_line_each_and_labels_and_hints():
    result = compare(
        nodes(node2={"driver_version": "575.57.08"}, node3={"count": 1}),
        labels={"driver_version": "driver version", "count": "GPU count"},
        hints={"driver_version": "install one driver on every node"},
    )
    lines = result["message"].splitlines()
    assert lines[0] == "2 checks failed across the nodes (nodes at fault: node2, node3):"
    assert lines[1] == ("- driver version differs: node2 has 575.57.08, while node1, node3 have 580.159.04 "
                        "(install one driver on every node)")
    assert lines[2] == "- GPU count differs: node3 has 1, while node1, node2 have 2"


def test_expected_values_name_the_nodes_that_miss_them():
    values = {"node1": {"persistence_mode": True, "foreign_processes": []},
              "node2": {"persistence_mode": False, "foreign_processes": ["pid 66 sleep (root) on GPU0"]},
              "node3": {"persistence_mode": False, "foreign_processes": []}}
    result = compare(values, expected={"persistence_mode": True, "foreign_processes": []})
    assert result["odd_hosts"] == {"persistence_mode": ["node2", "node3"], "foreign_processes": ["node2"]}
    assert "- persistence_mode: expected True; node2, node3 have False" in result["message"]
    assert "- foreign_processes: expected none; node2 has pid 66 sleep (root) on GPU0" in result["message"]


def test_expected_applies_even_when_every_node_agrees():
    values = {"node1": {"mig_mode": True}, "node2": {"mig_mode": True}}
    result = compare(values, expected={"mig_mode": False})
    assert result["odd_hosts"] == {"mig_mode": ["node1", "node2"]}
    assert "mig_mode: expected False; node1, node2 have True" in result["message"]


def test_a_missing_key_is_a_difference_and_reads_as_not_reported():
    values = {"node1": {"vllm": "0.32.0"}, "node2": {"vllm": "0.32.0"}, "node3": {}}
    result = compare(values)
    assert result["differing"] == {"vllm": {"node1": "0.32.0", "node2": "0.32.0", "node3": None}}
    assert f"node3 has {MISSING}, while node1, node2 have 0.32.0" in result["message"]


def test_none_and_missing_differ():
    result = compare({"a": {"nccl": None}, "b": {}})
    assert result["odd_hosts"] == {"nccl": ["b"]}
    assert f"b has {MISSING}, while a has none" in result["message"]


def test_bool_is_not_the_integer_one():
    result = compare({"a": {"flag": True}, "b": {"flag": 1}})
    assert not result["ok"]


def test_int_and_float_of_the_same_size_agree():
    assert compare({"a": {"mtu": 9000}, "b": {"mtu": 9000.0}})["ok"]


def test_lists_and_dicts_group_by_content():
    values = {"a": {"ports": [1, 2], "env": {"x": "1"}}, "b": {"ports": [1, 2], "env": {"x": "1"}},
              "c": {"ports": [2, 1], "env": {"x": "2"}}}
    result = compare(values)
    assert result["odd_hosts"] == {"ports": ["c"], "env": ["c"]}
    assert "c has 2, 1, while a, b have 1, 2" in result["message"]
    assert 'c has {"x": "2"}' in result["message"]


def test_keys_select_and_order_the_report():
    result = compare(nodes(node2={"driver_version": "1.0", "count": 8}), keys=["count"])
    assert list(result["differing"]) == ["count"]


def test_format_value():
    assert format_value([]) == "none"
    assert format_value(None) == "none"
    assert format_value(["a", "b"]) == "a, b"
    assert format_value(143771) == "143771"


@pytest.mark.parametrize("bad", [{}, [], {"node1": ["driver"]}, None])
def test_bad_input_is_refused_with_what_was_given(bad):
    with pytest.raises(ParityError, match="must be"):
        compare(bad)


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.sampled_from(["a", "b", "c"]), min_size=1, max_size=8))
def test_property_every_odd_host_is_named_and_the_reference_is_a_majority(per_host):
    values = {host: {"key": value} for host, value in per_host.items()}
    result = compare(values)
    distinct = set(per_host.values())
    assert result["ok"] == (len(distinct) == 1)
    if not result["ok"]:
        reference = result["reference"]["key"]
        counts = {value: list(per_host.values()).count(value) for value in distinct}
        assert counts[reference] == max(counts.values())
        assert set(result["odd_hosts"]["key"]) == {h for h, v in per_host.items() if v != reference}
        for host in result["odd_hosts"]["key"]:
            assert f"{host} " in result["message"] or f"{host}," in result["message"]


def test_an_expected_key_applies_only_to_the_hosts_that_report_it():
    values = {"node1": {"fabric_state": "Completed"}, "node2": {}, "node3": {"fabric_state": "In Progress"}}
    result = compare(values, expected={"fabric_state": "Completed"})
    assert result["odd_hosts"] == {"fabric_state": ["node3"]}
    assert result["differing"]["fabric_state"] == {"node1": "Completed", "node2": None, "node3": "In Progress"}
    assert "fabric_state: expected Completed; node3 has In Progress" in result["message"]


def test_the_parity_check_module_fails_with_the_message_and_passes_when_equal(tmp_path):
    """vllm_ops.cluster.parity_check through ansible-playbook on localhost."""
    values = {"node1": {"driver_version": "580.159.04", "persistence_mode": True},
              "node2": {"driver_version": "575.57.08", "persistence_mode": False},
              "node3": {"driver_version": "580.159.04", "persistence_mode": True}}
    tasks = [
        {"name": "differs", "vllm_ops.cluster.parity_check": {
            "values": values, "expected": {"persistence_mode": True}, "subject": "the 3 nodes of vllm_nodes",
            "labels": {"driver_version": "driver version"}}, "ignore_errors": True},
        {"name": "equal", "vllm_ops.cluster.parity_check": {"values": {"a": {"x": 1}, "b": {"x": 1}}}},
    ]
    playbook = tmp_path / "parity.yml"
    playbook.write_text(json.dumps([{"name": "Parity", "hosts": "localhost", "gather_facts": False, "tasks": tasks}]),
                        encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_HOME=str(tmp_path / "home"), ANSIBLE_NOCOLOR="1")
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    completed = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={python}", str(playbook)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    results = {t["task"]["name"]: t["hosts"]["localhost"] for t in json.loads(completed.stdout)["plays"][0]["tasks"]}
    differs, equal = results["differs"], results["equal"]
    assert differs["failed"]
    assert differs["msg"] == (
        "2 checks failed across the 3 nodes of vllm_nodes (nodes at fault: node2):\n"
        "- driver version differs: node2 has 575.57.08, while node1, node3 have 580.159.04\n"
        "- persistence_mode: expected True; node2 has False")
    assert differs["odd_hosts"] == {"driver_version": ["node2"], "persistence_mode": ["node2"]}
    assert not equal.get("failed") and equal["message"] == "" and equal["differing"] == {}
