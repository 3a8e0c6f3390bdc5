"""deploy.yml end to end on the lab: bare nodes to a verified vLLM, then the variants and the faults.

One 3-node lab for the module (the runtime is installed once, by the first
deploy); the layouts run one after the other, re-planned with -e overrides:

1. the lab's own deployment (inventories/lab/group_vars): 2-node mp, TP=2, one
   CPU worker per node. A second run reports changed=0, --check --diff too.
2. one node's unit stopped: verification fails with the table.
3. single node TP=2 (2 worker slots); then a unit restarted with TP=1 behind
   Ansible's back: verification fails with the table.
4. 2-node mp PP=2 (no --enforce-eager); an eager-first rollout is refused.
5. dense DP=2 across 2 nodes (a headless DP engine on node 2).

The lab is left serving, for the modules after it (the next deploy.yml puts a variant back to the lab's own
layout); playbooks/teardown.yml is tests/lab/test_teardown.py's, later in the run.

vLLM runs for real on its CPU platform in the nodes; the only thing checked
here that vllm_verify does not check itself is what the operator sees.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import urllib.request
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.render.vllm_unit import (
    env_file_line,
    exec_start,
)

# CI runs section 1 (deploy, verify, changed=0, --check --diff, the unit's quoting). The variants and
# failure tables (sections 2 to 5, about 400 s) are extended (scripts/test --extended, docs/lab.md): with them a
# clean-clone CI runs past its 65-minute budget on two cores.
pytestmark = [pytest.mark.lab, pytest.mark.timeout(5400)]
extended = pytest.mark.lab_extended

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / ".cache" / "models" / "tiny-llama"
RUNTIME_PYTHON = REPO / ".venv-runtime" / "bin" / "python"
VENV = "/opt/vllm-cluster/venv"
# The API's model id: the lab's vllm_cluster_deployment (inventories/lab/group_vars), the default served name.
SERVED_NAME = "lab-tiny-llama"
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)

ONE_NODE_TP2 = ["-e", json.dumps({"vllm_cluster_gpus": {"count": 2, "name": "cpu", "memory_total_mib": 4096,
                                                        "nvlink": False}})]
# JSON: -e key=value would pass strings, and the planner takes sizes only as integers.
PP2 = ["-e", json.dumps({"vllm_cluster_tp": 1, "vllm_cluster_pp": 2})]
DENSE_DP2 = ["-e", json.dumps({"vllm_cluster_tp": 1, "vllm_cluster_dp": 2})]
VLLM_AND_VERIFY = ["--tags", "vllm,verify"]


@pytest.fixture(scope="module")
def lab(shared_lab):
    """The run's one deployed lab (tests/lab/conftest.py: shared_lab)."""
    return shared_lab


def recap(output: str) -> dict[str, dict[str, int]]:
    return {
        host: {"ok": int(ok), "changed": int(changed), "unreachable": int(unreachable), "failed": int(failed)}
        for host, ok, changed, unreachable, failed in RECAP.findall(output)
    }


def table(output: str) -> list[str]:
    """The verification table as printed by vllm_verify (the debug msg list), one string per row."""
    start = output.rindex("TASK [vllm_ops.cluster.vllm_verify : Print the topology")
    block = output[start:]
    block = block[: block.index("\n}\n") + 2]
    message = json.loads(block[block.index("{"):])["msg"]
    return message


def stage_summary(output: str) -> str:
    """What converged.yml printed: which stages run and why (the reasons of the first that runs)."""
    start = output.find("TASK [Print what runs and why]")
    return output[start: output.find("TASK [", start + 10)] if start >= 0 else "no stage summary in the output"


def row(lines: list[str], node: str, check: str) -> list[str]:
    """Cells of the table row (node, check): [expected, found, result] split on runs of 2+ spaces."""
    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        if cells[:2] == [node, check]:
            return cells[2:]
    raise AssertionError(f"no row ({node}, {check}) in:\n" + "\n".join(lines))


