"""deploy.yml with backend ray on the lab, as the seed runs it: vLLM's real Ray executor across two nodes.

vLLM's CPU platform has no Ray device key; the lab's runtime carries the platform
plugin that gives it one (lab/vllm_cpu_ray_plugin, installed through
vllm_runtime_extra_packages by inventories/lab/group_vars), and the planner takes
backend ray on CPU only where the inventory says so (vllm_cluster_cpu_ray_support,
which the lab's group_vars leave unset: this module sets it with -e).

1. 2-node TP=2 over Ray, one rank per node (a logical GPU per node: the plan's
   worker slot, --num-gpus 1): verified by vllm_verify (world_size, every rank
   once, ranks per node from Ray's state API), a completion through the API with
   the lab's key, a second deploy.yml run changed=0.
2. 2-node PP=2 over Ray, the same way.
3. The lab's own deployment (mp, TP=2) back: teardown.yml (vLLM and the Ray units
   go), then deploy.yml without -e.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import RAY_CLI_ENV

# Outside CI's time budget: scripts/test --extended runs it (docs/lab.md).
pytestmark = [pytest.mark.lab_extended, pytest.mark.lab, pytest.mark.timeout(7200)]

REPO = Path(__file__).resolve().parents[2]
VENV = "/opt/vllm-cluster/venv"
RAY = f"{RAY_CLI_ENV} {VENV}/bin/ray"
SERVED_NAME = "lab-tiny-llama"  # the lab's vllm_cluster_deployment
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
# JSON: -e key=value would pass strings, and the planner takes sizes and switches only typed.
# The object store: Ray's default (30% of RAM) does not fit the nodes' 2.4 GiB /dev/shm.
RAY_BACKEND = {"vllm_cluster_backend": "ray", "vllm_cluster_cpu_ray_support": True,
               "ray_cluster_object_store_memory": 500000000}
RAY_TP2 = ["-e", json.dumps(RAY_BACKEND)]
RAY_PP2 = ["-e", json.dumps(RAY_BACKEND | {"vllm_cluster_tp": 1, "vllm_cluster_pp": 2})]


@pytest.fixture(scope="module")
def lab(shared_lab):
    """The run's one deployed lab (tests/lab/conftest.py: shared_lab)."""
    return shared_lab


def recap(output: str) -> dict[str, int]:
    """changed= per host of the PLAY RECAP."""
    return {host: int(changed) for host, _ok, changed, _unreachable, _failed in RECAP.findall(output)}


def table(output: str) -> list[str]:
    """The verification table as printed by vllm_verify (the debug msg list), one string per row."""
    start = output.rindex("TASK [vllm_ops.cluster.vllm_verify : Print the topology")
    block = output[start:]
    block = block[: block.index("\n}\n") + 2]
    return json.loads(block[block.index("{"):])["msg"]


def row(lines: list[str], node: str, check: str) -> list[str]:
    """Cells of the table row (node, check): [expected, found, result] split on runs of 2+ spaces."""
    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        if cells[:2] == [node, check]:
            return cells[2:]
    raise AssertionError(f"no row ({node}, {check}) in:\n" + "\n".join(lines))


