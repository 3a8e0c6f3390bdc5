"""The deploy's wait for vLLM in rounds: progress lines, the stall decision, journal reads scoped to the current start,
and the failure message with the doctor's first finding.

Pure logic in plugins/module_utils/verify/start_wait.py (round_report) and doctor/report.py (first_finding); the
module's round (vllm_topology.collect) runs against a fake systemctl/journalctl that keeps each invocation's lines
apart; the journal is the lab's real vLLM 0.32 start (tests/fixtures/vllm/lab).
"""

import json
import time
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.report import first_finding
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import vllm_phases
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify import start_wait
from ansible_collections.vllm_ops.cluster.plugins.modules import vllm_topology

REPO = Path(__file__).resolve().parents[2]
LAB_LOG = REPO / "tests" / "fixtures" / "vllm" / "lab" / "independent-dp3-node1.log"
T0 = 1_796_255_000.0  # when the journal's first line was written
MINUTE = 60


def lab_lines(cut):
    lines = LAB_LOG.read_text(encoding="utf-8").splitlines()
    return lines[: next(index for index, line in enumerate(lines) if cut in line) + 1]


def phase_at(cut, first=T0):
    lines = lab_lines(cut)
    return vllm_topology.startup_phase(lines, [first + index for index in range(len(lines))]), first + len(lines) - 1


# --- the stall bound -------------------------------------------------------------------------------------------------

def test_the_bound_is_the_phases_under_the_profile_unless_one_is_given():
    assert start_wait.stall_bound("weights") == 30 * MINUTE
    assert start_wait.stall_bound("weights", "lab") == 5 * MINUTE
    assert start_wait.stall_bound(None, "lab") == vllm_phases.PROFILES["lab"]["starting"]  # before vLLM's first line
    assert start_wait.stall_bound("weights", "lab", 120) == 120
    assert start_wait.stall_bound("graph_capture", "gpu", "45") == 45
    assert start_wait.stall_bound("api_up") is None
    with pytest.raises(ValueError, match="unknown start-up profile 'tpu'"):
        start_wait.stall_bound("weights", "tpu")


# --- one round's report and its progress line -----------------------------------------------------------------------

def test_a_node_that_moved_on_says_from_which_phase_to_which_and_since_when():
    phase, entered = phase_at("Starting to load model")
    report = start_wait.round_report("node1", phase, entered + 40, ended="deadline", profile="lab",
                                     resume={"phase": "engine_init", "since_epoch": T0})
    assert report["state"] == "waiting"
    assert (report["phase"], report["elapsed_s"], report["bound_s"]) == ("weights", 40, 300)
    assert report["since"] == vllm_phases.iso_utc(entered)[11:19]
    assert report["progress"] == (f"node1: engine init -> weights loading (since {report['since']} UTC, "
                                  "40 s of at most 300 s)")


def test_a_node_still_in_its_phase_names_it_alone():
    phase, entered = phase_at("Starting to load model")
    report = start_wait.round_report("node1", phase, entered + 70, ended="deadline", profile="gpu",
                                     resume={"phase": "weights", "since_epoch": entered})
    assert report["progress"] == f"node1: weights loading (since {report['since']} UTC, 70 s of at most 1800 s)"
    first = start_wait.round_report("node1", phase, entered + 5, ended="deadline")
    assert "->" not in first["progress"]  # the first round has no earlier phase to come from


def test_no_new_phase_within_the_bound_is_a_stall():
    phase, entered = phase_at("is assigned as")  # distributed init finished: now in weights
    within = start_wait.round_report("node2", phase, entered + 300, ended="deadline", profile="lab")
    assert within["state"] == "waiting"
    stalled = start_wait.round_report("node2", phase, entered + 301, ended="deadline", profile="lab")
    assert stalled["state"] == "stalled"
    assert stalled["progress"] == (f"node2: stalled in weights loading: no new start-up phase for 301 s "
                                   f"(since {stalled['since']} UTC; bound 300 s)")
    # An explicit bound overrides the profile's, either way.
    assert start_wait.round_report("node2", phase, entered + 61, ended="deadline", profile="lab",
                                   stall_timeout_s=60)["state"] == "stalled"
    assert start_wait.round_report("node2", phase, entered + 301, ended="deadline", profile="lab",
                                   stall_timeout_s=600)["state"] == "waiting"


