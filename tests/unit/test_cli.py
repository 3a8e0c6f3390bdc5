"""bin/vllm-cluster plan: flags in, a readable plan or JSON out, exit 2 when nothing fits."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

CLI = Path(__file__).resolve().parents[2] / "bin" / "vllm-cluster"
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
