"""vllm_argv_check: vLLM's parser results turned into one message; when the check runs; the module in Ansible.

The parser itself (vLLM's, in the runtime venv) runs in tests/runtime/test_vllm_argparse.py; here a
double of the runtime's python answers with recorded results of that parser, so the module's
decisions (skip on an unchanged plan.json, fail with host, flag, value and vLLM's message, check
mode, read-only) are checked without vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.argv_check import (
    deployed_argv,
    flag_name,
    flag_value,
    inexact_flags,
    runtime_newer_than,
    skip_reason,
    verdict,
)

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
MODULE_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable

ARGV = ["vllm", "serve", "/srv/models/tiny-llama", "--port", "8000", "--tensor-parallel-size", "2",
        "--served-model-name", "lab", "--max-num-seqs", "lots", "--nnodes", "2", "--node-rank", "1", "--headless"]
OPTIONS = ["--port", "--tensor-parallel-size", "-tp", "--served-model-name", "--max-num-seqs",
           "--max-num-batched-tokens", "--nnodes", "--node-rank", "--headless", "--enable-prefix-caching",
           "--no-enable-prefix-caching", "--chat-template", "--enable-auto-tool-choice", "--tool-call-parser",
           "--compilation-config"]
# What vLLM 0.32's parser wrote (tests/runtime/test_vllm_argparse.py runs the real one).
USAGE = "usage: vllm serve [model_tag] [options]\n"
LOTS = USAGE + "vllm serve: error: argument --max-num-seqs: invalid int value: 'lots'\n"
UNKNOWN = "usage: vllm [-h] {serve} ...\nvllm: error: unrecognized arguments: --invented-flag 1\n"


def with_flags(*extra):
    return ARGV[:9] + list(extra) + ARGV[11:]


def test_a_bad_value_names_the_host_the_flag_the_value_and_vllms_message():
    result = {"ok": False, "stage": "parse", "error": LOTS}
    assert verdict("node2", ARGV, result) == (
        "host node2: vllm serve rejects --max-num-seqs lots: argument --max-num-seqs: invalid int value: 'lots'")


def test_an_unknown_flag_names_the_flag_and_its_value():
    argv = with_flags("--invented-flag", "1")
    assert verdict("node3", argv, {"ok": False, "stage": "parse", "error": UNKNOWN}) == (
        "host node3: vllm serve rejects --invented-flag 1: unrecognized arguments: --invented-flag 1")


def test_a_stray_value_after_a_store_true_flag_names_that_flag():
    argv = with_flags("--enable-auto-tool-choice", "true")
    error = "usage: vllm [-h] {serve} ...\nvllm: error: unrecognized arguments: true\n"
    assert verdict("node1", argv, {"ok": False, "stage": "parse", "error": error}) == (
        "host node1: vllm serve rejects --enable-auto-tool-choice true: unrecognized arguments: true")


def test_an_argument_error_with_an_alias_names_the_flag_argv_uses():
    argv = with_flags("--api-server-count", "x")
    error = USAGE + "vllm serve: error: argument -asc/--api-server-count: invalid int value: 'x'\n"
    assert verdict("node1", argv, {"ok": False, "stage": "parse", "error": error}).startswith(
        "host node1: vllm serve rejects --api-server-count x: argument -asc/--api-server-count: invalid int")


def test_a_validation_error_names_the_flag_in_vllms_message():
    argv = with_flags("--enable-auto-tool-choice")
    result = {"ok": False, "stage": "validate", "error_type": "TypeError",
              "error": "Error: --enable-auto-tool-choice requires --tool-call-parser"}
    assert verdict("node1", argv, result) == (
        "host node1: vllm serve rejects --enable-auto-tool-choice: Error: --enable-auto-tool-choice requires "
        "--tool-call-parser")
    argv = with_flags("--chat-template", "/etc/t.jinja")
    result = {"ok": False, "stage": "validate", "error_type": "VLLMValidationError",
              "error": "The supplied chat template string (/etc/t.jinja) appears path-like, but doesn't exist! "
                       "Tried: /etc/t.jinja and /etc/t.jinja (parameter=chat_template)"}
    assert verdict("node1", argv, result).startswith(
        "host node1: vllm serve rejects --chat-template /etc/t.jinja: VLLMValidationError: The supplied chat")


def test_a_message_naming_no_flag_of_argv_shows_the_argv():
    result = {"ok": False, "stage": "validate", "error_type": "ValueError", "error": "something else"}
    assert verdict("n", ARGV[:4], result) == (
        "host n: vllm serve rejects its argv /srv/models/tiny-llama --port: ValueError: something else")


def test_a_runtime_whose_parser_cannot_be_built_says_so():
    result = {"ok": False, "stage": "import", "error": "ModuleNotFoundError: No module named 'vllm'"}
    assert verdict("n", ARGV, result) == (
        "host n: cannot build vLLM's serve parser in the node's runtime (vllm not importable): "
        "ModuleNotFoundError: No module named 'vllm'")


def test_an_accepted_argv_passes_and_an_abbreviation_does_not():
    good = with_flags("--max-num-seqs", "128", "--compilation-config.mode", "3", "--enable_prefix_caching")
    assert verdict("n", good, {"ok": True, "options": OPTIONS}) is None
    short = with_flags("--max-num-seq", "128")
    assert verdict("n", short, {"ok": True, "options": OPTIONS}) == (
        "host n: vllm serve rejects --max-num-seq 128: vLLM takes --max-num-seq only as an abbreviation of "
        "--max-num-seqs (argparse's prefix match); spell the flag as vLLM defines it: --max-num-seqs")
    assert inexact_flags(with_flags("--max-num-batched", "8"), OPTIONS) == [
        ("--max-num-batched", "--max-num-batched-tokens")]


def test_flag_names_and_values_follow_vllms_spelling_rules():
    assert flag_name("--max_num_seqs=4") == "--max-num-seqs"
    assert flag_name("--compilation-config.mode") == "--compilation-config"
    argv = ["vllm", "serve", "m", "--max_num_seqs=4", "--headless", "--port", "80"]
    assert flag_value(argv, "--max-num-seqs") == "4"
    assert flag_value(argv, "--headless") == ""
    assert flag_value(argv, "--port") == "80"
    assert flag_value(argv, "--host") is None


def test_the_check_is_skipped_only_for_the_argv_the_node_already_holds():
    plan = json.dumps({"nodes": [{"host": "node1", "argv": ARGV}, {"host": "node2", "argv": ARGV[:3]}]})
    assert deployed_argv(plan, "node1") == ARGV
    assert deployed_argv(plan, "node3") is None
    assert deployed_argv("{not json", "node1") is None
    assert deployed_argv("[]", "node1") is None
    assert skip_reason(ARGV, ARGV, runtime_newer=False)
    assert skip_reason(ARGV, ARGV, runtime_newer=True) is None
    assert skip_reason(ARGV, ARGV[:3], runtime_newer=False) is None
    assert skip_reason(ARGV, None, runtime_newer=False) is None


def test_a_runtime_installed_after_the_plan_counts_as_changed(tmp_path):
    marker, plan = tmp_path / "vllm", tmp_path / "plan.json"
    marker.write_text("")
    plan.write_text("{}")
    now = time.time()
    os.utime(marker, (now - 60, now - 60))
    assert runtime_newer_than(str(marker), str(plan)) is False
    os.utime(marker, (now + 60, now + 60))
    assert runtime_newer_than(str(marker), str(plan)) is True
    assert runtime_newer_than(str(marker), str(tmp_path / "absent")) is True


# The module in Ansible, with a double of the runtime's python.

DOUBLE = """#!/bin/sh
here=$(dirname "$0")
cat > "$here/stdin.json"
printf '%s\\n' "$HOME" > "$here/home.txt"
echo "vLLM and torch print here; the module reads stdout only" >&2
cat "$here/result.json"
"""


def fake_venv(root: Path, name: str, result, vllm_age_s: float = -3600) -> Path:
    venv = root / name
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(DOUBLE)
    python.chmod(0o755)
    (venv / "bin" / "result.json").write_text(result if isinstance(result, str) else json.dumps(result))
    vllm = venv / "bin" / "vllm"
    vllm.write_text("")
    os.utime(vllm, (time.time() + vllm_age_s, time.time() + vllm_age_s))
    return venv


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("argv-check")
    good = with_flags("--max-num-seqs", "128")
    plan = root / "plan.json"
    plan.write_text(json.dumps({"nodes": [{"host": "node1", "argv": good}]}))
    accepted = {"ok": True, "stage": "done", "options": OPTIONS, "seconds": 7.5, "import_s": 7.4,
                "vllm_version": "0.32.0"}
    scenarios = {
        "accepted": ({"argv": good}, fake_venv(root, "accepted", accepted), False),
        "accepted-check": ({"argv": good}, fake_venv(root, "accepted-check", accepted), True),
        "lots": ({"argv": ARGV}, fake_venv(root, "lots", {"ok": False, "stage": "parse", "error": LOTS}), False),
        "unchanged": ({"argv": good, "deployed_plan": str(plan)}, fake_venv(root, "unchanged", accepted), True),
        "unchanged-eager": ({"argv": [*good, "--enforce-eager"], "plan_argv": good, "deployed_plan": str(plan)},
                            fake_venv(root, "unchanged-eager", accepted), False),
        "forced": ({"argv": good, "deployed_plan": str(plan), "force": True},
                   fake_venv(root, "forced", accepted), False),
        "reinstalled": ({"argv": good, "deployed_plan": str(plan)},
                        fake_venv(root, "reinstalled", accepted, vllm_age_s=3600), False),
        "changed": ({"argv": ARGV, "deployed_plan": str(plan)},
                    fake_venv(root, "changed", {"ok": False, "stage": "parse", "error": LOTS}), False),
        "no-result": ({"argv": good}, fake_venv(root, "no-result", "Traceback: boom"), False),
        "not-serve": ({"argv": ["ray", "start"]}, fake_venv(root, "not-serve", accepted), False),
    }
    missing = root / "missing"
    tasks = [{"name": name, "vllm_ops.cluster.vllm_argv_check": {"host": "node1", "venv": str(venv), **args},
              "check_mode": check, "ignore_errors": True}
             for name, (args, venv, check) in scenarios.items()]
    tasks.append({"name": "missing", "vllm_ops.cluster.vllm_argv_check": {
        "host": "node1", "venv": str(missing), "argv": good}, "ignore_errors": True})
    playbook = root / "play.yml"
    playbook.write_text(json.dumps([{"name": "argv check", "hosts": "localhost", "gather_facts": False,
                                     "tasks": tasks}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_LOCAL_TEMP=str(root / "ansible-local"), ANSIBLE_HOME=str(root / "ansible-home"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_CACHE_PLUGIN="memory")
    completed = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local",
                                "-e", f"ansible_python_interpreter={MODULE_PYTHON}", str(playbook)],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    try:
        report = json.loads(completed.stdout)
    except json.JSONDecodeError as error:
        raise AssertionError(f"no JSON from ansible-playbook (rc {completed.returncode}): {completed.stderr}") from error
    results = {task["task"]["name"]: task["hosts"]["localhost"] for task in report["plays"][0]["tasks"]}
    return {name: (results[name], scenarios[name][1] if name in scenarios else missing) for name in results}


def test_an_accepted_argv_is_parsed_in_the_runtime_and_changes_nothing(runs):
    for name in ("accepted", "accepted-check"):
        result, venv = runs[name]
        assert not result.get("failed"), result.get("msg")
        assert result["changed"] is False and result["checked"] is True
        assert result["vllm_version"] == "0.32.0" and result["import_s"] == 7.4 and result["seconds"] > 0
        assert json.loads((venv / "bin" / "stdin.json").read_text()) == {"argv": with_flags("--max-num-seqs", "128")}
        # The parser's HOME was a temporary directory, removed afterwards.
        home = Path((venv / "bin" / "home.txt").read_text().strip())
        assert home.name.startswith("vllm-argv-check-") and not home.exists()


def test_a_rejected_argv_fails_with_one_message(runs):
    for name in ("lots", "changed"):
        result, _venv = runs[name]
        assert result["failed"] is True and result["checked"] is True
        assert result["msg"] == (
            "host node1: vllm serve rejects --max-num-seqs lots: argument --max-num-seqs: invalid int value: 'lots'")


def test_the_argv_the_node_already_runs_is_not_parsed_again(runs):
    for name in ("unchanged", "unchanged-eager"):
        result, venv = runs[name]
        assert not result.get("failed"), result.get("msg")
        assert result["checked"] is False and result["changed"] is False and result["seconds"] == 0
        assert "plan.json holds this argv" in result["reason"]
        assert not (venv / "bin" / "stdin.json").exists()
    for name in ("forced", "reinstalled"):
        result, venv = runs[name]
        assert result["checked"] is True and (venv / "bin" / "stdin.json").exists(), name


def test_a_runtime_that_answers_nothing_or_is_missing_fails_naming_it(runs):
    result, venv = runs["no-result"]
    assert result["msg"] == (f"host node1: vLLM's argument parser ({venv}/bin/python) exited 0 without a result: "
                             "vLLM and torch print here; the module reads stdout only")
    result, venv = runs["missing"]
    assert result["msg"] == (f"host node1: {venv}/bin/python is missing or not executable; "
                             "expected the vLLM runtime venv")
    result, _venv = runs["not-serve"]
    assert result["msg"] == "host node1: the argv to check must start with 'vllm serve', got ['ray', 'start']"


def test_the_preflight_skips_the_module_when_plan_json_is_this_plan(tmp_path):
    """vllm_service's plan text (vars/main.yml), written as configure.yml writes it, hashes as host_state reads it."""
    plan = {"deployment": "lab", "nodes": [{"host": "node1", "argv": ARGV, "env": {"A": "1"}}], "note": "a 'b' \"c\"",
            "x": 1.5}
    dest = tmp_path / "plan.json"
    play = [{"name": "plan text", "hosts": "localhost", "gather_facts": False,
             "vars": {"vllm_service_plan": plan, "vllm_service_config_dir": str(tmp_path)},
             "tasks": [
                 {"name": "vars", "ansible.builtin.include_vars": str(REPO / "roles/vllm_service/vars/main.yml")},
                 {"name": "write", "vllm_ops.cluster.managed_files": {"files": [
                     {"dest": "{{ __vllm_service_plan_path }}", "content": "{{ __vllm_service_plan_text }}",
                      "mode": "0644"}]}},
                 {"name": "read", "vllm_ops.cluster.host_state": {"checksums": ["{{ __vllm_service_plan_path }}"]},
                  "register": "__vllm_service_host"},
                 {"name": "compare", "ansible.builtin.assert": {"that": [
                     "__vllm_service_host['paths'][__vllm_service_plan_path]['sha256']"
                     " == (__vllm_service_plan_text | hash('sha256'))"]}},
             ]}]
    (tmp_path / "play.json").write_text(json.dumps(play))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "local"),
               ANSIBLE_HOME=str(tmp_path / "home"), ANSIBLE_NOCOLOR="1", ANSIBLE_CACHE_PLUGIN="memory")
    completed = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local",
                                "-e", f"ansible_python_interpreter={MODULE_PYTHON}", str(tmp_path / "play.json")],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-2000:]
    assert json.loads(dest.read_text()) == plan and dest.read_text().endswith("}\n")
