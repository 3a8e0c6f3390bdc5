"""Two deployments in one inventory, on the lab (issue 17): each planned, deployed, verified and changed alone.

The shared lab's three nodes as one fleet inventory (written here, beside the lab's own):

- deployment A, `lab-tiny-llama`: the lab's deployment (inventories/lab/group_vars), TP=2 over node1 and node2 (mp);
- deployment B, `lab-b`: one replica on node3 (TP=1), with vLLM's own flags `max-num-seqs` and
  `served-model-name` in its group_vars.

Both are verified by deploy.yml and answer /v1/completions by their served names through the `openai` client.
A second run changes nothing. A bad flag in B's group_vars fails before anything running changes (the planner
on the controller, or vLLM's own parser on node3 in B's preflight), and A and B keep serving. A new value of B's flag restarts B only: A's vLLM
start time does not move. Teardown of B (-e vllm_cluster_deployments=lab-b) leaves A serving.

What could make it fail: a run_once task that ran once for both deployments (B never verified, or verified
against A's plan), a plan read from the first host of vllm_nodes (B would get TP=2), a stage decision or a
restart that crossed deployments (A's start time would move), a teardown that ignored the selection.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

# It ends by putting the lab inventory's firewall back (deploy.yml --tags firewall), since Molecule's nccl_network
# probes later cross all three nodes.
extended = pytest.mark.lab_extended

# Outside CI's time budget (343 s in a clean-clone CI run, the two-deployment deploy 138 s of it): scripts/test
# --extended runs it (docs/lab.md). The fleet filters are unit-tested (tests/unit/test_fleet_inventory.py).
pytestmark = [pytest.mark.lab, pytest.mark.lab_extended, pytest.mark.timeout(5400)]

REPO = Path(__file__).resolve().parents[2]
RUNTIME_PYTHON = REPO / ".venv-runtime" / "bin" / "python"  # has the openai client (requirements/runtime.lock)
A, B = "lab-tiny-llama", "lab-b"
A_NODES, B_NODE = ("node1", "node2"), "node3"
B_SERVED = "tiny-b"
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def b_vars(max_num_seqs, more=None, gpu_ids=None) -> dict:
    found = {"vllm_cluster_deployment": B, "vllm_cluster_tp": 1,
             "vllm_cluster_serve_args": {"max-num-seqs": max_num_seqs, "served-model-name": B_SERVED, **(more or {})}}
    if gpu_ids is not None:  # node3 shared with C (test_two_deployments_share_node3_on_disjoint_gpus)
        found.update(vllm_cluster_gpus=TWO_LAB_GPUS, vllm_cluster_gpu_ids=gpu_ids)
    return found


@pytest.fixture(scope="module")
def fleet(shared_lab, tiny_model, tmp_path_factory):
    """The fleet inventory: the lab's hosts and variables, node3 moved into deployment B's own group."""
    lab = shared_lab
    inventory = tmp_path_factory.mktemp("fleet-inventory")
    hosts = yaml.safe_load((lab.inventory / "hosts.yml").read_text())
    nodes = hosts["all"]["children"]["vllm_nodes"]
    members = nodes.pop("hosts")
    nodes["children"] = {"fleet_a": {"hosts": {n: members[n] for n in A_NODES}},
                         "fleet_b": {"hosts": {B_NODE: members[B_NODE]}}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    for shared in ("host_vars", "secrets"):
        (inventory / shared).symlink_to(lab.inventory / shared)
    (inventory / "group_vars").mkdir()
    (inventory / "group_vars" / "vllm_nodes.yml").symlink_to(REPO / "inventories" / "lab" / "group_vars"
                                                             / "vllm_nodes.yml")
    write_b(inventory, 4)
    return lab, inventory


def write_b(inventory: Path, max_num_seqs, more=None, gpu_ids=None) -> None:
    (inventory / "group_vars" / "fleet_b.yml").write_text(yaml.safe_dump(b_vars(max_num_seqs, more, gpu_ids),
                                                                         sort_keys=False))


def play(fleet, playbook, *args, check=True, timeout=2400):
    lab, inventory = fleet
    try:
        result = lab.ansible_playbook(playbook, *args, check=check, timeout=timeout, inventory=inventory)
    except AssertionError as failed:
        _keep(inventory, playbook, str(failed))
        raise
    _keep(inventory, playbook, result.stdout)
    return result


def _keep(inventory: Path, playbook: str, output: str) -> None:
    """Each run's output beside the fleet inventory (pytest's tmp dir), for the one who reads a failure."""
    logs = inventory.parent / "logs"
    logs.mkdir(exist_ok=True)
    (logs / f"{len(list(logs.iterdir())):02d}-{Path(playbook).stem}.log").write_text(output)


def recap(output: str) -> dict[str, dict[str, int]]:
    return {host: {"ok": int(ok), "changed": int(changed), "failed": int(failed)}
            for host, ok, changed, _, failed in RECAP.findall(output)}


def started_at(lab, node: str, unit: str = "vllm.service") -> str:
    """The vLLM unit's start time and main PID on a node: a restart changes both."""
    shown = lab.ssh(node, f"systemctl show -p ActiveEnterTimestampMonotonic,MainPID,ActiveState {unit}").stdout
    return " ".join(sorted(shown.split()))


