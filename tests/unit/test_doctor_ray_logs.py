"""Ray's own start-up failures, read from Ray's session logs and the Ray units' journals; numbers from the log.

The Ray lines are real: Ray 2.60.0 (the project's pin) started on one machine with a port taken, an
address that is not the machine's, a head that does not run, and healthy (tests/fixtures/ray/logs,
README.source.txt says how), plus a public line of ray#31264 and the public excerpts of
tests/fixtures/doctor/public. Each case puts the lines where a node shows them (the Ray unit's journal, the
``ray_logs`` that doctor_gather reads from the session directory) on a planned 2-node Ray deployment
(test_doctor_public_logs.healthy_cluster) and checks the top finding, its node and the value it quotes.
"""

import copy
import os
import time
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.diagnosis import diagnose
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_ray import log_evidence
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import ray_logs
from ansible_collections.vllm_ops.cluster.plugins.modules import doctor_gather
from test_doctor_public_logs import CATALOG, PUBLIC, healthy_cluster, top, with_log

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "tests" / "fixtures" / "ray" / "logs"
# The address of the machine the captures were made on (Ray printed it as "Local node IP").
CAPTURED_IP = "192.0.2.2"


def lines(case, name):
    return (LOGS / case / name).read_text(encoding="utf-8").splitlines()


def ray_cluster(node_ips=None):
    """The planned Ray deployment, both nodes ALIVE in the head's list; node_ips: extra addresses on a node's NIC."""
    evidence = healthy_cluster("ray")
    for node, address in (node_ips or {}).items():
        evidence["nodes"][node]["gather"]["interfaces"]["eth1"]["addresses"].append(f"{address}/24")
    return evidence


def with_ray_failure(evidence, node, case, files, alive=False):
    """The capture's lines on ``node``: ``*.journal.txt`` as its Ray unit's journal, the rest as its Ray session logs;
    its Ray unit restarting and (unless ``alive``) the node gone from the head's list."""
    evidence = copy.deepcopy(evidence)
    gather = evidence["nodes"][node]["gather"]
    unit = "ray-head.service" if node == "node1" else "ray-worker.service"
    for name in files:
        if name.endswith(".journal.txt"):
            gather["journal"][unit] = lines(case, name)
        else:
            gather.setdefault("ray_logs", {"files": {}})["files"][name] = {"lines": lines(case, name)}
    gather["units"][unit].update(ActiveState="activating", SubState="auto-restart", Result="exit-code",
                                 ExecMainStatus="1", NRestarts="3")
    gather["unit_pids"][unit] = []
    if not alive:
        address = next(n["address"] for n in evidence["plan"]["nodes"] if n["host"] == node)
        head = evidence["nodes"]["node1"]["gather"]["ray"]
        head["nodes"] = [n for n in head["nodes"] if n["node_ip"] != address]
    return evidence


def finding(report, sig_id):
    found = [f for f in report["findings"] if f["id"] == sig_id]
    assert found, f"{sig_id} not among {[f['id'] for f in report['findings']]}"
    return found[0]


def without(sig_ids):
    return {**CATALOG, "signatures": [sig for sig in CATALOG["signatures"] if sig["id"] not in sig_ids]}


# --- the parser on real lines ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("case", "name", "port", "component"), [
    ("raylet-port-in-use", "raylet.err", "46380", "raylet"),
    ("raylet-port-in-use", "raylet.out", "46380", "raylet"),
    ("gcs-port-in-use", "gcs_server.err", "46379", "gcs_server"),
    # ray start quotes the GCS's error file in the unit's journal ("Failed to start GCS. Last 1 lines ...")
    ("gcs-port-in-use", "ray-head.journal.txt", "46379", "gcs_server"),
    ("dashboard-port-in-use", "ray-head.journal.txt", "46365", "dashboard"),
])
def test_the_port_a_ray_component_could_not_bind_is_read_from_its_log(case, name, port, component):
    found = [f for f in ray_logs.failures(lines(case, name), name) if f["kind"] == "port_in_use"]
    assert found, f"no port failure in {case}/{name}"
    assert {f["values"]["port"] for f in found} == {port}
    assert found[0]["values"]["component"] == component


