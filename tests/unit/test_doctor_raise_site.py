"""Where a failure was raised (doctor/raise_site.py, roles/doctor/files/subsystems.yml), on real logs only.

The root exception of a journal's last failure and the subsystem that raised it,
read from real output (tests/fixtures/tracebacks: vLLM 0.32 on its CPU platform,
torchrun, a Ray task error, a multiprocessing pool; tests/fixtures/doctor/public:
excerpts of public issues), then the doctor's raised_in_<subsystem> finding where
no signature of the catalog names the cause: its rank (below every signature,
above unit_failed), its quotes (the root exception and the raising frame, never a
frame or code line) and unit_failed left only where no error line exists.
"""

import copy
import json
import os
import shutil
import string
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import raise_site as rs
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.catalog import (
    load_catalog,
    load_catalog_file,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.diagnosis import diagnose
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import traceback as tb
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify import vllm_logs
from test_doctor_public_logs import CATALOG, RAW_CATALOG, catalog_without, healthy_cluster, with_log

REPO = Path(__file__).resolve().parents[2]
TRACEBACKS = REPO / "tests" / "fixtures" / "tracebacks"
PUBLIC = REPO / "tests" / "fixtures" / "doctor" / "public"
TABLE_FILE = REPO / "roles" / "doctor" / "files" / "subsystems.yml"
RAW_TABLE = yaml.safe_load(TABLE_FILE.read_text(encoding="utf-8"))
TABLE = rs.load_subsystems(RAW_TABLE)
RUNTIME_SITE = next(iter(sorted((REPO / ".venv-runtime" / "lib").glob("python3*/site-packages"))), None)


def lines_of(name):
    path = TRACEBACKS / f"{name}.txt" if (TRACEBACKS / f"{name}.txt").exists() else PUBLIC / f"{name}.log"
    return path.read_text(encoding="utf-8").splitlines()


def with_table(catalog):
    catalog = dict(catalog)
    catalog["subsystems"] = TABLE
    return catalog


# --- the table -------------------------------------------------------------------------------------------


def test_the_table_names_every_subsystem_once_with_checks_and_a_fix():
    assert [entry["id"] for entry in TABLE["subsystems"]] == [
        "memory", "distributed", "cuda", "compilation", "tokenizer", "model_loading", "configuration", "ray",
        "api_server"]
    assert sorted(rs.SUBSYSTEM_IDS) == sorted(entry["id"] for entry in TABLE["subsystems"])
    for entry in TABLE["subsystems"]:
        assert entry["checks"] and entry["fix"] and entry["cause"] and entry["verify"], entry["id"]


def test_the_catalog_file_loads_the_table_beside_it_and_none_without_one(tmp_path):
    # load_catalog_file is how doctor.yml (vllm_doctor.py) and every replay load the catalog.
    assert CATALOG["subsystems"]["subsystems"][0]["id"] == "memory"
    shutil.copy(REPO / "roles" / "doctor" / "files" / "signatures.yml", tmp_path / "signatures.yml")
    assert load_catalog_file(tmp_path / "signatures.yml")["subsystems"] is None


def test_every_placeholder_of_the_table_is_filled_by_a_raise_site_or_the_plan():
    site = rs.raise_site(lines_of("vllm-cpu-kv-cache-too-small"), TABLE)
    known = set(rs.finding_values(site, "vllm.service")) | {"node", "nodes", "model_path", "tp", "port_api",
                                                           "head_node", "head_address"}
    for entry in TABLE["subsystems"]:
        for text in [entry["cause"], entry["fix"], entry["verify"], *entry["checks"]]:
            names = {name for _, name, _, _ in string.Formatter().parse(text) if name}
            assert names <= known, (entry["id"], names - known)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["subsystems"][0].update(id="gpu"), "'id' must be one of"),
        (lambda d: d["subsystems"][1].update(messages=["(unclosed"]), "not a valid regular expression"),
        (lambda d: d["subsystems"][1]["prefixes"].append("vllm/v1/core/"), "already given to memory"),
        (lambda d: d["unmapped"].update({"vllm/distributed/": "why"}), "mapped to distributed too"),
        (lambda d: d["subsystems"][2].pop("fix"), "'fix' must be a non-empty string"),
        (lambda d: d["subsystems"].append(copy.deepcopy(d["subsystems"][0])), "the id is used twice"),
    ],
)
def test_a_malformed_table_is_refused_naming_the_subsystem_and_field(mutate, message):
    data = copy.deepcopy(RAW_TABLE)
    mutate(data)
    with pytest.raises(rs.SubsystemsError, match=message):
        rs.load_subsystems(data)


