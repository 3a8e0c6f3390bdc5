"""facts/tools.py: find a tool, run it under timeout, fail with host, command and exit status.

The module object is a stand-in for AnsibleModule with the three methods tools.py
calls: get_bin_path is Ansible's own lookup, run_command runs the command for real,
fail_json records what it was given and stops like the real one. The commands are
real processes (sh, sleep, timeout); the parse errors come from the real nvidia-smi
and ibstat parsers on real captures.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from ansible.module_utils.common.process import get_bin_path
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts import tools
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.ibstat import IbParseError, parse_ibstat
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi import NvidiaSmiParseError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi_query import parse_query_xml

HOST = socket.gethostname()
GPU = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
IB = Path(__file__).resolve().parents[1] / "fixtures" / "ib" / "public"


class Failed(Exception):
    """fail_json was called (the real one exits the module)."""


class Module:
    """What tools.py uses of AnsibleModule; ``hidden`` names tools get_bin_path does not find."""

    def __init__(self, hidden=()):
        self.hidden = set(hidden)
        self.lookups: list[tuple] = []
        self.commands: list[dict] = []
        self.failure: dict | None = None

    def get_bin_path(self, arg, required=False, opt_dirs=None):
        self.lookups.append((arg, opt_dirs))
        if arg in self.hidden:
            return None
        try:
            return get_bin_path(arg, opt_dirs=opt_dirs)
        except ValueError:
            return None

    def run_command(self, args, check_rc=False, environ_update=None):
        self.commands.append({"args": list(args), "check_rc": check_rc, "environ_update": environ_update})
        env = dict(os.environ, **(environ_update or {}))
        proc = subprocess.run(args, capture_output=True, text=True, env=env, check=False, timeout=60)
        return proc.returncode, proc.stdout, proc.stderr

    def fail_json(self, **kwargs):
        self.failure = kwargs
        raise Failed(kwargs["msg"])


def executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path


# ------------------------------------------------------------------ resolve_binary


def test_a_path_is_used_as_given_when_it_is_an_executable_file(tmp_path):
    tool = executable(tmp_path / "bin" / "nvidia-smi")
    module = Module()
    assert tools.resolve_binary(module, str(tool)) == str(tool)
    assert module.lookups == []  # a path is not looked up


def test_a_path_that_is_not_an_executable_file_is_none(tmp_path):
    plain = tmp_path / "ibstat"
    plain.write_text("#!/bin/sh\n", encoding="utf-8")
    plain.chmod(0o644)
    module = Module()
    assert tools.resolve_binary(module, str(plain)) is None
    assert tools.resolve_binary(module, str(tmp_path)) is None  # a directory
    assert tools.resolve_binary(module, str(tmp_path / "absent" / "ibstat")) is None


def test_a_name_is_looked_up_in_path_and_the_extra_dirs(tmp_path):
    extra = executable(tmp_path / "nvidia" / "bin" / "vllm-test-tool-nowhere-else")
    module = Module()
    assert tools.resolve_binary(module, extra.name) is None
    assert tools.resolve_binary(module, extra.name, opt_dirs=[str(extra.parent)]) == str(extra)
    assert module.lookups == [(extra.name, None), (extra.name, [str(extra.parent)])]
    assert tools.resolve_binary(module, "sh") == get_bin_path("sh")


# ------------------------------------------------------------------ first_line


def test_first_line_takes_the_first_text_with_a_non_blank_line():
    assert tools.first_line("\n  \n  No devices were found  \nmore", "stdout") == "No devices were found"
    assert tools.first_line("", None, "\nfrom stdout\n") == "from stdout"
    assert tools.first_line("", None, " \n") == "(no output)"
    assert tools.first_line() == "(no output)"


# ------------------------------------------------------------------ run_tool


def test_run_tool_returns_stdout_and_runs_under_timeout_with_lc_all_c():
    module = Module()
    out = tools.run_tool(module, ["sh", "-c", 'echo "LC_ALL=$LC_ALL"'], 60)
    assert out == "LC_ALL=C\n"
    assert module.commands == [{
        "args": [get_bin_path("timeout"), "--kill-after=5", "60", "sh", "-c", 'echo "LC_ALL=$LC_ALL"'],
        "check_rc": False,
        "environ_update": {"LC_ALL": "C"},
    }]
    assert module.failure is None


def test_run_tool_without_timeout_runs_the_command_alone():
    module = Module(hidden={"timeout"})
    assert tools.run_tool(module, ["sh", "-c", "echo ok"], 60) == "ok\n"
    assert module.commands[0]["args"] == ["sh", "-c", "echo ok"]


def test_a_failing_command_names_the_host_the_command_its_exit_code_and_its_first_error_line():
    module = Module()
    argv = ["sh", "-c", "echo partial; echo; echo 'No devices were found' >&2; echo second >&2; exit 6"]
    with pytest.raises(Failed):
        tools.run_tool(module, argv, 60)
    assert module.failure == {
        "msg": f"host {HOST}: '{' '.join(argv)}' exited with 6: No devices were found",
        "rc": 6,
        "cmd": argv,  # the command asked for, without the timeout prefix
        "stdout": "partial\n\n",
        "stderr": "No devices were found\nsecond\n",
    }


def test_a_failing_command_without_stderr_quotes_stdout_or_says_no_output():
    module = Module()
    with pytest.raises(Failed):
        tools.run_tool(module, ["sh", "-c", "echo 'Option -q is not recognized.'; exit 2"], 60)
    assert module.failure["msg"].endswith("' exited with 2: Option -q is not recognized.")
    with pytest.raises(Failed):
        tools.run_tool(module, ["sh", "-c", "exit 3"], 60)
    assert module.failure["msg"] == f"host {HOST}: 'sh -c exit 3' exited with 3: (no output)"


def test_a_command_that_runs_past_the_timeout_says_so():
    module = Module()
    with pytest.raises(Failed):
        tools.run_tool(module, ["sleep", "30"], 1)
    assert module.failure["rc"] == 124
    assert module.failure["msg"] == f"host {HOST}: 'sleep 30' did not finish within 1s: (no output)"


def test_exit_124_or_137_reads_as_a_timeout_only_under_timeout():
    # timeout exits 124 (or 137 after --kill-after): a command's own 124/137 reads the same.
    module = Module()
    with pytest.raises(Failed):
        tools.run_tool(module, ["sh", "-c", "exit 137"], 60)
    assert module.failure["msg"] == f"host {HOST}: 'sh -c exit 137' did not finish within 60s: (no output)"
    alone = Module(hidden={"timeout"})
    with pytest.raises(Failed):
        tools.run_tool(alone, ["sh", "-c", "exit 124"], 60)
    assert alone.failure["msg"] == f"host {HOST}: 'sh -c exit 124' exited with 124: (no output)"


# ------------------------------------------------------------------ parse_or_fail


def test_parse_or_fail_returns_what_the_parser_returns():
    module = Module()
    text = (GPU / "h200x2" / "nvidia-smi-q.xml").read_text(encoding="utf-8")
    parsed = tools.parse_or_fail(module, parse_query_xml, ["nvidia-smi", "-q", "-x"], text, errors=NvidiaSmiParseError)
    assert [gpu["name"] for gpu in parsed["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]
    assert module.failure is None


def test_parse_or_fail_names_the_host_and_the_command_with_the_parser_message():
    module = Module()
    text = (GPU / "h200x2" / "topo.txt").read_text(encoding="utf-8")
    argv = ["/usr/bin/nvidia-smi", "-q", "-x"]
    with pytest.raises(Failed):
        tools.parse_or_fail(module, parse_query_xml, argv, text, errors=NvidiaSmiParseError)
    with pytest.raises(NvidiaSmiParseError) as raised:
        parse_query_xml(text)
    assert module.failure == {
        "msg": f"host {HOST}: cannot parse the output of '/usr/bin/nvidia-smi -q -x' (exit code 0): {raised.value}",
        "cmd": argv,
        "stdout": text,
    }


def test_parse_or_fail_catches_only_the_errors_it_is_given():
    text = (IB / "gpud-ibstatus-a100-all-active.txt").read_text(encoding="utf-8")
    module = Module()
    with pytest.raises(Failed):
        tools.parse_or_fail(module, parse_ibstat, ["ibstat"], text, errors=IbParseError)
    assert module.failure["msg"].startswith(f"host {HOST}: cannot parse the output of 'ibstat' (exit code 0): ")
    # Another parser's error class, or a bug in the parser, is not a parse failure: it propagates.
    other = Module()
    with pytest.raises(IbParseError):
        tools.parse_or_fail(other, parse_ibstat, ["ibstat"], text, errors=NvidiaSmiParseError)
    with pytest.raises(KeyError):
        tools.parse_or_fail(other, lambda out: {}["gpus"], ["nvidia-smi"], "", errors=(NvidiaSmiParseError, IbParseError))
    assert other.failure is None
