"""The deploy's wait (vllm_topology, roles/vllm_service/tasks/service.yml) names the start-up phase each node reached.

vllm_topology reads the journal with its times (journalctl -o json) through the doctor's own reader
(parsers/vllm_phases.py); service.yml's failure message says "reached phase X (line), since T". The journal is
the lab's real vLLM 0.32 start (tests/fixtures/vllm/lab), cut where a start would hang.
"""

import json
from pathlib import Path

import jinja2
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import vllm_phases
from ansible_collections.vllm_ops.cluster.plugins.modules import vllm_topology

REPO = Path(__file__).resolve().parents[2]
LAB_LOG = REPO / "tests" / "fixtures" / "vllm" / "lab" / "independent-dp3-node1.log"
T0 = 1_796_255_000.0


def lab_lines(cut):
    lines = LAB_LOG.read_text(encoding="utf-8").splitlines()
    return lines[: next(index for index, line in enumerate(lines) if cut in line) + 1]


class FakeModule:
    """What vllm_topology asks of AnsibleModule here: journalctl's path and its output."""

    def __init__(self, rc, out):
        self.rc, self.out, self.argv = rc, out, None

    def get_bin_path(self, name, required=False):
        return f"/usr/bin/{name}"

    def run_command(self, argv, **_):
        self.argv = argv
        return self.rc, self.out, ""


def journal_json(lines):
    return "\n".join(json.dumps({"MESSAGE": line, "__REALTIME_TIMESTAMP": str(int((T0 + index) * 1e6)),
                                 "_SYSTEMD_INVOCATION_ID": "abc"}) for index, line in enumerate(lines)) + "\n"


def test_the_wait_reads_the_journal_with_its_times_and_the_phase_reached():
    lines = lab_lines("Starting to load model")
    module = FakeModule(0, journal_json(lines))
    read, times = vllm_topology.read_journal_entries(module, "abc")
    assert module.argv[1:3] == ["_SYSTEMD_INVOCATION_ID=abc", "--output=json"]
    assert read == lines and times[0] == T0 and times[-1] == T0 + len(lines) - 1
    phase = vllm_topology.startup_phase(read, times)
    assert (phase["phase"], phase["current"], phase["finished"], phase["complete"]) == ("weights", "weights", False,
                                                                                         False)
    assert "Starting to load model /srv/models/tiny-llama" in phase["line"]
    assert phase["since"] == vllm_phases.iso_utc(T0 + len(lines) - 1)  # the journal's time, in UTC
    assert {"process", "rank", "phase", "time"} <= set(phase["processes"][0])


def test_no_journal_and_no_phase_line():
    assert vllm_topology.read_journal_entries(FakeModule(1, ""), "abc") == ([], [])
    assert vllm_topology.read_journal_entries(FakeModule(0, "x"), None) == ([], [])
    assert vllm_topology.startup_phase(["Starting vllm.service...", "Triton is installed"]) is None


def start_problem(topology):
    """service.yml's message for a node that did not come up, rendered as Ansible would (its Jinja expressions)."""
    tasks = yaml.safe_load((REPO / "roles" / "vllm_service" / "tasks" / "service.yml").read_text(encoding="utf-8"))
    judge = next(task for task in tasks if task.get("name") == "Judge this node's start (the rollback needs every "
                                                                  "node's verdict)")
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined)
    env.filters["bool"] = bool
    context = {"__vllm_service_topology": topology, "__vllm_service_up": False, "vllm_service_unit": "vllm.service",
               "vllm_service_stage": "single", "__vllm_service_started": {}}
    # Ansible templates __vllm_service_phase to the module's startup_phase (a dict, or None)
    assert "['startup_phase'] | default(none)" in judge["vars"]["__vllm_service_phase"]
    context["__vllm_service_phase"] = topology.get("startup_phase")
    return env.from_string(judge["vars"]["__vllm_service_start_problem"]).render(context).strip()


def topology(phase):
    return {"waited_s": 600.0, "unit": {"active_state": "active", "sub_state": "running", "restarts": 0},
            "workers": [], "expected_here": {"workers": 1}, "server_url": None, "errors": [],
            "journal_tail": ["a", "b"], "startup_phase": phase}


def test_the_failure_message_names_the_phase_its_line_and_since_when():
    lines = lab_lines("is assigned as")
    times = [T0 + index for index in range(len(lines))]
    message = start_problem(topology(vllm_topology.startup_phase(lines, times)))
    assert message.startswith("vLLM (vllm.service, stage single) did not come up within 600.0 s: unit active")
    assert "; reached phase distributed_init (finished; now in weights) ((Worker pid=1021) INFO 12-02 23:43:49 " \
           "[parallel_state.py:2350] rank 0 in world size 1 is assigned as" in message
    assert "), since 2026-12-02T23:4" in message and message.endswith("; last journal lines: a | b")


def test_a_node_without_a_phase_line_says_so():
    message = start_problem(topology(None))
    assert "; reached no start-up phase (no vLLM start-up line); last journal lines: a | b" in message
