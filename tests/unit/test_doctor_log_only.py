"""The doctor on a log alone (doctor/log_only.py): real public excerpts and the lab's real start, nothing else known.

Each public excerpt (tests/fixtures/doctor/public) is diagnosed with only the backend and the unit its
test_doctor_public_logs case names: no plan, no facts. Where the log itself shows the cause, the first finding
must be the one the thread confirmed; where the cause needs a fact of the node (InfiniBand declared), it cannot be.
"""

from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import log_only
from test_doctor_public_logs import CATALOG, NEW_EXCERPTS, PUBLIC, catalog_without

REPO = Path(__file__).resolve().parents[2]
LAB_LOG = REPO / "tests" / "fixtures" / "vllm" / "lab" / "independent-dp3-node1.log"
RAY = {"gpustack1640-ray-version-mismatch.log", "awsdoeks50-gloo-loopback-connectfullmesh.log",
       "exllama242-safetensors-header-too-large.log", "vllm1432-hub-unreachable-offline.log"}
# The earlier excerpts of test_doctor_public_logs: (backend, unit, the confirmed cause's finding).
EARLIER = {
    "vllm6042-nccl-watchdog-timeout.log": ("mp", "vllm.service", "nccl_watchdog_timeout"),
    "gpustack1254-vllm-cuda-error-802.log": ("mp", "vllm.service", "fabric_manager_down"),
    "vllm7074-gloo-wrong-nic-connectfullmesh.log": ("ray", "vllm.service", "gloo_connect_failed"),
    "vllm14111-no-available-node-types-placement-group.log": ("ray", "vllm.service", "vllm_host_ip_mismatch"),
    "gpustack5509-placement-group-pending.log": ("ray", "vllm.service", "placement_group_unsatisfiable"),
    "vllm-pr43095-unique-ip.log": ("ray", "vllm.service", "vllm_host_ip_mismatch"),
    "logicrl30-ray-python-version-mismatch.log": ("ray", "ray-worker.service", "ray_version_mismatch"),
    "vllm4383-nccl-shm-segment.log": ("mp", "vllm.service", "shm_too_small"),
    "nccl1466-vllm-unhandled-system-error.log": ("mp", "vllm.service", "nccl_system_error"),
    "vllm33297-free-memory-gpu-busy.log": ("mp", "vllm.service", "gpu_memory_busy"),
    "vllm19670-tcpstore-client-timeout.log": ("mp", "vllm.service", "rendezvous_port_blocked"),
    "dynamo4934-tp-larger-than-gpus.log": ("mp", "vllm.service", "world_size_exceeds_gpus"),
    "dynamo4941-model-missing-on-ray-worker.log": ("ray", "vllm.service", "model_missing"),
    "gpustack5056-ray-tp-exceeds-gpus.log": ("ray", "vllm.service", "world_size_exceeds_gpus"),
}
CASES = {**{name: ("ray" if name in RAY else "mp", "vllm.service", expected) for name, expected in NEW_EXCERPTS.items()},
         **EARLIER}


def text(name):
    return (PUBLIC / name).read_text(encoding="utf-8")


def lab(cut=None):
    lines = LAB_LOG.read_text(encoding="utf-8").splitlines()
    if cut is not None:
        lines = lines[: next(index for index, line in enumerate(lines) if cut in line) + 1]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_public_log_alone_names_its_confirmed_cause_first(name):
    backend, unit, expected = CASES[name]
    findings = log_only.diagnose_log(text(name), backend, unit, catalog=CATALOG)
    assert findings and findings[0]["id"] == expected, [finding["id"] for finding in findings]
    assert findings[0]["nodes"] == [log_only.NODE]
    assert any(item["line"].strip() in text(name) or item["line"][:60] in text(name)
               for item in findings[0]["evidence"]), "the finding quotes no line of the log"


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_finding_never_fills_in_what_the_log_does_not_say(name):
    backend, unit, _ = CASES[name]
    for finding in log_only.diagnose_log(text(name), backend, unit, catalog=CATALOG):
        for key in ("title", "cause", "fix", "verify"):
            assert "{" not in finding[key].replace("{'", "").replace('{"', ""), (finding["id"], key, finding[key])
            assert "10.232." not in finding[key] and ":8000" not in finding[key], (finding["id"], key)


def test_the_unknown_port_and_address_are_named_blanks():
    findings = log_only.diagnose_log(text("vlmr1-289-tcpstore-port-in-use.log"), catalog=CATALOG)
    assert findings[0]["id"] == "port_in_use"
    assert "port 29500" in findings[0]["cause"]  # the log says which port
    assert "http://<head address>:<API port>/health" in findings[0]["verify"]  # the log does not say these


