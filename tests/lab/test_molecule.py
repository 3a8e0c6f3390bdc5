"""`molecule test --all` on the lab, exactly as molecule/README.md tells an operator to run it.

The `default` scenario brings the lab up (`lab up`) before every role scenario
and down (`lab down`) after them (shared_state). This test adds only a safety
net: whatever Molecule does, the lab is brought down at the end and nothing
may remain. It runs on the run's shared lab (tests/lab/conftest.py), last of
the lab modules: the runtime the deploy tests installed makes the vllm_runtime
and ray_cluster scenarios converge fast, and Molecule's destroy ends that lab.
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
MOLECULE_TIMEOUT_S = 2400  # every scenario, with the runtime install of the vllm_runtime scenario
OWN_SCENARIOS = ("default", "gpu_preflight", "nccl_network", "vllm_runtime", "ray_cluster")


def scenario_recap(output: str) -> dict[str, dict[str, int]]:
    """Molecule's SCENARIO RECAP: counters per scenario."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)
    section = plain.rsplit("SCENARIO RECAP", 1)[-1]
    rows = re.findall(r"^(\w+)\s+:\s+(.+)$", section, flags=re.MULTILINE)
    return {name: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counters)} for name, counters in rows}


@pytest.mark.timeout(MOLECULE_TIMEOUT_S + 600)
def test_molecule_test_all_on_the_lab(tmp_path, shared_lab):
    lab_name = shared_lab.name
    # A fresh state directory: a stale "created" from an interrupted run would make Molecule skip `lab up`.
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}", NO_COLOR="1",
               MOLECULE_EPHEMERAL_DIRECTORY=str(tmp_path / "molecule"), VLLM_LAB_NAME=lab_name,
               VLLM_LAB_NODES=str(shared_lab.node_count),
               VLLM_LAB_INVENTORY_DIR=str(shared_lab.inventory.relative_to(REPO)),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=shared_lab.ansible_env()["ANSIBLE_CACHE_PLUGIN_CONNECTION"])
    try:
        proc = subprocess.run([str(BIN / "molecule"), "-c", "molecule/config.yml", "test", "--all"], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=MOLECULE_TIMEOUT_S, check=False)
    finally:
        down = subprocess.run([str(REPO / "lab" / "lab"), "down", "--name", lab_name], capture_output=True,
                              text=True, timeout=300, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"molecule test --all exited {proc.returncode}:\n{output[-12000:]}"
    assert down.returncode == 0, f"lab down found leftovers:\n{down.stdout}\n{down.stderr}"
    recap = scenario_recap(output)
    for scenario in OWN_SCENARIOS:
        assert scenario in recap, f"scenario {scenario} did not run:\n{output[-4000:]}"
        assert recap[scenario].get("failed", 0) == 0 and recap[scenario].get("successful", 0) > 0, recap
    assert all(counters.get("failed", 0) == 0 for counters in recap.values()), recap
