"""vLLM's start-up phases read from real logs (parsers/vllm_phases.py): per process and rank, since when, stalls.

The logs: the lab's vLLM 0.32 journal of a whole start (tests/fixtures/vllm/lab), public excerpts of older
releases (tests/fixtures/vllm/public). The wording of each phase's lines is checked against vLLM 0.32's own
logger calls where its source is installed (.venv-runtime).
"""

from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import vllm_phases

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "tests" / "fixtures" / "vllm" / "lab"
PUBLIC = REPO / "tests" / "fixtures" / "vllm" / "public"
DOCTOR_PUBLIC = REPO / "tests" / "fixtures" / "doctor" / "public"
VLLM_SOURCE = next(iter(sorted((REPO / ".venv-runtime" / "lib").glob("python3*/site-packages/vllm"))), None)


def lab_lines():
    return (LAB / "independent-dp3-node1.log").read_text(encoding="utf-8").splitlines()


def upto(lines, text):
    """The log as it stood when the line holding ``text`` had just been written."""
    return lines[: next(index for index, line in enumerate(lines) if text in line) + 1]


# (file of vLLM 0.32, the words of its logger call, a line as vLLM prints it, the phase it shows, finished)
WORDING = [
    ("entrypoints/launchers/api_server/entry.py", "Starting vLLM server on",
     "(APIServer pid=1) INFO 12-02 23:43:58 [entry.py:140] Starting vLLM server on http://0.0.0.0:8000", "api_up", False),
    ("v1/engine/core.py", "Initializing a V1 LLM engine (v%s) with config",
     "(EngineCore pid=2) INFO 12-02 23:43:06 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: x",
     "engine_init", False),
    ("v1/engine/core.py", "Waiting for init message from front-end.",
     "(EngineCore_DP0 pid=2) DEBUG 12-02 23:43:06 [core.py:1371] Waiting for init message from front-end.",
     "engine_init", False),
    ("distributed/parallel_state.py", "world_size=%d rank=%d local_rank=%d distributed_init_method=%s backend=%s",
     "(Worker pid=3) INFO 12-02 23:43:49 [parallel_state.py:1906] world_size=2 rank=1 local_rank=1 "
     "distributed_init_method=tcp://10.0.0.1:29500 backend=nccl", "distributed_init", False),
    ("distributed/parallel_state.py", "in world size %s is assigned as",
     "(Worker pid=3) INFO 12-02 23:43:49 [parallel_state.py:2350] rank 1 in world size 2 is assigned as DP rank 0, "
     "PP rank 0, PCP rank 0, TP rank 1, ETP rank 1, EP rank N/A, EPLB rank N/A", "distributed_init", True),
    ("distributed/device_communicators/pynccl.py", "vLLM is using nccl==%s",
     "(Worker_TP1 pid=3) INFO 12-02 23:43:50 [pynccl.py:148] vLLM is using nccl==2.27.3", "distributed_init", False),
    ("v1/worker/gpu_model_runner.py", "Starting to load model %s...",
     "(Worker_TP1 pid=3) INFO 12-02 23:43:51 [gpu_model_runner.py:5040] Starting to load model /m...", "weights",
     False),
    ("model_executor/model_loader/default_loader.py", "Loading weights took %.2f seconds",
     "(Worker_TP1 pid=3) INFO 12-02 23:44:51 [default_loader.py:502] Loading weights took 60.00 seconds", "weights",
     True),
    ("v1/worker/gpu_model_runner.py", "Model loading took %s GiB memory and %.6f seconds",
     "(Worker_TP1 pid=3) INFO 12-02 23:44:52 [gpu_model_runner.py:5150] Model loading took 70.1 GiB memory and "
     "61.2 seconds", "weights", True),
    ("compilation/backends.py", "Dynamo bytecode transform time: %.2f s",
     "(Worker_TP1 pid=3) INFO 12-02 23:45:02 [backends.py:1167] [backbone] Dynamo bytecode transform time: 9.10 s",
     "compile", False),
    ("compilation/backends.py", "Compiling a graph for compile range %s takes %.2f s",
     "(Worker_TP1 pid=3) INFO 12-02 23:45:30 [backends.py:399] Compiling a graph for compile range (1, 8192) "
     "takes 27.5 s", "compile", False),
    ("v1/worker/gpu_worker.py", "Available KV cache memory: %s GiB",
     "(Worker_TP1 pid=3) INFO 12-02 23:45:40 [gpu_worker.py:760] Available KV cache memory: 3.2 GiB",
     "memory_profiling", True),
    ("v1/core/kv_cache_utils.py", "%s KV cache size: %s tokens, ",
     "(EngineCore pid=2) INFO 12-02 23:45:41 [kv_cache_utils.py:2327] GPU KV cache size: 104,832 tokens, Maximum "
     "concurrency for 8,192 tokens per request: 12.80x", "kv_cache", True),
    ("v1/worker/gpu_model_runner.py", "Graph capturing finished in %.0f secs, took %.2f GiB",
     "(Worker_TP1 pid=3) INFO 12-02 23:46:10 [gpu_model_runner.py:6582] Graph capturing finished in 29 secs, "
     "took 0.5 GiB", "graph_capture", True),
    ("v1/executor/ray_utils.py", "Waiting for creating a placement group of specs for ",
     "(EngineCore pid=84) INFO 06-07 18:13:55 [ray_utils.py:464] Waiting for creating a placement group of specs for "
     "150 seconds. specs=[{'GPU': 1.0}, {'GPU': 1.0}].", "engine_init", False),
    ("compilation/monitor.py", "%sStarting torch.compile",
     "(Worker_TP1 pid=3) INFO 12-02 23:44:53 [monitor.py:40] [backbone] Starting torch.compile", "compile", False),
    ("compilation/monitor.py", "%sInitial profiling/warmup run took %.2f s",
     "(Worker_PP0 pid=8449) INFO 11-29 20:54:48 [monitor.py:91] [backbone] Initial profiling/warmup run took 0.03 s",
     "compile", True),
    ("v1/worker/cpu_worker.py", "Explicitly set (",
     "(Worker pid=1021) INFO 12-02 23:43:51 [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on "
     "node 0.", "memory_profiling", True),
    ("v1/worker/gpu_model_runner.py", 'desc="Capturing CUDA graphs ({}, {})"',
     "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  40%|####      | 28/70 [00:03<00:04,  9.1it/s]",
     "graph_capture", False),
    ("v1/engine/core.py", "init engine (profile, create kv cache, warmup model) took %.2f s",
     "(EngineCore pid=2) INFO 12-02 23:46:11 [core.py:402] init engine (profile, create kv cache, warmup model) "
     "took 120.05 s", "engine_ready", True),
]