def test_a_gcs_that_does_not_answer_is_read_with_its_address():
    found = ray_logs.failures(lines("worker-gcs-unreachable", "ray-worker.journal.txt"))
    gcs = [f for f in found if f["kind"] == "gcs_unreachable" and f["values"].get("address")]
    assert gcs[0]["values"] == {"address": CAPTURED_IP, "port": "46999", "seconds": "5", "what": "connect"}
    # a node that timed out registering is a failure to register, with no address
    registering = ray_logs.failures(lines("raylet-port-in-use", "ray-head.journal.txt"))
    assert {f["values"]["what"] for f in registering if f["kind"] == "gcs_unreachable"} == {"register"}
    # Ray's colour codes are gone from the node IP it printed
    assert {"kind": "local_ip", "values": {"address": CAPTURED_IP}}.items() <= \
        next(f for f in found if f["kind"] == "local_ip").items()


def test_the_versions_of_a_mismatch_are_read_from_the_lines_after_it():
    found = ray_logs.failures((PUBLIC / "gpustack1640-ray-version-mismatch.log").read_text().splitlines())
    assert found[0]["kind"] == "version_mismatch"
    assert found[0]["values"] == {"cluster_ray": "2.43.0", "cluster_python": "3.11.10", "address": "10.18.215.196",
                                  "node_ray": "2.44.1", "node_python": "3.11.10"}


def test_a_healthy_head_start_shows_no_failure():
    for name in ("ray-head.journal.txt", "raylet.out", "gcs_server.out"):
        kinds = {f["kind"] for f in ray_logs.failures(lines("healthy-head", name), name)}
        assert kinds <= {"local_ip"}, (name, kinds)


def test_the_tail_is_bounded_and_keeps_the_error_before_it():
    text = "\n".join(["[2026-12-05 12:37:40,172 C 6075 6075] (raylet) Check failed: bind"]
                     + [f"[2026-12-05 12:37:41,000 I 1 1] line {i}" for i in range(500)])
    kept = ray_logs.tail_lines(text.encode(), lines=10)
    assert kept[0].endswith("Check failed: bind") and len(kept) == 11 and kept[-1].endswith("line 499")
    # read from an offset: the broken first line is dropped
    assert ray_logs.tail_lines(b"artial line\nwhole line\n", lines=5, cut_head=True) == ["whole line"]


def test_the_files_read_are_the_daemons_then_the_newest_workers_since_the_start():
    entries = [("raylet.out", 100.0, 10), ("gcs_server.out", 100.0, 10), ("dashboard.log", 10.0, 5),
               ("worker-a-01000000-1.err", 101.0, 1), ("worker-b-01000000-2.err", 103.0, 1),
               ("python-core-worker-c_3.log", 102.0, 1), ("events", 100.0, 0)]
    assert ray_logs.select_files(entries, since=50.0, workers=2) == \
        ["raylet.out", "gcs_server.out", "worker-b-01000000-2.err", "python-core-worker-c_3.log"]


def test_a_daemon_started_again_in_the_session_is_read_from_its_newest_file():
    # A worker node's Ray restarted while the head runs joins the same session: Ray names the new raylet's logs
    # raylet.1.out, raylet.2.out (ray/_private/node.py, _make_inc_temp). Reading only raylet.out missed the
    # restarted raylet's port failure on the lab.
    entries = [("raylet.out", 100.0, 10), ("raylet.err", 100.0, 0), ("raylet.1.out", 200.0, 10),
               ("raylet.1.err", 200.0, 3), ("raylet.2.out", 300.0, 10), ("raylet.2.err", 300.0, 3),
               ("gcs_server.out", 100.0, 10), ("rayletx.out", 400.0, 1)]
    assert ray_logs.select_files(entries, since=250.0) == ["raylet.2.out", "raylet.2.err"]
    assert ray_logs.select_files(entries) == ["raylet.2.out", "raylet.2.err", "gcs_server.out"]


# --- the diagnosis: Ray's failure named, with the host and the value the log quotes --------------------------------

RAY_LOG_OBSERVATIONS = ("ray_port_in_use", "ray_gcs_unreachable", "ray_log_version_mismatch", "ray_node_ip_wrong")


def before_ray_logs():
    """The catalog as it was before it read Ray's own failures: no rule on them, ray_not_running on any failed Ray unit."""
    catalog = copy.deepcopy(CATALOG)
    for sig in catalog["signatures"]:
        sig["rules"] = [rule for rule in sig["rules"] if rule.get("observation") not in RAY_LOG_OBSERVATIONS]
        for rule in sig["rules"]:
            rule.get("params", {}).pop("never_ran", None)
    catalog["signatures"] = [sig for sig in catalog["signatures"] if sig["rules"]]
    return catalog