@pytest.mark.parametrize(
    ("file", "path"),
    [
        ("/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/distributed/parallel_state.py",
         "vllm/distributed/parallel_state.py"),
        # Ray's images run as the user "ray": the path's "ray/" is no frame of Ray
        ("/home/ray/anaconda3/lib/python3.9/site-packages/vllm/v1/core/kv_cache_utils.py",
         "vllm/v1/core/kv_cache_utils.py"),
        ("/workspace/vllm/vllm/v1/core/kv_cache_utils.py", "vllm/v1/core/kv_cache_utils.py"),  # a source checkout
        ("/usr/lib/python3/dist-packages/torch/cuda/__init__.py", "torch/cuda/__init__.py"),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/json/decoder.py", "json/decoder.py"),
    ],
)
def test_a_frame_s_file_is_read_as_its_module_path(file, path):
    assert rs.module_path(file) == path


def test_the_longest_prefix_decides_and_an_unmapped_one_passes_the_frame_over():
    def frame(path, function="f"):
        return {"file": f"/v/lib/python3.11/site-packages/{path}", "line": 1, "function": function}

    assert rs.frame_subsystem(frame("vllm/distributed/device_communicators/ray_communicator.py"), TABLE)[0] == "ray"
    assert rs.frame_subsystem(frame("vllm/distributed/parallel_state.py"), TABLE)[0] == "distributed"
    assert rs.frame_subsystem(frame("vllm/v1/worker/utils.py", "request_memory"), TABLE)[0] == "memory"
    assert rs.frame_subsystem(frame("vllm/v1/worker/utils.py", "bind_kv_cache"), TABLE) == (None, "vllm/v1/worker/")
    assert rs.frame_subsystem(frame("vllm/entrypoints/cli/serve.py"), TABLE) == (None, "vllm/entrypoints/cli/")
    assert rs.frame_subsystem(frame("vllm/entrypoints/openai/api_server.py"), TABLE)[0] == "api_server"


# --- the pinned vLLM's layout ------------------------------------------------------------------------------


@pytest.mark.skipif(RUNTIME_SITE is None or not (RUNTIME_SITE / "vllm").is_dir(),
                    reason="no runtime venv with the pinned vLLM (scripts/bootstrap)")
def test_the_table_covers_the_pinned_vllm_package():
    # Fails when vLLM moved a file the table names, or grew a package the table neither maps nor leaves unmapped.
    assert rs.layout_problems(TABLE, RUNTIME_SITE / "vllm", RUNTIME_SITE) == []


def fake_vllm(root, files):
    for name in files:
        path = root / "vllm" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("def request_memory():\n    pass\n" if name.endswith("utils.py") else "")
    return root / "vllm"