def complete(lab, node: str) -> dict:
    body = json.dumps({"model": SERVED_NAME, "prompt": "The quick brown fox", "max_tokens": 4,
                       "temperature": 0, "ignore_eos": True}).encode()
    request = urllib.request.Request(f"http://{lab.management_address(node)}:8000/v1/completions", data=body,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {lab.api_key}"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def unit_state(lab, node: str, unit: str) -> str:
    return lab.ssh(node, f"systemctl is-active {unit}", check=False).stdout.strip()


def ray_gpus_by_address(lab) -> dict[str, float]:
    """Ray's state API on the head: the GPUs each ALIVE node registered."""
    head = lab.fabric_address("node1")
    nodes = json.loads(lab.ssh("node1", f"cd / && {RAY} list nodes --detail --format json "
                                        f"--address http://{head}:8265").stdout)
    return {n["node_ip"]: n["resources_total"].get("GPU", 0) for n in nodes if n["state"] == "ALIVE"}


def check_ray_deployment(lab, output: str, layout: str, ranks: dict[str, str]) -> None:
    lines = table(output)
    assert lines[0].startswith(f"vLLM runs as planned: {layout} world_size=2 on node1, node2"), "\n".join(lines)
    assert "MISMATCH" not in "\n".join(lines), "\n".join(lines)
    for node, cells in ranks.items():
        assert row(lines, node, "ranks (rank/local)")[:2] == [cells, cells], node
    assert row(lines, "all", "every rank once")[:3] == ["0,1", "0,1", "ok"]
    # The seed's shape: the Ray head and a worker, one vllm serve on the head only, nothing on node3.
    assert (unit_state(lab, "node1", "ray-head"), unit_state(lab, "node2", "ray-worker")) == ("active", "active")
    assert unit_state(lab, "node1", "vllm.service") == "active"
    assert unit_state(lab, "node2", "vllm.service") in ("inactive", "unknown")
    assert unit_state(lab, "node3", "ray-worker") in ("inactive", "unknown")
    # One logical GPU a node (the plan's worker slot), so vLLM's placement group puts one rank on each.
    assert ray_gpus_by_address(lab) == {lab.fabric_address("node1"): 1.0, lab.fabric_address("node2"): 1.0}
    answer = complete(lab, "node1")
    assert answer["usage"]["completion_tokens"] == 4 and isinstance(answer["choices"][0]["text"], str)


def check_second_run_changes_nothing(lab, extra: list[str]) -> None:
    again = lab.ansible_playbook("deploy.yml", *extra, timeout=1500)
    changed = recap(again.stdout)
    assert set(changed) >= {"node1", "node2", "node3"}
    assert changed == {host: 0 for host in changed}, again.stdout[-3000:]


@pytest.fixture(scope="module")
def ray_tp2(lab, tiny_model):
    """The first deploy of the module: on a bare lab it installs the runtime (with the plugin) too."""
    return lab.ansible_playbook("deploy.yml", *RAY_TP2, timeout=3000)


def test_two_node_tp2_over_ray(lab, ray_tp2):
    # The lab's plugin is in the runtime (vLLM's CPU platform would refuse the Ray executor without it).
    for node in ("node1", "node2"):
        installed = lab.ssh(node, f"{VENV}/bin/python -c \"import importlib.metadata as m; "
                                  "print(m.version('vllm-cpu-ray-plugin'))\"").stdout.strip()
        assert installed == "0.2.0", node
    check_ray_deployment(lab, ray_tp2.stdout, "tp (ray) TP=2 PP=1 DP=1 EP=1", {"node1": "0/0", "node2": "1/0"})
    exec_line = lab.ssh("node1", "grep ^ExecStart= /etc/systemd/system/vllm.service").stdout
    assert "--distributed-executor-backend ray" in exec_line and "--nnodes" not in exec_line


def test_two_node_tp2_over_ray_second_run_changes_nothing(lab, ray_tp2):
    check_second_run_changes_nothing(lab, RAY_TP2)


STRAY_TOKEN = "/var/lib/vllm-cluster/.ray/auth_token"  # what a local ray.init() of the service user leaves


def wait_until(what: str, predicate, timeout: float, every: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except (OSError, ValueError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


def both_nodes_serve(lab) -> bool:
    expected = {lab.fabric_address("node1"): 1.0, lab.fabric_address("node2"): 1.0}
    return ray_gpus_by_address(lab) == expected and complete(lab, "node1")["usage"]["completion_tokens"] == 4


def journal_since(lab, node: str, unit: str, since: str) -> str:
    return lab.ssh(node, f"journalctl -u {unit} --since @{since} --no-pager -o cat", check=False).stdout


def test_a_stray_token_file_on_the_head_does_not_split_the_cluster(lab, ray_tp2):
    """Ray 2.59+ with RAY_AUTH_MODE unset would turn authentication on from this file alone and refuse node2; the
    roles pin the mode, so the head and the worker restart into one cluster and vLLM serves again."""
    since = lab.ssh("node1", "date +%s").stdout.strip()
    lab.ssh("node1", f"install -d -o vllm -g vllm -m 0700 {Path(STRAY_TOKEN).parent} && "
                     f"od -An -N32 -tx1 /dev/urandom | tr -d ' \\n' > {STRAY_TOKEN} && "
                     f"chown vllm:vllm {STRAY_TOKEN} && chmod 0600 {STRAY_TOKEN}")
    try:
        lab.ssh("node1", "systemctl restart ray-head.service")  # vLLM follows its head (PartOf)
        lab.ssh("node2", "systemctl restart ray-worker.service")
        wait_until("both Ray nodes ALIVE and a completion from vLLM", lambda: both_nodes_serve(lab), timeout=900)
        assert "Token authentication is enabled" not in journal_since(lab, "node1", "ray-head.service", since)
        assert "InvalidAuthToken" not in journal_since(lab, "node2", "ray-worker.service", since)
    finally:
        lab.ssh("node1", f"rm -f {STRAY_TOKEN}")


def test_a_wrong_token_on_one_node_fails_the_deploy_naming_it_and_the_doctor_names_it(lab, ray_tp2, tmp_path):
    """An operator's slip: node2's host variables give it another token. The deploy writes it, node2's worker is
    refused, and the ray stage fails with the doctor's finding on node2; doctor.yml names it too. The next
    deploy.yml without the slip is green."""
    overlay = tmp_path / "wrong-token.yml"
    overlay.write_text(json.dumps({"all": {"hosts": {"node2": {"ray_cluster_auth_token": "0" * 64}}}}))
    failed = lab.ansible_playbook("deploy.yml", *RAY_TP2, "-e", "ray_cluster_wait_timeout=120", "-i", str(overlay),
                                  check=False, timeout=1500)
    out = failed.stdout + failed.stderr
    assert failed.returncode != 0, out[-4000:]
    failures = "\n".join(line for line in out.splitlines() if line.startswith(("fatal:", "failed:")))
    assert "Ray refused the authentication token of node2" in failures, failures[-4000:]  # the doctor's finding
    assert "0" * 64 not in out  # the token itself is never printed

    results = tmp_path / "doctor"
    doctor = lab.ansible_playbook("playbooks/doctor.yml", *RAY_TP2, "-i", str(overlay), "-e",
                                  f"doctor_results_dir={results}", check=False, timeout=900)
    report = json.loads((results / SERVED_NAME / "doctor.json").read_text())
    rejected = [f for f in report["findings"] if f["id"] == "ray_auth_token_rejected"]
    assert rejected and rejected[0]["nodes"] == ["node2"], (doctor.stdout[-3000:], report["findings"])

    lab.ansible_playbook("deploy.yml", *RAY_TP2, timeout=1500)
    wait_until("both Ray nodes ALIVE and a completion from vLLM", lambda: both_nodes_serve(lab), timeout=600)


@pytest.fixture(scope="module")
def ray_pp2(lab, ray_tp2):
    return lab.ansible_playbook("deploy.yml", *RAY_PP2, timeout=2400)


def test_two_node_pp2_over_ray(lab, ray_pp2):
    check_ray_deployment(lab, ray_pp2.stdout, "tp_pp (ray) TP=1 PP=2 DP=1 EP=1", {"node1": "0/0", "node2": "1/0"})
    assert "--pipeline-parallel-size 2" in lab.ssh("node1", "grep ^ExecStart= /etc/systemd/system/vllm.service").stdout


def test_two_node_pp2_over_ray_second_run_changes_nothing(lab, ray_pp2):
    check_second_run_changes_nothing(lab, RAY_PP2)


def test_the_lab_s_own_deployment_is_back(lab, ray_tp2):
    """What the next module of the run expects: the lab's mp TP=2, and no Ray unit left running."""
    lab.ansible_playbook("playbooks/teardown.yml", *RAY_TP2, timeout=900)
    for node in lab.nodes:
        assert unit_state(lab, node, "ray-head") in ("inactive", "unknown"), node
        assert unit_state(lab, node, "ray-worker") in ("inactive", "unknown"), node
    result = lab.ansible_playbook("deploy.yml", timeout=2400)
    assert table(result.stdout)[0].startswith("vLLM runs as planned: tp (mp) TP=2 PP=1 DP=1 EP=1 world_size=2")