def raylet_port_taken():
    evidence = ray_cluster({"node1": CAPTURED_IP})
    evidence["plan"]["ports"]["ray_node_manager"] = 46380
    evidence["nodes"]["node1"]["gather"]["listening"] = [
        {"address": "0.0.0.0", "port": 46380, "processes": [{"name": "python3", "pid": 5071}], "line": "LISTEN"}]
    return with_ray_failure(evidence, "node1", "raylet-port-in-use", ["ray-head.journal.txt", "raylet.out", "raylet.err"])


def test_a_raylet_port_taken_is_named_with_the_port_and_the_plan_name_of_it():
    first, report = top(raylet_port_taken())
    assert (first["id"], first["nodes"]) == ("port_in_use", ["node1"])
    # the process that holds it now (ss) and the name the plan gives the port
    assert "Port 46380 (ray_node_manager) on node1" in first["title"]
    assert "python3 (pid 5071) listens on port 46380" in first["cause"]
    assert "holds port 46380" in first["fix"] and "sport = :46380" in first["verify"]
    assert any(item["source"].startswith("ray log raylet") for item in first["evidence"])
    # "Ray is not running, install Ray" is not said of a Ray that ran and failed
    assert "ray_not_running" not in [f["id"] for f in report["findings"]]


def test_the_raylets_own_log_names_the_port_and_who_holds_it_is_not_needed():
    evidence = with_ray_failure(ray_cluster({"node1": CAPTURED_IP}), "node1", "raylet-port-in-use",
                                ["ray-head.journal.txt", "raylet.out", "raylet.err"])
    first, _ = top(evidence)
    assert first["id"] == "port_in_use"
    assert "Port 46380 (Ray's raylet: the raylet's node manager or object manager port" in first["title"]


def test_before_the_ray_logs_were_read_ray_not_running_was_the_answer():
    """What the doctor said of the Ray unit's journal alone before: a Ray that ran and failed was 'not running,
    install Ray'; now its registration timeout is named, with the session logs to read."""
    evidence = with_ray_failure(ray_cluster({"node1": CAPTURED_IP}), "node1", "raylet-port-in-use",
                                ["ray-head.journal.txt"])
    assert diagnose(before_ray_logs(), evidence)["findings"][0]["id"] == "ray_not_running"
    first, report = top(evidence)
    assert first["id"] == "ray_node_registration_failed" and "raylet.out" in first["cause"]
    assert "ray_not_running" not in [f["id"] for f in report["findings"]]


def test_a_gcs_port_taken_on_the_head_explains_the_head_not_answering():
    evidence = with_ray_failure(ray_cluster({"node1": CAPTURED_IP}), "node1", "gcs-port-in-use",
                                ["ray-head.journal.txt", "gcs_server.err"])
    first, report = top(evidence)
    assert (first["id"], first["nodes"]) == ("port_in_use", ["node1"])
    assert "Port 46379 (Ray's gcs_server: the GCS port (--port))" in first["title"]
    # the head's own "Failed to connect to GCS at address <itself>" is no blocked path between the nodes
    assert "rendezvous_port_blocked" not in [f["id"] for f in report["findings"]]
    head = finding(report, "head_not_listening")
    assert f"{CAPTURED_IP}:46379" in head["title"]
    assert any(cause["id"] == "port_in_use" for cause in head["follows_from"])


def test_a_dashboard_port_taken_names_the_dashboard():
    evidence = with_ray_failure(ray_cluster({"node1": CAPTURED_IP}), "node1", "dashboard-port-in-use",
                                ["ray-head.journal.txt"])
    first, _ = top(evidence)
    assert first["id"] == "port_in_use" and "Port 46365 (Ray's dashboard: the dashboard port (--dashboard-port))" \
        in first["title"]