def test_the_layout_check_names_a_moved_prefix_and_a_new_package(tmp_path):
    data = {"subsystems_version": 1, "priority": 21, "verify": "v",
            "subsystems": [{"id": "memory", "title": "t", "prefixes": ["vllm/v1/core/", "vllm/v1/worker/utils.py:request_memory",
                                                                     "vllm/gone/"],
                            "checks": ["c"], "cause": "c", "fix": "f"}],
            "unmapped": {"vllm/__init__.py": "imports", "vllm/v1/worker/": "workers"}}
    table = rs.load_subsystems(data)
    vllm = fake_vllm(tmp_path, ["__init__.py", "v1/__init__.py", "v1/core/kv_cache_utils.py", "v1/worker/utils.py",
                                "v1/engine/core.py", "newpkg/__init__.py", "envs.py"])
    assert rs.layout_problems(table, vllm) == [
        "vllm/gone/ (memory): nothing of that path in the installed vLLM",
        "vllm/envs.py: neither mapped to a subsystem nor listed as unmapped in subsystems.yml",
        "vllm/newpkg/: neither mapped to a subsystem nor listed as unmapped in subsystems.yml",
        "vllm/v1/engine/: neither mapped to a subsystem nor listed as unmapped in subsystems.yml",
    ]
    os.remove(vllm / "v1" / "worker" / "utils.py")
    (vllm / "v1" / "worker" / "utils.py").write_text("def other():\n    pass\n")
    assert "vllm/v1/worker/utils.py:request_memory (memory): vllm/v1/worker/utils.py defines no function " \
           "request_memory" in rs.layout_problems(table, vllm)


# --- the raise site of real failures ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "subsystem", "how", "exception", "frame"),
    [
        # TP=2, a model directory without weights: the API server's "See root cause above" after the engine core's
        # and two workers' tracebacks; the root is worker 0's, raised in vLLM's model loader.
        ("vllm-cpu-tp2-model-weights-missing", "model_loading", "frame",
         "RuntimeError: Cannot find any model weights with `/tmp/tb/tiny-noweights`",
         "vllm/model_executor/model_loader/default_loader.py:259 in _prepare_weights"),
        ("vllm-cpu-kv-cache-too-small", "memory", "frame",
         "ValueError: To serve at least one request with the model's max seq len (2048)",
         "vllm/v1/core/kv_cache_utils.py:1030 in _check_enough_kv_cache_memory"),
        # Python's chain ("During handling of the above exception"): the root is the JSONDecodeError, raised in the
        # standard library; transformers' config reader (a library frame of model loading) decides.
        ("vllm-cpu-config-json-invalid", "model_loading", "frame",
         "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes",
         "json/decoder.py:353 in raw_decode; inside transformers/configuration_utils.py:991 in _dict_from_json_file"),
        # Ray's RayTaskError quotes the task's traceback: that one is the root; its errno decides.
        ("ray-task-error-file-missing", "model_loading", "errno",
         "FileNotFoundError: [Errno 2] No such file or directory: '/srv/models/missing/config.json'",
         "tmp/tb/ray_task.py:8 in read_config"),
        # torchrun's ChildFailedError passes on; the rank's CUDA out-of-memory is decisive whatever its frames.
        ("torchrun-h200-rank0-cuda-oom", "memory", "exception type", "torch.OutOfMemoryError: CUDA out of memory.",
         "tmp/oom_rank.py:8 in <module>"),
        ("nccl1466-vllm-unhandled-system-error", "distributed", "frame",
         "RuntimeError: NCCL error: unhandled system error",
         "vllm/distributed/device_communicators/pynccl_wrapper.py:223 in NCCL_CHECK"),
        ("echomimic100-safetensors-header-too-large", "model_loading", "exception type",
         "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge",
         "safetensors/torch.py:313 in load_file"),
        # pydantic raises, vLLM's argument handling is the deepest vLLM frame: configuration.
        ("vllm-cpu-model-dir-without-config", "configuration", "frame",
         "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig Value error, Invalid "
         "repository ID or local directory specified: '/tmp/tb/tiny-noconfig'.",
         "pydantic/_internal/_dataclasses.py:121 in __init__; inside vllm/engine/arg_utils.py:1955 in "
         "create_model_config"),
    ],
)
def test_the_root_exception_and_the_subsystem_that_raised_it(name, subsystem, how, exception, frame):
    site = rs.raise_site(lines_of(name), TABLE)
    assert (site["subsystem"], site["how"]) == (subsystem, how)
    assert site["exception"].startswith(exception)
    assert rs.evidence_line(site).endswith(f"; raised at {frame}")
    assert site["traceback"] is True