def test_before_the_first_line_the_unit_start_counts_and_the_starting_bound_holds():
    report = start_wait.round_report("node2", None, T0 + 12, ended="deadline", unit_started_epoch=T0, profile="gpu")
    assert report["progress"] == f"node2: no vLLM start-up line yet (since {start_wait.clock(T0)} UTC, 12 s of at most 600 s)"
    late = start_wait.round_report("node2", None, T0 + 601, ended="deadline", unit_started_epoch=T0)
    assert late["state"] == "stalled" and late["progress"].startswith("node2: stalled in no vLLM start-up line yet")


def test_a_phase_without_a_time_keeps_the_time_an_earlier_round_first_saw_it():
    phase = vllm_topology.startup_phase(lab_lines("Starting to load model"))  # no journal times
    assert phase["since_epoch"] is None
    first = start_wait.round_report("node1", phase, T0, ended="deadline", profile="lab")
    assert (first["since_epoch"], first["elapsed_s"]) == (T0, 0)
    later = start_wait.round_report("node1", phase, T0 + 400, ended="deadline", profile="lab", resume=first)
    assert (later["state"], later["elapsed_s"]) == ("stalled", 400)


def test_a_unit_that_failed_says_since_when_and_where_it_was():
    phase, entered = phase_at("Starting to load model")
    report = start_wait.round_report("node2", phase, entered + 30, ended="failed",
                                     unit={"active_state": "failed", "sub_state": "failed"},
                                     unit_changed_epoch=entered + 20)
    assert report["state"] == "failed"
    assert report["progress"] == (f"node2: unit failed (failed) since {start_wait.clock(entered + 20)} UTC, "
                                  f"in weights loading (since {report['since']} UTC)")


def test_a_node_whose_api_server_started_is_up_however_long_it_took():
    phase, entered = phase_at("Starting vLLM server on")
    report = start_wait.round_report("node1", phase, entered + 9999, ended="server", profile="lab")
    assert report["state"] == "up"
    assert report["progress"] == "node1: up (every start-up line this node prints is in its journal)"


# --- the module's round: the current start only ---------------------------------------------------------------------

class Done(Exception):
    pass


class FakeSystemd:
    """vllm_topology's AnsibleModule, with systemctl show and journalctl over invocations that each keep their lines."""

    def __init__(self, params, units, journals):
        self.params = {"unit": "vllm.service", "plan": None, "host": "node1", "wait_timeout": 0, "poll_interval": 0.0,
                       "restarts_allowed": 0, "tail": 25, "ray": None, "startup_profile": "lab",
                       "stall_timeout": 0, "error_grace": 60, "resume": None, **params}
        self.units = list(units)  # one systemctl show answer per read; the last repeats
        self.journals = journals  # invocation id -> lines
        self.result = None
        self.warnings = []

    def warn(self, text):
        self.warnings.append(text)

    def get_bin_path(self, name, required=False):
        return f"/usr/bin/{name}"

    def run_command(self, argv, **_):
        if argv[0].endswith("systemctl"):
            unit = self.units.pop(0) if len(self.units) > 1 else self.units[0]
            return 0, "\n".join(f"{key}={value}" for key, value in unit.items()), ""
        invocation = argv[1].split("=", 1)[1]
        lines = self.journals.get(invocation, [])
        if "--output=json" in argv:  # written one line a second, the last one just now
            first = time.time() - len(lines)
            return 0, "".join(json.dumps({"MESSAGE": line, "__REALTIME_TIMESTAMP": str(int((first + i) * 1e6))}) + "\n"
                              for i, line in enumerate(lines)), ""
        return 0, "".join(line + "\n" for line in lines), ""

    def fail_json(self, **kwargs):
        raise AssertionError(kwargs["msg"])

    def exit_json(self, **kwargs):
        self.result = kwargs
        raise Done


