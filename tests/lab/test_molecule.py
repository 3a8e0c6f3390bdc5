"""Molecule on the lab, as molecule/README.md tells an operator to run it; the two tests together are `test --all`.

The `default` scenario brings the lab up (`lab up`) before the role scenarios
and down (`lab down`) after them (shared_state). CI runs `default`;
`scripts/test --extended` first runs the role scenarios (`gpu_preflight`,
`nccl_network`, `vllm_runtime`: the stages deploy.yml already runs in CI;
`ray_cluster`: Ray's 3-node cluster, about 230 s), leaving the lab up for the
second test. Each scenario must report successes and
no failure. It runs on the run's shared lab (tests/lab/conftest.py), last of
the lab modules: the runtime the deploy tests installed makes the vllm_runtime
and ray_cluster scenarios converge fast, and Molecule's destroy ends that lab;
whatever Molecule does, the lab is brought down at the end and nothing may
remain.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
MOLECULE_TIMEOUT_S = 2400  # a bound, not a target: every scenario with a runtime install took 318 s on a warm lab
CI_SCENARIOS = ("default",)
EXTENDED_SCENARIOS = ("gpu_preflight", "nccl_network", "vllm_runtime", "ray_cluster")


def scenario_recap(output: str) -> dict[str, dict[str, int]]:
    """Molecule's SCENARIO RECAP: counters per scenario (a scenario listed twice, default's create and destroy,
    adds up)."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)
    section = plain.rsplit("SCENARIO RECAP", 1)[-1]
    recap: dict[str, dict[str, int]] = {}
    for name, counters in re.findall(r"^(\w+)\s+:\s+(.+)$", section, flags=re.MULTILINE):
        counts = recap.setdefault(name, {})
        for key, value in re.findall(r"(\w+)=(\d+)", counters):
            counts[key] = counts.get(key, 0) + int(value)
    return recap


def molecule_test(shared_lab, tmp_path, scenarios, *extra):
    lab_name = shared_lab.name
    # A fresh state directory: a stale "created" from an interrupted run would make Molecule skip `lab up`.
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}", NO_COLOR="1",
               MOLECULE_EPHEMERAL_DIRECTORY=str(tmp_path / "molecule"), VLLM_LAB_NAME=lab_name,
               VLLM_LAB_NODES=str(shared_lab.node_count),
               VLLM_LAB_INVENTORY_DIR=str(shared_lab.inventory.relative_to(REPO)),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=shared_lab.ansible_env()["ANSIBLE_CACHE_PLUGIN_CONNECTION"])
    argv = [str(BIN / "molecule"), "-c", "molecule/config.yml", "test"]
    for scenario in scenarios:
        argv += ["-s", scenario]
    proc = subprocess.run([*argv, *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=MOLECULE_TIMEOUT_S, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(argv[3:])} exited {proc.returncode}:\n{output[-12000:]}"
    recap = scenario_recap(output)
    for scenario in scenarios:
        assert scenario in recap, f"scenario {scenario} did not run:\n{output[-4000:]}"
        assert recap[scenario].get("successful", 0) > 0, recap
    assert all(counters.get("failed", 0) == 0 for counters in recap.values()), recap


@pytest.mark.lab_extended  # the stages deploy.yml runs in CI, and Ray's cluster: more than CI's budget has
@pytest.mark.timeout(MOLECULE_TIMEOUT_S + 600)
def test_molecule_role_scenarios_of_the_stages_deploy_runs(tmp_path, shared_lab):
    # The lab stays up for the test below, which ends it whether or not this one passed.
    molecule_test(shared_lab, tmp_path, EXTENDED_SCENARIOS, "--destroy", "never")


@pytest.mark.timeout(MOLECULE_TIMEOUT_S + 600)
def test_molecule_default_and_ray_cluster_scenarios_then_the_lab_is_down(tmp_path, shared_lab):
    try:
        molecule_test(shared_lab, tmp_path, CI_SCENARIOS)
    finally:
        down = subprocess.run([str(REPO / "lab" / "lab"), "down", "--name", shared_lab.name], capture_output=True,
                              text=True, timeout=300, check=False)
    assert down.returncode == 0, f"lab down found leftovers:\n{down.stdout}\n{down.stderr}"
