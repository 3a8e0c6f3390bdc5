"""The doctor asks the API as a client would (issue 23, item 1): from the controller, never "0 faults" when it fails.

The evidence is the real healthy lab deployment (tests/fixtures/doctor/lab/cases/healthy.json, saved by doctor.yml);
the controller's probes are the uri results doctor.yml registers: a node that looks healthy from inside while the
API does not answer from outside must still be a fault, ranked after any finding that explains it.
"""

import json
import subprocess
import sys
from pathlib import Path

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import diagnosis
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.catalog import load_catalog_file
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
    client_from_registered,
    evidence_from_registered,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.report import render_report

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "fixtures" / "doctor" / "lab" / "cases"
CATALOG_FILE = REPO / "roles" / "doctor" / "files" / "signatures.yml"
CATALOG = load_catalog_file(CATALOG_FILE)
CLI = REPO / "collections" / "ansible_collections" / "vllm_ops" / "cluster" / "roles" / "doctor" / "files" / "vllm_doctor.py"
URL = "http://10.77.0.11:8000"


def probe(method, path, status, msg="OK (unknown bytes)", body=None, elapsed=0):
    return {"status": status, "msg": msg, "elapsed": elapsed, "json": body, "skipped": False,
            "__doctor_probe": {"method": method, "path": path}}


GOOD = [probe("GET", "/health", 200), probe("GET", "/v1/models", 200, body={"data": [{"id": "lab-tiny-llama"}]}),
        probe("POST", "/v1/completions", 200, body={"choices": [{"text": " world"}]}),
        probe("POST", "/v1/chat/completions", 200, body={"choices": [{"message": {"role": "assistant",
                                                                                  "content": " world"}}]})]
# What vLLM answers a chat for a model without a chat template (its words, as the lab's model answered before it
# shipped one).
NO_TEMPLATE = probe("POST", "/v1/chat/completions", 400, "Status code was 400 and not [200]: HTTP Error 400: Bad Request",
                    body={"error": {"message": "As of transformers v4.44, default chat template is no longer allowed, "
                                               "so you must provide a chat template if the tokenizer does not define "
                                               "one.", "type": "BadRequestError", "param": None, "code": 400}})
# What uri registers when nothing answers within the timeout (a firewall that drops the controller's packets).
TIMED_OUT = "Status code was -1 and not [200]: Request failed: <urlopen error timed out>"
SILENT = [probe("GET", "/health", -1, TIMED_OUT, elapsed=20), probe("GET", "/v1/models", -1, TIMED_OUT, elapsed=20),
          probe("POST", "/v1/completions", -1, TIMED_OUT, elapsed=20)]


def case(name, client_results):
    data = json.loads((CASES / f"{name}.json").read_text(encoding="utf-8"))
    hosts = [{"host": h, "gather": g, "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    return diagnosis.diagnose(CATALOG, evidence_from_registered(data["plan"], hosts,
                                                                client_from_registered(URL, client_results)))


def test_the_probes_are_read_as_a_client_would_judge_them():
    assert client_from_registered(URL, GOOD)["probes"] == [
        {"probe": "GET /health", "ok": True, "status": 200, "error": None, "elapsed_s": 0},
        {"probe": "GET /v1/models", "ok": True, "status": 200, "error": None, "elapsed_s": 0},
        {"probe": "POST /v1/completions", "ok": True, "status": 200, "error": None, "elapsed_s": 0},
        {"probe": "POST /v1/chat/completions", "ok": True, "status": 200, "error": None, "elapsed_s": 0}]
    empty = probe("POST", "/v1/completions", 200, body={"object": "text_completion"})
    assert client_from_registered(URL, [empty])["probes"][0]["error"] == "status 200 without a completion in the body"
    assert client_from_registered(URL, [probe("GET", "/health", 401, "Status code was 401 and not [200]")])[
        "probes"][0] == {"probe": "GET /health", "ok": False, "status": 401, "error": "Status code was 401 and not [200]",
                         "elapsed_s": 0}
    # A refusal quotes the API's own message, not only uri's status line.
    refused = client_from_registered(URL, [NO_TEMPLATE])["probes"][0]
    assert refused["ok"] is False and refused["status"] == 400
    assert refused["error"].startswith("Status code was 400 and not [200]: HTTP Error 400: Bad Request; the API said: "
                                       "As of transformers v4.44, default chat template is no longer allowed")
    # Not probed (doctor_client_check false, or no plan): no client evidence, no finding.
    assert client_from_registered(None, [{"skipped": True}]) == {}