@pytest.mark.parametrize(("source", "words", "line", "expected", "finished"), WORDING)
def test_each_phase_line_in_vllm_s_own_words(source, words, line, expected, finished):
    """A wrong pattern or a phase out of order fails here; with vLLM's source present, so does a changed wording."""
    if VLLM_SOURCE is not None:
        assert words in (VLLM_SOURCE / source).read_text(encoding="utf-8"), f"vLLM 0.32 no longer says {words!r}"
    found = vllm_phases.match_phase(vllm_phases.split_line(line)[3])
    assert found is not None, line
    assert (vllm_phases.PHASE_IDS[found[0]], found[1]) == (expected, finished)


def test_the_lab_s_whole_start_reaches_the_api_server():
    report = vllm_phases.read_phases(lab_lines())
    assert report["complete"] is True
    by_process = {entry["key"]: entry for entry in report["processes"]}
    assert by_process["pid=880"]["phase"] == "api_up"
    assert by_process["pid=986"]["phase"] == "engine_ready" and by_process["pid=986"]["finished"]
    worker = by_process["pid=1021"]
    # the worker is renamed under its pid (VllmWorker-0 -> Worker); its rank comes from its world_size line
    assert worker["rank"] == 0 and worker["process"] == "(Worker pid=1021)"
    assert worker["phase"] == "memory_profiling" and worker["finished"]
    assert worker["time"] == "12-02 23:43:51" and "Explicitly set (1.0/23.54) GiB for KV cache" in worker["line"]
    assert report["furthest"]["key"] == "pid=880" and report["least"]["key"] == "pid=1021"


