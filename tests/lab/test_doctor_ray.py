"""The doctor's Ray findings under a live vLLM on Ray (issue 24): each fault injected for real, each first-ranked.

The shared lab deployed as tests/lab/test_ray_backend.py deploys it: 2-node TP=2
over Ray (the Ray head and vllm serve on node1, a Ray worker on node2, one
logical GPU a node), answering completions. Then, one at a time, with vLLM
serving when the fault comes:

a) the Ray worker node lost under vLLM (ray-worker.service stopped on node2);
b) a Ray version that differs on one node (another Ray of the lab's wheelhouse
   installed into node2's runtime venv, its Ray worker restarted: Ray refuses it);
c) a placement group that cannot be placed (node2's Ray worker restarted by a
   drop-in with --num-gpus 0 where the plan gives 1; vLLM restarted, its
   placement group pending).

doctor.yml runs with the fault in place; the test asserts the top fault, its
node and the words of its fix, saves what the doctor read (ray/<case>/ under the
results, and under $VLLM_CLUSTER_RAY_CAPTURE when set: tests/fixtures/doctor/ray/
comes from there, replayed offline by tests/unit/test_doctor_ray_live.py), then
removes the fault and requires a completion before the next one. At the end the
lab's own deployment (mp TP=2) comes back, as test_ray_backend.py leaves it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import RAY_CLI_ENV

# Outside CI's time budget (deploy, three faults each with a vLLM restart): scripts/test --extended runs it.
pytestmark = [pytest.mark.lab_extended, pytest.mark.lab, pytest.mark.timeout(7200)]
REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT = "lab-tiny-llama"
VENV = "/opt/vllm-cluster/venv"
RAY = f"{RAY_CLI_ENV} {VENV}/bin/ray"
OTHER_RAY = "2.59.0"  # a Ray of the lab's wheelhouse other than the runtime's pin (as test_doctor.py uses)
RAY_DEPLOYED = next(line.split("==", 1)[1].strip() for line in (REPO / "requirements" / "runtime.lock")
                    .read_text().splitlines() if line.startswith("ray=="))
WHEEL = "/srv/wheelhouse/ray-{version}-cp311-cp311-manylinux2014_x86_64.whl"
PIP_INSTALL = f"{VENV}/bin/python -m pip install --no-index --no-deps --force-reinstall --quiet"
DROPIN = "/etc/systemd/system/ray-worker.service.d/50-gpus.conf"
# As tests/lab/test_ray_backend.py: JSON, so that the planner gets typed values.
RAY_TP2 = ["-e", json.dumps({"vllm_cluster_backend": "ray", "vllm_cluster_cpu_ray_support": True,
                             "ray_cluster_object_store_memory": 500000000})]
HEALTHY_BOUND_S = 900
# Bounded: the same small profile for both stages (a stage under another profile is refused).
BENCH_PROFILE = ["-e", json.dumps({"vllm_benchmark_profile": {
    "input_len": 64, "output_len": 32, "num_prompts": 16, "request_rate": "inf", "max_concurrency": 4, "seed": 0,
    "num_warmups": 2}})]


@dataclass
class RayFault:
    name: str
    node: str
    inject: str
    restore: str
    expect: tuple[str, ...]
    fix_words: tuple[str, ...]
    symptom: tuple[str, str, str]  # (node, unit, words) awaited in that unit's journal after the injection
    restart_vllm: bool = False  # vLLM restarted with the fault in place (its placement group is made at start)


FAULTS = [
    RayFault("ray_worker_lost_under_vllm", "node2",
             "systemctl stop ray-worker.service",
             "systemctl start ray-worker.service",
             ("ray_worker_stopped",), ("systemctl start ray-worker.service",),
             ("node2", "ray-worker.service", "Stopping ray-worker.service")),
    RayFault("ray_version_differs_on_one_node", "node2",
             f"{PIP_INSTALL} {WHEEL.format(version=OTHER_RAY)} && systemctl restart --no-block ray-worker.service",
             f"{VENV}/bin/python -c 'import ray; print(ray.__version__)' | grep -qx {RAY_DEPLOYED} || "
             f"{PIP_INSTALL} {WHEEL.format(version=RAY_DEPLOYED)}; systemctl restart ray-worker.service",
             ("ray_version_mismatch",), ("runtime.yml",),
             ("node2", "ray-worker.service", "Version mismatch")),
    RayFault("placement_group_cannot_be_placed", "node2",
             f"mkdir -p {os.path.dirname(DROPIN)} && {{ echo '[Service]'; echo 'ExecStart='; "
             "grep '^ExecStart=' /etc/systemd/system/ray-worker.service | sed 's/--num-gpus 1/--num-gpus 0/'; } "
             f"> {DROPIN} && systemctl daemon-reload && systemctl restart ray-worker.service",
             f"rm -f {DROPIN} && systemctl daemon-reload && systemctl restart ray-worker.service",
             ("ray_gpus_below_plan",), ("--num-gpus 1", "50-gpus.conf", "ray.yml"),
             ("node1", "vllm.service", "Waiting for creating a placement group"), restart_vllm=True),
    # Ray's own failure, read from its session logs: the raylet cannot bind its node manager port (6380, the
    # role's default) because another process holds it; Ray itself prints only a registration timeout.
    RayFault("ray_port_taken_on_one_node", "node2",
             "systemctl stop ray-worker.service && systemd-run --unit=doctor-ray-port-holder python3 -c "
             "'import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
             "s.bind((\"0.0.0.0\", 6380)); s.listen(); time.sleep(3600)' && sleep 1 && "
             "systemctl start --no-block ray-worker.service",
             "systemctl stop doctor-ray-port-holder.service; systemctl restart ray-worker.service",
             ("port_in_use",), ("port 6380",),
             ("node2", "ray-worker.service", "Failed to get node info")),
]
HEALTHY = RayFault("healthy", "", "", "", (), (), ("", "", ""))


@pytest.fixture(scope="module")
def results(lab_results):
    return lab_results


@pytest.fixture(scope="module")
def module_state():
    return {"mp_back": False}


@pytest.fixture(scope="module")
def ray_deployed(shared_lab, tiny_model, module_state):
    """TP=2 over Ray, answering; at the end every fault removed and the lab's own mp deployment back."""
    lab = shared_lab
    started = time.monotonic()
    lab.ansible_playbook("deploy.yml", *RAY_TP2, timeout=3000)
    print(f"deploy.yml (TP=2 over Ray) took {time.monotonic() - started:.0f} s")
    yield lab
    for fault in FAULTS:
        lab.ssh(fault.node, fault.restore, check=False, timeout=600)
    if not module_state["mp_back"]:
        back_to_mp(lab)