def test_a_message_wrapped_over_two_lines_is_quoted_whole():
    # The PR quotes the error with its line break: both halves are the message, and the distributed runtime's
    # "unique IP address" check raised it.
    site = rs.raise_site(lines_of("vllm-pr43095-unique-ip"), TABLE)
    assert site["exception"] == ("RuntimeError: Every node should have a unique IP address. Got N nodes with N+1 "
                                 "unique IP addresses {...}")
    assert site["subsystem"] == "distributed"
    assert site["quotes"] == [(0, "RuntimeError: Every node should have a unique IP address. Got N nodes"),
                              (1, "with N+1 unique IP addresses {...}")]


@pytest.mark.parametrize(
    ("name", "subsystem", "type_", "start"),
    [
        ("vllm4383-nccl-shm-segment", "distributed", "NCCL WARN", "a46f6c76528f:2777:5429 [0] misc/shmutils.cc:113 "
                                                                  "NCCL WARN Error while creating shared memory"),
        ("vllm19670-tcpstore-client-timeout", "distributed", "c10d error",
         "[E616 02:08:15.931416442 socket.cpp:1023] [c10d] The client socket has timed out"),
        ("transformers13472-cache-permission-denied", "model_loading", "[Errno 13] error",
         "[Errno 13] Permission denied: '/.cache'"),
        # a traceback cut off after its first line: the first ERROR line that names the error, not "Traceback"
        ("gpustack1254-vllm-cuda-error-802", "cuda", "ERROR line", "Unexpected error from cudaGetDeviceCount()"),
    ],
)
def test_without_a_traceback_the_error_lines_stand_for_it(name, subsystem, type_, start):
    site = rs.raise_site(lines_of(name), TABLE)
    assert (site["subsystem"], site["type"], site["traceback"]) == (subsystem, type_, False)
    assert site["exception"].startswith(start)
    assert "raised at" not in rs.evidence_line(site)


def test_an_interrupt_decides_no_subsystem():
    # SIGINT during import: KeyboardInterrupt only reports that the process was stopped.
    site = rs.raise_site(lines_of("vllm-cpu-sigint-during-import"), TABLE)
    assert site["subsystem"] is None and site["exception"] == "KeyboardInterrupt"


def test_the_frame_line_quoted_before_is_no_longer_quoted():
    journal = lines_of("vllm-cpu-tp2-model-weights-missing")
    assert vllm_logs.parse_log("\n".join(journal))["errors"][-1]["line"] == "self.load_weights(model, model_config)"
    site = rs.raise_site(journal, TABLE)
    quoted = [rs.evidence_line(site), *(text for _, text in site["quotes"])]
    assert not any("self.load_weights" in text or 'File "' in text or "^^^" in text for text in quoted), quoted


