"""plugins/module_utils/deploy/results.py: the controller's results directory, never the collection's."""

import os

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.results import results_dir


@pytest.mark.parametrize(("configured", "expected"), [
    (None, "/work/ops/results"),
    ("", "/work/ops/results"),
    ("  ", "/work/ops/results"),
    ("out", "/work/ops/out"),
    ("out/../plans/", "/work/ops/plans"),
    ("/srv/vllm-results", "/srv/vllm-results"),
])
def test_the_default_and_a_relative_directory_are_under_the_working_directory(configured, expected):
    assert results_dir(configured, "/work/ops") == expected


def test_a_home_directory_is_expanded(monkeypatch):
    monkeypatch.setenv("HOME", "/home/op")
    assert results_dir("~/vllm", "/work/ops") == "/home/op/vllm"


def test_the_lookup_answers_with_the_process_working_directory(tmp_path, monkeypatch):
    from ansible.errors import AnsibleLookupError
    from ansible_collections.vllm_ops.cluster.plugins.lookup.results_dir import LookupModule

    monkeypatch.chdir(tmp_path)
    assert LookupModule().run([]) == [os.path.join(str(tmp_path), "results")]
    assert LookupModule().run([""]) == [os.path.join(str(tmp_path), "results")]
    assert LookupModule().run(["r"]) == [os.path.join(str(tmp_path), "r")]
    with pytest.raises(AnsibleLookupError, match="at most one directory, got 2"):
        LookupModule().run(["a", "b"])