def test_a_node_ip_not_on_the_node_is_named_with_the_address():
    evidence = with_ray_failure(ray_cluster(), "node1", "node-ip-not-local", ["ray-head.journal.txt"])
    first, report = top(evidence)
    assert (first["id"], first["nodes"]) == ("vllm_host_ip_mismatch", ["node1"])
    assert "Ray runs node1 under 10.255.77.1" in first["cause"] and "10.232.9.11" in first["cause"]
    head = finding(report, "head_not_listening")
    assert "10.255.77.1:46379" in head["title"]
    assert any(cause["id"] == "vllm_host_ip_mismatch" for cause in head["follows_from"])


def test_a_node_ip_no_raylet_matches_is_named_from_rays_warning():
    evidence = ray_cluster()
    evidence["nodes"]["node2"]["gather"]["ray_logs"] = log_evidence(
        (LOGS / "ray31264-node-ip-no-matching-raylet.log").read_text().splitlines(), "python-core-worker-x.log")
    first, _ = top(evidence)
    assert (first["id"], first["nodes"]) == ("vllm_host_ip_mismatch", ["node2"])
    assert "under 11.22.33.44" in first["cause"] and "no raylet" in first["cause"]


def test_a_worker_that_cannot_reach_the_gcs_names_the_address_it_dialed():
    # the worker's own "Local node IP" line is left out: the capture ran the worker where it dialed
    evidence = local_ip_lines_left_out(with_ray_failure(ray_cluster(), "node2", "worker-gcs-unreachable",
                                                        ["ray-worker.journal.txt"]))
    report = diagnose(CATALOG, evidence)
    # the head's node list says node2 is missing; the worker's log says where it looked for the head
    assert [(f["id"], f["nodes"]) for f in report["findings"][:2]] == [("ray_node_missing", ["node2"]),
                                                                      ("head_not_listening", ["node2"])]
    head = report["findings"][1]
    assert f"Nothing listens on {CAPTURED_IP}:46999 (Ray GCS)" in head["title"]
    assert head["evidence"][0]["node"] == "node2" and f"/dev/tcp/{CAPTURED_IP}/46999" in head["verify"]
    assert "ray_not_running" not in [f["id"] for f in report["findings"]]


def test_a_retry_of_a_node_that_joined_is_no_finding():
    evidence = with_ray_failure(ray_cluster({"node1": CAPTURED_IP}), "node2", "worker-gcs-unreachable",
                                ["ray-worker.journal.txt"], alive=True)
    assert "head_not_listening" not in [f["id"] for f in diagnose(CATALOG, evidence)["findings"]]


def test_a_healthy_session_gives_no_ray_finding():
    evidence = ray_cluster({"node1": CAPTURED_IP})
    gather = evidence["nodes"]["node1"]["gather"]
    gather["journal"]["ray-head.service"] = lines("healthy-head", "ray-head.journal.txt")
    gather["ray_logs"] = {"files": {name: {"lines": lines("healthy-head", name)}
                                    for name in ("raylet.out", "raylet.err", "gcs_server.out", "gcs_server.err")}}
    report = diagnose(CATALOG, evidence)
    assert report["faults"] == 0, [f["id"] for f in report["findings"]]


def test_the_version_mismatch_quotes_the_versions_ray_printed():
    evidence = with_log(ray_cluster(), "gpustack1640-ray-version-mismatch.log", node="node2", unit="ray-worker.service")
    first, _ = top(evidence)
    assert (first["id"], first["nodes"]) == ("ray_version_mismatch", ["node2"])
    assert "Ray 2.43.0" in first["title"] and "Ray 2.44.1" in first["title"]
    assert "Ray 2.44.1 where the cluster runs 2.43.0" in first["cause"]


def test_a_pasted_log_gets_the_same_findings_as_the_nodes_logs():
    """The --log entry point: a log's lines as one node's Ray logs (or a Ray unit's journal), no plan."""
    pasted = lines("raylet-port-in-use", "raylet.err")
    as_file = {"plan": {}, "nodes": {"node": {"gather": {"ray_logs": log_evidence(pasted, "raylet.err")}}}}
    as_journal = {"plan": {"backend": "ray"}, "nodes": {"node": {"gather": {
        "units": {"ray-head.service": {"LoadState": "loaded", "ActiveState": "failed"}},
        "journal": {"ray-head.service": pasted}}}}}
    for evidence in (as_file, as_journal):
        first, report = top(evidence)
        assert first["id"] == "port_in_use" and "Port 46380 (Ray's raylet" in first["title"], first["title"]
        assert "ray_not_running" not in [f["id"] for f in report["findings"]]