def complete(lab, node: str) -> dict:
    """One completion from the controller through the node's management address (vLLM listens on all)."""
    body = json.dumps({"model": SERVED_NAME, "prompt": "The quick brown fox", "max_tokens": 4,
                       "temperature": 0, "ignore_eos": True}).encode()
    request = urllib.request.Request(f"http://{lab.management_address(node)}:8000/v1/completions", data=body,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {lab.api_key}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def unit_active(lab, node: str) -> str:
    return lab.ssh(node, "systemctl is-active vllm.service", check=False).stdout.strip()


@pytest.fixture(scope="module")
def first_deploy(lab, tiny_model):
    """The lab's first deploy.yml of the run: scripts/demo's when test_demo ran it on bare nodes, else one now."""
    earlier = lab.first_output_of("deploy.yml")
    if earlier is not None:
        return subprocess.CompletedProcess(["deploy.yml"], 0, stdout=earlier, stderr="")
    return lab.ansible_playbook("deploy.yml", timeout=2400)


# --------------------------------------------------------------------------- 1. the lab's deployment


def test_deploy_brings_bare_nodes_to_a_verified_two_node_tp2(lab, first_deploy):
    out = first_deploy.stdout
    lines = table(out)
    assert lines[0].startswith("vLLM runs as planned: tp (mp) TP=2 PP=1 DP=1 EP=1 world_size=2 on node1, node2")
    assert row(lines, "node1", "ranks (rank/local)") == ["0/0", "0/0", "ok"]
    assert row(lines, "node2", "ranks (rank/local)") == ["1/0", "1/0", "ok"]
    assert row(lines, "node1", "worker processes") == ["Worker_TP0", "Worker_TP0", "ok"]
    assert row(lines, "node2", "worker processes") == ["Worker_TP1", "Worker_TP1", "ok"]
    assert row(lines, "node2", "DP/PP/TP/EP ranks") == ["DP0 PP0 TP1", "DP0 PP0 TP1", "ok"]
    master = f"{lab.fabric_address('node1')}:29501"
    assert row(lines, "node2", "role") == [f"headless multiproc executor -> {master}"] * 2 + ["ok"]
    assert row(lines, "node1", "KV tokens EngineCore")[:2] == ["2,097,152 (exact)", "2,097,152 (4096.00x at 512)"]
    assert row(lines, "node3", "unit (not in plan)")[1:] == ["no vllm unit", "ok"]
    assert "MISMATCH" not in "\n".join(lines)
    # The smoke completion went through the head's API, and the API answers the controller too.
    smoke = out[out.index("TASK [vllm_ops.cluster.vllm_service : Send one smoke completion]"):]
    assert smoke.split("TASK [", 2)[1].count("ok: [node1]") == 1
    answer = complete(lab, "node1")
    assert answer["usage"]["completion_tokens"] == 4 and isinstance(answer["choices"][0]["text"], str)
    assert unit_active(lab, "node1") == unit_active(lab, "node2") == "active"
    assert unit_active(lab, "node3") in ("inactive", "unknown")


def test_units_carry_the_plan_argv_and_env_exactly(lab, first_deploy):
    lab.ansible_playbook("playbooks/plan.yml", "-e", "vllm_cluster_plan_output=true")
    plan = json.loads((REPO / "results" / "lab-tiny-llama" / "plan.json").read_text())
    for node in plan["nodes"]:
        shown = lab.ssh(node["host"], "systemctl show -p ExecStart --value vllm.service").stdout
        argv = shown.split("argv[]=", 1)[1].split(" ;", 1)[0].split()
        assert argv == [f"{VENV}/bin/vllm", *node["argv"][1:]]
        mode = lab.ssh(node["host"], "stat -c '%a %U %G' /etc/vllm-cluster/vllm.env").stdout.split()
        assert mode == ["600", "root", "root"]
        pid = lab.ssh(node["host"], "systemctl show -p MainPID --value vllm.service").stdout.strip()
        environ = lab.ssh(node["host"], f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines()
        for name, value in node["env"].items():
            assert f"{name}={value}" in environ, name
        user = lab.ssh(node["host"], f"ps -o user= -p {pid}").stdout.strip()
        assert user == "vllm"


def test_a_second_run_changes_nothing(lab, first_deploy):
    result = lab.ansible_playbook("deploy.yml", timeout=1200)
    counts = recap(result.stdout)
    assert set(counts) >= {"node1", "node2", "node3", "localhost"}
    assert {host: c["changed"] for host, c in counts.items()} == {host: 0 for host in counts}, result.stdout[-3000:]
    # The fast path: every stage holds on every node, and vLLM still runs the processes verify saw.
    assert "nothing to do: every stage holds on every node" in result.stdout, stage_summary(result.stdout)
    assert "vLLM runs the processes verified at " in result.stdout
    full = lab.ansible_playbook("deploy.yml", "-e", "vllm_cluster_full_run=true", timeout=1200)
    assert {host: c["changed"] for host, c in recap(full.stdout).items()} == {host: 0 for host in counts}
    assert "no stage skipped: -e vllm_cluster_full_run=true" in full.stdout
    assert "vLLM runs as planned" in full.stdout


def check_diff_changes_nothing(lab, *extra):
    result = lab.ansible_playbook("deploy.yml", "--check", "--diff", *extra, timeout=1200)
    counts = recap(result.stdout)
    assert {host: c["changed"] for host, c in counts.items()} == {host: 0 for host in counts}, result.stdout[-3000:]
    assert "--- before" not in result.stdout


def test_check_diff_reports_nothing_to_change(lab, first_deploy):
    check_diff_changes_nothing(lab)  # the fast path


@extended  # about 110 s: every role in check mode (the run the fast path saves); the full run above is in CI
def test_check_diff_of_every_role_reports_nothing_to_change(lab, first_deploy):
    check_diff_changes_nothing(lab, "-e", "vllm_cluster_full_run=true")


@extended
def test_a_stage_whose_evidence_changed_runs_again_with_every_later_stage(lab, first_deploy):
    started = lab.ssh("node1", "systemctl show -p InvocationID --value vllm.service").stdout.strip()
    lab.ssh("node3", "nft delete table inet vllm_cluster")
    result = lab.ansible_playbook("deploy.yml", timeout=1200)
    assert "converged on every node, skipped: preflight, network" in result.stdout
    assert "runs: firewall, runtime, vllm, verify" in result.stdout  # no ray stage for the mp backend
    assert "firewall because node3: `nft --stateless list table inet vllm_cluster` answers differently" in result.stdout
    changed = {host: c["changed"] for host, c in recap(result.stdout).items()}
    assert changed["node3"] > 0 and changed["node1"] == changed["node2"] == 0, changed
    assert "vLLM runs as planned" in result.stdout
    assert lab.ssh("node3", "nft list table inet vllm_cluster", check=False).returncode == 0
    assert lab.ssh("node1", "systemctl show -p InvocationID --value vllm.service").stdout.strip() == started
    again = lab.ansible_playbook("deploy.yml", timeout=600)
    assert "nothing to do: every stage holds on every node" in again.stdout


def test_systemd_reads_exec_start_and_env_file_back(lab, first_deploy):
    """The quoting of vllm_unit, read back by a real systemd: argv and environment arrive unchanged."""
    words = ["plain", "two words", "50%", "$HOME", 'say "hi"', "back\\slash", "a;b", "", "tab\there",
             '{"k": 1}', "naïve"]
    env = {"A": "0|1", "B": 'x "y" $z `w` \\v', "C": "=mlx5_0:1,mlx5_1:1"}
    code = "import json, os, sys; print(json.dumps([sys.argv[1:], {k: os.environ[k] for k in 'ABC'}]))"
    unit = "\n".join([
        "[Service]",
        "Type=oneshot",
        "EnvironmentFile=/run/vllm-quote-test.env",
        "ExecStart=" + exec_start("/usr/bin/python3", ["python3", "-c", code, *words]),
    ]) + "\n"
    env_text = "\n".join(env_file_line(k, v) for k, v in env.items()) + "\n"
    script = (
        f"printf %s {shlex.quote(unit)} > /run/systemd/system/vllm-quote-test.service && "
        f"printf %s {shlex.quote(env_text)} > /run/vllm-quote-test.env && "
        "systemctl daemon-reload && systemctl start vllm-quote-test.service && "
        "journalctl -u vllm-quote-test.service -o cat --no-pager | grep '^\\[' | tail -1; "
        "rm -f /run/systemd/system/vllm-quote-test.service /run/vllm-quote-test.env; systemctl daemon-reload"
    )
    printed = lab.ssh("node3", script).stdout.strip().splitlines()[-1]
    assert json.loads(printed) == [words, env]


# --------------------------------------------------------------------------- 2. a node's unit stopped


@extended
def test_verification_fails_with_the_table_when_one_node_is_stopped(lab, first_deploy):
    lab.ssh("node2", "systemctl stop vllm.service")
    result = lab.ansible_playbook("deploy.yml", "--tags", "verify", check=False, timeout=900)
    assert result.returncode != 0
    lines = table(result.stdout)
    assert lines[0].startswith("vLLM does NOT run as planned")
    # A headless worker stopped under a live head exits with an error: systemd may say failed.
    found_unit = row(lines, "node2", "unit")
    assert found_unit[0] == "active (running)" and found_unit[2] == "MISMATCH"
    assert found_unit[1] in ("inactive (dead)", "failed (failed)")
    assert row(lines, "node2", "ranks (rank/local)") == ["1/0", "none", "MISMATCH"]
    assert row(lines, "all", "every rank once")[2] == "MISMATCH"
    assert "vLLM does not run as planned (" in result.stdout
    assert f"node2 unit: expected active (running), found {found_unit[1]}" in result.stdout


# --------------------------------------------------------------------------- 3. single node TP=2, then a TP fault


@extended
def test_single_node_tp2(lab, first_deploy):
    result = lab.ansible_playbook("deploy.yml", *ONE_NODE_TP2, *VLLM_AND_VERIFY, timeout=1200)
    lines = table(result.stdout)
    assert lines[0].startswith("vLLM runs as planned: tp (mp) TP=2 PP=1 DP=1 EP=1 world_size=2 on node1")
    assert row(lines, "node1", "ranks (rank/local)")[:2] == ["0/0 1/1", "0/0 1/1"]
    assert row(lines, "node1", "worker processes")[:2] == ["Worker_TP0 Worker_TP1"] * 2
    assert row(lines, "node2", "unit (not in plan)")[1:] == ["no vllm unit", "ok"]
    assert unit_active(lab, "node2") in ("inactive", "unknown")


@extended
def test_verification_fails_with_the_table_when_a_unit_runs_another_tp(lab, first_deploy):
    lab.ssh("node1", "sed -i 's/--tensor-parallel-size 2/--tensor-parallel-size 1/' /etc/systemd/system/vllm.service"
                     " && systemctl daemon-reload && systemctl restart vllm.service")
    result = lab.ansible_playbook("deploy.yml", *ONE_NODE_TP2, "--tags", "verify", check=False, timeout=900)
    assert result.returncode != 0
    lines = table(result.stdout)
    assert row(lines, "node1", "world_size") == ["2", "1", "MISMATCH"]
    assert row(lines, "node1", "ranks (rank/local)") == ["0/0 1/1", "0/0", "MISMATCH"]
    assert row(lines, "node1", "KV tokens EngineCore") == ["2,097,152 (exact)", "1,048,576 (2048.00x at 512)",
                                                           "MISMATCH"]
    assert row(lines, "node1", "sizes vLLM was given") == ["TP=2 PP=1 DP=1", "TP=1 PP=1 DP=1", "MISMATCH"]
    assert row(lines, "all", "every rank once") == ["0,1", "0 (missing 1)", "MISMATCH"]


# --------------------------------------------------------------------------- 4. 2-node PP=2


@extended
def test_two_node_pp2_without_eager(lab, first_deploy):
    result = lab.ansible_playbook("deploy.yml", *PP2, *VLLM_AND_VERIFY, timeout=1500)
    lines = table(result.stdout)
    assert lines[0].startswith("vLLM runs as planned: tp_pp (mp) TP=1 PP=2 DP=1 EP=1 world_size=2 on node1, node2")
    assert row(lines, "node1", "DP/PP/TP/EP ranks")[:2] == ["DP0 PP0 TP0"] * 2
    assert row(lines, "node2", "DP/PP/TP/EP ranks")[:2] == ["DP0 PP1 TP0"] * 2
    assert row(lines, "node2", "worker processes")[:2] == ["Worker_PP1"] * 2
    exec_line = lab.ssh("node1", "grep ^ExecStart= /etc/systemd/system/vllm.service").stdout
    assert "--enforce-eager" not in exec_line and "--pipeline-parallel-size 2" in exec_line


@extended
def test_an_eager_first_rollout_is_refused_for_pp_on_cpu(lab, first_deploy):
    result = lab.ansible_playbook("deploy.yml", *PP2, "-e", '{"vllm_service_eager_first": true}', "--tags", "vllm",
                                  check=False, timeout=600)
    assert result.returncode != 0
    assert ("vllm_service_eager_first=true cannot run for this plan (deployment lab-tiny-llama): "
            "PP=2 on the CPU platform crashes") in result.stdout
    # Refused before touching anything: the PP=2 deployment still runs.
    assert unit_active(lab, "node1") == unit_active(lab, "node2") == "active"


# --------------------------------------------------------------------------- 5. dense DP=2


@extended
def test_dense_dp2(lab, first_deploy):
    """A dense model's DP=2 is two independent servers (plan data_parallel.mode independent, issue 18): node1 and
    node2 each run their own API server with one engine, vLLM given TP=1 PP=1 DP=1, no --data-parallel-*."""
    result = lab.ansible_playbook("deploy.yml", *DENSE_DP2, *VLLM_AND_VERIFY, timeout=1200)
    lines = table(result.stdout)
    assert lines[0].startswith("vLLM runs as planned: dp_replicas (mp) TP=1 PP=1 DP=2")
    assert row(lines, "node2", "role")[:2] == ["API server (independent replica)", "API server on http://0.0.0.0:8000"]
    for node in ("node1", "node2"):
        assert row(lines, node, "KV tokens EngineCore")[:2] == ["1,048,576 (exact)", "1,048,576 (2048.00x at 512)"]
        assert row(lines, node, "sizes vLLM was given")[:2] == ["TP=1 PP=1 DP=1", "TP=1 PP=1 DP=1"]
        exec_line = lab.ssh(node, "grep ^ExecStart= /etc/systemd/system/vllm.service").stdout
        assert "--data-parallel" not in exec_line and "--headless" not in exec_line, (node, exec_line)
    assert row(lines, "all", "every rank once per replica (x2)")[:2] == ["0,0", "0,0"]