def unit(invocation, active="active", sub="running", restarts=0):
    return {"LoadState": "loaded", "ActiveState": active, "SubState": sub, "InvocationID": invocation,
            "MainPID": 42, "NRestarts": restarts, "ExecMainStartTimestampMonotonic": 0,
            "StateChangeTimestampMonotonic": 0}


def run_round(module):
    with pytest.raises(Done):
        vllm_topology.collect(module)
    return module.result["ansible_facts"]["vllm_topology"]


PLAN_ONE_NODE = {"nodes": [{"host": "node1", "role": "head", "argv": ["vllm", "serve", "/m"]}]}

OLD_START = ["(APIServer pid=1) ERROR 12-01 10:00:00 [x.py:1] OLD START: CUDA out of memory",
             "RuntimeError: OLD START failed"]


def plan_targets(monkeypatch):
    monkeypatch.setattr(vllm_topology.topology_check, "readiness_targets",
                        lambda plan, host: {"workers": 1, "engines": 1, "server": True})


def test_a_restarted_unit_is_read_from_its_new_start_only(monkeypatch):
    plan_targets(monkeypatch)
    current = lab_lines("Starting to load model")
    module = FakeSystemd({"plan": PLAN_ONE_NODE}, [unit("new")], {"old": OLD_START, "new": current})
    topology = run_round(module)
    text = json.dumps(topology)
    assert "OLD START" not in text
    assert topology["unit"]["invocation_id"] == "new" and topology["journal_tail"][-1] == current[-1]
    wait = topology["wait"]
    assert (wait["state"], wait["phase"], wait["invocation_id"], wait["ended"]) == ("waiting", "weights", "new",
                                                                                      "deadline")
    assert wait["progress"].startswith("node1: weights loading (since ")


def test_a_failed_unit_not_restarted_quotes_its_own_start_and_says_since_when(monkeypatch):
    plan_targets(monkeypatch)
    failed = lab_lines("Starting to load model") + ["(Worker pid=1021) ERROR 12-02 23:43:50 [x.py:1] boom",
                                                   "RuntimeError: the failed start's own error"]
    module = FakeSystemd({"plan": PLAN_ONE_NODE}, [unit("last", "failed", "failed")],
                         {"older": OLD_START, "last": failed})
    topology = run_round(module)
    assert "OLD START" not in json.dumps(topology)
    assert topology["wait"]["state"] == "failed" and topology["wait"]["ended"] == "failed"
    assert topology["wait"]["progress"].startswith("node1: unit failed (failed) since ")
    assert any("the failed start's own error" in line for line in topology["journal_tail"])


def test_a_restart_between_rounds_is_followed_from_the_resumed_start(monkeypatch):
    plan_targets(monkeypatch)
    journals = {"first": OLD_START, "second": lab_lines("Starting to load model")}
    # The previous round followed 'first'; systemd restarted it: with no restart allowed, the round ends failed.
    module = FakeSystemd({"plan": PLAN_ONE_NODE, "resume": {"invocation_id": "first", "earlier_starts": []}},
                         [unit("second", restarts=1)], journals)
    topology = run_round(module)
    assert topology["wait"]["state"] == "failed"
    assert topology["wait"]["earlier_starts"][0]["invocation_id"] == "first"
    assert topology["errors"][0]["line"].startswith("(a start that failed; systemd restarted it)")
    # With one restart allowed it is sat out; the next round carries it on.
    module = FakeSystemd({"plan": PLAN_ONE_NODE, "restarts_allowed": 1,
                          "resume": {"invocation_id": "first", "earlier_starts": []}},
                         [unit("second", restarts=1)], journals)
    topology = run_round(module)
    assert (topology["wait"]["state"], topology["wait"]["invocation_id"]) == ("waiting", "second")
    assert len(topology["wait"]["earlier_starts"]) == 1 and topology["errors"] == []


