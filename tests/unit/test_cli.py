"""bin/vllm-cluster: flags in, a readable plan or JSON out, exit 2 when nothing fits or an input is wrong.

Also: --version, the catalog (vllm-cluster models), help without internal names, bounds on every number
(plan/cli_inputs.py), unit-slip warnings, and over 60 bad inputs that each end in one line, never a traceback.
"""

import importlib.machinery
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import cli_inputs, model_catalog
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import PlanError

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "bin" / "vllm-cluster"
JSON_KEYS = {"strategy", "tp", "pp", "dp", "ep", "world_size", "nodes_used", "nodes", "memory", "decision"}


def run(*args):
    return subprocess.run(
        [sys.executable, str(CLI), "plan", *args], capture_output=True, text=True, timeout=60, check=False
    )


def run_json(*args):
    result = run(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_seed_70b_on_4_a100_as_json():
    plan = run_json(
        "--model",
        "llama-3.1-70b",
        "--gpus-per-node",
        "4",
        "--gpu-memory-gib",
        "80",
        "--gpu-name",
        "NVIDIA A100-SXM4-80GB",
        "--max-model-len",
        "8192",
        "--gpu-memory-utilization",
        "0.9",
    )
    assert JSON_KEYS <= set(plan)
    assert (plan["strategy"], plan["tp"], plan["world_size"]) == ("tp", 4, 4)
    assert set(plan["memory"]) >= {"weights_gib_per_gpu", "kv_cache_tokens", "max_concurrency"}
    assert plan["nodes"][0]["argv"][:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"]
    assert {"node_rank", "ranks", "argv", "env"} <= set(plan["nodes"][0])
    assert all(isinstance(line, str) for line in plan["decision"])


def test_seed_405b_on_two_nodes():
    plan = run_json(
        "--model",
        "llama-3.1-405b",
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--gpu-memory-gib",
        "79.65",
        "--addresses",
        "10.0.0.1,10.0.0.2",
        "--fabric-interface",
        "ib0",
    )
    assert (plan["tp"], plan["pp"], plan["world_size"], plan["nodes_used"]) == (8, 2, 16, 2)
    assert [node["ranks"] for node in plan["nodes"]] == [list(range(8)), list(range(8, 16))]
    assert plan["nodes"][1]["env"]["VLLM_HOST_IP"] == "10.0.0.2"


def test_seed_405b_over_ray():
    plan = run_json(
        "--model",
        "llama-3.1-405b",
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--gpu-memory-gib",
        "79.65",
        "--backend",
        "ray",
    )
    head, worker = plan["nodes"]
    assert "--distributed-executor-backend" in head["argv"] and worker["argv"] == []


def test_seed_deepseek_v3_on_8_h200():
    plan = run_json(
        "--model",
        "deepseek-ai/DeepSeek-V3",
        "--gpus-per-node",
        "8",
        "--gpu-memory-gib",
        "140.4",
        "--gpu-name",
        "NVIDIA H200",
    )
    assert plan["strategy"] == "ep_dp" and plan["ep"] == plan["tp"] * plan["dp"] == 8


def test_seed_8b_single():
    plan = run_json(
        "--model", "llama-3.1-8b", "--gpus-per-node", "1", "--gpu-memory-gib", "80", "--no-nvlink"
    )
    assert (plan["strategy"], plan["tp"], plan["ep"]) == ("single", 1, 1)


def test_overrides_reach_the_planner():
    plan = run_json(
        "--model", "deepseek-v3", "--gpus-per-node", "8", "--gpu-memory-gib", "140.4", "--tp", "2"
    )
    assert (plan["tp"], plan["dp"], plan["ep"]) == (2, 4, 8)
    plan = run_json(
        "--model", "deepseek-v3", "--gpus-per-node", "8", "--gpu-memory-gib", "140.4", "--ep", "1"
    )
    assert plan["ep"] == 1 and plan["tp"] == 8


def test_full_json_is_the_whole_plan():
    result = run(
        "--model", "llama-3.1-8b", "--gpus-per-node", "1", "--gpu-memory-gib", "80", "--json", "--full"
    )
    plan = json.loads(result.stdout)
    assert {"plan_version", "expect", "ports", "cluster", "targets"} <= set(plan)


def test_cpu_lab_layout():
    plan = run_json(
        "--model",
        "llama-3.1-8b",
        "--device",
        "cpu",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--gpu-memory-gib",
        "40",
        "--tp",
        "2",
        "--allow-tp-across-nodes",
        "--cpu-cores-per-node",
        "2",
        "--addresses",
        "10.213.1.11,10.213.1.12",
        "--max-model-len",
        "512",
    )
    assert plan["tp"] == 2 and plan["nodes_used"] == 2
    assert plan["nodes"][1]["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"


def test_readable_summary_shows_the_decision_path():
    result = run("--model", "llama-3.1-70b", "--gpus-per-node", "4", "--gpu-memory-gib", "80")
    assert result.returncode == 0 and result.stderr == ""
    out = result.stdout
    for fragment in (
        "Decision path:",
        "Q1 Does it fit on one GPU? no",
        "Q3 Does it fit on one node? yes",
        "Layout: tp (mp) TP=4",
        "vllm serve meta-llama/Llama-3.1-70B-Instruct",
        "Per GPU: ",
    ):
        assert fragment in out


def test_impossible_layout_exits_2_with_the_error_on_stderr():
    result = run("--model", "llama-3.1-405b", "--gpus-per-node", "8", "--gpu-memory-gib", "80")
    assert result.returncode == 2 and result.stdout == ""
    assert "no layout fits llama-3.1-405b" in result.stderr and "usable" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--model", "llama-3.1-70b", "--gpus-per-node", "4", "--gpu-memory-gib", "80", "--tp", "3"),
        ("--model", "no-such-model", "--gpus-per-node", "4", "--gpu-memory-gib", "80"),
        (
            "--model",
            "llama-3.1-8b",
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--gpu-memory-gib",
            "80",
            "--addresses",
            "a",
        ),
        ("--model", "llama-3.1-8b", "--gpus-per-node", "1"),
    ],
)
def test_bad_input_exits_2(args):
    result = run(*args)
    assert result.returncode == 2 and result.stdout == "" and "error" in result.stderr


def test_a_hybrid_model_is_refused_until_its_size_and_kv_bytes_are_given(tmp_path):
    config = {"architectures": ["JambaForCausalLM"], "model_type": "jamba", "hidden_size": 1024,
              "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 32000,
              "intermediate_size": 4096, "attn_layer_period": 8, "mamba_d_state": 16, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    cluster = ["--model", str(tmp_path), "--gpus-per-node", "1", "--gpu-memory-gib", "80", "--gpu-name", "NVIDIA H100"]
    refused = run(*cluster)
    assert refused.returncode == 2 and "--model: JambaForCausalLM has state-space" in refused.stderr
    assert "--weights-gib and --kv-bytes-per-token" in refused.stderr
    planned = run_json(*cluster, "--weights-gib", "3", "--kv-bytes-per-token", "65536", "--full")
    assert planned["model"]["weights_gib"] == 3.0
    assert planned["memory"]["kv_bytes_per_token_per_gpu"] == 65536


def test_a_model_name_outside_the_catalog_plans_with_its_size_and_kv_bytes():
    cluster = ["--model", "someorg/new-model", "--gpus-per-node", "2", "--gpu-memory-gib", "80",
               "--gpu-name", "NVIDIA H100 80GB HBM3"]
    refused = run(*cluster)
    assert refused.returncode == 2 and "unknown model 'someorg/new-model'" in refused.stderr
    assert "--weights-gib and --kv-bytes-per-token" in refused.stderr
    planned = run_json(*cluster, "--weights-gib", "42", "--kv-bytes-per-token", "131072", "--full")
    assert planned["model"]["weights_gib"] == 42.0 and planned["model"]["path"] == "someorg/new-model"
    assert any("not from its shapes" in warning for warning in planned["warnings"])


def test_the_vllm_release_is_a_flag():
    cluster = ["--model", "llama-3.1-8b", "--gpus-per-node", "1", "--gpu-memory-gib", "80",
               "--gpu-name", "NVIDIA H100 80GB HBM3"]
    assert run_json(*cluster, "--vllm-version", "0.33.0", "--full")["vllm_version"] == "0.33.0"
    refused = run(*cluster, "--vllm-version", "0.33.0", "--serve-arg", "mamba-cache-mode=align")
    assert refused.returncode == 2 and "--mamba-cache-mode: it is deprecated and has no effect in vLLM 0.33" in \
        refused.stderr


# --------------------------------------------------------------------------- bad inputs, in-process


@pytest.fixture(scope="module")
def cli():
    """bin/vllm-cluster as a module: main(argv) without a Python start per case."""
    loader = importlib.machinery.SourceFileLoader("vllm_cluster_cli", str(CLI))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def call(cli, capsys, argv):
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's own errors and --help/--version
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


BASE = ("plan", "--model", "llama-3.1-8b", "--gpus-per-node", "1", "--gpu-memory-gib", "80")
LONG = "x" * 5000


def bad(*extra, expect=None, base=BASE, id=None):
    """A bad input: ``extra`` after ``base``; ``expect``: what stderr must hold (default: the flag and value)."""
    if expect is None:
        flag, value = extra[0], extra[1] if len(extra) > 1 else ""
        shown = value if value.strip() and value == value.strip() and value.isprintable() and len(value) <= 40 \
            else None
        expect = (flag, shown if shown is not None else "")
    name = id or " ".join(extra)[:40] or "(none)"
    return pytest.param((*base, *extra), expect, id=name)


BAD_INPUTS = [
    # --nodes: the MemoryError of a million nodes, and every other number that is no node count
    bad("--nodes", "1000000", expect=("--nodes 1000000", "1 to 4,096")),
    bad("--nodes", "0", expect=("--nodes 0", "1 to 4,096")),
    bad("--nodes", "-1"),
    bad("--nodes", "1.5", expect=("--nodes 1.5", "not an integer")),
    bad("--nodes", "1e3", expect=("--nodes 1e3", "not an integer")),
    bad("--nodes", "nan"),
    bad("--nodes", "inf"),
    bad("--nodes", "", expect=("--nodes ''", "not an integer")),
    bad("--nodes", "two"),
    bad("--nodes", "99999999999999999999999999999999999999999999999999", expect=("--nodes 9999", "characters")),
    # --gpus-per-node
    bad("--gpus-per-node", "1000", expect=("--gpus-per-node 1000", "1 to 64")),
    bad("--gpus-per-node", "0"),
    bad("--gpus-per-node", "-8"),
    bad("--gpus-per-node", "8.0", expect=("--gpus-per-node 8.0", "not an integer")),
    bad("--gpus-per-node", "nan"),
    bad("--gpus-per-node", "", expect=("--gpus-per-node ''",)),
    # --gpu-memory-gib: unit slips first
    bad("--gpu-memory-gib", "81920", expect=("--gpu-memory-gib 81920", "81920 GiB per GPU looks like MiB: 80 GiB?")),
    bad("--gpu-memory-gib", "143771", expect=("looks like MiB: 140.4 GiB?",)),
    bad("--gpu-memory-gib", "85899345920", expect=("looks like bytes: 80 GiB?",)),
    bad("--gpu-memory-gib", "80GiB", expect=("--gpu-memory-gib 80GiB", "give the number alone", "--gpu-memory-gib 80")),
    bad("--gpu-memory-gib", "81920MiB", expect=("--gpu-memory-gib 80",)),
    bad("--gpu-memory-gib", "80GB", expect=("--gpu-memory-gib 74.51",)),
    bad("--gpu-memory-gib", "2048", expect=("<= 1,024 GiB", "looks like MiB: 2 GiB?")),
    bad("--gpu-memory-gib", "0", expect=("--gpu-memory-gib 0", "> 0 and <= 1,024 GiB")),
    bad("--gpu-memory-gib", "-80"),
    bad("--gpu-memory-gib", "nan", expect=("--gpu-memory-gib nan", "not a number")),
    bad("--gpu-memory-gib", "inf"),
    bad("--gpu-memory-gib", "-inf", expect=("--gpu-memory-gib", "expected one argument")),  # argparse: an option?
    bad("--gpu-memory-gib=-inf", expect=("--gpu-memory-gib -inf", "not a number")),
    bad("--gpu-memory-gib", "1e999"),
    bad("--gpu-memory-gib", "1e308"),
    bad("--gpu-memory-gib", ""),
    bad("--gpu-memory-gib", "80,5"),
    # planning targets
    bad("--max-model-len", "0", expect=("--max-model-len 0", "16,777,216 tokens")),
    bad("--max-model-len", "-1"),
    bad("--max-model-len", "100000000000000000000"),
    bad("--max-model-len", "8k", expect=("--max-model-len 8k", "give the number alone", "--max-model-len 8000")),
    bad("--max-model-len", "128K", expect=("--max-model-len 131072",)),
    bad("--max-model-len", "8 kilo", expect=("--max-model-len '8 kilo'", "not an integer")),
    bad("--max-model-len", "1e4"),
    bad("--max-model-len", "nan"),
    bad("--gpu-memory-utilization", "90", expect=("--gpu-memory-utilization 90", "looks like a percentage: 0.9?")),
    bad("--gpu-memory-utilization", "0"),
    bad("--gpu-memory-utilization", "1.01"),
    bad("--gpu-memory-utilization", "-0.5"),
    bad("--gpu-memory-utilization", "nan"),
    bad("--gpu-memory-utilization", "inf"),
    bad("--gpu-memory-utilization", ""),
    bad("--kv-tokens-target", "0"),
    bad("--kv-tokens-target", "100000000000"),
    bad("--kv-tokens-target", "nan"),
    bad("--concurrency-target", "0"),
    bad("--concurrency-target", "-1"),
    bad("--concurrency-target", "nan"),
    bad("--concurrency-target", "inf"),
    bad("--concurrency-target", "10000000"),
    bad("--throughput-need", "0"),
    bad("--throughput-need", "nan"),
    bad("--throughput-need", "1e10"),
    bad("--replica-throughput", "0"),
    bad("--replica-throughput", "inf"),
    bad("--replica-throughput", "-5"),
    # overrides
    bad("--tp", "0"),
    bad("--tp", "1000000", expect=("--tp 1000000", "262,144")),
    bad("--tp", "nan"),
    bad("--tp", "3", expect=("--tp 3",)),  # in bounds, refused by the planner (32 heads)
    bad("--pp", "0"),
    bad("--pp", "-2"),
    bad("--pp", "64", expect=("--pp 64",)),  # more stages than layers
    bad("--dp", "1000000000"),
    bad("--dp", "2", expect=("--dp 2 needs 2 GPUs; the cluster has --nodes 1 x --gpus-per-node 1 = 1",)),
    bad("--tp", "2", "--pp", "2", expect=("--tp 2 --pp 2 need 4 GPUs",)),
    bad("--ep", "-1"),
    bad("--ep", ""),
    # CPU and model sizes
    bad("--cpu-kvcache-space-gib", "0"),
    bad("--cpu-kvcache-space-gib", "2048", expect=("--cpu-kvcache-space-gib 2048", "looks like MiB: 2 GiB?")),
    bad("--cpu-kvcache-space-gib", "1.5"),
    bad("--cpu-cores-per-node", "0"),
    bad("--cpu-cores-per-node", "1000000"),
    bad("--weights-gib", "0"),
    bad("--weights-gib", "-1"),
    bad("--weights-gib", "nan"),
    bad("--weights-gib", "inf"),
    bad("--weights-gib", "700000", expect=("--weights-gib 700000", "looks like MiB: 683.59 GiB?")),
    bad("--kv-bytes-per-token", "0"),
    bad("--kv-bytes-per-token", "-1"),
    bad("--kv-bytes-per-token", "100000000000000000000000"),
    bad("--kv-bytes-per-token", "1.5"),
    # the model and other text
    bad("--model", "no-such-model", expect=("--model", "no-such-model", "vllm-cluster models")),
    bad("--model", "ллама-3", expect=("--model", "ллама-3")),
    bad("--model", "🦙", expect=("--model", "🦙")),
    bad("--model", "", expect=("--model ''", "non-empty")),
    bad("--model", LONG, expect=("--model xxxx", "5,000 characters", "at most 4,096"), id="--model 5000 characters"),
    bad("--model", "llama\n3", expect=("--model 'llama\\n3'", "control characters")),
    bad("--model", "/nonexistent/model", expect=("--model", "/nonexistent/model")),
    bad("--model", "/", expect=("--model", "config.json")),
    bad("--model", "meta-llama/Nope-9B", expect=("--model", "meta-llama/Nope-9B")),
    bad("--model-path", "", expect=("--model-path ''",)),
    bad("--model-path", LONG, expect=("--model-path",), id="--model-path 5000 characters"),
    bad("--deployment", "", expect=("--deployment ''",)),
    bad("--deployment", "bad name!", expect=("--deployment", "bad name!")),
    bad("--deployment", "ünïcode", expect=("--deployment", "ünïcode")),
    bad("--gpu-name", "", expect=("--gpu-name ''",)),
    bad("--gpu-name", "   ", expect=("--gpu-name '   '",)),
    bad("--gpu-name", "A100\tSXM", expect=("--gpu-name", "control characters")),
    bad("--gpu-name", "G" * 300, expect=("--gpu-name", "at most 255"), id="--gpu-name 300 characters"),
    bad("--fabric-interface", "", expect=("--fabric-interface ''",)),
    bad("--fabric-interface", "eth0;reboot", "--addresses", "10.0.0.1", expect=("eth0;reboot", "interface")),
    bad("--fabric-interface", "a-very-long-interface-name", "--addresses", "10.0.0.1",
        expect=("a-very-long-interface-name", "interface")),
    bad("--fabric-interface", "ib0", expect=("--fabric-interface ib0 needs --addresses",)),
    bad("--fabric-interface", "ib0", "--addresses", "gpu-a", expect=("'gpu-a'", "not an IP address")),
    bad("--api-host", "", expect=("--api-host ''",)),
    # choices
    bad("--device", "tpu"),
    bad("--device", "", expect=("--device",)),
    bad("--backend", "slurm"),
    bad("--load-format", "gguf"),
    bad("--kv-cache-dtype", "int3"),
    # vLLM's own flags
    bad("--serve-arg", "garbage", expect=("--serve-arg garbage", "KEY=VALUE")),
    bad("--serve-arg", "=1", expect=("--serve-arg =1", "KEY=VALUE")),
    bad("--serve-arg", "", expect=("--serve-arg ''",)),
    bad("--serve-arg", "tensor-parallel-size=2", expect=("tensor-parallel-size", "--tp")),
    bad("--serve-arg", "max-num-seqs=-1", expect=("max-num-seqs=-1",)),
    bad("--serve-arg", "max-num-seqs=99999999999999999999", expect=("max-num-seqs=99999999999999999999", "1,048,576")),
    bad("--serve-arg", "max_num_seqs=0", expect=("max_num_seqs=0",)),
    bad("--serve-arg", "block-size=0", expect=("block-size=0",)),
    bad("--serve-arg", "cpu-offload-gb=1e308", expect=("cpu-offload-gb", "65,536")),
    bad("--serve-arg", "swap-space=1e999", expect=("swap-space=inf", "finite")),
    bad("--serve-arg", "seed=99999999999999999999999999", expect=("seed=", "9,223,372,036,854,775,807")),
    bad("--serve-arg", "api-key=sk-secret", expect=("api-key", "(hidden)")),
    bad("--serve-arg", "max-num-seqs=8", "--serve-arg", "max-num-seqs=16", expect=("max-num-seqs", "twice")),
    bad("--serve-arg", "served-model-name=a\nb", expect=("--serve-arg", "control characters")),
    # the cluster's addresses
    bad("--addresses", "a,b", expect=("--addresses a,b", "2 addresses for --nodes 1")),
    bad("--addresses", "", expect=("--addresses ''", "an empty address")),
    bad("--addresses", ",", expect=("--addresses ,", "an empty address")),
    bad("--nodes", "3", "--addresses", "a,,b", expect=("--addresses a,,b", "--nodes 3")),
    bad("--nodes", "2", "--addresses", "10.0.0.1,10.0.0.1", expect=("10.0.0.1", "already used")),
    bad("--nodes", "2", "--addresses", "10.0.0.1", expect=("--addresses 10.0.0.1", "1 address for --nodes 2")),
    # argparse: a missing, unknown or misspelt flag, a missing subcommand
    bad(expect=("--gpus-per-node",), base=("plan", "--model", "llama-3.1-8b", "--gpu-memory-gib", "80"),
        id="missing --gpus-per-node"),
    bad(expect=("--model",), base=("plan", "--gpus-per-node", "1", "--gpu-memory-gib", "80"), id="missing --model"),
    bad("--gpus", "8", expect=("unrecognized arguments", "--gpus")),  # not an abbreviation of --gpus-per-node
    bad("--max-model", "8192", expect=("unrecognized arguments", "--max-model")),
    bad("--nodes", expect=("--nodes", "expected one argument")),
    bad(expect=("deploy",), base=("deploy",), id="unknown command"),
    bad(expect=("required",), base=(), id="no command"),
    bad("--json", "--full", expect=("no layout fits",), base=(
        "plan", "--model", "llama-3.1-405b", "--gpus-per-node", "8", "--gpu-memory-gib", "80"), id="nothing fits"),
]


@pytest.mark.parametrize(("argv", "expect"), BAD_INPUTS)
def test_a_bad_input_is_one_clear_line_and_exit_2(cli, capsys, argv, expect):
    code, out, err = call(cli, capsys, argv)
    assert code == 2, (code, err)
    assert out == ""
    assert "Traceback" not in err and "internal error" not in err
    for fragment in expect:
        assert fragment in err, (fragment, err)
    assert "error:" in err.splitlines()[-1]
    assert len(err) < 6000  # a long value is cut, not echoed


def test_there_are_at_least_60_bad_inputs():
    assert len(BAD_INPUTS) >= 60


def test_an_unexpected_exception_is_one_line_and_exit_1(cli, capsys, monkeypatch):
    def broken(args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(cli, "_plan", broken)
    code, out, err = call(cli, capsys, BASE)
    assert code == 1 and out == ""
    assert err == "vllm-cluster plan: internal error, please report: RuntimeError: boom\n"


# --------------------------------------------------------------------------- as a user runs it


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, str(CLI), *args], capture_output=True, timeout=60, check=False,
                          env=env)


def test_a_million_nodes_is_refused_at_once_without_a_traceback():
    result = run_cli("plan", "--model", "llama-3.1-8b", "--nodes", "1000000", "--gpus-per-node", "8",
                     "--gpu-memory-gib", "80")
    assert result.returncode == 2 and result.stdout == b""
    assert result.stderr.decode() == "vllm-cluster plan: error: --nodes 1000000: expected an integer from 1 to 4,096\n"


@pytest.mark.parametrize("value", [b"\xff\xfe", "ллама".encode(), b"a" * 20000])
def test_bytes_that_are_no_text_and_an_ascii_terminal_end_in_one_line(value):
    env = dict(os.environ, PYTHONIOENCODING="ascii")
    for flag in (b"--model", b"--gpu-name", b"--deployment"):
        argv = {b"--model": value} if flag == b"--model" else {b"--model": b"llama-3.1-8b", flag: value}
        args = [part for key, item in argv.items() for part in (key, item)]
        result = run_cli("plan", *args, "--gpus-per-node", "1", "--gpu-memory-gib", "80", env=env)
        assert result.returncode in (0, 2), result.stderr
        assert b"Traceback" not in result.stderr and len(result.stderr) < 6000


def test_version_is_the_collections():
    version = re.search(r"^version:\s*(\S+)", (REPO / "galaxy.yml").read_text(), re.M).group(1)
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.decode() == f"vllm-cluster {version} (collection vllm_ops.cluster)\n"


def test_models_lists_the_catalog():
    result = run_cli("models")
    assert result.returncode == 0 and result.stderr == b""
    lines = result.stdout.decode().splitlines()
    assert lines[0].split()[:3] == ["NAME", "HUB", "ID"]
    names = [line.split()[0] for line in lines[1:] if line and not line.startswith("plan --model")]
    assert names == model_catalog.catalog_names()
    row = next(line for line in lines if line.startswith("llama-3.1-70b"))
    assert "llama-3.3-70b" in row and "meta-llama/Llama-3.1-70B-Instruct" in row and "131.4 GiB" in row
    rows = json.loads(run_cli("models", "--json").stdout)
    assert [row["name"] for row in rows] == model_catalog.catalog_names()
    deepseek = next(row for row in rows if row["name"] == "deepseek-v3")
    assert (deepseek["experts"], deepseek["experts_per_token"], deepseek["dtype"]) == (256, 8, "fp8")


def test_every_catalog_name_plans():
    """What `models` lists, `plan --model` takes (a cluster big enough for each)."""
    for name in model_catalog.catalog_names():
        result = run("--model", name, "--nodes", "4", "--gpus-per-node", "8", "--gpu-memory-gib", "141", "--json")
        assert result.returncode == 0, (name, result.stderr)


@pytest.mark.parametrize("args", [("--help",), ("plan", "--help"), ("models", "--help")])
def test_help_names_no_internal_keys_and_shows_examples(args):
    result = run_cli(*args)
    assert result.returncode == 0
    text = result.stdout.decode()
    assert not re.findall(r"\b[A-Z_]+\.[A-Z_]+\b", text), "an internal dotted name as a metavar"
    assert "targets." not in text and "overrides." not in text
    if args[0] != "models":
        assert "examples:" in text and "vllm-cluster plan --model llama-3.1-70b" in text
        assert "vllm-cluster models" in text


def test_plan_help_shows_each_numbers_bounds():
    text = " ".join(run_cli("plan", "--help").stdout.decode().split())
    for fragment in ("--nodes N", "--gpus-per-node N", "--gpu-memory-gib GIB", "--max-model-len TOKENS",
                     "[an integer from 1 to 4,096]", "[an integer from 1 to 64]", "[a number > 0 and <= 1,024 GiB]"):
        assert fragment in text, fragment


# --------------------------------------------------------------------------- warnings: in bounds, still odd


@pytest.mark.parametrize(("args", "warning"), [
    (("--gpu-memory-gib", "1024"), "--gpu-memory-gib 1024: 1024 GiB per GPU looks like MiB: 1 GiB?"),
    (("--gpus-per-node", "8", "--gpu-memory-gib", "640"),
     "--gpu-memory-gib 640: more than any GPU holds (288 GB at most); per GPU, not per node: 80 GiB?"),
    (("--max-model-len", "8"), "--max-model-len 8: 8 tokens per request looks like thousands of tokens: 8192?"),
])
def test_a_value_that_looks_like_the_wrong_unit_is_planned_with_a_warning(args, warning):
    result = run("--model", "llama-3.1-8b", "--gpus-per-node", "1", "--gpu-memory-gib", "80", *args, "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"vllm-cluster plan: warning: {warning}\n"
    assert warning in json.loads(result.stdout)["warnings"]


# --------------------------------------------------------------------------- plan/cli_inputs.py


def test_parse_returns_numbers_of_the_flags_kind():
    assert cli_inputs.parse("--nodes", " 4 ") == 4 and isinstance(cli_inputs.parse("--nodes", "4"), int)
    assert cli_inputs.parse("--gpu-memory-gib", "79.65") == 79.65
    assert cli_inputs.parse("--gpu-memory-gib", "1024") == 1024.0
    assert cli_inputs.parse("--gpu-memory-utilization", "1") == 1.0
    with pytest.raises(PlanError, match=r"^--gpu-memory-gib 1e4: expected a number > 0 and <= 1,024 GiB; "
                                        r"10000 GiB per GPU looks like MiB: 9.77 GiB\?$"):
        cli_inputs.parse("--gpu-memory-gib", "1e4")


def test_every_numeric_flag_has_bounds(cli):
    numeric = {spec.flag for spec in cli.INPUTS if spec.flag and spec.kind in ("int", "number")}
    numeric |= {"--nodes", "--gpus-per-node", "--gpu-memory-gib", "--weights-gib", "--kv-bytes-per-token"}
    assert numeric == set(cli_inputs.BOUNDS)


def test_no_warning_for_ordinary_values():
    assert cli_inputs.warnings({"--gpu-memory-gib": 80.0, "--gpus-per-node": 8, "--max-model-len": 8192}) == []
    assert cli_inputs.warnings({"--gpu-memory-gib": 500.0}, device="cpu") == []  # a CPU worker may hold that


def test_collection_version_reads_galaxy_yml_then_manifest_json(tmp_path):
    assert cli_inputs.collection_version(tmp_path) == "unknown"
    (tmp_path / "MANIFEST.json").write_text(json.dumps({"collection_info": {"version": "1.2.3"}}))
    assert cli_inputs.collection_version(tmp_path) == "1.2.3"
    (tmp_path / "galaxy.yml").write_text("namespace: vllm_ops\nname: cluster\nversion: '2.0.0'  # next\n")
    assert cli_inputs.collection_version(tmp_path) == "2.0.0"
    (tmp_path / "galaxy.yml").unlink()
    (tmp_path / "MANIFEST.json").write_text("not json")
    assert cli_inputs.collection_version(tmp_path) == "unknown"


def test_the_largest_cluster_the_bounds_allow_plans_in_seconds(cli, capsys):
    """4,096 nodes, every GPU its own DP rank: the planner's expectations are linear in the ranks (was 31 s)."""
    started = time.monotonic()
    code, out, err = call(cli, capsys, ("plan", "--model", "llama-3.1-8b", "--nodes", "4096", "--gpus-per-node", "8",
                                        "--gpu-memory-gib", "80", "--dp", "32768", "--json"))
    assert code == 0 and err == ""
    assert json.loads(out)["dp"] == 32768
    assert time.monotonic() - started < 20
