"""playbooks/teardown.yml on the lab's own deployment: vLLM stopped and removed, the runtime and the plan kept.

It runs once the modules that need the default deployment serving are done (tests/lab/lab_order.py: after
test_doctor and test_fleet, before the front family, whose first deploy.yml then starts on nodes that serve
nothing), so that no later module pays a vLLM start for it. What would make it fail: a --check that stops
vLLM, a unit, environment, key or plan left behind, the runtime or the converged stamps of the stages
before vllm removed, the previous plan not kept for doctor.yml, a second teardown that changes something.
Extended (77 s in a clean-clone CI run): in CI, test_monitoring's last test runs teardown.yml on the front's
three replicas, the router and Prometheus.
"""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.lab_extended, pytest.mark.timeout(2400)]

VENV = "/opt/vllm-cluster/venv"
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def changed(output: str) -> dict[str, int]:
    return {host: int(count) for host, _, count, _, _ in RECAP.findall(output)}


def unit_active(lab, node: str) -> str:
    return lab.ssh(node, "systemctl is-active vllm.service", check=False).stdout.strip()


@pytest.fixture(scope="module")
def deployed(shared_lab, tiny_model):
    """The lab's own deployment serving (deploy.yml: a no-op when the module before left it so)."""
    shared_lab.ansible_playbook("deploy.yml", timeout=2400)
    return shared_lab


def test_teardown_stops_vllm_and_keeps_the_runtime_and_the_plan(deployed):
    lab = deployed
    deployment = json.loads(lab.ssh("node1", "cat /etc/vllm-cluster/plan.json").stdout)["deployment"]
    dry = lab.ansible_playbook("playbooks/teardown.yml", "--check", timeout=600)
    assert changed(dry.stdout)["node1"] > 0
    assert unit_active(lab, "node1") == "active", "teardown --check stopped vLLM"

    lab.ansible_playbook("playbooks/teardown.yml", timeout=900)
    for node in ("node1", "node2", "node3"):
        assert unit_active(lab, node) in ("inactive", "unknown"), node
        left = lab.ssh(node, "ls /etc/systemd/system/vllm.service /etc/vllm-cluster/vllm.env "
                             "/etc/vllm-cluster/api-key.env /etc/vllm-cluster/plan.json 2>/dev/null",
                       check=False).stdout.split()
        assert left == [], f"{node} keeps {left}"
        assert lab.ssh(node, f"test -x {VENV}/bin/vllm", check=False).returncode == 0, f"{node} lost the runtime"
        stamps = lab.ssh(node, "ls /etc/vllm-cluster/stages", check=False).stdout.split()
        assert stamps == ["firewall.json", "network.json", "preflight.json", "runtime.json"], f"{node}: {stamps}"
    for node in ("node1", "node2"):
        kept = json.loads(lab.ssh(node, "cat /etc/vllm-cluster/plan.previous.json").stdout)
        assert kept["deployment"] == deployment
    request = urllib.request.Request(f"http://{lab.management_address('node1')}:8000/health")
    with pytest.raises(OSError):
        urllib.request.urlopen(request, timeout=10)

    again = lab.ansible_playbook("playbooks/teardown.yml", timeout=600)
    assert changed(again.stdout) == {"node1": 0, "node2": 0, "node3": 0}