# --- numbers from the evidence, the plan's only when the log has none ---------------------------------------------

def test_port_in_use_names_the_port_of_the_log_not_the_plans_api_port():
    api = str(healthy_cluster()["plan"]["ports"]["api"])
    for fixture, port in (("vlmr1-289-tcpstore-port-in-use.log", "29500"),
                          ("pipelinerl27-tcpstore-port-race.log", "46571")):
        first, _ = top(with_log(healthy_cluster(), fixture))
        assert first["id"] == "port_in_use" and f"port {port}" in first["cause"] and f":{port}'" in first["verify"]
        assert f"port {api} " not in first["cause"]
    # Ray's GCS in the Ray unit's journal: before, the bare "Address already in use" left the plan's API port
    evidence = with_ray_failure(ray_cluster({"node1": CAPTURED_IP}), "node1", "gcs-port-in-use", ["ray-head.journal.txt"])
    port_in_use = finding(diagnose(CATALOG, evidence), "port_in_use")
    assert "port 46379" in port_in_use["cause"] and f"port {api} " not in port_in_use["cause"]


def test_port_in_use_falls_back_to_the_plans_port_when_the_log_names_none():
    evidence = healthy_cluster()
    evidence["nodes"]["node1"]["gather"]["journal"]["vllm.service"] = ["OSError: [Errno 98] Address already in use"]
    first, _ = top(evidence)
    assert first["id"] == "port_in_use" and f"port {evidence['plan']['ports']['api']}" in first["cause"]


@pytest.mark.parametrize(("fixture", "needed", "visible"), [
    ("dynamo4934-tp-larger-than-gpus.log", "2", "1"),
    ("gpustack5056-ray-tp-exceeds-gpus.log", "16", "8"),
])
def test_world_size_exceeds_gpus_quotes_the_counts_of_the_log(fixture, needed, visible):
    report = diagnose(CATALOG, with_log(healthy_cluster(), fixture))
    cause = finding(report, "world_size_exceeds_gpus")["cause"]
    assert f"({needed} ranks, {visible} GPUs visible" in cause, cause


def test_gpu_memory_busy_quotes_the_memory_of_the_log():
    report = diagnose(CATALOG, with_log(healthy_cluster(), "vllm33297-free-memory-gpu-busy.log"))
    cause = finding(report, "gpu_memory_busy")["cause"]
    assert "cuda:0: 1.53/22.05 GiB free where gpu_memory_utilization 0.9 needs 19.84 GiB" in cause, cause


# --- the gather: the current session's logs, bounded, read-only --------------------------------------------------

class _Module:
    def __init__(self, **params):
        self.params = {"ray_temp_dir": None, "ray_log_lines": 20, "ray_log_bytes": 4096, "ray_log_workers": 1,
                       "timeout": 5, **params}

    def get_bin_path(self, name):
        return None


def test_gather_reads_the_current_sessions_logs_from_the_units_temp_dir(tmp_path):
    session = tmp_path / "session_2026-12-05_12-37-36_632368_5968" / "logs"
    session.mkdir(parents=True)
    (tmp_path / "session_latest").symlink_to(session.parent.name)
    for name in ("raylet.out", "raylet.err"):
        (session / name).write_text((LOGS / "raylet-port-in-use" / name).read_text())
    (session / "worker-old-01-1.err").write_text("Traceback of an earlier start\n")
    (session / "worker-new-01-2.err").write_text("a worker\n")
    old = time.time() - 3600
    os.utime(session / "worker-old-01-1.err", (old, old))
    before = sorted(p.name for p in session.iterdir())
    started_us = int((time.monotonic() - 60) * 1e6)
    units = {"ray-head.service": {"LoadState": "loaded", "InactiveExitTimestampMonotonic": str(started_us),
                                  "ExecStart": "{ path=/opt/v/bin/ray ; argv[]=/opt/v/bin/ray start --head "
                                               f"--temp-dir {tmp_path} ; ignore_errors=no }}"}}
    found = doctor_gather.Gatherer(_Module()).ray_logs(units)
    assert found["dir"] == str(tmp_path / "session_latest" / "logs")
    assert found["session"] == "session_2026-12-05_12-37-36_632368_5968"
    assert sorted(found["files"]) == ["raylet.err", "raylet.out", "worker-new-01-2.err"]
    raylet = found["files"]["raylet.out"]
    # 4096 bytes of a larger file: cut, at most 20 lines and the error lines before them
    assert raylet["truncated"] and raylet["size"] > 4096 and len(raylet["lines"]) <= 70
    assert any("The specified port is 46380" in line for line in raylet["lines"])
    assert sorted(p.name for p in session.iterdir()) == before
    # a node without a Ray unit reads nothing
    assert doctor_gather.Gatherer(_Module()).ray_logs({"vllm.service": {"LoadState": "loaded"}}) == {}


