"""After nccl_network converged: the env file on each node, read back over SSH, and nothing left running.

testinfra over SSH (the lab's inventory); every test runs once per node.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

ENV_FILE = "/etc/vllm-cluster/env"
PROBE_SCRIPT = Path(__file__).resolve().parents[3] / "roles" / "nccl_network" / "files" / "nccl_probe.py"


def env_of(host) -> dict[str, str]:
    lines = host.file(ENV_FILE).content_string.splitlines()
    pairs = [line.split("=", 1) for line in lines if line and not line.startswith("#")]
    return {key: shlex.split(value)[0] if value else "" for key, value in pairs}


def fabric_address(host) -> str:
    # The address as the kernel reports it, not as Ansible's facts do.
    out = host.check_output("ip -4 -o addr show dev eth1")
    return out.split()[3].split("/")[0]


def test_env_file_is_root_owned_and_readable(host):
    env_file = host.file(ENV_FILE)
    assert env_file.is_file
    assert (env_file.user, env_file.group, env_file.mode) == ("root", "root", 0o644)
    assert env_file.content_string.startswith("#\n# Ansible managed")


def test_every_variable_points_at_the_fabric_interface(host):
    env = env_of(host)
    assert env["VLLM_HOST_IP"] == fabric_address(host)
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "eth1"


def test_the_host_ip_is_not_the_management_address(host):
    management = host.check_output("ip -4 -o addr show dev eth0").split()[3].split("/")[0]
    assert env_of(host)["VLLM_HOST_IP"] != management


def test_without_declared_hcas_nccl_does_not_probe_infiniband(host):
    env = env_of(host)
    assert env["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_HCA" not in env


def test_no_port_listener_is_left_running(host):
    assert host.run("pgrep -f vllm-cluster-port-probe").rc == 1
    listening = host.check_output("ss -Hltn")
    assert f"{fabric_address(host)}:29501 " not in listening
    assert host.run("ss -Hlun").stdout.count(":29597 ") == 0


def test_the_probe_script_is_the_roles_own(host):
    installed = host.file("/usr/local/libexec/vllm-cluster/nccl_probe.py")
    assert installed.mode == 0o755
    assert installed.sha256sum == hashlib.sha256(PROBE_SCRIPT.read_bytes()).hexdigest()
