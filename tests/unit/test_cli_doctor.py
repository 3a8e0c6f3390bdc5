"""bin/vllm-cluster doctor --log: the doctor's diagnosis on a log from anywhere, as text or JSON; exit 2 on bad input.

Real logs: a public excerpt (tests/fixtures/doctor/public) and the lab's vLLM 0.32 start (tests/fixtures/vllm/lab).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "bin" / "vllm-cluster"
PUBLIC = REPO / "tests" / "fixtures" / "doctor" / "public"
LAB_LOG = REPO / "tests" / "fixtures" / "vllm" / "lab" / "independent-dp3-node1.log"


def doctor(*args, stdin=None):
    return subprocess.run([sys.executable, str(CLI), "doctor", *args], capture_output=True, text=True, timeout=120,
                          check=False, input=stdin)


def test_the_report_names_the_cause_first_with_its_fix():
    result = doctor("--log", str(PUBLIC / "vlmr1-289-tcpstore-port-in-use.log"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("vllm-cluster doctor: deployment the log vlmr1-289-tcpstore-port-in-use.log, "
                               "nodes the node;")
    first = next(line for line in lines if line.startswith("1. "))
    assert first.startswith("1. [FAULT] ") and "(port_in_use; startup; the node)" in first
    assert any(line.strip().startswith("fix: ") for line in lines)
    assert any(line.strip().startswith("check it worked: ") for line in lines)


def test_json_lists_the_ranked_findings_first_finding_first():
    result = doctor("--log", str(PUBLIC / "gpustack5509-placement-group-pending.log"), "--backend", "ray", "--json")
    assert result.returncode == 0, result.stderr
    findings = json.loads(result.stdout)
    assert [finding["id"] for finding in findings][:2] == ["placement_group_unsatisfiable", "startup_stalled"]
    for finding in findings:
        assert {"id", "title", "cause", "evidence", "fix"} <= set(finding)
        assert finding["evidence"] and all(isinstance(line, str) for line in finding["evidence"])


def test_stdin_and_a_log_that_stops_mid_start():
    lines = LAB_LOG.read_text(encoding="utf-8").splitlines()
    cut = next(index for index, line in enumerate(lines) if "world_size=1 rank=0" in line)
    result = doctor("--log", "-", "--json", stdin="\n".join(lines[: cut + 1]) + "\n")
    assert result.returncode == 0, result.stderr
    findings = json.loads(result.stdout)
    assert [finding["id"] for finding in findings] == ["startup_stalled"]
    assert findings[0]["cause"].startswith("The log stops in phase distributed_init")
    assert "NCCL_DEBUG=INFO" in findings[0]["fix"]


def test_a_healthy_start_is_diagnosed_without_a_finding():
    result = doctor("--log", str(LAB_LOG))
    assert result.returncode == 0, result.stderr
    assert "No finding: no signature of the catalog matched the log" in result.stdout
    assert "Start-up phases (the API server came up;" in result.stdout
    assert json.loads(doctor("--log", str(LAB_LOG), "--json").stdout) == []


def test_a_ray_worker_s_log_in_its_ray_unit():
    result = doctor("--log", str(PUBLIC / "logicrl30-ray-python-version-mismatch.log"), "--backend", "ray",
                    "--unit", "ray-worker.service", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["id"] == "ray_version_mismatch"


@pytest.mark.parametrize(("args", "stdin", "words"), [
    (["--log", "/nonexistent/vllm.log"], None, "No such file or directory"),
    (["--log", str(REPO / "tests")], None, "a directory, not a log file"),
    (["--log", "-"], "", "the log is empty"),
    (["--log", "-", "--backend", "tpu"], "x", "invalid choice: 'tpu'"),
    (["--backend", "mp"], None, "the following arguments are required: --log"),
])
def test_bad_input_is_one_line_and_exit_2(args, stdin, words):
    result = doctor(*args, stdin=stdin)
    assert result.returncode == 2
    assert words in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    # one error line, the last; argparse prints its usage before it
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0]
    assert errors[0].startswith("vllm-cluster doctor: error: ")
    if args[0] == "--log" and "--backend" not in args:
        assert len(result.stderr.strip().splitlines()) == 1


def test_help_shows_the_doctor_command():
    result = subprocess.run([sys.executable, str(CLI), "--help"], capture_output=True, text=True, timeout=60,
                            check=False)
    assert "doctor" in result.stdout
    result = doctor("--help")
    assert "--log FILE" in result.stdout and "- reads stdin" in result.stdout


def test_a_reader_that_goes_away_is_no_error():
    """`vllm-cluster doctor --log FILE | head -1`: the reader closes the pipe; before, the command printed
    "error: [Errno 32] Broken pipe". Here the pipe's read end is closed before anything is written."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, str(CLI), "doctor", "--log", str(PUBLIC / "vlmr1-289-tcpstore-port-in-use.log")],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Broken pipe" not in proc.stderr and "error" not in proc.stderr, proc.stderr
