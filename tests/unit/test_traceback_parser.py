"""The exception line of a failing unit's last traceback (parsers/traceback.py), on real logs only.

Real output of the programs, each with its .source.txt: tests/fixtures/tracebacks
(vLLM 0.32 on its CPU platform failing at start in five ways, torchrun's
``[rankN]:`` tracebacks on CPU and a CUDA out-of-memory on an H200, a Ray task
error, a multiprocessing pool); the journals doctor.yml saved on the lab
(tests/fixtures/doctor/lab/cases); excerpts of public issues
(tests/fixtures/doctor/public). Every test names the exact line chosen; none of
them may be a frame, a code line or a line of carets.
"""

import copy
import hashlib
import json
import re
from itertools import zip_longest
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import diagnosis
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.catalog import load_catalog_file
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
    Cluster,
    evidence_from_registered,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_node import (
    _last_error_line,
    obs_unit_failed,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import traceback as tb
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify import vllm_logs

REPO = Path(__file__).resolve().parents[2]
TRACEBACKS = REPO / "tests" / "fixtures" / "tracebacks"
LAB_CASES = REPO / "tests" / "fixtures" / "doctor" / "lab" / "cases"
PUBLIC = REPO / "tests" / "fixtures" / "doctor" / "public"
CATALOG = load_catalog_file(REPO / "roles" / "doctor" / "files" / "signatures.yml")

KV_VALUE_ERROR = (
    "ValueError: To serve at least one request with the model's max seq len (2048), (0.0 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (0.0 GiB). Based on the available memory, the estimated "
    "maximum model length is 128. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the "
    "CPU backend) or decreasing `max_model_len` when initializing the engine. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 200.00 GiB. GPU 0 has a total capacity of "
    "139.80 GiB of which 138.77 GiB is free. Including non-PyTorch memory, this process has 518.00 MiB memory in "
    "use. Process 472 has 518.00 MiB memory in use. Of the allocated memory 0 bytes is allocated by PyTorch, and 0 "
    "bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-"
    "alloc-conf)"
)
ENGINE_CORE_FAILED = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
WEIGHTS_MISSING = "RuntimeError: Cannot find any model weights with `/tmp/tb/tiny-noweights`"
CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"


def fixture(name):
    return (TRACEBACKS / f"{name}.txt").read_text(encoding="utf-8").splitlines()


def lab_journal(case, host, unit):
    data = json.loads((LAB_CASES / f"{case}.json").read_text(encoding="utf-8"))
    gather = dict(zip(data["hosts"], data["gather"], strict=True))[host]
    return gather["evidence"]["journal"][unit]


def public(name):
    return (PUBLIC / f"{name}.log").read_text(encoding="utf-8").splitlines()


def test_every_traceback_fixture_has_its_source():
    logs = sorted(path for path in TRACEBACKS.glob("*.txt") if not path.name.endswith(".source.txt"))
    assert len(logs) >= 9
    for log in logs:
        source = log.with_name(log.stem + ".source.txt")
        assert source.exists(), f"{log.name} has no {source.name}"
        text = source.read_text(encoding="utf-8")
        assert f"file: {log.name}" in text and "source: " in text and "what it shows: " in text
        assert f"sha256: {hashlib.sha256(log.read_bytes()).hexdigest()}" in text, f"{log.name} changed"


@pytest.mark.parametrize(
    ("name", "exception", "context", "root", "root_process", "root_context"),
    [
        # vLLM V1: the engine core's ValueError (logged, then printed again by multiprocessing), then the API
        # server's "See root cause above"; a resource_tracker warning after it is not part of its message.
        ("vllm-cpu-kv-cache-too-small",
         "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
         "{'EngineCore': 1}",
         ["raise RuntimeError(", "RuntimeError: Engine core initialization failed. See root cause above. Failed "
          "core proc(s): {'EngineCore': 1}"],
         KV_VALUE_ERROR, "(EngineCore pid=30703)", ["raise ValueError(", KV_VALUE_ERROR]),
        # TP=2: both workers fail, the engine core and the API server follow; the root is worker 0's.
        ("vllm-cpu-tp2-model-weights-missing", ENGINE_CORE_FAILED, ["raise RuntimeError(", ENGINE_CORE_FAILED],
         WEIGHTS_MISSING, "(Worker_TP0 pid=1949)", ["raise RuntimeError(", WEIGHTS_MISSING]),
        # Python's chain: "During handling of the above exception, another exception occurred:".
        ("vllm-cpu-config-json-invalid",
         "OSError: It looks like the config file at '/tmp/tb/tiny-badjson/config.json' is not a valid JSON file.",
         ["raise OSError(f\"It looks like the config file at '{resolved_config_file}' is not a valid JSON file.\")",
          "OSError: It looks like the config file at '/tmp/tb/tiny-badjson/config.json' is not a valid JSON file."],
         "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 19 column 26 "
         "(char 426)", "",
         ["obj, end = self.scan_once(s, idx)",
          "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 19 column 26 "
          "(char 426)"]),
        # A message over several lines, the first indented, the next ones not.
        ("vllm-cpu-model-dir-without-config",
         "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
         ["s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)",
          "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
          "Value error, Invalid repository ID or local directory specified: '/tmp/tb/tiny-noconfig'.",
          "Please verify the following requirements:"],
         None, None, None),
        # An exception without a message.
        ("vllm-cpu-sigint-during-import", "KeyboardInterrupt", ["from .conv_fused import (", "KeyboardInterrupt"],
         None, None, None),
        # torch's "[rank0]: " prefix; torchrun's own traceback last, its message empty, its rules left out.
        ("torchrun-gloo-rank0-file-missing", CHILD_FAILED,
         ["raise ChildFailedError(", CHILD_FAILED, "dist_fail.py FAILED", "Failures:"],
         "FileNotFoundError: [Errno 2] No such file or directory: '/srv/models/missing/model.safetensors'",
         "[rank0]:",
         ['with open(path, "rb") as handle:',
          "FileNotFoundError: [Errno 2] No such file or directory: '/srv/models/missing/model.safetensors'"]),
        # A dotted exception name: a real CUDA out-of-memory on an H200.
        ("torchrun-h200-rank0-cuda-oom", CHILD_FAILED,
         ["raise ChildFailedError(", CHILD_FAILED, "oom_rank.py FAILED", "Failures:"],
         CUDA_OOM, "[rank0]:", ['weights = torch.empty(200 * 2**30, dtype=torch.uint8, device="cuda")', CUDA_OOM]),
        # Ray's RayTaskError quotes the worker's traceback in its message: that one is the root; colour removed.
        ("ray-task-error-file-missing",
         "ray.exceptions.RayTaskError(FileNotFoundError): ray::read_config() (pid=6592, ip=192.0.2.2)",
         ["raise value.as_instanceof_cause()",
          "ray.exceptions.RayTaskError(FileNotFoundError): ray::read_config() (pid=6592, ip=192.0.2.2)"],
         "FileNotFoundError: [Errno 2] No such file or directory: '/srv/models/missing/config.json'", "",
         ["with open(path) as handle:",
          "FileNotFoundError: [Errno 2] No such file or directory: '/srv/models/missing/config.json'"]),
        # "The above exception was the direct cause ...": the root says the same, so it is not repeated.
        ("python-pool-remote-traceback",
         "FileNotFoundError: [Errno 2] No such file or directory: '/srv/models/missing/model-00002-of-00002.safetensors'",
         ["raise self._value",
          "FileNotFoundError: [Errno 2] No such file or directory: "
          "'/srv/models/missing/model-00002-of-00002.safetensors'"],
         None, None, None),
    ],
)
def test_the_last_exception_line_and_its_root(name, exception, context, root, root_process, root_context):
    found = tb.last_exception(fixture(name))
    assert found["exception"] == exception
    assert found["context"] == context
    assert found["root"] == root
    assert found["root_process"] == root_process
    assert found["root_context"] == root_context


def test_chains_and_quoted_tracebacks_are_marked():
    context = tb.parse_tracebacks(fixture("vllm-cpu-config-json-invalid"))
    assert [(r["type"], r["chained"]) for r in context] == [("json.decoder.JSONDecodeError", None),
                                                              ("OSError", "context")]
    cause = tb.parse_tracebacks(fixture("python-pool-remote-traceback"))
    assert [(r["type"], r["chained"]) for r in cause] == [("FileNotFoundError", None), ("FileNotFoundError", "cause")]
    quoted = tb.parse_tracebacks(fixture("ray-task-error-file-missing"))
    assert [(r["type"], r["nested"], r["line"]) for r in quoted] == [
        ("FileNotFoundError", True, 22), ("ray.exceptions.RayTaskError(FileNotFoundError)", False, 18)]


def test_every_traceback_of_a_multi_process_failure_is_read_with_its_process():
    records = tb.parse_tracebacks(fixture("vllm-cpu-tp2-model-weights-missing"))
    assert [(r["process"], r["exception"], r["failure"]) for r in records] == [
        ("(Worker_TP0 pid=1949)", WEIGHTS_MISSING, 0),
        ("(Worker_TP1 pid=1950)", WEIGHTS_MISSING, 0),
        ("(EngineCore pid=1423)", "Exception: WorkerProc initialization failed due to an exception in a background "
                                  "process. See stack trace for root cause.", 0),
        ("", "Exception: WorkerProc initialization failed due to an exception in a background process. See stack "
             "trace for root cause.", 0),
        ("", ENGINE_CORE_FAILED, 0),
    ]
    assert records[0]["context"][0] == "raise RuntimeError("
    assert records[2]["context"][0] == "raise e from None"


@pytest.mark.parametrize("name", sorted(p.stem for p in TRACEBACKS.glob("*.txt") if ".source" not in p.name))
def test_no_frame_code_or_caret_line_is_ever_chosen(name):
    lines = fixture(name)
    bodies = [tb.split_line(line)[3] for line in lines]
    records = tb.parse_tracebacks(lines)
    assert records
    for record in records:
        chosen = bodies[record["line"]]
        assert chosen == record["exception"] or chosen.rstrip() == record["exception"]
        assert not chosen[:1].isspace() and not chosen.startswith("File ")
        assert not re.fullmatch(r"\s*[\^~]+\s*", chosen)


@pytest.mark.parametrize(
    ("case", "host", "unit", "exception", "context"),
    [
        ("port-conflict", "node1", "vllm.service", "OSError: [Errno 98] Address already in use",
         ["sock.bind(addr)", "OSError: [Errno 98] Address already in use"]),
        ("heads-not-divisible", "node2", "vllm.service",
         "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig",
         ["s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)",
          "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig",
          "Value error, Total number of attention heads (4) must be divisible by tensor parallel size (6). "
          "[type=value_error, input_value=ArgsKwargs((), {'model_co... 'shutdown_timeout': 0}), "
          "input_type=ArgsKwargs]",
          "For further information visit https://errors.pydantic.dev/2.14/v/value_error"]),
        ("model-missing", "node2", "vllm.service",
         "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
         "'namespace/repo_name': '/srv/models/tiny-llama'. Use `repo_type` argument if needed.",
         ["raise HFValidationError(",
          "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
          "'namespace/repo_name': '/srv/models/tiny-llama'. Use `repo_type` argument if needed."]),
        # The message goes on after the exception line; systemd's lines after it are not part of it.
        ("ray-version-mismatch", "node2", "ray-worker.service",
         "RuntimeError: Version mismatch: The cluster was started with:",
         ["raise RuntimeError(error_message)", "RuntimeError: Version mismatch: The cluster was started with:",
          "Ray: 2.60.0", "Python: 3.11.2"]),
    ],
)
def test_lab_journals(case, host, unit, exception, context):
    found = tb.last_exception(lab_journal(case, host, unit))
    assert (found["exception"], found["context"], found["root"]) == (exception, context, None)


def test_a_traceback_whose_start_the_excerpt_cut_off_under_vllm_worker_prefix_and_header():
    # Public excerpt (nccl#1466): frames only, each line "(VllmWorkerProcess pid=N) ERROR ... ]", then an empty one.
    found = tb.last_exception(public("nccl1466-vllm-unhandled-system-error"))
    assert found["exception"] == "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"
    assert found["process"] == "(VllmWorkerProcess pid=675597)"
    assert found["context"] == ['raise RuntimeError(f"NCCL error: {error_str}")', found["exception"]]


@pytest.mark.parametrize(
    "name",
    [
        "gpustack1254-vllm-cuda-error-802",  # ends on "Traceback (most recent call last):"
        "dynamo4941-model-missing-on-ray-worker",  # a code line and an exception line, no frame
        "vllm33297-free-memory-gpu-busy",  # an exception line alone
    ],
)
def test_no_complete_traceback_gives_none(name):
    assert tb.parse_tracebacks(public(name)) == []
    assert tb.last_exception(public(name)) is None


@pytest.mark.parametrize(
    ("line", "process", "header", "body"),
    [
        # public excerpts: a collector's timestamp, two process prefixes, Ray's prefix with torch's rank prefix
        (public("vllm33297-free-memory-gpu-busy")[0], "(EngineCore_DP0 pid=972)", "ERROR 01-28 15:59:42 [core.py:935]",
         "ValueError: Free memory on device cuda:0 (1.53/22.05 GiB) on startup is less than desired GPU memory "
         "utilization (0.9, 19.84 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
         "processes."),
        (public("dynamo4941-model-missing-on-ray-worker")[0],
         "(EngineCore_DP0 pid=1305) (RayWorkerWrapper pid=344, ip=10.2.30.130)",
         "ERROR 12-12 22:31:21 [worker_base.py:275]", "    raise HFValidationError("),
        (public("vllm7074-gloo-wrong-nic-connectfullmesh")[2], "(RayWorkerWrapper pid=1890, ip=10.41.0.8) [rank8]:",
         None, "[E ProcessGroupGloo.cpp:144] Gloo connectFullMesh failed with "
               "[../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error"),
        # the lab's Ray head (Ray's header) and torchrun's glog header
        (next(line for line in lab_journal("port-conflict", "node1", "ray-head.service") if "usage_lib" in line), "",
         "2026-11-30 04:26:34,339\tINFO usage_lib.py:448 --", "Usage stats collection is disabled."),
        (fixture("torchrun-gloo-rank0-file-missing")[1], "",
         "W1202 09:56:40.128000 19491 torch/distributed/run.py:874]", "*****************************************"),
        (fixture("torchrun-gloo-rank0-file-missing")[5], "[rank0]:", None,
         '  File "/tmp/tb/dist_fail.py", line 15, in <module>'),
    ],
)
def test_prefixes_are_removed_and_indentation_kept(line, process, header, body):
    assert tb.split_line(line)[0] == process
    assert tb.split_line(line)[2] == header
    assert tb.split_line(line)[3] == body


def test_journal_timestamps_before_the_lines_change_nothing():
    # node.journal() holds each entry's MESSAGE only; `journalctl -o short` and `-o short-iso` put a
    # timestamp, the host and the unit's process before it: the same real lines read the same with them.
    lines = fixture("vllm-cpu-kv-cache-too-small")
    for stamp in ("Dec 02 10:03:49 node1 vllm[30374]: ", "2026-12-02T10:03:49+0000 node1 vllm[30374]: "):
        stamped = tb.last_exception([stamp + line for line in lines])
        assert stamped == tb.last_exception(lines)
        assert stamped["root"] == KV_VALUE_ERROR and stamped["root_process"] == "(EngineCore pid=30703)"


def interleave(first, second):
    return [line for pair in zip_longest(first, second) for line in pair if line is not None]


def test_interleaved_tracebacks_of_two_processes_are_read_apart():
    # journald interleaves the lines of two processes that write at once: the two real [rank0]/[rank1]
    # tracebacks of the torchrun log, line by line, rank 1's first.
    lines = fixture("torchrun-gloo-rank0-file-missing")
    rank0 = [line for line in lines if line.startswith("[rank0]:")]
    rank1 = [line for line in lines if line.startswith("[rank1]:")]
    # rank 1's exception line as torch printed it (it ends in an emoji), without its "[rank1]: "
    gloo = next(line for line in rank1 if line.startswith("[rank1]: RuntimeError: "))[len("[rank1]: "):]
    assert gloo.startswith("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
                           "Connection closed by peer [127.0.0.1]:48789. This is typically caused by a remote worker ")
    records = tb.parse_tracebacks(interleave(rank1, rank0))
    assert [(r["process"], r["exception"], r["context"][0]) for r in records] == [
        ("[rank0]:", "FileNotFoundError: [Errno 2] No such file or directory: '/srv/models/missing/model.safetensors'",
         'with open(path, "rb") as handle:'),
        ("[rank1]:", gloo, "work.wait()"),
    ]
    found = tb.last_exception(interleave(rank1, rank0))
    assert found["exception"] == gloo
    assert found["root"] == "FileNotFoundError: [Errno 2] No such file or directory: '/srv/models/missing/model.safetensors'"


def test_interleaved_vllm_worker_tracebacks_under_one_header_each():
    # The two 60-line worker tracebacks of the TP=2 log (vLLM's header on every line), interleaved line by line.
    lines = fixture("vllm-cpu-tp2-model-weights-missing")
    tp0 = [line for line in lines if line.startswith("(Worker_TP0 pid=1949) ERROR")]
    tp1 = [line for line in lines if line.startswith("(Worker_TP1 pid=1950) ERROR")]
    assert len(tp0) == len(tp1) == 60
    records = tb.parse_tracebacks(interleave(tp0, tp1))
    assert [(r["process"], r["exception"], r["context"]) for r in records] == [
        ("(Worker_TP0 pid=1949)", WEIGHTS_MISSING, ["raise RuntimeError(", WEIGHTS_MISSING]),
        ("(Worker_TP1 pid=1950)", WEIGHTS_MISSING, ["raise RuntimeError(", WEIGHTS_MISSING]),
    ]


def test_a_new_start_of_the_unit_begins_a_new_failure():
    # A crash-looping unit's journal holds the attempt before (select_invocation): the lab's port conflict,
    # systemd restarting the unit (its real lines from the lab), then the KV cache failure.
    port = lab_journal("port-conflict", "node1", "vllm.service")
    looping = lab_journal("heads-not-divisible", "node1", "vllm.service")
    first = next(n for n, line in enumerate(looping) if line.startswith("vllm.service: Scheduled restart job"))
    restart = looping[first:first + 4]
    assert [line.split(" ")[0] for line in restart] == ["vllm.service:", "Stopped", "Starting", "Started"]
    kv = fixture("vllm-cpu-kv-cache-too-small")
    assert tb.last_exception(port + restart + kv)["root"] == KV_VALUE_ERROR
    interrupted = fixture("vllm-cpu-sigint-during-import")
    assert tb.last_exception(port + restart + interrupted)["root"] is None
    # without systemd's start between them, two tracebacks a few lines apart are one failure, the first its root
    assert tb.last_exception(port + interrupted)["root"] == "OSError: [Errno 98] Address already in use"


def test_a_traceback_long_before_the_last_one_is_not_its_root():
    # More than BURST_GAP lines of the server's own log (the lab's healthy vLLM) between two tracebacks.
    port = lab_journal("port-conflict", "node1", "vllm.service")
    served = [line for line in lab_journal("healthy", "node1", "vllm.service") if line.startswith("(APIServer")]
    assert len(served) > tb.BURST_GAP
    found = tb.last_exception(port + served + fixture("vllm-cpu-sigint-during-import"))
    assert (found["exception"], found["root"]) == ("KeyboardInterrupt", None)


# --- the doctor: obs_unit_failed and the unit_failed finding -------------------------------------------------


def failing(journal, case="healthy", host="node1", unit="vllm.service"):
    """The real evidence of the lab's healthy deployment, with one unit crash-looping on the given journal."""
    data = json.loads((LAB_CASES / f"{case}.json").read_text(encoding="utf-8"))
    hosts = [{"host": h, "gather": g, "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    evidence = copy.deepcopy(evidence_from_registered(data["plan"], hosts))
    gather = evidence["nodes"][host]["gather"]
    gather["units"][unit].update(ActiveState="activating", SubState="auto-restart", Result="exit-code",
                                 ExecMainStatus="1", NRestarts="3")
    gather["journal"][unit] = journal
    return evidence


def test_unit_failed_quotes_the_exception_line_not_a_frame_line():
    journal = fixture("vllm-cpu-tp2-model-weights-missing")
    # What the doctor quoted before: vllm_logs' last error line, a frame's code line.
    assert vllm_logs.parse_log("\n".join(journal))["errors"][-1]["line"] == "self.load_weights(model, model_config)"
    # Now: the root exception first (the worker's), the API server's "See root cause above" after it.
    last = f"{WEIGHTS_MISSING} (reported last as: {ENGINE_CORE_FAILED})"
    assert _last_error_line(journal, "vllm.service") == last
    hits = obs_unit_failed(Cluster(failing(journal)), {})
    assert [(hit["node"], hit["source"], hit["line"]) for hit in hits] == [
        ("node1", "systemctl", "systemctl: vllm.service activating (auto-restart), result exit-code, exit status 1, "
                               f"3 restarts, enabled; last error: {last}"),
        ("node1", "journal vllm.service", f"(Worker_TP0 pid=1949) raise RuntimeError( | {WEIGHTS_MISSING}"),
        ("node1", "journal vllm.service", f"raise RuntimeError( | {ENGINE_CORE_FAILED}"),
    ]
    assert all(hit["values"] == {"unit": "vllm.service", "last_error": last} for hit in hits)

    report = diagnosis.diagnose(CATALOG, failing(journal))
    finding = next(f for f in report["findings"] if f["id"] == "unit_failed")
    quoted = "\n".join(item["line"] for item in finding["evidence"])
    assert f"last error: {last}" in quoted
    assert "self.load_weights" not in quoted and "^^^" not in quoted


def test_unit_failed_quotes_the_root_of_a_cut_long_line_and_the_ray_unit_too():
    # The KV cache error is longer than a finding quotes; the Ray worker of the lab's version mismatch.
    hits = obs_unit_failed(Cluster(failing(fixture("vllm-cpu-kv-cache-too-small"))), {})
    assert hits[0]["values"]["last_error"] == (
        KV_VALUE_ERROR[:297] + "... (reported last as: RuntimeError: Engine core initialization failed. See root "
        "cause above. Failed core proc(s): {'EngineCore': 1})")
    journal = lab_journal("ray-version-mismatch", "node2", "ray-worker.service")
    hits = obs_unit_failed(Cluster(failing(journal, host="node2", unit="ray-worker.service")), {})
    assert [hit["line"] for hit in hits if hit["source"] != "systemctl"] == [
        "raise RuntimeError(error_message) | RuntimeError: Version mismatch: The cluster was started with: "
        "| Ray: 2.60.0 | Python: 3.11.2"]
    # The whole message, joined over the lines it was printed on.
    assert hits[0]["values"]["last_error"] == (
        "RuntimeError: Version mismatch: The cluster was started with: Ray: 2.60.0 Python: 3.11.2 This process on "
        "node 10.231.4.12 was started with: Ray: 2.59.0 Python: 3.11.2")


def test_without_a_traceback_the_first_error_line_is_quoted_never_a_traceback_line():
    # No complete traceback: the first line that names its error, else the first ERROR line.
    assert _last_error_line(public("vllm33297-free-memory-gpu-busy"), "vllm.service") == (
        "ValueError: Free memory on device cuda:0 (1.53/22.05 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 19.84 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.")
    hits = obs_unit_failed(Cluster(failing(public("gpustack1254-vllm-cuda-error-802"))), {})
    assert [hit["source"] for hit in hits] == ["systemctl"]
    # Before, the last ERROR line was quoted: "Traceback (most recent call last):" of a cut-off traceback.
    assert hits[0]["values"]["last_error"] == (
        "Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() "
        "that might have already set an error? Error 802: system not yet initialized")