def test_a_failing_ray_unit_is_read_with_the_attempts_before_its_current_one(tmp_path):
    # On the lab: node2's raylet could not bind its port; systemd restarted ray-worker.service, and its current
    # attempt had written nothing yet when the doctor read the node. The attempt before wrote raylet.1.out.
    session = tmp_path / "session_x" / "logs"
    session.mkdir(parents=True)
    (tmp_path / "session_latest").symlink_to(session.parent.name)
    (session / "raylet.out").write_text("the first raylet, healthy\n")
    (session / "raylet.1.out").write_text((LOGS / "raylet-port-in-use" / "raylet.out").read_text())
    for name, age in (("raylet.out", 3600), ("raylet.1.out", 40)):
        when = time.time() - age
        os.utime(session / name, (when, when))
    started_us = int((time.monotonic() - 10) * 1e6)
    exec_start = f"{{ path=/opt/v/bin/ray ; argv[]=/opt/v/bin/ray start --temp-dir {tmp_path} ; ignore_errors=no }}"

    def read(state, sub_state, restarts="0"):
        units = {"ray-worker.service": {"LoadState": "loaded", "ActiveState": state, "SubState": sub_state,
                                        "NRestarts": restarts,
                                        "InactiveExitTimestampMonotonic": str(started_us), "ExecStart": exec_start}}
        return doctor_gather.Gatherer(_Module()).ray_logs(units)["files"]

    failing = read("activating", "auto-restart")
    assert list(failing) == ["raylet.1.out"]
    assert any("The specified port is 46380" in line for line in failing["raylet.1.out"]["lines"])
    # restarted once and running its next attempt (ray start waits for a raylet that already died): the same
    assert list(read("active", "running", restarts="1")) == ["raylet.1.out"]
    # a Ray that runs and never restarted: only what its current start wrote
    assert read("active", "running") == {}


def test_a_saved_evidence_file_replays_the_ray_logs():
    """doctor-evidence.json keeps each node's gather whole: the lab's real Ray deployment (tests/fixtures/doctor/ray),
    node2's session logs holding the raylet's port failure, node2 gone from the head's list, replayed offline."""
    import json

    from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import evidence_from_saved

    saved = json.loads((REPO / "tests/fixtures/doctor/ray/healthy/doctor-evidence.json").read_text())
    index = saved["hosts"].index("node2")
    gather = saved["gather"][index]["evidence"]
    gather["ray_logs"] = {"dir": "/var/lib/vllm-cluster/ray/session_latest/logs", "files": {
        name: {"lines": lines("raylet-port-in-use", name)} for name in ("raylet.out", "raylet.err")}}
    gather["units"]["ray-worker.service"].update(ActiveState="activating", SubState="auto-restart", Result="exit-code")
    head = saved["gather"][saved["hosts"].index("node1")]["evidence"]["ray"]
    head["nodes"] = [node for node in head["nodes"] if node["node_ip"] != "10.232.1.12"]
    first, _ = top(evidence_from_saved(json.loads(json.dumps(saved))))
    assert (first["id"], first["nodes"]) == ("port_in_use", ["node2"])
    assert "Port 46380 (Ray's raylet" in first["title"]
    assert any(item["source"].startswith("ray log raylet") for item in first["evidence"])


@pytest.mark.parametrize(("fixture", "max_len", "fits"), [
    ("bonito7-kv-cache-below-max-seq-len.log", "32768", "16816"),
    ("tpuinference223-kv-cache-needed-above-available.log", "131072", "5632"),
])
def test_kv_cache_too_small_gives_the_length_that_fits_from_the_log(fixture, max_len, fits):
    first, _ = top(with_log(healthy_cluster(), fixture))
    assert first["id"] == "kv_cache_too_small" and f"({max_len})" in first["title"]
    assert f"to at most {fits} " in first["fix"], first["fix"]


