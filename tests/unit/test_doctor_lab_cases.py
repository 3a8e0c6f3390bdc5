"""Failures reproduced for real on the lab, replayed offline: the evidence doctor.yml saved, diagnosed again.

Each file of tests/fixtures/doctor/lab/cases is the doctor-evidence.json that
doctor.yml wrote on the lab while that fault was in place (cases.source.txt
says how each was made). tests/lab/test_doctor.py makes them again on a fresh
lab; this test keeps the catalog honest against them in every unit run, and
runs the controller CLI (roles/doctor/files/vllm_doctor.py) exactly as the
playbook does.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import diagnosis
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.catalog import load_catalog_file
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import evidence_from_registered

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "fixtures" / "doctor" / "lab" / "cases"
CATALOG_FILE = REPO / "roles" / "doctor" / "files" / "signatures.yml"
CATALOG = load_catalog_file(CATALOG_FILE)
# The CLI as the playbook runs it: from inside the collection tree (collections/ansible_collections/...).
CLI = REPO / "collections" / "ansible_collections" / "vllm_ops" / "cluster" / "roles" / "doctor" / "files" / "vllm_doctor.py"


def diagnose(case):
    data = json.loads((CASES / f"{case}.json").read_text(encoding="utf-8"))
    hosts = [{"host": h, "gather": g, "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    return diagnosis.diagnose(CATALOG, evidence_from_registered(data["plan"], hosts))


def faults(report):
    return [f for f in report["findings"] if f["severity"] == "fault"]


def text(finding):
    return "\n".join(f"{item['node']} [{item['source']}] {item['line']}" for item in finding["evidence"])


def test_every_case_has_a_source_entry():
    sources = (CASES / "cases.source.txt").read_text(encoding="utf-8")
    for path in CASES.glob("*.json"):
        assert f"{path.name}:" in sources, f"{path.name} is not described in cases.source.txt"


def test_healthy_deployment_has_no_fault():
    report = diagnose("healthy")
    assert report["faults"] == 0
    assert [f["id"] for f in report["findings"]] == ["tp_across_nodes"]


@pytest.mark.parametrize(
    ("case", "expected", "nodes", "quoted"),
    [
        ("port-conflict", "port_in_use", ["node1"], "OSError: [Errno 98] Address already in use"),
        ("heads-not-divisible", "heads_not_divisible", ["node1", "node2"],
         "Total number of attention heads (4) must be divisible by tensor parallel size (6)"),
        ("model-missing", "model_missing", ["node2"], "/srv/models/tiny-llama: no such file or directory on node2"),
        ("rendezvous-port-blocked", "rendezvous_port_blocked", ["node1", "node2"],
         "(master): timeout after"),
        ("gloo-wrong-nic", "socket_ifname_wrong_nic", ["node1", "node2"], "GLOO_SOCKET_IFNAME=eth0  <- expected eth1"),
        ("gpu-squatter", "gpu_held_by_foreign_process", ["node1"], "belongs to no deployment unit"),
        ("ray-worker-stopped", "ray_worker_stopped", ["node2"], "Stopping ray-worker.service"),
        ("ray-version-mismatch", "ray_version_mismatch", ["node2"],
         "Version mismatch: The cluster was started with: | Ray: 2.60.0"),
    ],
)
def test_the_real_fault_is_the_top_finding(case, expected, nodes, quoted):
    report = diagnose(case)
    top = faults(report)[0]
    assert top["id"] == expected, [f["id"] for f in report["findings"]]
    assert top["nodes"] == nodes
    assert quoted in text(top)
    for finding in report["findings"]:
        assert "{" not in finding["title"] + finding["cause"] + finding["fix"], finding["id"]


def test_consequences_are_ranked_after_their_cause():
    report = diagnose("port-conflict")
    ids = [f["id"] for f in report["findings"]]
    assert ids.index("port_in_use") < ids.index("unit_failed")
    failed = next(f for f in report["findings"] if f["id"] == "unit_failed")
    assert failed["explained_by"] == ["port_in_use"]


def test_the_unit_override_is_reported_with_its_drop_in():
    report = diagnose("heads-not-divisible")
    drift = next(f for f in report["findings"] if f["id"] == "unit_drifted_from_plan")
    assert "--tensor-parallel-size 6 (plan: 2)" in drift["cause"]
    assert "/etc/systemd/system/vllm.service.d/tp.conf" in drift["cause"]
    assert drift["explained_by"] == ["heads_not_divisible"]


def test_the_cli_diagnoses_saved_evidence_as_the_playbook_runs_it(tmp_path):
    markdown, report_json = tmp_path / "doctor.md", tmp_path / "doctor.json"
    proc = subprocess.run(
        [sys.executable, str(CLI), "diagnose", "--catalog", str(CATALOG_FILE), "--evidence",
         str(CASES / "model-missing.json"), "--markdown", str(markdown), "--json", str(report_json)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["faults"] >= 1 and summary["top"]["id"] == "model_missing"
    assert summary["lines"][0].startswith("vllm-cluster doctor: deployment lab-tiny-llama")
    assert "## 1. The model directory /srv/models/tiny-llama is missing on node2" in markdown.read_text()
    assert json.loads(report_json.read_text())["findings"][0]["id"] == "model_missing"


def test_an_unreachable_node_is_the_first_finding_and_the_rest_is_still_diagnosed():
    data = json.loads((CASES / "model-missing.json").read_text(encoding="utf-8"))
    # What Ansible registers for a host it cannot reach (ignore_unreachable: true).
    unreachable = {"unreachable": True, "changed": False,
                   "msg": "Failed to connect to the host via ssh: ssh: connect to host 10.231.4.12 port 22: "
                          "No route to host"}
    hosts = [{"host": h, "gather": g, "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    hosts[1].update(gather=unreachable, gpu=unreachable, ib=unreachable)
    report = diagnosis.diagnose(CATALOG, evidence_from_registered(data["plan"], hosts))
    first = report["findings"][0]
    assert first["id"] == "node_unreachable" and first["nodes"] == ["node2"]
    assert "No route to host" in first["evidence"][0]["line"]
    assert report["unreachable"] == ["node2"]


def test_a_gather_that_failed_on_a_node_is_recorded_not_fatal():
    data = json.loads((CASES / "healthy.json").read_text(encoding="utf-8"))
    hosts = [{"host": h, "gather": g, "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    hosts[0]["gpu"] = {"failed": True, "msg": "host node1: 'nvidia-smi -q -x' exited with 9: NVIDIA-SMI has failed"}
    evidence = evidence_from_registered(data["plan"], hosts)
    assert evidence["nodes"]["node1"]["gpu"] == {"error": hosts[0]["gpu"]["msg"]}
    assert diagnosis.diagnose(CATALOG, evidence)["faults"] == 0


def test_a_deployment_that_shares_machines_is_told_its_own_unit():
    """A deployment on a shared machine runs vllm-<deployment>.service (plan service.unit): doctor_gather reads it
    under the catalog's name vllm.service, and every command of the report names the real unit. Fails if a fix
    told the operator to restart vllm.service, which on that machine is no unit at all (or another's)."""
    data = json.loads((CASES / "port-conflict.json").read_text(encoding="utf-8"))
    data["plan"]["service"] = {"unit": "vllm-lab-b.service", "config_dir": "/etc/vllm-cluster/deployments/lab-b"}
    hosts = [{"host": h, "gather": g, "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    report = diagnosis.diagnose(CATALOG, evidence_from_registered(data["plan"], hosts))
    first = faults(report)[0]
    assert first["id"] == "port_in_use"
    written = [f[key] for f in report["findings"] for key in ("title", "cause", "fix", "verify")]
    assert any("vllm-lab-b.service" in text for text in written)
    assert not any("vllm.service" in text.replace("vllm-lab-b.service", "") for text in written), written
