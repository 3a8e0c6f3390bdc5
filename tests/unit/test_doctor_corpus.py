"""The doctor on public failure logs it was tuned on: the training part of the corpus.

tests/fixtures/doctor/corpus holds public vLLM failure logs whose cause is confirmed in their thread (each
``.source.txt`` names the thread, the confirmation and ``accept:``, the findings that name that cause). They are
the two thirds of the collected corpus the rules were written against; the other third was held out and scored
once (docs/doctor.md, "How well it reads logs it has never seen"). Each log goes through ``vllm-cluster doctor
--log``'s diagnosis (``log_only.diagnose_log``): no plan, no node, only the log.

A case the doctor misses is listed in MISSES with the reason. The test fails when a listed hit turns into a miss
(a rule broke it) and when a listed miss turns into a hit (take it off the list: the list stays true).
"""

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "fixtures" / "doctor" / "corpus"
# case -> why the first finding is not one the case accepts
MISSES = {
    "awsdoeks51-gloo-ifname-exclusion-syntax": (
        "gloo_connect_failed (fix: set GLOO_SOCKET_IFNAME to the fabric NIC) where the case accepts only the "
        "wrong-interface finding, which needs the node's env file: a log alone does not show it"),
    "vllm22407-stray-vllm-api-key-401": (
        "the log is the client's 401: the server logged nothing wrong, api_key_differs needs the nodes' key files"),
}


def _scorer():
    path = REPO / "scripts" / "doctor-corpus-score"
    loader = importlib.machinery.SourceFileLoader("doctor_corpus_score", str(path))
    spec = importlib.util.spec_from_loader("doctor_corpus_score", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    module._collection_imports()
    return module


@pytest.fixture(scope="module")
def result():
    return _scorer().score(str(CORPUS))


def test_every_case_has_its_source_and_digest():
    import hashlib

    logs = sorted(CORPUS.glob("*.log"))
    assert len(logs) >= 30
    for log in logs:
        source = log.with_name(log.name[: -len(".log")] + ".source.txt").read_text()
        assert "source: https://github.com/" in source, log.name
        assert "confirmed by:" in source, log.name
        assert f"sha256: {hashlib.sha256(log.read_bytes()).hexdigest()}" in source, log.name


def test_each_case_is_a_hit_or_a_listed_miss(result):
    rows = {row["case"]: row for row in result["cases"]}
    assert set(MISSES) <= set(rows), "a listed miss has no case"
    broken = {case: (row["first"], row["accept"], row["note"]) for case, row in rows.items()
              if not row["hit"] and case not in MISSES}
    assert not broken, f"cases the doctor no longer names: {broken}"
    mended = [case for case in MISSES if rows[case]["hit"]]
    assert not mended, f"listed misses that are hits now (take them off MISSES): {mended}"


def test_no_case_ends_in_the_generic_findings(result):
    generic = {"unit_failed", "api_unanswered_from_controller"}
    assert not [row["case"] for row in result["cases"] if row["first"] in generic and row["case"] not in MISSES]