class JournalGrowsBetweenReads(FakeSystemd):
    """The journal gains lines between the round's last verdict read and its read of the phases (journal times)."""

    def __init__(self, params, units, journals, later):
        super().__init__(params, units, journals)
        self.later = later  # invocation id -> the lines the json read sees

    def run_command(self, argv, **kwargs):
        if "--output=json" in argv:
            self.journals = self.later
        return super().run_command(argv, **kwargs)


def test_a_round_that_ended_at_its_deadline_as_the_server_came_up_waits_another_round(monkeypatch):
    # The round's verdict read ended before the API server's line; its read of the phases came just after it. The
    # node must not be reported up on a topology that has no server (the deploy then failed a start that came up).
    plan_targets(monkeypatch)
    before, after = lab_lines("Explicitly set"), lab_lines("Starting vLLM server on")
    assert len(after) > len(before)
    module = JournalGrowsBetweenReads({"plan": PLAN_ONE_NODE}, [unit("a")], {"a": before}, {"a": after})
    topology = run_round(module)
    assert topology["server_url"] is None
    assert (topology["wait"]["ended"], topology["wait"]["state"]) == ("deadline", "waiting")
    assert topology["startup_phase"]["complete"] is False
    # The next round sees the server's line and ends up.
    module = FakeSystemd({"plan": PLAN_ONE_NODE, "resume": topology["wait"]}, [unit("a")], {"a": after})
    topology = run_round(module)
    assert topology["server_url"] is not None and topology["wait"]["state"] == "up"


# vLLM 0.32 on a full cache filesystem (registry.py's model-info cache, written through weight_utils.atomic_writer):
# two ERROR lines with their tracebacks, then the start goes on.
FULL_CACHE = [
    "(APIServer pid=880) ERROR 12-02 23:43:41 [weight_utils.py:137] Error during atomic write. Original file "
    "'/var/lib/vllm/.cache/vllm/modelinfos/vllm-model_executor-models-llama-LlamaForCausalLM.json' not modified",
    "(APIServer pid=880) Traceback (most recent call last):",
    '(APIServer pid=880)   File "/opt/vllm/vllm/model_executor/model_loader/weight_utils.py", line 129, in atomic_writer',
    "(APIServer pid=880) OSError: [Errno 28] No space left on device",
    "(APIServer pid=880) ERROR 12-02 23:43:41 [registry.py:1041] Error saving model info cache.",
    "(APIServer pid=880) Traceback (most recent call last):",
    '(APIServer pid=880)   File "/opt/vllm/vllm/model_executor/models/registry.py", line 1039, in _save_modelinfo_to_cache',
    "(APIServer pid=880) OSError: [Errno 28] No space left on device",
]


def with_full_cache(cut):
    lines = lab_lines(cut)
    at = next(index for index, line in enumerate(lines) if "Starting to load model" in line)
    return lines[:at] + FULL_CACHE + lines[at:]


def test_an_error_followed_by_more_lines_is_not_fatal_and_a_start_that_came_up_is_up(monkeypatch):
    plan_targets(monkeypatch)
    module = FakeSystemd({"plan": PLAN_ONE_NODE, "error_grace": 0},
                         [unit("a")], {"a": with_full_cache("Starting vLLM server on")})
    topology = run_round(module)
    assert topology["wait"]["state"] == "up" and topology["errors"] == []
    assert "No space left on device" in json.dumps(topology["tolerated_errors"])
    assert module.warnings and module.warnings[0].startswith("host node1: vLLM came up although its start logged")