@pytest.mark.parametrize("name", ["pytorch111424-nccl-ib-no-device-socket.log", "areal639-nccl-net-socket-bond.log"])
def test_a_cause_that_needs_the_node_s_facts_is_not_guessed(name):
    """NCCL over sockets is a fault only where InfiniBand is declared, which a log alone does not say: the
    doctor says where the log stops instead."""
    findings = log_only.diagnose_log(text(name), catalog=CATALOG)
    assert "nccl_socket_where_ib_declared" not in [finding["id"] for finding in findings]
    assert findings[0]["id"] == "startup_stalled"
    assert findings[0]["cause"].startswith("The log stops in phase distributed_init")


def test_a_log_that_stops_in_the_middle_of_the_start_is_stalled_there():
    findings = log_only.diagnose_log(lab("Starting to load model"), catalog=CATALOG)
    assert [finding["id"] for finding in findings] == ["startup_stalled"]
    finding = findings[0]
    assert finding["title"] == "vLLM's start-up on the node is stuck in weights loading"
    assert "The log stops in phase weights (weights loading) with no error after it" in finding["cause"]
    assert "since 12-02 23:43:49" in finding["cause"] and "storage throughput" in finding["fix"]
    assert "Starting to load model /srv/models/tiny-llama" in finding["evidence"][0]["line"]


def test_a_whole_healthy_start_has_no_finding():
    report = log_only.diagnose_log_report(lab(), catalog=CATALOG)
    assert report["findings"] == []
    assert report["startup_phases"]["complete"] is True


def test_the_unit_failed_when_the_log_ends_in_an_error_and_runs_otherwise():
    def state(log):
        return log_only.evidence_from_log(log)["nodes"][log_only.NODE]["gather"]["units"]["vllm.service"]["ActiveState"]

    assert state(lab()) == "active"
    assert state(lab("Starting to load model")) == "active"
    assert state(text("vlmr1-289-tcpstore-port-in-use.log")) == "failed"
    traceback = text("vllm5244-trust-remote-code-local-path.log")
    assert state(lab() + traceback) == "failed"  # an error after the API came up: it ends in the error
    assert state(traceback + lab()) == "active"  # the API came up after the error
    # an error the start-up went on after did not end it; one after its last step did
    assert state(traceback + lab("Starting to load model")) == "active"
    assert state(lab("Starting to load model") + traceback) == "failed"
    # torch's c10 log records (E<mmdd>) and pydantic's validation error count as errors
    assert state(text("vllm19670-tcpstore-client-timeout.log")) == "failed"
    assert state(text("longvt9-max-model-len-above-derived.log")) == "failed"
    # a traceback the paste cut before its exception line, Ray's C++ error record, a qualified exception type
    traceback_lines = traceback.splitlines()
    cut = next(index for index, line in enumerate(traceback_lines) if line.lstrip().startswith("File "))
    assert state("\n".join(traceback_lines[: cut + 1]) + "\n") == "failed"
    assert state("[2025-06-13 01:49:41,730 E 1 1] gcs_rpc_client.h:179: Failed to connect to GCS at address "
                 "10.0.0.1:6379 within 5 seconds.\n") == "failed"
    assert state("huggingface_hub.utils._http.OfflineModeIsEnabled: Cannot reach https://huggingface.co/api/models/x: "
                 "offline mode is enabled.\n") == "failed"
    assert state("INFO 12-02 23:43:49 [x.py:1] vllm.config: using defaults\n") == "active"
    # a command's own error line (argparse's, docker's) ends a start too
    assert state("api_server.py: error: unrecognized arguments: --bogus\n") == "failed"
    assert state(lab("Starting to load model") + "docker: Error response from daemon: OCI runtime create failed\n") \
        == "failed"


def test_without_its_signature_the_log_alone_falls_back_to_another_finding():
    findings = log_only.diagnose_log(text("vlmr1-289-tcpstore-port-in-use.log"),
                                     catalog=catalog_without("port_in_use"))
    assert findings and findings[0]["id"] != "port_in_use"


@pytest.mark.parametrize(("log", "backend", "unit", "message"), [
    ("", "mp", None, "the log is empty"),
    ("\n   \n\n", "mp", None, "the log is empty"),
    ("INFO x\x00y", "mp", None, "NUL bytes"),
    ("INFO ok", "tpu", None, "backend must be one of mp, ray"),
    ("INFO ok", "mp", "nginx.service", "unit must be one of vllm.service"),
])
def test_what_it_cannot_read_is_refused(log, backend, unit, message):
    with pytest.raises(ValueError, match=message):
        log_only.evidence_from_log(log, backend, unit)


def test_the_json_form_of_a_finding():
    finding = log_only.finding_json(log_only.diagnose_log(text("vllm9531-trust-remote-code.log"), catalog=CATALOG)[0])
    assert set(finding) == {"id", "title", "severity", "cause", "evidence", "fix", "verify"}
    assert finding["id"] == "trust_remote_code_required" and all(isinstance(line, str) for line in finding["evidence"])