def test_a_healthy_deployment_that_answers_has_no_fault():
    report = case("healthy", GOOD)
    assert report["faults"] == 0 and "api_unanswered_from_controller" not in [f["id"] for f in report["findings"]]


def test_healthy_nodes_that_do_not_answer_the_controller_are_a_fault_never_zero():
    """The issue's worst answer: "0 faults" while a completion from the controller times out. Without the client
    probes this very evidence reports 0 faults (test_doctor_lab_cases); with them it must report this one."""
    report = case("healthy", SILENT)
    assert report["faults"] == 1
    top = next(f for f in report["findings"] if f["severity"] == "fault")
    assert top["id"] == "api_unanswered_from_controller" and top["nodes"] == ["node1"]
    assert top["title"] == f"The API does not answer from the controller (GET /health at {URL})"
    assert "no cause was found on the nodes" in top["cause"]
    assert "http://127.0.0.1:8000/health" in top["fix"] and f"{URL}/health" in top["fix"]
    quoted = top["evidence"][0]["line"]
    assert quoted.startswith(f"from the controller, {URL}: GET /health -> {TIMED_OUT} after 20 s; GET /v1/models")
    assert any("The API does not answer from the controller" in line for line in render_report(report))


def test_a_chat_refused_for_want_of_a_template_is_named_as_such_not_as_a_blocked_path():
    report = case("healthy", GOOD[:3] + [NO_TEMPLATE])
    faults = [f for f in report["findings"] if f["severity"] == "fault"]
    assert [f["id"] for f in faults] == ["chat_template_missing"], [f["id"] for f in faults]
    assert faults[0]["title"] == f"Chat is refused: the model has no chat template (POST /v1/chat/completions at {URL})"
    assert "default chat template is no longer allowed" in faults[0]["cause"]
    # Any other refusal of the chat is what a client sees, with the API's own words.
    other = probe("POST", "/v1/chat/completions", 404, "Status code was 404 and not [200]",
                  body={"error": {"message": "The model `x` does not exist."}})
    ids = [f["id"] for f in case("healthy", GOOD[:3] + [other])["findings"] if f["severity"] == "fault"]
    assert ids == ["api_unanswered_from_controller"]


def test_a_cause_on_the_nodes_ranks_before_what_the_client_sees():
    report = case("model-missing", SILENT)
    ids = [f["id"] for f in report["findings"] if f["severity"] == "fault"]
    assert ids[0] == "model_missing" and ids[-1] == "api_unanswered_from_controller"


def test_the_cli_reads_the_client_probes_as_the_playbook_saves_them(tmp_path):
    data = json.loads((CASES / "healthy.json").read_text(encoding="utf-8"))
    data["client"] = {"url": URL, "results": SILENT}
    evidence = tmp_path / "doctor-evidence.json"
    evidence.write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, str(CLI), "diagnose", "--catalog", str(CATALOG_FILE), "--evidence",
                           str(evidence)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["faults"] == 1 and summary["top"]["id"] == "api_unanswered_from_controller"
    # Evidence saved before this change (no "client" key) still diagnoses as before.
    del data["client"]
    evidence.write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, str(CLI), "diagnose", "--catalog", str(CATALOG_FILE), "--evidence",
                           str(evidence)], capture_output=True, text=True, timeout=120, check=False)
    assert json.loads(proc.stdout)["faults"] == 0