@pytest.mark.parametrize(("cut", "phase", "finished", "current"), [
    ("non-default args", "starting", False, "starting"),
    ("Initializing a V1 LLM engine", "engine_init", False, "engine_init"),
    ("world_size=1 rank=0 local_rank=0", "distributed_init", False, "distributed_init"),
    ("is assigned as", "distributed_init", True, "weights"),
    ("Starting to load model", "weights", False, "weights"),
    # the lab runs --enforce-eager ("Enforce eager set, disabling torch.compile, CUDAGraphs"): no compile phase
    ("Loading weights took", "weights", True, "memory_profiling"),
    ("Explicitly set (1.0/23.54) GiB", "memory_profiling", True, "kv_cache"),
])
def test_a_start_cut_short_says_where_it_was(cut, phase, finished, current):
    report = vllm_phases.read_phases(upto(lab_lines(), cut))
    assert report["complete"] is False
    entry = report["current"]
    assert (entry["phase"], entry["finished"], entry["current"]) == (phase, finished, current)
    assert cut in entry["line"]


def test_a_start_that_compiles_goes_from_weights_to_torch_compile():
    lines = [line for line in upto(lab_lines(), "Loading weights took") if "Enforce eager" not in line
             and "'enforce_eager': True" not in line and "enforce_eager=True" not in line]
    report = vllm_phases.read_phases(lines)
    assert report["eager"] is False and report["current"]["current"] == "compile"
    assert vllm_phases.read_phases(upto(lab_lines(), "Loading weights took"))["eager"] is True


def test_torch_s_rendezvous_and_nccl_s_own_lines_are_distributed_init():
    # Real lines (vllm#19670's TCPStore client, vllm#4383's NCCL shared memory): no vLLM line names the phase.
    for fixture, words in (("vllm19670-tcpstore-client-timeout.log", "[c10d] The client socket has timed out"),
                           ("vllm4383-nccl-shm-segment.log", "NCCL WARN Error while creating shared memory")):
        lines = [line for line in (DOCTOR_PUBLIC / fixture).read_text(encoding="utf-8").splitlines() if words in line]
        assert lines, fixture
        assert vllm_phases.read_phases(lines)["current"]["phase"] == "distributed_init"


def test_the_least_advanced_rank_is_where_the_start_waits():
    # Real V0 lines of eight workers loading a 405B checkpoint (vllm#6746): five finished, three still loading.
    lines = (PUBLIC / "vllm6746-mp-tp8-405b-fp8-weights.log").read_text(encoding="utf-8").splitlines()
    report = vllm_phases.read_phases(lines)
    finished = [entry for entry in report["processes"] if entry["finished"]]
    loading = [entry for entry in report["processes"] if not entry["finished"]]
    assert finished and loading
    assert report["least"]["phase"] == "weights" and not report["least"]["finished"]
    assert report["current"] is report["least"]
    assert report["furthest"]["finished"] and "Loading model weights took 57.7520 GB" in report["furthest"]["line"]
    assert report["least"]["time"] == "07-24 14:03:36"


def test_ranks_named_by_their_prefix_and_ray_workers_by_their_address():
    lines = [
        "(VllmWorker rank=3 pid=2950723) INFO 05-28 13:30:33 [weight_utils.py:291] Using model weights format "
        "['*.safetensors']",
        "(EngineCore_DP0 pid=1305) (RayWorkerWrapper pid=344, ip=10.2.30.130) INFO 12-12 22:31:21 "
        "[gpu_model_runner.py:2653] Model loading took 0.7098 GiB and 0.379731 seconds",
    ]
    report = vllm_phases.read_phases(lines)
    first, second = report["processes"]
    assert first["rank"] == 3 and first["is_rank"] and first["phase"] == "weights"
    assert second["ip"] == "10.2.30.130" and second["is_rank"] and second["finished"]