def test_wrapped_messages_are_joined_per_process_and_never_inside_frames():
    joined = tb.wrapped_messages(lines_of("vllm-cpu-model-dir-without-config"))
    assert [(m["start"], m["end"]) for m in joined] == [(50, 58)]
    assert joined[0]["text"].startswith("pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                                        "ModelConfig Value error, Invalid repository ID")
    records = tb.parse_tracebacks(lines_of("vllm-cpu-model-dir-without-config"))
    frames = {index for record in records for index in range(record["start"], record["line"])}
    assert not frames & {index for m in joined for index in m["lines"]}


# --- the finding -------------------------------------------------------------------------------------------


def test_a_pattern_across_a_line_break_matches_the_joined_message():
    data = copy.deepcopy(RAW_CATALOG)
    sig = next(sig for sig in data["signatures"] if sig["id"] == "vllm_host_ip_mismatch")
    data["signatures"] = [dict(sig, match={"any": [{"log": {"pattern": r"Got N nodes with N\+1 unique IP"}}]})]
    data["signatures"][0]["explains"] = []
    evidence = with_log(healthy_cluster("ray"), "vllm-pr43095-unique-ip.log")
    report = diagnose(load_catalog(data), evidence)
    assert report["findings"][0]["id"] == "vllm_host_ip_mismatch"
    assert report["findings"][0]["evidence"][0]["line"] == (
        "RuntimeError: Every node should have a unique IP address. Got N nodes | with N+1 unique IP addresses {...}")


@pytest.mark.parametrize(
    ("fixture", "signature", "expected", "quoted"),
    [
        ("vllm33297-free-memory-gpu-busy.log", "gpu_memory_busy", "raised_in_memory",
         "root error: ValueError: Free memory on device cuda:0 (1.53/22.05 GiB) on startup is less than desired"),
        ("nccl1466-vllm-unhandled-system-error.log", "nccl_system_error", "raised_in_distributed",
         "raised at vllm/distributed/device_communicators/pynccl_wrapper.py:223 in NCCL_CHECK"),
        ("echomimic100-safetensors-header-too-large.log", "model_weights_corrupt", "raised_in_model_loading",
         "root error: safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge; raised at "
         "safetensors/torch.py:313 in load_file"),
        ("vllm1772-nvidia-driver-too-old.log", "cuda_driver_too_old", "raised_in_cuda",
         "root error: RuntimeError: The NVIDIA driver on your system is too old"),
        ("gpustack1640-ray-version-mismatch.log", "ray_version_mismatch", "raised_in_ray",
         "root error: RuntimeError: Version mismatch: The cluster was started with: Ray: 2.43.0"),
        ("vllm-pr19660-max-model-len-above-derived.log", "max_model_len_exceeds_model", "raised_in_configuration",
         "User-specified max_model_len (513) is greater than the derived max_model_len"),
    ],
)
def test_without_its_signature_the_subsystem_finding_comes_first(fixture, signature, expected, quoted):
    evidence = with_log(healthy_cluster("mp"), fixture)
    report = diagnose(with_table(catalog_without(signature)), evidence)
    finding = report["findings"][0]
    assert finding["id"] == expected, [f["id"] for f in report["findings"]]
    assert finding["severity"] == "fault" and finding["nodes"] == ["node1"]
    assert quoted in finding["evidence"][0]["line"]
    assert "unit_failed" not in [f["id"] for f in report["findings"]]
    assert "{" not in finding["title"] + finding["cause"] + finding["fix"] + finding["verify"], finding
    assert finding["checks"] == next(s["checks"] for s in TABLE["subsystems"] if s["id"] == expected[10:])


def failing(evidence, node, journal):
    gather = evidence["nodes"][node]["gather"]
    gather["journal"]["vllm.service"] = journal
    gather["units"]["vllm.service"].update(ActiveState="failed", SubState="failed", Result="exit-code")
    gather["unit_pids"]["vllm.service"] = []
    return evidence


def test_a_specific_signature_still_wins_and_the_fallback_ranks_below_it():
    # node1: the KV cache error its signature names; node2: an NCCL error no signature is left for.
    evidence = failing(healthy_cluster("mp"), "node1", lines_of("vllm-cpu-kv-cache-too-small"))
    failing(evidence, "node2", lines_of("nccl1466-vllm-unhandled-system-error"))
    report = diagnose(with_table(catalog_without("nccl_system_error")), evidence)
    order = [(f["id"], f["nodes"]) for f in report["findings"]]
    assert order[0] == ("kv_cache_too_small", ["node1"]), order
    assert ("raised_in_distributed", ["node2"]) in order, order
    assert not any(name == "raised_in_memory" for name, _ in order), order  # node1's cause has its signature
    ranks = [name for name, _ in order]
    raised = report["findings"][ranks.index("raised_in_distributed")]
    assert raised["priority"] == TABLE["priority"] and raised["priority"] > next(
        sig["priority"] for sig in CATALOG["signatures"] if sig["id"] == "unit_failed")
    # node1's unit_failed stays, a consequence of its signature; node2's gave way to the subsystem finding.
    assert [item["node"] for f in report["findings"] if f["id"] == "unit_failed" for item in f["evidence"]] \
        and all(item["node"] == "node1" for f in report["findings"] if f["id"] == "unit_failed"
                for item in f["evidence"]), order


def test_unit_failed_stays_where_the_journal_holds_no_error_line():
    evidence = failing(healthy_cluster("mp"), "node2", ["Started vllm.service - vLLM.", "INFO 12-02 10:00:00 "
                                                        "[api_server.py:1] vLLM API server version 0.32.0"])
    report = diagnose(CATALOG, evidence)
    assert [(f["id"], f["nodes"]) for f in report["findings"]][:1] == [("unit_failed", ["node2"])]
    assert not any(f["id"].startswith("raised_in_") for f in report["findings"])


def test_the_fallback_ranks_above_unit_failed_and_below_every_log_signature():
    below = [sig["id"] for sig in CATALOG["signatures"] if sig["priority"] <= TABLE["priority"]]
    assert "unit_failed" in below
    log_signatures = [sig for sig in CATALOG["signatures"] if any("log" in rule for rule in sig["rules"])]
    assert all(sig["priority"] > TABLE["priority"] for sig in log_signatures), [
        (sig["id"], sig["priority"]) for sig in log_signatures if sig["priority"] <= TABLE["priority"]]


def test_a_running_unit_with_a_traceback_is_a_warning_and_a_healthy_one_nothing():
    evidence = healthy_cluster("mp")
    assert diagnose(CATALOG, evidence)["findings"] == []
    evidence["nodes"]["node2"]["gather"]["journal"]["vllm.service"] = lines_of("ray-task-error-file-missing")
    report = diagnose(with_table(catalog_without("model_missing")), evidence)
    finding = next(f for f in report["findings"] if f["id"].startswith("raised_in_"))
    assert (finding["id"], finding["severity"], finding["nodes"]) == ("raised_in_model_loading", "warning", ["node2"])


def test_a_running_unit_s_error_header_alone_is_no_failure_but_a_failing_unit_s_is():
    # Only ERROR lines (the traceback under them cut off): a running unit logs those for a request that failed.
    journal = lines_of("gpustack1254-vllm-cuda-error-802")
    evidence = healthy_cluster("mp")
    evidence["nodes"]["node1"]["gather"]["journal"]["vllm.service"] = journal
    catalog = with_table(catalog_without("fabric_manager_down"))
    assert not any(f["id"].startswith("raised_in_") for f in diagnose(catalog, evidence)["findings"])
    report = diagnose(catalog, failing(evidence, "node1", journal))
    assert (report["findings"][0]["id"], report["findings"][0]["severity"]) == ("raised_in_cuda", "fault")


def lab_journal(case, host, unit):
    data = json.loads((REPO / "tests" / "fixtures" / "doctor" / "lab" / "cases" / f"{case}.json").read_text())
    return dict(zip(data["hosts"], data["gather"], strict=True))[host]["evidence"]["journal"][unit]


def test_an_address_in_use_is_the_api_server_s_only_where_one_runs():
    # The lab's port conflict: vLLM's API server on the head could not bind, its frame says so.
    journal = lab_journal("port-conflict", "node1", "vllm.service")
    site = rs.raise_site(journal, TABLE, exclude=("api_server",))
    assert (site["subsystem"], site["how"]) == ("api_server", "frame")  # a frame decides wherever it was logged
    assert rs.evidence_line(site).endswith("raised at vllm/entrypoints/launchers/launcher.py:348 in "
                                           "create_server_socket")
    # The exception line alone (no frames): its errno says the API server where one runs; where none runs (a
    # Ray unit, a headless node), the address in use points to the distributed runtime.
    alone = [line for line in journal if "Address already in use" in line]
    assert alone == ["OSError: [Errno 98] Address already in use"]
    assert (rs.raise_site(alone, TABLE)["subsystem"], rs.raise_site(alone, TABLE)["how"]) == ("api_server", "errno")
    assert rs.raise_site(alone, TABLE, exclude=("api_server",))["subsystem"] == "distributed"


def test_the_first_thing_a_message_names_decides_between_subsystems():
    # torch's TCPStore: "The server socket has failed ... address already in use": the socket (distributed) is
    # named before the address in use (also the API server's words).
    site = rs.raise_site(lines_of("vlmr1-289-tcpstore-port-in-use"), TABLE)
    assert (site["subsystem"], site["how"]) == ("distributed", "message")


def test_an_exception_type_s_module_decides_when_no_frame_is_printed():
    # A Ray worker's HFValidationError logged without its frames: huggingface_hub defines it.
    site = rs.raise_site(lines_of("dynamo4941-model-missing-on-ray-worker"), TABLE)
    assert (site["subsystem"], site["how"], site["type"]) == (
        "model_loading", "exception type", "huggingface_hub.errors.HFValidationError")


def test_a_ray_that_ran_and_failed_is_named_by_where_it_raised_not_as_not_running():
    # The Ray worker's version mismatch without its signature: the Ray unit ran and failed, so ray_not_running
    # ("install Ray") is not said; where Ray raised the root exception comes first.
    evidence = with_log(healthy_cluster("ray"), "logicrl30-ray-python-version-mismatch.log", node="node2",
                        unit="ray-worker.service")
    report = diagnose(with_table(catalog_without("ray_version_mismatch")), evidence)
    ids = [f["id"] for f in report["findings"]]
    assert ids[0] == "raised_in_ray", ids
    assert "ray_not_running" not in ids, ids


def test_a_root_that_only_passes_a_failure_on_decides_no_subsystem():
    # The API server's traceback of the KV cache failure alone (the engine core's cut off): its "See root cause
    # above" was raised in the API server's frames, which say nothing of the failure.
    journal = lines_of("vllm-cpu-kv-cache-too-small")
    last = max(index for index, line in enumerate(journal) if "Traceback (most recent call last)" in line)
    site = rs.raise_site(journal[last:], TABLE)
    assert site["exception"].startswith("RuntimeError: Engine core initialization failed. See root cause above.")
    assert site["subsystem"] is None
    # with the engine core's lines, the root is the engine core's and it names memory
    assert rs.raise_site(journal, TABLE)["subsystem"] == "memory"


def test_a_deprecation_warning_is_no_error_line_and_a_resource_warning_names_no_subsystem():
    journal = lines_of("vllm-cpu-kv-cache-too-small")
    warnings = [line for line in journal if "Warning: " in line and ".py:" in line]
    assert any("FutureWarning" in line for line in warnings) and any("UserWarning" in line for line in warnings)
    kinds = [(item["kind"], item["type"]) for item in tb.error_lines(warnings)]
    assert kinds == [("Python warning", "UserWarning")] * sum("UserWarning" in line for line in warnings)
    site = rs.raise_site(warnings, TABLE)  # multiprocessing's resource_tracker is no subsystem of the table
    assert site["subsystem"] is None and site["frame"]["file"].endswith("multiprocessing/resource_tracker.py")


def test_a_pattern_that_matches_a_frame_s_code_quotes_the_exception_it_belongs_to():
    # A log rule that matches a code line of worker 0's traceback (the line vllm_logs quoted before): the
    # evidence is that traceback's exception line, never the code line.
    data = copy.deepcopy(RAW_CATALOG)
    sig = next(sig for sig in data["signatures"] if sig["id"] == "model_weights_missing")
    data["signatures"] = [dict(sig, match={"any": [{"log": {"pattern": r"self\.load_weights\(model, model_config\)"}}]},
                               explains=[])]
    evidence = failing(healthy_cluster("mp"), "node1", lines_of("vllm-cpu-tp2-model-weights-missing"))
    report = diagnose(load_catalog(data), evidence)
    quoted = [item["line"] for item in report["findings"][0]["evidence"]]
    assert quoted and all(line.endswith("RuntimeError: Cannot find any model weights with `/tmp/tb/tiny-noweights`")
                          for line in quoted), quoted
    assert not any("load_weights" in line for line in quoted)
