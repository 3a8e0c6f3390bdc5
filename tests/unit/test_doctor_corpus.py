"""The doctor on the public failure logs of its corpus.

tests/fixtures/doctor/corpus holds public vLLM failure logs whose cause is confirmed in their thread (each
``.source.txt`` names the thread, the confirmation and ``accept:``, the findings that name that cause). The rules
were written on part of them; the others were held out and scored once before joining this folder
(docs/doctor.md, "How well it reads logs it has never seen"; ``split.json`` says which case was held out when).
Here they all guard against regressions. Each log goes through ``vllm-cluster doctor --log``'s diagnosis (``log_only.diagnose_log``): no plan,
no node, only the log.

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
    "awsdoeks49-ray-worker-wrong-node-ip": (
        "ray_node_registration_failed (read raylet.out for a port, a node IP, the GCS) where the case accepts the "
        "node the head cannot reach: the log's 'Local node IP' is not compared with the head's network"),
    "kimik2-19-vllm-too-old-for-tool-parser": (
        "a bare KeyError 'invalid tool call parser' with no frame: no subsystem claims it, unit_failed quotes it"),
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
    assert len(logs) >= 60
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


def _diagnose_case(case):
    import re

    from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import log_only

    source = (CORPUS / f"{case}.source.txt").read_text()
    backend = re.search(r"^backend: (\w+)", source, re.M).group(1)
    unit = re.search(r"^unit: (\S+)", source, re.M).group(1)
    return log_only.diagnose_log((CORPUS / f"{case}.log").read_text(), backend, unit)


# What each kind of line gives: the case, the first finding, words its evidence must quote. Each would fail if the
# reader of that kind of line went (the finding would be another, or none: these cases scored no finding before).
WORDINGS = [
    # a CUDA runtime error printed by a C++ extension, no Python exception: out of memory decides the subsystem
    ("lmmr1042-cumem-oom-vllm-gpu-memory-utilization", "raised_in_memory", "Cuda error: out of memory"),
    # an exception named by its module path inside a line of prose
    ("qwen3067-72b-single-gpu-no-tensor-parallel-oom", "raised_in_memory", "torch.cuda.OutOfMemoryError: CUDA out"),
    # Ray's C++ fatal level (C)
    ("ray62328-ray-cgraph-crossnode-semaphore-bug", "raised_in_ray", "An unexpected system state has occurred"),
    # argparse's error of a subcommand ("vllm serve: error:")
    ("sparkvllm283-invalid-json-diffusion-config", "raised_in_configuration", "argument --diffusion-config"),
    # a frame in an earlier vLLM's tokenizer module (former_prefixes)
    ("vllm569-llama-tokenizer-load-failed", "raised_in_tokenizer", "RuntimeError: Failed to load the tokenizer"),
    # a compiler missing from the node decides before the errno's "file not found"
    ("flashinfer1781-nvcc-missing-for-jit", "raised_in_compilation", "No such file or directory: 'nvcc'"),
    # Ray's resource request wrapped onto the next line, pinned to a node address no Ray node has
    ("sparkvllmdocker227-pg-pinned-to-route-ip-multinic", "vllm_host_ip_mismatch", "'node:192.168.50.192'"),
    # huggingface_hub's disk-space warning before a download that cannot fit
    ("tpurecipes148-disk-full-model-download", "disk_full_where_vllm_writes", "Not enough free disk space"),
    # docker compose's "service  | " before vLLM's own prefixes
    ("club3090-1036-missing-weight-shard", "raised_in_model_loading", "Weight files referenced in index but missing"),
    # NCCL's shared-memory words quoted as "Last error:" in torch's exception
    ("vllm6689-nccl-shm-segment-too-small", "shm_too_small", "Error while creating shared memory segment"),
]


@pytest.mark.parametrize(("case", "finding", "quoted"), WORDINGS, ids=[case for case, _, _ in WORDINGS])
def test_each_kind_of_error_line_is_read(case, finding, quoted):
    findings = _diagnose_case(case)
    assert findings and findings[0]["id"] == finding, [f["id"] for f in findings]
    evidence = " ".join(item["line"] for item in findings[0]["evidence"])
    assert quoted in evidence, evidence