def back_to_mp(lab):
    """The lab's own deployment (mp TP=2), no Ray unit left: what the next module of the run expects."""
    lab.ansible_playbook("playbooks/teardown.yml", *RAY_TP2, timeout=900)
    return lab.ansible_playbook("deploy.yml", timeout=2400)


def complete(lab, timeout=60):
    body = json.dumps({"model": DEPLOYMENT, "prompt": "Hello", "max_tokens": 2, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://{lab.management_address('node1')}:8000/v1/completions", data=body,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {lab.api_key}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def answers(lab):
    try:
        return complete(lab)["usage"]["completion_tokens"] >= 1
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return False


def wait_for(what, predicate, timeout, every=5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def now(lab, node):
    return int(lab.ssh(node, "date +%s").stdout.strip())


def journal_since(lab, node, unit, since):
    return lab.ssh(node, f"journalctl -u {unit} --since @{since} --no-pager -o cat", check=False).stdout


def ray_gpus(lab):
    """{address: GPUs} of the ALIVE nodes in the head's state API."""
    head = lab.fabric_address("node1")
    out = lab.ssh("node1", f"cd / && {RAY} list nodes --detail --format json --address http://{head}:8265",
                  check=False).stdout
    try:
        nodes = json.loads(out[out.index("["):])
    except ValueError:
        return {}
    return {n["node_ip"]: n["resources_total"].get("GPU", 0) for n in nodes if n["state"] == "ALIVE"}


def restart_vllm(lab):
    lab.ssh("node1", "systemctl reset-failed vllm.service; systemctl restart --no-block vllm.service")


def back_to_healthy(lab, fault):
    """The fault removed, both Ray nodes ALIVE with their GPU, vLLM restarted on them and answering."""
    lab.ssh(fault.node, fault.restore, timeout=600)
    planned = {lab.fabric_address("node1"): 1.0, lab.fabric_address("node2"): 1.0}
    wait_for("both Ray nodes ALIVE with one GPU each", lambda: ray_gpus(lab) == planned, timeout=300)
    restart_vllm(lab)  # its Ray workers died with the fault: a new engine, a new placement group
    wait_for("a completion after the fault", lambda: answers(lab), timeout=HEALTHY_BOUND_S, every=10)


def save_capture(results, fault, lab):
    source = results / DEPLOYMENT / "doctor-evidence.json"
    text = source.read_text(encoding="utf-8")
    assert lab.api_key not in text, "the API key must never reach the evidence"
    targets = [results / "ray" / fault.name]
    if os.environ.get("VLLM_CLUSTER_RAY_CAPTURE"):
        targets.append(Path(os.environ["VLLM_CLUSTER_RAY_CAPTURE"]) / fault.name)
    expected = {"fault": fault.name, "node": fault.node, "expect": list(fault.expect),
                "fix_words": list(fault.fix_words), "inject": fault.inject or "none"}
    for target in targets:
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target / "doctor-evidence.json")
        (target / "expected.json").write_text(json.dumps(expected, indent=1) + "\n", encoding="utf-8")


def run_doctor(lab, results):
    started = time.monotonic()
    proc = lab.ansible_playbook("playbooks/doctor.yml", *RAY_TP2, "-e", f"doctor_results_dir={results}",
                                "-e", "doctor_client_timeout_s=10", check=False, timeout=900)
    report = json.loads((results / DEPLOYMENT / "doctor.json").read_text(encoding="utf-8"))
    return proc, report, time.monotonic() - started


def test_the_healthy_vllm_on_ray_has_no_fault(ray_deployed, results):
    lab = ray_deployed
    wait_for("a completion from vLLM on Ray", lambda: answers(lab), timeout=HEALTHY_BOUND_S, every=10)
    proc, report, elapsed = run_doctor(lab, results)
    save_capture(results, HEALTHY, lab)
    print(f"healthy: doctor.yml exit {proc.returncode} in {elapsed:.0f} s; "
          f"findings {[(f['id'], f['severity'], f['nodes']) for f in report['findings']]}")
    assert report["faults"] == 0, report["findings"]
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_the_checklist_s_ray_items_pass_on_vllm_on_ray(ray_deployed, results):
    """Ray's nodes and GPUs as planned, vLLM's workers as Ray actors on the planned nodes (Ray's state API)."""
    lab = ray_deployed
    lab.ansible_playbook("playbooks/checklist.yml", *RAY_TP2, "-e", f"doctor_results_dir={results}", check=False,
                         timeout=900)
    checklist = json.loads((results / DEPLOYMENT / "checklist.json").read_text(encoding="utf-8"))
    items = {item["id"]: item for item in checklist["items"]}
    print({key: (item["status"], item["evidence"]) for key, item in items.items() if key in ("ray_cluster",
                                                                                             "rank_layout")})
    assert items["ray_cluster"]["status"] == "pass", items["ray_cluster"]
    assert f"{lab.fabric_address('node2')}: ALIVE, GPU 1.0" in items["ray_cluster"]["evidence"]
    assert items["rank_layout"]["status"] == "pass", items["rank_layout"]
    layout = "\n".join(items["rank_layout"]["evidence"])
    assert "node2: Ray workers (ranks) expected 1, found 1" in layout, layout
    assert "node1: Ray workers (ranks) expected 0, found 0" in layout, layout


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_a_ray_fault_under_a_live_vllm_is_the_top_finding_on_its_node(ray_deployed, results, fault):
    lab = ray_deployed
    wait_for("a completion before the fault", lambda: answers(lab), timeout=HEALTHY_BOUND_S, every=10)
    symptom_node, unit, words = fault.symptom
    since = now(lab, symptom_node)
    try:
        lab.ssh(fault.node, fault.inject, timeout=600)
        if fault.restart_vllm:
            restart_vllm(lab)
        wait_for(f"'{words}' in {symptom_node}'s {unit} journal",
                 lambda: words in journal_since(lab, symptom_node, unit, since), timeout=600)
        proc, report, elapsed = run_doctor(lab, results)
        save_capture(results, fault, lab)
        findings = [(f["id"], f["severity"], f["nodes"]) for f in report["findings"]]
        print(f"{fault.name}: doctor.yml exit {proc.returncode} in {elapsed:.0f} s; findings {findings}")
        assert proc.returncode != 0, "the doctor must fail on a fault"
        faults = [f for f in report["findings"] if f["severity"] == "fault"]
        assert faults, findings
        top = faults[0]
        assert top["id"] in fault.expect, findings
        assert top["nodes"] == [fault.node], findings
        for word in fault.fix_words:
            assert word in top["fix"], top["fix"]
        if fault.name == "ray_port_taken_on_one_node":
            # the session logs read on the node: the restarted raylet's own bind failure is quoted
            quoted = [e["line"] for f in report["findings"] for e in f["evidence"] if e["source"].startswith("ray log ")]
            assert any("6380" in line for line in quoted), report["findings"]
    finally:
        back_to_healthy(lab, fault)
    assert complete(lab)["usage"]["completion_tokens"] >= 1


def bench(lab, results, *args):
    started = time.monotonic()
    proc = lab.ansible_playbook("playbooks/benchmark.yml", "-e", f"vllm_benchmark_results_dir={results}",
                                *BENCH_PROFILE, *args, timeout=1200)
    print(f"benchmark.yml {' '.join(args)} took {time.monotonic() - started:.0f} s")
    return proc


def test_the_ray_layout_is_a_benchmark_stage_beside_the_mp_one(ray_deployed, results, module_state):
    """TP=2 over Ray benchmarked (stage tp2-2nodes-ray), then the lab's mp TP=2 (tp2-2nodes, the reference the
    report compares with); the report shows both stages."""
    lab = ray_deployed
    wait_for("a completion from vLLM on Ray", lambda: answers(lab), timeout=HEALTHY_BOUND_S, every=10)
    bench(lab, results, *RAY_TP2)
    ray_stage = json.loads((results / DEPLOYMENT / "tp2-2nodes-ray.json").read_text(encoding="utf-8"))
    assert ray_stage["plan"]["backend"] == "ray"
    metrics = ray_stage["result"]
    assert metrics["completed"] == 16 and not metrics.get("failed"), metrics
    mp = back_to_mp(lab)
    module_state["mp_back"] = True
    assert "vLLM runs as planned: tp (mp) TP=2" in mp.stdout
    bench(lab, results, "-e", "vllm_benchmark_baseline_stage=tp2-2nodes")
    report = (results / DEPLOYMENT / "report.md").read_text(encoding="utf-8")
    print(report[:3000])
    assert "### tp2-2nodes-ray:" in report and "### tp2-2nodes:" in report, report[:2000]
    assert "TP=2, 2 CPU workers on 2 nodes over Ray" in report
    rows = [line for line in report.splitlines() if line.startswith("| tp2-2nodes")]
    assert len(rows) >= 2, rows
