"""The all-reduce probe for real on this CPU: torch.distributed with gloo in .venv-runtime.

Local mode (the script spawns 2 ranks), a 2-"node" run on 127.0.0.1 (two script
processes, one rank each), the time bound, and the nccl_probe module through
ansible-playbook, including two inventory hosts that rendezvous at once.
Sizes are small and every process has a deadline.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.runtime

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles" / "nccl_network" / "files" / "nccl_probe.py"
PLAYBOOK_BIN = Path(sys.executable).with_name("ansible-playbook")
SMALL = ["--backend", "gloo", "--min-bytes", "64K", "--max-bytes", "1M", "--factor", "4", "--warmup", "1",
         "--iters", "3"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra) -> dict:
    """This machine's environment without NCCL/Gloo settings, plus extra."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "GLOO_", "MASTER_"))}
    env.update(extra)
    return env


def run_probe(runtime_python, *args, env=None, timeout=180):
    completed = subprocess.run([str(runtime_python), str(SCRIPT), *args], capture_output=True, text=True,
                               env=env or clean_env(), timeout=timeout)
    return completed.returncode, json.loads(completed.stdout), completed.stderr


def test_local_mode_two_ranks(runtime_python):
    rc, doc, stderr = run_probe(runtime_python, *SMALL, "--nproc-per-node", "2", "--timeout", "120")
    assert rc == 0, (doc.get("error"), stderr[-2000:])
    assert doc["ok"] and doc["mode"] == "local" and doc["world_size"] == 2
    assert doc["device_type"] == "cpu" and doc["settings"]["timing"] == "perf_counter"
    assert [p["size_bytes"] for p in doc["sweep"]] == [64 * 1024, 256 * 1024, 1024 * 1024]
    for point in doc["sweep"]:
        assert point["correct"] is True and point["trials"] == 3
        assert point["busbw_gbps"] == pytest.approx(point["algbw_gbps"])  # 2 ranks: factor 1
        assert point["algbw_gbps"] == pytest.approx(point["size_bytes"] / point["time_us"] / 1e3)
    assert [d["global_rank"] for d in doc["devices"]] == [0, 1]
    assert doc["env"]["NCCL_NVLS_ENABLE"] == "0" and "NCCL_NVLS_ENABLE=0" in doc["env_defaults_applied"]
    assert "nccl_debug_log" not in doc  # gloo has no NCCL log


def test_operator_nvls_setting_is_kept(runtime_python):
    rc, doc, _ = run_probe(runtime_python, *SMALL, "--max-bytes", "64K", "--timeout", "120",
                           env=clean_env(NCCL_NVLS_ENABLE="1"))
    assert rc == 0 and doc["env"]["NCCL_NVLS_ENABLE"] == "1"
    assert not any(item.startswith("NCCL_NVLS_ENABLE") for item in doc["env_defaults_applied"])


