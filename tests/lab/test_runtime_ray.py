"""vllm_runtime + ray_cluster on a real 3-node lab: what Molecule's acceptance run does not cover.

- Ray 2.60's live outputs (`ray list nodes`, `ray status`, `ray status -v`) read
  by plugins/module_utils/verify/ray_state.py;
- the wait's timeout names the missing node (a worker stopped by hand);
- workers rejoin a restarted head by themselves (no Ansible), and a rebooted
  worker rejoins;
- `--check --diff` on the converged lab reports no change.

One lab for the module; the runtime install (3.4 GB per node, offline from the
wheelhouse) dominates its time.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.ray_state import (
    RayStateError,
    parse_nodes,
    parse_status,
)
from conftest import RAY_CLI_ENV

# Outside CI's time budget: scripts/test --extended runs it (docs/lab.md).
pytestmark = [pytest.mark.lab_extended, pytest.mark.lab]

REPO = Path(__file__).resolve().parents[2]
RUNTIME_PYTHON = REPO / ".venv-runtime" / "bin" / "python"
MODEL = REPO / ".cache" / "models" / "tiny-llama"  # where inventories/lab/group_vars points
RAY = f"{RAY_CLI_ENV} /opt/vllm-cluster/venv/bin/ray"
LAB_RAY_VARS = ("-e", "ray_cluster_object_store_memory=500000000")
GPUS_PER_NODE = 2  # the lab's replayed nvidia-smi (gpu/h200x2)


@pytest.fixture(scope="module")
def lab(shared_lab):
    """The run's one deployed lab (tests/lab/conftest.py: shared_lab)."""
    return shared_lab


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counters per host."""
    counts = {}
    for host, fields in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", output, flags=re.M):
        counts[host] = {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", fields)}
    return counts


def ray_nodes(lab, timeout: float = 120) -> list[dict]:
    head = lab.fabric_address("node1")
    proc = lab.ssh("node1", f"cd / && {RAY} list nodes --format json --limit 1000 --address http://{head}:8265",
                   check=False, timeout=timeout)
    if proc.returncode != 0:
        raise RayStateError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no output")
    return parse_nodes(proc.stdout)


def wait_for_cluster(lab, timeout: float, *, changed_ids: set[str] | None = None) -> list[dict]:
    """Poll the state API until every node is ALIVE at its fabric address (with new ids, if asked)."""
    want = {lab.fabric_address(node) for node in lab.nodes}
    deadline = time.monotonic() + timeout
    last = "nothing read yet"
    while time.monotonic() < deadline:
        try:
            alive = [n for n in ray_nodes(lab) if n["state"] == "ALIVE"]
        except (RayStateError, subprocess.TimeoutExpired) as error:
            last = str(error)
        else:
            last = ", ".join(f"{n['address']} {n['node_id'][:8]}" for n in alive)
            fresh = changed_ids is None or not ({n["node_id"] for n in alive} & changed_ids)
            if {n["address"] for n in alive} == want and len(alive) == len(want) and fresh:
                return alive
        time.sleep(5)
    raise AssertionError(f"the Ray cluster did not re-form within {timeout} s; last reading: {last}")


def unit_restarts(lab, node: str, unit: str) -> int:
    out = lab.ssh(node, f"systemctl show -p NRestarts --value {unit}").stdout.strip()
    return int(out or 0)


@pytest.fixture(scope="module")
def cluster(lab, tiny_model):
    lab.ansible_playbook("playbooks/runtime.yml", timeout=3600)
    lab.ansible_playbook("playbooks/ray.yml", *LAB_RAY_VARS, timeout=1800)
    return lab


def test_live_ray_outputs_through_the_parsers(cluster):
    nodes = [n for n in ray_nodes(cluster) if n["state"] == "ALIVE"]  # a died node stays listed a while
    assert sorted(n["address"] for n in nodes) == sorted(
        cluster.fabric_address(node) for node in cluster.nodes)
    assert [n["address"] for n in nodes if n["is_head"]] == [cluster.fabric_address("node1")]
    assert {n["gpus"] for n in nodes} == {float(GPUS_PER_NODE)}
    # Ray 2.60 prints memory resources as text: the raw value is kept, the counts are numbers.
    assert all(isinstance(n["resources"]["memory"], str) for n in nodes)

    head = cluster.fabric_address("node1")
    status = parse_status(cluster.ssh("node1", f"cd / && {RAY} status --address {head}:6379").stdout)
    assert status["node_count"] == len(cluster.nodes)
    assert status["usage"]["GPU"]["total"] == float(GPUS_PER_NODE * len(cluster.nodes))
    verbose = parse_status(cluster.ssh("node1", f"cd / && {RAY} status -v --address {head}:6379").stdout)
    # Ray 2.60's per-node blocks name nodes by id: "Node: <id> (node_<id>)".
    assert sorted(block["node"] for block in verbose["per_node"]) == sorted(n["node_id"] for n in nodes)
    assert all(block["usage"]["GPU"]["total"] == float(GPUS_PER_NODE) for block in verbose["per_node"])


def test_converged_lab_reports_no_change_in_check_mode(cluster):
    for playbook, extra in (("playbooks/runtime.yml", ()), ("playbooks/ray.yml", LAB_RAY_VARS)):
        proc = cluster.ansible_playbook(playbook, "--check", "--diff", *extra, timeout=1800)
        counts = recap(proc.stdout)
        assert counts and all(c["changed"] == 0 and c["failed"] == 0 for c in counts.values()), (playbook, counts)


def test_the_timeout_names_a_stopped_worker(cluster):
    node3 = cluster.fabric_address("node3")
    cluster.ssh("node3", "systemctl stop ray-worker")
    try:
        proc = cluster.ansible_playbook(
            "playbooks/ray.yml", *LAB_RAY_VARS, "-e", "ray_cluster_wait_timeout=20",
            "--skip-tags", "ray_cluster_configure,ray_cluster_service", check=False, timeout=900)
        assert proc.returncode != 0
        head = cluster.fabric_address("node1")
        assert (f"Ray cluster {head}:6379: expected 3 ALIVE nodes with 6 GPUs; Ray reports 2 ALIVE with 4 GPUs."
                in proc.stdout), proc.stdout[-4000:]
        assert re.search(rf"Missing: node3 \({re.escape(node3)}\)( is DEAD[^.]*)?\.", proc.stdout), proc.stdout[-4000:]
        said = [line.strip() for line in proc.stdout.splitlines() if "Found:" in line]
        assert f"Found: node1 ({head}, head, 2 GPUs), node2 ({cluster.fabric_address('node2')}, 2 GPUs)." in proc.stdout, said
        # Ray exits 1 on SIGTERM by design (ray/_private/node.py), so a stopped unit reads "failed".
        assert re.search(r"host node3: ray-worker\.service is (inactive|failed) and enabled", proc.stdout)
    finally:
        cluster.ssh("node3", "systemctl start ray-worker")
    wait_for_cluster(cluster, 600)


def test_workers_rejoin_a_restarted_head_without_ansible(cluster):
    before = {n["node_id"] for n in wait_for_cluster(cluster, 600)}
    restarts = {node: unit_restarts(cluster, node, "ray-worker") for node in ("node2", "node3")}
    cluster.ssh("node1", "systemctl restart ray-head")
    wait_for_cluster(cluster, 900, changed_ids=before)
    # The workers left through their own failure (raylet gave up on the old GCS), and systemd restarted them.
    for node, count in restarts.items():
        assert unit_restarts(cluster, node, "ray-worker") > count, node


def test_a_rebooted_worker_rejoins(cluster):
    before = {n["node_id"]: n["address"] for n in wait_for_cluster(cluster, 600)}
    cluster.node("node2", "reboot")
    old_node2 = {node_id for node_id, address in before.items() if address == cluster.fabric_address("node2")}
    wait_for_cluster(cluster, 900, changed_ids=old_node2)
    assert cluster.ssh("node2", "systemctl is-active ray-worker").stdout.strip() == "active"


def test_unit_runs_hardened_as_the_service_user(cluster):
    props = dict(line.split("=", 1) for line in cluster.ssh(
        "node1", "systemctl show -p User -p ProtectSystem -p NoNewPrivileges -p PrivateTmp -p Restart ray-head"
    ).stdout.strip().splitlines())
    assert props == {"User": "vllm", "ProtectSystem": "strict", "NoNewPrivileges": "yes", "PrivateTmp": "yes",
                     "Restart": "on-failure"}
    owners = cluster.ssh("node1", "ps -o user= -C raylet,gcs_server | sort -u").stdout.split()
    assert owners == ["vllm"]


def test_deploy_s_launch_stage_brings_up_the_ray_plan_s_cluster_and_records_it(cluster, tmp_path):
    # The lab's own plans are mp (vLLM's CPU platform refuses the Ray executor), so this plans the lab's
    # nodes as CUDA nodes with backend ray: playbooks/launch.yml must run the ray mode's role (ray_cluster) on
    # the plan's nodes only, record the ray stage there, and skip itself for an mp plan or a converged stage.
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan

    gpus = {"count": GPUS_PER_NODE, "name": "NVIDIA H200", "memory_total_mib": 143771, "nvlink": True}
    nodes = [{"name": node, "address": cluster.fabric_address(node), "gpus": gpus} for node in cluster.nodes]
    plan = build_plan("llama-3.1-8b", nodes, overrides={"backend": "ray", "tp": 2, "pp": 2})
    assert [node["host"] for node in plan["nodes"]] == ["node1", "node2"]
    extra = tmp_path / "launch.json"
    extra.write_text(json.dumps({"vllm_cluster_plan": plan, "vllm_cluster_stage_digest": "launch-test",
                                 "ray_cluster_object_store_memory": 500000000}))
    stamp = "/etc/vllm-cluster/stages/ray.json"
    try:
        proc = cluster.ansible_playbook("playbooks/launch.yml", "-e", f"@{extra}", timeout=1800)
        assert "Run the launch mode's bring-up role" in proc.stdout
        alive = {n["address"] for n in ray_nodes(cluster) if n["state"] == "ALIVE"}
        assert alive == {cluster.fabric_address("node1"), cluster.fabric_address("node2")}
        for node in ("node1", "node2"):
            written = json.loads(cluster.ssh(node, f"cat {stamp}").stdout)
            unit = "ray-head.service" if node == "node1" else "ray-worker.service"
            assert (written["stage"], written["digest"], list(written["evidence"]["units"])) == (
                "ray", "launch-test", [unit])
        # node3 is outside the plan: its stamp says the stage holds there with nothing of Ray's (deploy.yml's
        # fast path needs a stamp on every node; ray_cluster's evidence is empty for a non-member)
        outside = json.loads(cluster.ssh("node3", f"cat {stamp}").stdout)
        assert (outside["stage"], outside["evidence"]["units"], outside["evidence"]["paths"]) == ("ray", {}, {})
        # A converged ray stage ends the play before the role; an mp plan has no launch stage at all.
        skipped = json.loads(extra.read_text()) | {"vllm_cluster_stages_skipped": ["ray"]}
        extra.write_text(json.dumps(skipped))
        proc = cluster.ansible_playbook("playbooks/launch.yml", "-e", f"@{extra}", timeout=600)
        assert "Run the launch mode's bring-up role" not in proc.stdout
        proc = cluster.ansible_playbook("playbooks/plan.yml", "playbooks/launch.yml", timeout=600)
        assert "Run the launch mode's bring-up role" not in proc.stdout
    finally:
        for node in cluster.nodes:
            cluster.ssh(node, f"rm -f {stamp}", check=False)
        cluster.ansible_playbook("playbooks/ray.yml", *LAB_RAY_VARS, timeout=1800)
    wait_for_cluster(cluster, 600)