def test_an_error_then_silence_fails_the_start_after_the_grace(monkeypatch):
    plan_targets(monkeypatch)
    journals = {"a": with_full_cache("Starting to load model")}
    # The first round sees the error and lines it has not seen before: it waits on.
    first = run_round(FakeSystemd({"plan": PLAN_ONE_NODE, "error_grace": 0}, [unit("a")], journals))
    assert first["wait"]["state"] == "waiting" and first["wait"]["error_quiet"]["lines"] == first["lines"]
    # The next round finds no new line: with the grace spent, the start failed, on the error after which it fell silent.
    resume = {**first["wait"], "error_quiet": {**first["wait"]["error_quiet"], "since_epoch": time.time() - 61}}
    second = run_round(FakeSystemd({"plan": PLAN_ONE_NODE, "resume": resume}, [unit("a")], journals))
    assert (second["wait"]["state"], second["wait"]["ended"]) == ("failed", "failed")
    assert second["wait"]["progress"].startswith("node1: logged an error and nothing since ")
    assert "Error saving model info cache." in second["wait"]["progress"]
    assert "Errno 28" in json.dumps(second["errors"])
    # Within the grace it still waits.
    resume["error_quiet"]["since_epoch"] = time.time() - 30
    third = run_round(FakeSystemd({"plan": PLAN_ONE_NODE, "resume": resume}, [unit("a")], journals))
    assert third["wait"]["state"] == "waiting"


def test_the_journals_silence_after_an_error_counts_from_its_last_new_line():
    assert start_wait.error_silence(10, False, 100.0) == (None, False)
    quiet, fatal = start_wait.error_silence(10, True, 100.0, None, 60)
    assert quiet == {"lines": 10, "since_epoch": 100.0} and not fatal
    assert start_wait.error_silence(10, True, 159.0, quiet, 60) == (quiet, False)
    assert start_wait.error_silence(10, True, 160.0, quiet, 60) == (quiet, True)
    # A new line starts the silence again.
    assert start_wait.error_silence(12, True, 160.0, quiet, 60) == ({"lines": 12, "since_epoch": 160.0}, False)


# --- the doctor's first finding --------------------------------------------------------------------------------------

def finding(fid, severity, nodes, evidence, title="T", fix="F", cause="C"):
    return {"id": fid, "severity": severity, "nodes": nodes, "title": title, "cause": cause, "fix": fix,
            "evidence": [{"node": node, "source": source, "line": line} for node, source, line in evidence]}


def test_the_first_finding_is_the_first_fault_with_its_evidence_on_its_own_node():
    report = {"findings": [
        finding("unit_restarting", "warning", ["node1"], [("node1", "systemd", "restarted 3 times")]),
        finding("route_missing", "fault", ["node2", "node1"],
                [("node1", "ip route", "no route to 10.0.0.12"), ("node2", "ip route", "no route to 10.0.0.11")],
                title="No route to the peer's fabric address", fix="ip route add 10.0.0.0/24 dev ens1"),
        finding("startup_stalled", "fault", ["node1"], [("node1", "journal", "x")]),
    ]}
    first = first_finding(report, "results/lab/doctor.md")
    assert (first["id"], first["host"]) == ("route_missing", "node2")
    assert first["evidence"] == "[ip route] no route to 10.0.0.11"
    assert first["text"] == ("No route to the peer's fabric address — [ip route] no route to 10.0.0.11 — fix: "
                             "ip route add 10.0.0.0/24 dev ens1 (doctor: results/lab/doctor.md)")


def test_without_a_fault_the_first_warning_without_any_finding_none():
    warning = finding("unit_restarting", "warning", [], [], title="The unit restarted\n  3 times", cause="it crashed")
    first = first_finding({"findings": [warning]})
    assert (first["host"], first["evidence"], first["title"]) == ("the cluster", "it crashed", "The unit restarted 3 times")
    assert "(doctor:" not in first["text"]
    assert first_finding({"findings": []}) is None


# --- the failure message, as Ansible renders it ----------------------------------------------------------------------

def task(path, name):
    return next(t for t in yaml.safe_load((REPO / path).read_text(encoding="utf-8")) if t.get("name") == name)


def render(template, **context):
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined)
    env.filters["bool"] = bool
    return " ".join(env.from_string(template).render(context).split())


