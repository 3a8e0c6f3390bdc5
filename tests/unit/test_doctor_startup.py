"""The doctor reads each rank's start-up phase (doctor/startup.py) and reports a start stuck in one: startup_stalled.

The journals are the lab's real vLLM 0.32 start (tests/fixtures/vllm/lab), cut where a start would hang, put on
the planner's healthy two-node H100 deployment of test_doctor_public_logs with the journal's time of each line and
the moment the doctor read it (what doctor_gather saves: journal_times, gathered_at).
"""

import copy
import json
from pathlib import Path
from types import SimpleNamespace

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.diagnosis import diagnose
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import client_from_registered
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.report import (
    render_markdown,
    render_report,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import systemd, vllm_phases
from ansible_collections.vllm_ops.cluster.plugins.modules import doctor_gather
from test_doctor_public_logs import CATALOG, PUBLIC, healthy_cluster, ids

REPO = Path(__file__).resolve().parents[2]
LAB_LOG = REPO / "tests" / "fixtures" / "vllm" / "lab" / "independent-dp3-node1.log"
T0 = 1_796_255_000.0  # when the journal's first line was written
MINUTE = 60


def lab_lines(cut=None):
    lines = LAB_LOG.read_text(encoding="utf-8").splitlines()
    if cut is None:
        return lines
    return lines[: next(index for index, line in enumerate(lines) if cut in line) + 1]


def with_journal(evidence, node, lines, read_after_s, times=None):
    """The node's vllm.service journal with each line's time (one second apart), read read_after_s after the last."""
    evidence = copy.deepcopy(evidence)
    gather = evidence["nodes"][node]["gather"]
    times = times or [T0 + index for index in range(len(lines))]
    gather["journal"]["vllm.service"] = list(lines)
    gather["journal_times"] = {"vllm.service": times}
    gather["gathered_at"] = times[-1] + read_after_s
    return evidence


def stalled(report):
    return [finding for finding in report["findings"] if finding["id"] == "startup_stalled"]


def test_a_rank_stuck_in_weights_past_the_bound_is_stalled_on_its_node():
    evidence = with_journal(healthy_cluster("mp"), "node2", lab_lines("Starting to load model"), 31 * MINUTE)
    report = diagnose(CATALOG, evidence)
    finding = stalled(report)[0]
    assert finding["nodes"] == ["node2"] and finding["severity"] == "fault"
    assert finding["title"] == "vLLM's start-up on node2 is stuck in weights loading"
    assert "rank 0 (Worker pid=1021): in weights loading since" in finding["cause"]
    assert "31 min" in finding["cause"] and "30 min" in finding["cause"]
    assert "Starting to load model /srv/models/tiny-llama" in finding["evidence"][0]["line"]
    assert "storage throughput" in finding["fix"] and "{" not in finding["fix"] + finding["verify"]


def test_the_same_phase_within_its_bound_is_no_finding():
    evidence = with_journal(healthy_cluster("mp"), "node2", lab_lines("Starting to load model"), 29 * MINUTE)
    assert not stalled(diagnose(CATALOG, evidence))


def test_distributed_init_names_nccl_s_checks_and_a_finished_phase_moves_to_the_next():
    evidence = with_journal(healthy_cluster("mp"), "node1", lab_lines("world_size=1 rank=0"), 11 * MINUTE)
    finding = stalled(diagnose(CATALOG, evidence))[0]
    assert "distributed init" in finding["title"]
    for words in ("P2P", "ACS", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG=INFO"):
        assert words in finding["fix"], words
    # "rank 0 ... is assigned as" ends distributed init: the rank then waits in weights loading
    evidence = with_journal(healthy_cluster("mp"), "node1", lab_lines("is assigned as"), 31 * MINUTE)
    finding = stalled(diagnose(CATALOG, evidence))[0]
    assert "weights loading" in finding["title"] and "finished distributed init" in finding["cause"]


def test_only_the_node_of_the_least_advanced_rank_is_judged():
    # node2 finished its weights long ago and waits; node1's rank still loads, within its bound: no finding.
    evidence = with_journal(healthy_cluster("mp"), "node1", lab_lines("Starting to load model"), 10 * MINUTE)
    evidence = with_journal(evidence, "node2", lab_lines("Loading weights took"), 60 * MINUTE,
                            times=[T0 - 3000 + index for index in range(len(lab_lines("Loading weights took")))])
    assert not stalled(diagnose(CATALOG, evidence))
    # past the bound, the finding is node1's alone
    evidence["nodes"]["node1"]["gather"]["gathered_at"] += 25 * MINUTE
    assert [finding["nodes"] for finding in stalled(diagnose(CATALOG, evidence))] == [["node1"]]


def test_no_stall_once_the_api_server_came_up_anywhere():
    evidence = with_journal(healthy_cluster("mp"), "node1", lab_lines(), 60 * MINUTE)
    evidence = with_journal(evidence, "node2", lab_lines("Starting to load model"), 60 * MINUTE)
    report = diagnose(CATALOG, evidence)
    assert not stalled(report)
    assert report["startup_phases"]["complete"] is True


def test_a_failed_unit_or_evidence_without_its_time_of_reading_is_not_judged():
    evidence = with_journal(healthy_cluster("mp"), "node2", lab_lines("Starting to load model"), 60 * MINUTE)
    failed = copy.deepcopy(evidence)
    failed["nodes"]["node2"]["gather"]["units"]["vllm.service"].update(ActiveState="failed", SubState="failed",
                                                                        Result="exit-code", ExecMainStatus="1")
    assert not stalled(diagnose(CATALOG, failed)) and "unit_failed" in ids(diagnose(CATALOG, failed))
    older = copy.deepcopy(evidence)
    del older["nodes"]["node2"]["gather"]["gathered_at"]
    report = diagnose(CATALOG, older)
    assert not stalled(report)
    assert report["startup_phases"]["rows"], "the phases are still reported"


def test_the_lab_profile_is_shorter_and_bounds_can_be_set_per_phase():
    evidence = with_journal(healthy_cluster("mp"), "node1", lab_lines("world_size=1 rank=0"), 5 * MINUTE)
    assert not stalled(diagnose(CATALOG, evidence))  # gpu: distributed init may take 10 minutes
    evidence["nodes"]["node1"]["gather"]["expected"] = {"startup_profile": "lab"}
    finding = stalled(diagnose(CATALOG, evidence))[0]
    assert "under the lab profile: 3 min" in finding["cause"]
    cpu = copy.deepcopy(evidence)  # no profile named: a CPU plan is the lab's
    cpu["nodes"]["node1"]["gather"]["expected"] = {}
    cpu["plan"]["cluster"]["device"] = "cpu"
    assert stalled(diagnose(CATALOG, cpu))
    evidence["nodes"]["node1"]["gather"]["expected"] = {"startup_profile": "lab",
                                                        "startup_bounds": {"distributed_init": 600}}
    assert not stalled(diagnose(CATALOG, evidence))


def test_a_specific_cause_ranks_first_and_the_stall_explains_the_silent_api():
    lines = (PUBLIC / "gpustack5509-placement-group-pending.log").read_text(encoding="utf-8").splitlines()
    evidence = with_journal(healthy_cluster("ray"), "node1", lines, 20 * MINUTE)
    evidence["client"] = client_from_registered("http://10.232.9.11:8000", [
        {"__doctor_probe": {"method": "GET", "path": "/health"}, "status": -1,
         "msg": "Status code was -1 and not [200]: Request failed: <urlopen error [Errno 111] Connection refused>"}])
    report = diagnose(CATALOG, evidence)
    assert ids(report)[0] == "placement_group_unsatisfiable"
    finding = stalled(report)[0]
    assert "engine init" in finding["title"] and "ray status" in finding["fix"]
    silent = next(f for f in report["findings"] if f["id"] == "api_unanswered_from_controller")
    assert "startup_stalled" in silent["explained_by"]
    assert CATALOG_PRIORITY["unit_failed"] < CATALOG_PRIORITY["startup_stalled"] < CATALOG_PRIORITY["nccl_system_error"]


CATALOG_PRIORITY = {sig["id"]: sig["priority"] for sig in CATALOG["signatures"]}


def test_the_report_lists_each_rank_with_its_node_and_since_when():
    # A Ray head's journal carries its workers' lines, each with the worker's address (node2's, 10.232.9.12).
    lines = lab_lines("Starting to load model") + [
        "(EngineCore_DP0 pid=986) (RayWorkerWrapper pid=344, ip=10.232.9.12) INFO 12-02 23:43:52 "
        "[parallel_state.py:1906] world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://10.232.9.11:29500 "
        "backend=nccl"]
    evidence = with_journal(healthy_cluster("ray"), "node1", lines, 12 * MINUTE)
    report = diagnose(CATALOG, evidence)
    rows = report["startup_phases"]["rows"]
    ray_rank = next(row for row in rows if row["rank"] == 1)
    assert ray_rank["node"] == "node2" and ray_rank["phase"] == "distributed_init"
    assert ray_rank["since"] == vllm_phases.iso_utc(T0 + len(lines) - 1)
    assert "node2: rank 1" in report["startup_phases"]["least"]
    text = "\n".join(render_report(report))
    assert "Start-up phases (the API server has not come up;" in text
    assert "  node1: rank 0 (Worker pid=1021): in weights loading since" in text
    assert "  node2: rank 1 (EngineCore_DP0 pid=986) (RayWorkerWrapper pid=344, ip=10.232.9.12): in distributed init" in text
    assert "## Start-up phases" in render_markdown(report)
    # the lagging rank runs on node2: the finding is there, quoting the head's journal
    finding = stalled(report)[0]
    assert finding["nodes"] == ["node2"] and "distributed init" in finding["title"]
    assert finding["evidence"][0]["source"] == "journal vllm.service on node1"
    json.dumps(report)  # doctor.json holds it


def test_the_healthy_evidence_without_journals_has_no_phase_section():
    report = diagnose(CATALOG, healthy_cluster("mp"))
    assert report["startup_phases"] == {}
    assert not any(line.startswith("Start-up phases") for line in render_report(report))


def test_the_gatherer_keeps_each_line_s_journal_time():
    entries = [json.loads(line) for line in
               (REPO / "tests/fixtures/doctor/lab/journal-crashloop.json").read_text().splitlines() if line.strip()]
    last = next(e.get("_SYSTEMD_INVOCATION_ID") or e.get("INVOCATION_ID") for e in reversed(entries)
                if e.get("_SYSTEMD_INVOCATION_ID") or e.get("INVOCATION_ID"))
    selected = systemd.select_invocation_entries(entries, last)
    assert [line for line, _ in selected] == systemd.select_invocation(entries, last)
    times = [when for _, when in selected]
    assert all(isinstance(when, float) for when in times) and times == sorted(times)
    assert 1.79e9 < times[0] < 1.80e9  # __REALTIME_TIMESTAMP, microseconds -> seconds


def test_doctor_gather_returns_the_times_beside_the_lines():
    text = (REPO / "tests/fixtures/doctor/lab/journal-crashloop.json").read_text()
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    last = entries[-1].get("_SYSTEMD_INVOCATION_ID") or entries[-1].get("INVOCATION_ID")
    module = SimpleNamespace(params={"journal_lines": 4000, "timeout": 5}, get_bin_path=lambda name: f"/usr/bin/{name}",
                             run_command=lambda argv, **_: (0, text, ""))
    gatherer = doctor_gather.Gatherer(module)
    lines = gatherer.journal("h10-crash.service", last)
    assert lines == systemd.select_invocation(entries, last)
    assert gatherer.journal_times["h10-crash.service"] == [
        when for _, when in systemd.select_invocation_entries(entries, last)]
