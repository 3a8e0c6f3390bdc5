"""The unseen-fault suite (issue 23, item 8), replayed offline: what doctor.yml read on the lab, diagnosed again.

Each folder of tests/fixtures/doctor/unseen/ holds the doctor-evidence.json that
doctor.yml wrote on the lab while one fault was in place, and expected.json: the
fault, how it was injected, the node, the acceptable top findings and the words
the fix must say (tests/lab/test_doctor_unseen.py makes both on a fresh lab).
This keeps every later change of the catalog or of the observations honest
against real failures: the top fault, its node and its fix, as on the lab.
"""

import json
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import diagnosis
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.catalog import load_catalog_file
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import evidence_from_saved

REPO = Path(__file__).resolve().parents[2]
UNSEEN = REPO / "tests" / "fixtures" / "doctor" / "unseen"
CATALOG = load_catalog_file(REPO / "roles" / "doctor" / "files" / "signatures.yml")
CASES = sorted(path.name for path in UNSEEN.iterdir() if (path / "expected.json").is_file() and path.name != "healthy")


def diagnose(case):
    data = json.loads((UNSEEN / case / "doctor-evidence.json").read_text(encoding="utf-8"))
    return diagnosis.diagnose(CATALOG, evidence_from_saved(data))


def test_the_healthy_lab_deployment_captured_before_the_faults_has_no_fault():
    # Fails when a compared fact fires on a healthy lab (it did: the limits the nodes' container caps alike).
    report = diagnose("healthy")
    assert report["faults"] == 0, [(f["id"], f["nodes"]) for f in report["findings"]]


def test_the_suite_has_at_least_sixteen_faults_of_distinct_kinds():
    kinds = {json.loads((UNSEEN / case / "expected.json").read_text(encoding="utf-8"))["kind"] for case in CASES}
    assert len(CASES) >= 16, CASES
    assert len(kinds) >= 12, kinds


@pytest.mark.parametrize("case", CASES)
def test_the_unseen_fault_is_the_top_finding_on_its_node_with_a_fix_that_fits(case):
    expected = json.loads((UNSEEN / case / "expected.json").read_text(encoding="utf-8"))
    report = diagnose(case)
    faults = [f for f in report["findings"] if f["severity"] == "fault"]
    summary = [(f["id"], f["severity"], f["nodes"]) for f in report["findings"]]
    assert faults, summary
    top = faults[0]
    assert top["id"] in expected["expect"], summary
    assert top["nodes"] == [expected["node"]], summary
    for word in expected["fix_words"]:
        assert word in top["fix"], top["fix"]
    assert top.get("verify"), f"{top['id']}: a fix says how to check it worked"