def test_a_port_the_log_quotes_gets_the_plans_name_for_it():
    evidence = healthy_cluster()
    evidence["plan"]["ports"]["master"] = 29500
    first, _ = top(with_log(evidence, "vlmr1-289-tcpstore-port-in-use.log"))
    assert "port 29500 (master)" in first["cause"], first["cause"]
    # a port the plan does not have keeps the signature's own wording
    first, _ = top(with_log(healthy_cluster(), "pipelinerl27-tcpstore-port-race.log"))
    assert "port 46571 (a port vLLM or torch binds)" in first["cause"], first["cause"]


def test_the_session_logs_count_from_the_last_start_of_the_unit_that_runs_ray():
    now, monotonic = 10_000.0, 500.0
    started = {"ActiveState": "active", "InactiveExitTimestampMonotonic": str(int(400 * 1e6))}
    never = {"ActiveState": "inactive", "InactiveExitTimestampMonotonic": "0"}
    assert doctor_gather.unit_started([started, never], monotonic=lambda: monotonic, now=lambda: now) == 9_900.0
    assert doctor_gather.unit_started([never], monotonic=lambda: monotonic, now=lambda: now) is None


def test_a_zeromq_port_taken_is_port_in_use_with_its_port():
    """ray#60057 (PR description): two vLLM deployments on Ray gave their NIXL side channels one port base."""
    first, _ = top(with_log(ray_cluster(), "ray60057-nixl-side-channel-port-in-use.log"))
    assert (first["id"], first["nodes"]) == ("port_in_use", ["node1"])
    assert "Port 40009 " in first["title"] and "sport = :40009" in first["verify"]


def test_a_worker_dialing_a_head_where_nothing_answers_is_head_not_listening_with_that_address():
    """vllm#19543: the worker's raylet cannot reach the GCS it was pointed at (a maintainer: the --address was wrong)."""
    excerpt = (PUBLIC / "vllm19543-ray-worker-head-address-localhost.log").read_text().splitlines()
    alone = {"plan": {"backend": "ray"}, "nodes": {"the node": {"gather": {
        "units": {"ray-worker.service": {"LoadState": "loaded", "ActiveState": "failed", "Result": "exit-code"}},
        "journal": {"ray-worker.service": excerpt}}}}}
    first, report = top(alone)
    assert first["id"] == "head_not_listening" and "10.108.0.184:6379 (Ray GCS)" in first["title"]
    assert "ray_not_running" not in [f["id"] for f in report["findings"]]
    # without the Ray log rules the line is not read as the head's GCS not answering
    assert diagnose(before_ray_logs(), alone)["findings"][0]["id"] != "head_not_listening"


def test_a_wrapped_message_gives_its_values_from_the_lines_after_it():
    """NeMo-RL#259 wraps vLLM's bfloat16 refusal after its first sentence (the GPU on the next line), in a Ray
    worker's journal; LlamaFactory#4960 keeps it on one line: both name the GPU and its capability."""
    first, _ = top(with_log(healthy_cluster(), "llamafactory4960-bf16-v100.log"))
    one_line = first["title"]
    first, _ = top(with_log(ray_cluster(), "nemorl259-bf16-on-v100.log", node="node2", unit="ray-worker.service"))
    assert first["id"] == "gpu_compute_capability_unsupported"
    assert "Tesla V100-SXM2-32GB compute capability 7.0" in first["title"] and "compute capability 7.0" in one_line


def test_the_catalogs_log_rules_read_the_daemons_logs_not_the_workers():
    """A worker log keeps what an earlier vLLM start under the same Ray session said; the catalog's log rules read
    the daemons' logs (raylet, GCS) and the journals, where Ray forwards its workers' lines while they run."""
    excerpt = (PUBLIC / "vlmr1-289-tcpstore-port-in-use.log").read_text().splitlines()
    evidence = ray_cluster()
    evidence["nodes"]["node2"]["gather"]["ray_logs"] = log_evidence(excerpt, "worker-0f1e-01000000-4711.err")
    assert "port_in_use" not in [f["id"] for f in diagnose(CATALOG, evidence)["findings"]]
    evidence["nodes"]["node2"]["gather"]["ray_logs"] = log_evidence(excerpt, "raylet.err")
    assert "port_in_use" in [f["id"] for f in diagnose(CATALOG, evidence)["findings"]]