def test_journal_times_win_over_the_header_and_an_iso_prefix_gives_an_epoch():
    lines = upto(lab_lines(), "Starting to load model")
    times = [1_796_000_000.0 + index for index in range(len(lines))]
    entry = vllm_phases.read_phases(lines, times)["current"]
    assert entry["epoch"] == times[-1] and entry["time"] == vllm_phases.iso_utc(times[-1])
    prefixed = ["2026-12-02T23:43:49+0000 node1 vllm[880]: " + lines[-1]]
    entry = vllm_phases.read_phases(prefixed)["current"]
    assert entry["time"] == "2026-12-02T23:43:49+0000" and entry["epoch"] == 1_796_255_029.0
    short = ["Dec 02 23:43:49 node1 vllm[880]: " + lines[-1]]
    entry = vllm_phases.read_phases(short)["current"]
    assert entry["time"] == "Dec 02 23:43:49" and entry["epoch"] is None


def test_a_stall_is_judged_against_the_phase_s_bound():
    lines = upto(lab_lines(), "world_size=1 rank=0 local_rank=0")
    times = [1_000_000.0] * len(lines)
    report = vllm_phases.read_phases(lines, times)
    bound = vllm_phases.PROFILES["gpu"]["distributed_init"]
    assert vllm_phases.stall(report, now=1_000_000.0 + bound - 1) is None
    found = vllm_phases.stall(report, now=1_000_000.0 + bound + 60)
    assert found["phase"] == "distributed_init" and found["elapsed_s"] == bound + 60 and found["bound_s"] == bound
    assert any("NCCL_SOCKET_IFNAME" in check for check in found["checks"])
    assert any("NCCL_DEBUG=INFO" in check for check in found["checks"])
    # the lab profile is shorter; an override replaces one phase's bound
    lab = vllm_phases.PROFILES["lab"]["distributed_init"]
    assert lab < bound and vllm_phases.stall(report, now=1_000_000.0 + lab + 1, profile="lab")
    assert vllm_phases.stall(report, now=1_000_000.0 + bound + 60, overrides={"distributed_init": 7200}) is None


def test_without_a_time_of_reading_the_log_is_taken_as_ended():
    report = vllm_phases.read_phases(upto(lab_lines(), "Starting to load model"))
    found = vllm_phases.stall(report)
    assert found["phase"] == "weights" and found["elapsed_s"] is None
    assert any("storage throughput" in check for check in found["checks"])
    # a whole start is never stalled; a line without a time cannot be judged against a clock
    assert vllm_phases.stall(vllm_phases.read_phases(lab_lines())) is None
    assert vllm_phases.stall(report, now=10**10) is None


def test_a_headless_node_completes_when_its_ranks_are_past_memory_profiling():
    head = upto(lab_lines(), "Explicitly set (1.0/23.54) GiB")
    headless = ["(MainProcess pid=20370) INFO 11-29 21:00:57 [serve.py:224] Launching vLLM (v0.32.0) headless "
                "multiproc executor, with head node address 10.0.0.1:29611 for torch.distributed process group.",
                *[line for line in head if "(Worker pid=1021)" in line]]
    assert vllm_phases.read_phases(headless)["complete"] is True
    assert vllm_phases.read_phases(headless[:-1])["complete"] is False


def test_bad_profiles_and_phases_are_refused():
    with pytest.raises(ValueError, match="unknown start-up profile"):
        vllm_phases.bounds("tpu")
    with pytest.raises(ValueError, match="unknown start-up phase"):
        vllm_phases.bounds("gpu", {"loading": 60})


def test_every_phase_but_the_last_has_checks_and_a_bound_in_every_profile():
    for profile in vllm_phases.PROFILES.values():
        assert list(profile) == list(vllm_phases.PHASE_IDS[:-1])
    for phase in vllm_phases.PHASES[:-1]:
        assert phase["checks"] and phase["enter"], phase["id"]