def test_the_vllm_stage_fails_with_the_doctors_first_finding_and_keeps_its_own_account():
    check = task("roles/vllm_service/tasks/service.yml", "Check that vLLM came up")["ansible.builtin.assert"]
    found = {"host": "node2", "text": "No route — [ip route] no route to 10.0.0.11 — fix: ip route add "
                                      "(doctor: results/lab/doctor.md)"}
    message = render(check["fail_msg"], __vllm_service_finding=found, inventory_hostname="node1",
                     __vllm_service_problem="vLLM (vllm.service, stage final) did not come up within 95 s",
                     vllm_service_rollback=True)
    assert message.startswith("host node2: vLLM did not come up: No route — [ip route] no route to 10.0.0.11 — fix: "
                              "ip route add (doctor: results/lab/doctor.md) (no rollback:")
    assert message.endswith("; host node1: vLLM (vllm.service, stage final) did not come up within 95 s)")
    without = render(check["fail_msg"], __vllm_service_finding={}, inventory_hostname="node1",
                     __vllm_service_problem="did not come up", vllm_service_rollback=True)
    assert without.startswith("host node1: did not come up (no rollback:") and without.endswith("; no diagnosis)")
    nothing = render(check["fail_msg"], __vllm_service_finding={"text": ""}, inventory_hostname="node1",
                     __vllm_service_problem="did not come up", vllm_service_rollback=True)
    assert nothing.endswith("; the doctor found no fault)")


def test_the_diagnosis_runs_before_the_rollback_and_only_for_a_failed_start():
    tasks = yaml.safe_load((REPO / "roles/vllm_service/tasks/service.yml").read_text(encoding="utf-8"))
    names = [t.get("name") for t in tasks]
    diagnose = names.index("Diagnose the failed start with the doctor (its first finding)")
    assert diagnose < names.index("Put the previous deployment back when the new one did not come up")
    assert tasks[diagnose]["ansible.builtin.include_role"] == {"name": "vllm_ops.cluster.doctor",
                                                               "tasks_from": "first_finding.yml"}
    assert "__vllm_service_failed_peers | length > 0" in tasks[diagnose]["when"]


def test_the_explicit_stall_bound_reaches_the_doctor_for_every_bounded_phase():
    phases = yaml.safe_load((REPO / "roles/vllm_service/vars/main.yml").read_text())["__vllm_service_startup_phases"]
    assert phases == list(vllm_phases.PROFILES["gpu"]) == list(vllm_phases.PROFILES["lab"])
    assert vllm_phases.bounds("lab", dict.fromkeys(phases, 90)) == dict.fromkeys(phases, 90)


def test_the_next_round_runs_only_while_the_node_waits_and_no_coupled_peer_failed_or_stalled():
    rounds = yaml.safe_load((REPO / "roles/vllm_service/tasks/wait_round.yml").read_text(encoding="utf-8"))
    again = next(t for t in rounds if "ansible.builtin.include_tasks" in t)
    assert again["ansible.builtin.include_tasks"]["file"] == "wait_round.yml"
    assert again["when"][0] == "__vllm_service_wait['state'] == 'waiting'"
    assert "__vllm_service_wait_deadline" in again["when"][1]
    module = next(t for t in rounds if "vllm_ops.cluster.vllm_topology" in t)["vllm_ops.cluster.vllm_topology"]
    assert "vllm_service_progress_interval_s" in module["wait_timeout"] and module["resume"] == "{{ __vllm_service_wait }}"


def test_the_ray_stage_fails_with_the_doctors_first_finding():
    fail = task("roles/ray_cluster/tasks/diagnose.yml", "Fail with the doctor's first finding when Ray did not come up")
    found = {"host": "node2", "text": "Ray's GCS port blocked — [nft] drop tcp 6379 — fix: allow it (doctor: x)"}
    message = render(fail["ansible.builtin.fail"]["msg"], __ray_cluster_finding=found, inventory_hostname="node1",
                     __ray_cluster_failed_peers=[])
    assert message.startswith("host node2: Ray did not come up: Ray's GCS port blocked — [nft] drop tcp 6379 — "
                              "fix: allow it (doctor: x)")