# --- token authentication (Ray 2.59+): a stray token file turns it on where RAY_AUTH_MODE is unset ---------------

def head_journal(evidence, case):
    evidence = copy.deepcopy(evidence)
    evidence["nodes"]["node1"]["gather"]["journal"]["ray-head.service"] = lines(case, "ray-head.journal.txt")
    return evidence


def local_ip_lines_left_out(evidence):
    """The captures ran on one machine: its "Local node IP" is neither planned node's address, which is another
    finding (vllm_host_ip_mismatch, tested above); without it only the lines under test speak."""
    for node in ("node1", "node2"):
        journal = evidence["nodes"][node]["gather"]["journal"]
        for unit in ("ray-head.service", "ray-worker.service"):
            if unit in journal:
                journal[unit] = [line for line in journal[unit] if "Local node IP" not in line]
    return evidence


def test_a_head_that_turned_token_auth_on_by_itself_is_named_before_the_worker_it_refused():
    evidence = local_ip_lines_left_out(with_ray_failure(head_journal(ray_cluster(), "auth-head-token-file-mode-unset"),
                                                       "node2", "auth-worker-without-token", ["ray-worker.journal.txt"]))
    report = diagnose(CATALOG, evidence)
    first = report["findings"][0]
    assert (first["id"], first["nodes"]) == ("ray_auth_enabled_by_token_file", ["node1"]), report["findings"]
    assert [f["id"] for f in report["findings"][:3]] == ["ray_auth_enabled_by_token_file", "ray_auth_token_rejected",
                                                        "ray_node_missing"], report["findings"]
    assert "/var/lib/vllm-cluster" in first["fix"] and "RAY_AUTH_MODE=disabled" in first["fix"]
    rejected = finding(report, "ray_auth_token_rejected")
    assert rejected["nodes"] == ["node2"] and "disabled" in rejected["cause"]


def test_a_worker_with_another_token_is_named_with_the_mode_ray_reports():
    evidence = local_ip_lines_left_out(with_ray_failure(head_journal(ray_cluster(), "auth-head-mode-token"), "node2",
                                                       "auth-worker-wrong-token", ["ray-worker.journal.txt"]))
    report = diagnose(CATALOG, evidence)
    first = report["findings"][0]
    assert (first["id"], first["nodes"]) == ("ray_auth_token_rejected", ["node2"]), report["findings"]
    assert "as Ray reports it: token" in first["cause"]
    assert "ray_auth_enabled_by_token_file" not in [f["id"] for f in report["findings"]]
    # without the signature the worker's failure is only a node missing from the head's list
    assert diagnose(without({"ray_auth_token_rejected"}), evidence)["findings"][0]["id"] != "ray_auth_token_rejected"


def test_a_worker_still_retrying_with_another_token_is_named_before_ray_gives_up():
    """The roles' worker on the lab, seconds into a start with another token than the head's: `ray start` retries
    the GCS once a second and its line has no period yet (the AuthenticationError comes after 60 s)."""
    evidence = local_ip_lines_left_out(with_ray_failure(head_journal(ray_cluster(), "auth-head-mode-token"), "node2",
                                                       "auth-worker-wrong-token-retrying", ["ray-worker.journal.txt"]))
    assert not any("incorrect." in line for line in evidence["nodes"]["node2"]["gather"]["journal"]["ray-worker.service"])
    report = diagnose(CATALOG, evidence)
    first = report["findings"][0]
    assert (first["id"], first["nodes"]) == ("ray_auth_token_rejected", ["node2"]), report["findings"]
    assert "as Ray reports it: token" in first["cause"]  # the default: the roles pin token mode
    assert diagnose(without({"ray_auth_token_rejected"}), evidence)["findings"][0]["id"] != "ray_auth_token_rejected"


@pytest.mark.parametrize("case", ["auth-head-mode-disabled-token-file", "auth-head-mode-token"])
def test_a_head_whose_mode_is_pinned_gives_no_auth_finding(case):
    # What keeps a stray token file from splitting the cluster: the mode set explicitly (Ray then says nothing).
    report = diagnose(CATALOG, local_ip_lines_left_out(head_journal(ray_cluster(), case)))
    assert report["faults"] == 0, [f["id"] for f in report["findings"]]