def test_two_nodes_on_loopback(runtime_python):
    port = str(free_port())
    common = [str(runtime_python), str(SCRIPT), *SMALL, "--nnodes", "2", "--nproc-per-node", "1",
              "--master-addr", "127.0.0.1", "--master-port", port, "--timeout", "120"]
    nodes = [subprocess.Popen([*common, "--node-rank", str(rank)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=clean_env()) for rank in (0, 1)]
    outputs = [node.communicate(timeout=180) for node in nodes]
    docs = [json.loads(out) for out, _ in outputs]
    for rank, (node, doc) in enumerate(zip(nodes, docs, strict=True)):
        assert node.returncode == 0, (doc.get("error"), outputs[rank][1][-2000:])
        assert doc["mode"] == "multinode" and doc["node_rank"] == rank
        assert doc["world_size"] == 2 and doc["devices"][0]["global_rank"] == rank
        assert all(p["correct"] for p in doc["sweep"])
    assert [p["size_bytes"] for p in docs[0]["sweep"]] == [p["size_bytes"] for p in docs[1]["sweep"]]


def test_missing_peer_stops_at_the_timeout(runtime_python):
    rc, doc, _ = run_probe(runtime_python, *SMALL, "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1",
                           "--master-port", str(free_port()), "--timeout", "10", timeout=90)
    assert rc == 1 and not doc["ok"]
    assert doc["error"].startswith("timed out")
    assert doc["elapsed_s"] < 40


def test_bad_arguments_are_reported_as_json(runtime_python):
    rc, doc, _ = run_probe(runtime_python, "--backend", "gloo", "--nnodes", "2", "--node-rank", "1")
    assert rc == 1 and "--master-port is required" in doc["error"]


def run_playbook(tmp_path, hosts: list[str], tasks: list[dict], runtime_python) -> dict:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[probe]\n" + "".join(f"{h} ansible_connection=local\n" for h in hosts), encoding="utf-8")
    playbook = tmp_path / "probe.yml"
    playbook.write_text(json.dumps([{"name": "Probe", "hosts": "probe", "gather_facts": False,
                                     "vars": {"probe_python": str(runtime_python), "probe_script": str(SCRIPT),
                                              "probe_port": free_port()},
                                     "tasks": tasks}]), encoding="utf-8")
    env = clean_env(
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory",
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOCAL_TEMP=str(tmp_path / "local"),
        ANSIBLE_HOME=str(tmp_path / "home"), ANSIBLE_NOCOLOR="1",
    )
    completed = subprocess.run(
        [str(PLAYBOOK_BIN), "-i", str(inventory), "-e", f"ansible_python_interpreter={sys.executable}",
         str(playbook)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    report = json.loads(completed.stdout)
    return {task["task"]["name"]: task["hosts"] for task in report["plays"][0]["tasks"]}


def test_module_judges_a_gloo_run_and_fails_clearly(tmp_path, runtime_python):
    args = {"python": "{{ probe_python }}", "script": "{{ probe_script }}", "backend": "gloo",
            "min_bytes": "256K", "max_bytes": "1M", "factor": 4, "warmup": 1, "iters": 3, "timeout": 120}
    results = run_playbook(tmp_path, ["localhost"], [
        {"name": "probe", "vllm_ops.cluster.nccl_probe": args},
        {"name": "probe in check mode", "vllm_ops.cluster.nccl_probe": args, "check_mode": True},
        {"name": "missing script", "vllm_ops.cluster.nccl_probe": {**args, "script": "/nonexistent/nccl_probe.py"},
         "ignore_errors": True},
        {"name": "bad threshold key", "vllm_ops.cluster.nccl_probe": {**args, "thresholds": {"pass": 1}},
         "ignore_errors": True},
    ], runtime_python)
    probe = results["probe"]["localhost"]
    assert not probe.get("failed"), probe.get("msg")
    assert probe["changed"] is False
    assert probe["verdict"]["status"] == "pass" and probe["verdict"]["threshold"] is None
    assert probe["probe"]["world_size"] == 2 and probe["transport"] is None
    assert [p["size_bytes"] for p in probe["sweep"]] == [256 * 1024, 1024 * 1024]
    checked = results["probe in check mode"]["localhost"]
    assert not checked.get("failed") and checked["changed"] is False and len(checked["sweep"]) == 2
    missing = results["missing script"]["localhost"]
    assert missing["failed"] and "/nonexistent/nccl_probe.py" in missing["msg"] and "expected" in missing["msg"]
    assert socket.gethostname() in missing["msg"]
    assert "unknown keys ['pass']" in results["bad threshold key"]["localhost"]["msg"]


def test_module_on_two_hosts_at_once(tmp_path, runtime_python):
    """Two inventory hosts (both this machine) rendezvous through the module's multi-node options."""
    task = {"name": "fabric", "vllm_ops.cluster.nccl_probe": {
        "python": "{{ probe_python }}", "script": "{{ probe_script }}", "backend": "gloo",
        "nnodes": 2, "node_rank": "{{ ansible_play_hosts.index(inventory_hostname) }}",
        "master_addr": "127.0.0.1", "master_port": "{{ probe_port }}", "nproc_per_node": 1,
        "min_bytes": "256K", "max_bytes": "1M", "factor": 4, "warmup": 1, "iters": 3, "timeout": 120}}
    results = run_playbook(tmp_path, ["node0", "node1"], [task], runtime_python)
    for rank, host in enumerate(("node0", "node1")):
        result = results["fabric"][host]
        assert not result.get("failed"), result.get("msg")
        assert result["probe"]["mode"] == "multinode" and result["probe"]["node_rank"] == rank
        assert result["probe"]["world_size"] == 2
        assert all(p["correct"] for p in result["sweep"])
