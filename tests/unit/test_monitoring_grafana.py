"""Role vllm_monitoring's Grafana phase (tasks/grafana.yml) without a Grafana: no Grafana can be installed here
(not in Debian, not on the package index), so this runs the phase for real against a loopback port where nothing
listens. What it proves: the community.grafana modules are found and accept every option the role passes (a
misspelt option fails with "Unsupported parameters" before any connection), the phase runs once on the controller,
it stops at the first task, which asked the named URL, and the token appears nowhere in Ansible's output, also
at -vvv. What it cannot prove: that a real Grafana takes the data source and the dashboards (docs/monitoring.md).
"""

from __future__ import annotations

import os
import socket
import subprocess

from test_facts_modules import REPO

TOKEN = "glsa_NOT-A-REAL-TOKEN-0123456789"


def closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_grafana_phase_reaches_for_the_named_grafana_and_never_prints_its_token(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}"
    (tmp_path / "inventory.yml").write_text(
        "all:\n  hosts:\n    mon1: {ansible_connection: local, ansible_python_interpreter: " + os.sys.executable + "}\n")
    (tmp_path / "play.yml").write_text(f"""
- hosts: mon1
  gather_facts: false
  vars:
    __vllm_monitoring_address: 10.232.2.11
  tasks:
    - ansible.builtin.include_role:
        name: vllm_ops.cluster.vllm_monitoring
        tasks_from: grafana.yml
      vars:
        vllm_monitoring_grafana_url: "{url}"
        vllm_monitoring_grafana_token: "{TOKEN}"
""")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="false",
               PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}")
    run = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"),
                          str(tmp_path / "play.yml"), "-vvv"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=REPO, check=False)
    output = run.stdout + run.stderr
    assert run.returncode == 2, output[-3000:]
    assert "Unsupported parameters" not in output and "couldn't resolve module" not in output, output[-3000:]
    assert "Put this Prometheus into Grafana as a data source" in output
    # community.grafana's words for "nothing answered" (HTTP -1), on the data source the role names.
    assert "Grafana API answered with HTTP -1 for url /api/datasources/name/vllm-cluster-prometheus" in output, (
        output[-3000:])
    assert "Put the dashboards into Grafana" not in output  # stopped at the first task
    assert TOKEN not in output
