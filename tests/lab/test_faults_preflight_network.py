"""gpu_preflight and nccl_network on a real 3-node lab: check mode on a converged lab, then injected faults.

Each fault is injected into the running lab (`lab hw set`, an nftables rule in
one node, an inventory override), the playbook runs as an operator would run
it, and the failure must name the node (or pair of nodes) and the value. Every
test puts the lab back as it found it, even when it fails.
"""

from __future__ import annotations

import contextlib
import re

import pytest

pytestmark = pytest.mark.lab
LAB_NAME = "tprenet"
LAB_NODES = 3
PLAYBOOK_TIMEOUT_S = 600
# The captured H200 node the lab replays (tests/fixtures/gpu/h200x2).
CAPTURE_DRIVER = "580.159.04"
CAPTURE_GPUS = 2


def run(lab, playbook: str, *args: str):
    """ansible-playbook on the lab's inventory; args may name more playbooks, run in the same process."""
    proc = lab.ansible_playbook(playbook, *args, check=False, timeout=PLAYBOOK_TIMEOUT_S)
    return proc, proc.stdout + proc.stderr


def expect_failure(lab, playbook: str, *args: str) -> str:
    proc, output = run(lab, playbook, *args)
    assert proc.returncode == 2, f"expected the play to fail (rc 2), got {proc.returncode}:\n{output[-6000:]}"
    return output


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counters per host."""
    rows = re.findall(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", output, flags=re.MULTILINE)
    return {host: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counters)} for host, counters in rows}


@contextlib.contextmanager
def hardware(lab, node: str, **keys):
    lab.hw_set(node, **keys)
    try:
        yield
    finally:
        lab.hw_reset(node)


@pytest.fixture(scope="module")
def converged(lab):
    """Both playbooks applied once to the fresh lab (one run): the state the fault tests start from."""
    proc, output = run(lab, "playbooks/preflight.yml", "playbooks/network.yml")
    assert proc.returncode == 0, f"preflight + network failed on a healthy lab:\n{output[-8000:]}"
    assert all(c["changed"] > 0 for c in recap(proc.stdout).values()), "the first run wrote the env file"
    return lab


def test_check_diff_on_the_converged_lab_reports_no_change(converged):
    lab = converged
    proc, output = run(lab, "playbooks/preflight.yml", "playbooks/network.yml", "--check", "--diff")
    assert proc.returncode == 0, output[-8000:]
    counters = recap(proc.stdout)
    assert set(counters) == set(lab.nodes), proc.stdout[-3000:]
    assert {host: c["changed"] for host, c in counters.items()} == dict.fromkeys(lab.nodes, 0)
    assert all(c["failed"] == 0 and c["unreachable"] == 0 for c in counters.values())
    assert "--- before" not in proc.stdout  # no diff shown: nothing would change


def test_driver_version_on_one_node(converged):
    lab = converged
    with hardware(lab, "node2", driver_version="575.57.08"):
        output = expect_failure(lab, "playbooks/preflight.yml")
    assert "nodes at fault: node2)" in output
    assert f"driver version differs: node2 has 575.57.08, while node1, node3 have {CAPTURE_DRIVER}" in output


def test_gpu_count_on_one_node(converged):
    lab = converged
    with hardware(lab, "node3", gpu_count=1):
        output = expect_failure(lab, "playbooks/preflight.yml")
    assert f"GPU count differs: node3 has 1, while node1, node2 have {CAPTURE_GPUS}" in output


def test_foreign_process_holding_a_gpu(converged):
    lab = converged
    pid = lab.ssh("node1", "setsid sleep 300 </dev/vlab-gpu0 >/dev/null 2>&1 & echo $!").stdout.strip()
    try:
        output = expect_failure(lab, "playbooks/preflight.yml")
    finally:
        lab.ssh("node1", f"kill {pid}")
    assert re.search(rf"processes of others holding GPUs: expected none; node1 has pid {pid} sleep "
                     r"\(user root, unit [\w.@-]+, \d+ MiB\) on GPU0", output), output[-4000:]


def test_infiniband_port_down(converged):
    lab = converged
    declared = '{"vllm_cluster_ib_hcas": ["mlx5_0", "mlx5_1"]}'
    with hardware(lab, "node2", ib_port__mlx5_1="Down/Polling"):
        output = expect_failure(lab, "playbooks/network.yml", "-e", declared)
    assert "InfiniBand check failed on 1 port:" in output
    assert "node2: mlx5_1/1 is Down/Polling; expected Active/LinkUp" in output
    # Nothing was written: the check runs before the env file.
    assert "NCCL_IB_HCA" not in lab.ssh("node2", "cat /etc/vllm-cluster/env").stdout


def test_mtu_differs_on_one_node(converged):
    lab = converged
    with hardware(lab, "node3", fabric_mtu=1500):
        output = expect_failure(lab, "playbooks/network.yml")
    assert "fabric MTU mismatch: expected 9000 (the MTU of the first node, node1); node3 (eth1) has 1500" in output


def test_blocked_fabric_port_between_two_nodes(converged):
    lab = converged
    rule = ("nft add table inet vlabfault && "
            "nft add chain inet vlabfault input '{ type filter hook input priority 0; }' && "
            "nft add rule inet vlabfault input iifname eth1 tcp dport 29501 drop")
    lab.ssh("node2", rule)
    try:
        output = expect_failure(lab, "playbooks/network.yml")
    finally:
        lab.ssh("node2", "nft delete table inet vlabfault")
    address = lab.fabric_address("node2")
    for source in ("node1", "node3"):
        assert re.search(rf"^{source}\s+node2\s+{re.escape(address)}:29501 \(master\)\s+eth1 -> eth1\s+timed out",
                         output, flags=re.MULTILINE), output[-4000:]
    assert "fabric reachability failed for 2 of" in output
    assert "every node fails to reach node2 on port 29501" in output
    # The listeners were stopped although the play failed.
    for node in lab.nodes:
        assert lab.ssh(node, "pgrep -f vllm-cluster-port-probe", check=False).returncode == 1


def test_wrong_fabric_interface_name(converged):
    lab = converged
    output = expect_failure(lab, "playbooks/network.yml", "-e", "vllm_cluster_fabric_interface=eth9")
    for node in lab.nodes:
        assert f"{node}: fabric interface 'eth9' does not exist; interfaces on {node}: eth0, eth1, lo" in output