def openai_completion(lab, node: str, model: str, port: int = 8000) -> dict:
    """One completion and the model list through the openai client, against the node's API."""
    script = (
        "import json, sys, openai\n"
        "client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], timeout=120, max_retries=0)\n"
        "models = [m.id for m in client.models.list().data]\n"
        "done = client.completions.create(model=sys.argv[3], prompt='The quick brown fox', max_tokens=4,\n"
        "                                 temperature=0, extra_body={'ignore_eos': True})\n"
        "print(json.dumps({'models': models, 'model': done.model, 'tokens': done.usage.completion_tokens}))\n")
    proc = subprocess.run([str(RUNTIME_PYTHON), "-c", script, f"http://{lab.management_address(node)}:{port}/v1",
                           lab.api_key, model], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{node} {model}: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


def argv_of(lab, node: str, unit: str = "vllm.service") -> list[str]:
    shown = lab.ssh(node, f"systemctl show -p ExecStart --value {unit}").stdout
    return shown.split("argv[]=", 1)[1].split(" ;", 1)[0].split()


@pytest.fixture(scope="module")
def deployed(fleet):
    return play(fleet, "deploy.yml")


def test_both_deployments_are_planned_apart_deployed_and_verified(fleet, deployed):
    lab, _ = fleet
    out = deployed.stdout
    assert f"{A}: node1, node2" in out and f"{B}: node3" in out  # plan.yml's list of the deployments
    verified = re.findall(r"vLLM runs as planned: (\S+ \(\S+\)) TP=(\d) .*? on ([\w, ]+)", out)
    assert ("tp (mp)", "2", "node1, node2") in verified and ("single (mp)", "1", "node3") in verified, verified
    assert all(c["failed"] == 0 for c in recap(out).values())
    argv = argv_of(lab, B_NODE)
    assert argv[argv.index("--max-num-seqs") + 1] == "4" and argv[argv.index("--served-model-name") + 1] == B_SERVED
    assert "--tensor-parallel-size" not in argv or argv[argv.index("--tensor-parallel-size") + 1] == "1"
    a_argv = argv_of(lab, "node1")
    assert a_argv[a_argv.index("--served-model-name") + 1] == A and "--max-num-seqs" not in a_argv


def test_both_answer_by_their_served_names_through_the_openai_client(fleet, deployed):
    lab, _ = fleet
    a = openai_completion(lab, "node1", A)
    b = openai_completion(lab, B_NODE, B_SERVED)
    assert (a["models"], a["model"], a["tokens"]) == ([A], A, 4)
    assert (b["models"], b["model"], b["tokens"]) == ([B_SERVED], B_SERVED, 4)


def test_a_second_run_changes_nothing(fleet, deployed):
    again = play(fleet, "deploy.yml", timeout=1200)
    counts = recap(again.stdout)
    assert set(counts) >= {"node1", "node2", "node3", "localhost"}
    assert {host: c["changed"] for host, c in counts.items()} == {host: 0 for host in counts}, again.stdout[-3000:]


def test_a_bad_flag_of_b_fails_before_anything_running_changes(fleet, deployed):
    """max-num-seqs is a memory flag: the planner refuses 'lots' on the controller. max-loras is not modelled:
    vLLM's own parser on node3 refuses it in vllm_service's preflight, before B's unit is touched."""
    lab, inventory = fleet
    before = {node: started_at(lab, node) for node in (*A_NODES, B_NODE)}
    try:
        write_b(inventory, "lots")
        planned = play(fleet, "deploy.yml", check=False, timeout=600)
        assert planned.returncode != 0
        assert "vllm_cluster_serve_args.max-num-seqs=lots on node3: --max-num-seqs must be an integer >= 1" \
            in planned.stdout, planned.stdout[-4000:]
        assert recap(planned.stdout).get("node3", {}).get("changed", 0) == 0

        write_b(inventory, 4, {"max-loras": "lots"})
        parsed = play(fleet, "deploy.yml", check=False, timeout=1800)
        assert parsed.returncode != 0
        assert "host node3: vllm serve rejects --max-loras lots: argument --max-loras: invalid int value: 'lots'" \
            in parsed.stdout, parsed.stdout[-4000:]
    finally:
        write_b(inventory, 4)
    assert {node: started_at(lab, node) for node in (*A_NODES, B_NODE)} == before
    assert openai_completion(lab, B_NODE, B_SERVED)["tokens"] == 4


def test_a_change_to_b_restarts_b_only(fleet, deployed):
    """B's group_vars get max-num-seqs 6 (and keep it: the tests after this one start from it)."""
    lab, inventory = fleet
    before = {node: started_at(lab, node) for node in (*A_NODES, B_NODE)}
    write_b(inventory, 6)
    changed = play(fleet, "deploy.yml", timeout=2400)
    counts = recap(changed.stdout)
    assert counts["node3"]["changed"] > 0
    assert counts["node1"]["changed"] == counts["node2"]["changed"] == 0, changed.stdout[-3000:]
    after = {node: started_at(lab, node) for node in (*A_NODES, B_NODE)}
    assert after["node1"] == before["node1"] and after["node2"] == before["node2"], "A was restarted"
    assert after[B_NODE] != before[B_NODE], "B was not restarted"
    argv = argv_of(lab, B_NODE)
    assert argv[argv.index("--max-num-seqs") + 1] == "6"
    assert openai_completion(lab, B_NODE, B_SERVED)["tokens"] == 4


def test_a_run_for_b_alone_touches_no_host_of_a(fleet, deployed):
    """-e vllm_cluster_deployments=lab-b: B's hosts only, and the selection itself is no input of B's stages."""
    selected = play(fleet, "deploy.yml", "-e", f"vllm_cluster_deployments={B}", timeout=1200)
    counts = recap(selected.stdout)
    assert set(counts) == {"localhost", B_NODE}, counts
    assert counts[B_NODE]["changed"] == 0, selected.stdout[-3000:]
    assert "nothing to do: every stage holds on every node" in selected.stdout


def test_teardown_of_b_leaves_a_serving(fleet, deployed):
    lab, _ = fleet
    a_before = {node: started_at(lab, node) for node in A_NODES}
    play(fleet, "playbooks/teardown.yml", "-e", f"vllm_cluster_deployments={B}", timeout=900)
    assert lab.ssh(B_NODE, "systemctl is-active vllm.service", check=False).stdout.strip() in ("inactive", "unknown")
    assert {node: started_at(lab, node) for node in A_NODES} == a_before
    assert openai_completion(lab, "node1", A)["tokens"] == 4


# Two deployments on node3, on disjoint lab GPUs (node3 declares two; lab GPU i is core i): B on GPU 0 and C on
# GPU 1, C through a second inventory host for the same machine, with ports of its own.
C, C_HOST, C_SERVED = "lab-c", "node3-c", "tiny-c"
C_PORTS = {"api": 8001, "master": 29511, "dp_rpc": 29560}
TWO_LAB_GPUS = {"count": 2, "name": "cpu", "memory_total_mib": 4096, "nvlink": False}


def share_node3(inventory: Path) -> None:
    """B and C on node3: C's host (node3-c, node3's ansible_host and host vars), both groups naming their GPU."""
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    nodes = hosts["all"]["children"]["vllm_nodes"]
    nodes["children"]["fleet_c"] = {"hosts": {C_HOST: dict(nodes["children"]["fleet_b"]["hosts"][B_NODE])}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    lab_host_vars = (inventory / "host_vars").resolve()
    (inventory / "host_vars").unlink()
    (inventory / "host_vars").mkdir()
    for path in lab_host_vars.glob("*.yml"):
        (inventory / "host_vars" / path.name).symlink_to(path)
    (inventory / "host_vars" / f"{C_HOST}.yml").symlink_to(lab_host_vars / f"{B_NODE}.yml")
    write_b(inventory, 6, gpu_ids=[0])
    (inventory / "group_vars" / "fleet_c.yml").write_text(yaml.safe_dump({
        "vllm_cluster_deployment": C, "vllm_cluster_tp": 1, "vllm_cluster_gpus": TWO_LAB_GPUS,
        "vllm_cluster_gpu_ids": [1], "vllm_cluster_ports": C_PORTS,
        "vllm_cluster_serve_args": {"served-model-name": C_SERVED}}, sort_keys=False))


@extended
def test_two_deployments_share_node3_on_disjoint_gpus(fleet, deployed):
    """Each runs as its own unit with its own files, CUDA_VISIBLE_DEVICES and cores; node3's one firewall table
    opens both API ports; A is not restarted; both are verified and answer by their served names. Fails if the
    second deployment's files or unit replaced the first's, or if node3's table closed one of them."""
    lab, inventory = fleet
    a_before = {node: started_at(lab, node) for node in A_NODES}
    share_node3(inventory)
    shared = play(fleet, "deploy.yml", timeout=2400)
    out = shared.stdout
    verified = re.findall(r"vLLM runs as planned: (\S+ \(\S+\)) TP=(\d) .*? on ([\w, -]+)", out)
    assert ("single (mp)", "1", B_NODE) in verified and ("single (mp)", "1", C_HOST) in verified, verified
    assert {node: started_at(lab, node) for node in A_NODES} == a_before, "A was restarted"
    units = {B: f"vllm-{B}.service", C: f"vllm-{C}.service"}
    for name, unit in units.items():
        assert lab.ssh(B_NODE, f"systemctl is-active {unit}", check=False).stdout.strip() == "active", unit
        env = lab.ssh(B_NODE, f"cat /etc/vllm-cluster/deployments/{name}/vllm.env").stdout
        gpu = "0" if name == B else "1"
        assert f'CUDA_VISIBLE_DEVICES="{gpu}"' in env and f'VLLM_CPU_OMP_THREADS_BIND="{gpu}"' in env, env
    assert lab.ssh(B_NODE, "systemctl is-active vllm.service", check=False).stdout.strip() in ("inactive", "unknown")
    table = lab.ssh(B_NODE, "nft list table inet vllm_cluster").stdout
    assert "tcp dport 8000 ip saddr @api_v4 accept" in table and "tcp dport 8001 ip saddr @api_v4 accept" in table
    b = openai_completion(lab, B_NODE, B_SERVED)
    c = openai_completion(lab, B_NODE, C_SERVED, port=C_PORTS["api"])
    assert (b["models"], b["tokens"]) == ([B_SERVED], 4) and (c["models"], c["tokens"]) == ([C_SERVED], 4)
    again = play(fleet, "deploy.yml", timeout=1200)
    assert {host: c["changed"] for host, c in recap(again.stdout).items()} == {
        host: 0 for host in recap(again.stdout)}, again.stdout[-3000:]


@extended
def test_teardown_of_c_leaves_b_serving_on_the_same_node(fleet, deployed):
    lab, _ = fleet
    b_before = started_at(lab, B_NODE, f"vllm-{B}.service")
    play(fleet, "playbooks/teardown.yml", "-e", f"vllm_cluster_deployments={C}", timeout=900)
    assert lab.ssh(B_NODE, f"systemctl is-active vllm-{C}.service", check=False).stdout.strip() in (
        "inactive", "unknown")
    assert started_at(lab, B_NODE, f"vllm-{B}.service") == b_before
    assert openai_completion(lab, B_NODE, B_SERVED)["tokens"] == 4


def test_the_lab_is_left_as_test_deploy_leaves_it(fleet, deployed):
    """For the modules after this one: no vLLM anywhere, and the lab inventory's firewall (one deployment of
    three nodes, which allow each other) on every node."""
    lab, _ = fleet
    play(fleet, "playbooks/teardown.yml", timeout=900)
    lab.ansible_playbook("deploy.yml", "--tags", "firewall", timeout=900)
    for node in (*A_NODES, B_NODE):
        listed = lab.ssh(node, "systemctl list-units --state=active --no-legend --plain 'vllm*.service'", check=False)
        # vllm-cluster-firewall.service is the firewall's own unit (it stays); any other is a vLLM unit left running.
        active = [line.split()[0] for line in listed.stdout.splitlines()
                  if line.strip() and line.split()[0] != "vllm-cluster-firewall.service"]
        assert active == [], f"{node}: {listed.stdout}"
    assert "tcp dport 8001" not in lab.ssh(B_NODE, "nft list table inet vllm_cluster").stdout
