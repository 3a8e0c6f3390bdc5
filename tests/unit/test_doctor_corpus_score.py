"""scripts/doctor-corpus-score: hits and misses of the doctor's first finding over a corpus of logs.

The corpus is made here from the public excerpts (tests/fixtures/doctor/public), each with the finding its
confirmed cause gives in tests/unit/test_doctor_public_logs.py, plus deliberate misses: an accept list that names
another cause, and a log whose first finding would be the generic unit_failed.
"""

import importlib.machinery
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_doctor_public_logs import PUBLIC, RAW_CATALOG, load_catalog

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "doctor-corpus-score"
# case id -> (fixture, backend, unit, accept)
CORPUS = {
    "vlmr1-289-port": ("vlmr1-289-tcpstore-port-in-use.log", "mp", "vllm.service", "port_in_use"),
    "vllm9531-trust": ("vllm9531-trust-remote-code.log", "mp", "vllm.service",
                       "trust_remote_code_required, raised_in_configuration"),
    "gpustack5509-pg": ("gpustack5509-placement-group-pending.log", "ray", "vllm.service",
                        "placement_group_unsatisfiable, startup_stalled"),
    "logicrl30-ray": ("logicrl30-ray-python-version-mismatch.log", "ray", "ray-worker.service", "ray_version_mismatch"),
    # deliberate miss: the accept list names another cause than the one the log shows
    "bonito7-wrong-accept": ("bonito7-kv-cache-below-max-seq-len.log", "mp", "vllm.service", "port_in_use"),
}
HITS = {"vlmr1-289-port", "vllm9531-trust", "gpustack5509-pg", "logicrl30-ray"}


def make_corpus(directory, cases=CORPUS):
    directory.mkdir(exist_ok=True)
    for case, (fixture, backend, unit, accept) in cases.items():
        shutil.copy(PUBLIC / fixture, directory / f"{case}.log")
        (directory / f"{case}.source.txt").write_text(
            f"file: {case}.log\nsource: (see tests/fixtures/doctor/public/{fixture[:-4]}.source.txt)\n"
            f"backend: {backend}\nunit: {unit}\naccept: {accept}\n", encoding="utf-8")
    return directory


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=300, check=False)


def scorer():
    loader = importlib.machinery.SourceFileLoader("doctor_corpus_score", str(SCRIPT))
    spec = importlib.util.spec_from_loader("doctor_corpus_score", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_table_counts_hits_and_the_deliberate_miss(tmp_path):
    result = run(make_corpus(tmp_path / "corpus"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["case", "first", "finding", "accepted", "result"]
    rows = {line.split()[0]: line for line in lines[1: 1 + len(CORPUS)]}
    assert set(rows) == set(CORPUS)
    for case in HITS:
        assert rows[case].rstrip().endswith("hit"), rows[case]
    miss = rows["bonito7-wrong-accept"].split()
    assert miss[1] == "kv_cache_too_small" and miss[2] == "port_in_use" and miss[-1] == "miss"
    assert lines[-1] == "score: 4/5 hits (80.0%)"


def test_json_gives_each_case_its_findings(tmp_path):
    result = run(make_corpus(tmp_path / "corpus"), "--json")
    assert result.returncode == 0, result.stderr
    scored = json.loads(result.stdout)
    assert (scored["hits"], scored["total"], scored["score"]) == (4, 5, 0.8)
    by_case = {row["case"]: row for row in scored["cases"]}
    assert by_case["gpustack5509-pg"]["first"] == "placement_group_unsatisfiable"
    assert by_case["gpustack5509-pg"]["findings"][:2] == ["placement_group_unsatisfiable", "startup_stalled"]
    assert by_case["bonito7-wrong-accept"]["hit"] is False


def test_a_generic_first_finding_is_a_miss_even_when_accepted(tmp_path):
    """unit_failed names no cause: with the catalog less the signature of the cause (and any fallback by
    subsystem), a log's first finding is unit_failed, and an accept list naming it still scores a miss."""
    names = ["port_in_use"] + [sig["id"] for sig in RAW_CATALOG["signatures"] if sig["id"].startswith("raised_in_")]
    data = {**RAW_CATALOG, "signatures": [sig for sig in RAW_CATALOG["signatures"] if sig["id"] not in names]}
    for sig in data["signatures"]:
        sig["explains"] = [name for name in sig.get("explains", []) if name not in names]
    catalog = load_catalog(data)
    corpus = make_corpus(tmp_path / "corpus", {"port-generic": (
        "vlmr1-289-tcpstore-port-in-use.log", "mp", "vllm.service", "unit_failed, port_in_use")})
    scored = scorer().score(str(corpus), catalog)
    row = scored["cases"][0]
    assert row["first"] == "unit_failed" and row["hit"] is False and scored["hits"] == 0
    assert "names no cause" in row["note"]


def test_a_case_it_cannot_read_is_a_miss_and_the_others_still_count(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", {"vlmr1-289-port": CORPUS["vlmr1-289-port"]})
    (corpus / "empty.log").write_text("", encoding="utf-8")
    (corpus / "empty.source.txt").write_text("backend: mp\nunit: vllm.service\naccept: startup_stalled\n")
    (corpus / "nosource.log").write_text("INFO something\n", encoding="utf-8")
    scored = json.loads(run(corpus, "--json").stdout)
    by_case = {row["case"]: row for row in scored["cases"]}
    assert by_case["vlmr1-289-port"]["hit"] and scored["hits"] == 1 and scored["total"] == 3
    assert by_case["empty"]["note"] == "refused: the log is empty"
    assert by_case["nosource"]["note"].startswith("unreadable case:")


@pytest.mark.parametrize("make", [lambda path: path / "missing", lambda path: path])
def test_no_corpus_is_exit_2_with_one_line(tmp_path, make):
    result = run(make(tmp_path))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("doctor-corpus-score: error: ")
