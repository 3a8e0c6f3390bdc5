"""vllm_unit: rollout stages of a plan node's argv, and systemd quoting of ExecStart.

Plans come from the real planner. The quoting is checked for real on a lab
node's systemd in tests/lab/test_deploy.py (test_systemd_reads_exec_start_back).
"""

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan
from ansible_collections.vllm_ops.cluster.plugins.module_utils.render.vllm_unit import (
    StageError,
    api_probe_host,
    eager_stage_unsafe,
    env_file_line,
    exec_start,
    served_model_name,
    stage_argv,
    systemd_quote,
)

TINY = {
    "config": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 2048, "torch_dtype": "bfloat16",
    }
}


def plan(overrides, workers=2, nodes=1, device="cpu", **kwargs):
    cluster = [
        {"name": f"n{i}", "address": f"10.232.0.{11 + i}",
         "gpus": {"count": workers, "name": "cpu" if device == "cpu" else "NVIDIA H200",
                  "memory_total_mib": 8192 if device == "cpu" else 143771, "nvlink": device != "cpu"}}
        for i in range(nodes)
    ]
    if device == "cpu":
        kwargs.setdefault("cpu_cores_per_node", 2)
    return build_plan(TINY, cluster, {"max_model_len": 512}, overrides, device=device,
                      model_path="/srv/models/tiny-llama", **kwargs)


def test_final_stage_is_the_plan_argv_unchanged():
    p = plan({"tp": 2}, enforce_eager=False)
    assert stage_argv(p, p["nodes"][0], "final") == p["nodes"][0]["argv"]
    assert "--enforce-eager" not in p["nodes"][0]["argv"]


def test_eager_stage_adds_enforce_eager_once():
    p = plan({"tp": 2}, enforce_eager=False)
    eager = stage_argv(p, p["nodes"][0], "eager")
    assert eager == [*p["nodes"][0]["argv"], "--enforce-eager"]
    already = plan({"tp": 2}, enforce_eager=True)
    assert stage_argv(already, already["nodes"][0], "eager") == already["nodes"][0]["argv"]


def test_eager_stage_is_refused_for_pp_on_cpu():
    p = plan({"pp": 2}, workers=1, nodes=2)
    assert "--enforce-eager" not in p["nodes"][1]["argv"]
    assert "PP=2 on the CPU platform" in eager_stage_unsafe(p)
    with pytest.raises(StageError, match=r"node n1: refusing the --enforce-eager stage: PP=2 on the CPU platform"):
        stage_argv(p, p["nodes"][1], "eager")
    assert stage_argv(p, p["nodes"][1], "final")[-1] == "--headless"
    # On CUDA the eager stage is the seed's functional first start.
    cuda = plan({"pp": 2, "tp": 1}, workers=1, nodes=2, device="cuda", allow_tp_across_nodes=False)
    assert eager_stage_unsafe(cuda) is None
    assert stage_argv(cuda, cuda["nodes"][0], "eager")[-1] == "--enforce-eager"


def test_nodes_without_vllm_and_unknown_stages_are_refused():
    ray = plan({"tp": 2, "backend": "ray"}, workers=1, nodes=2, device="cuda", allow_tp_across_nodes=True)
    worker = ray["nodes"][1]
    assert worker["runs_vllm"] is False
    with pytest.raises(StageError, match="node n1 runs no vLLM in this plan"):
        stage_argv(ray, worker)
    p = plan({"tp": 2})
    with pytest.raises(StageError, match="unknown rollout stage 'graph'"):
        stage_argv(p, p["nodes"][0], "graph")


@pytest.mark.parametrize(
    ("word", "quoted"),
    [
        ("--tensor-parallel-size", "--tensor-parallel-size"),
        ("/srv/models/tiny-llama", "/srv/models/tiny-llama"),
        ("10.232.0.11", "10.232.0.11"),
        ("", '""'),
        ("two words", '"two words"'),
        ("50%", "\"50%%\""),
        ("$HOME", "\"$$HOME\""),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("line\nbreak", '"line\\nbreak"'),
        ("a;b", '"a;b"'),
        ('{"k": 1}', '"{\\"k\\": 1}"'),
    ],
)
def test_systemd_quote(word, quoted):
    assert systemd_quote(word) == quoted


def test_exec_start_uses_the_venv_binary_and_the_plan_argv():
    p = plan({"tp": 2})
    line = exec_start("/opt/vllm-cluster/venv/bin/vllm", p["nodes"][0]["argv"])
    assert line.startswith("/opt/vllm-cluster/venv/bin/vllm serve /srv/models/tiny-llama --port 8000 ")
    assert line.split() == ["/opt/vllm-cluster/venv/bin/vllm", *p["nodes"][0]["argv"][1:]]
    with pytest.raises(StageError, match="absolute path"):
        exec_start("vllm", p["nodes"][0]["argv"])


def test_probe_host_and_served_model():
    argv = ["vllm", "serve", "/srv/models/tiny-llama", "--port", "8000"]
    assert api_probe_host(argv) == "127.0.0.1"
    assert api_probe_host([*argv, "--host", "0.0.0.0"]) == "127.0.0.1"
    assert api_probe_host([*argv, "--host", "10.232.0.11"]) == "10.232.0.11"
    assert api_probe_host([*argv, "--host=fd00::1"]) == "[fd00::1]"
    assert served_model_name(argv) == "/srv/models/tiny-llama"
    assert served_model_name([*argv, "--served-model-name", "tiny"]) == "tiny"
    p = plan({"tp": 2}, api_host="10.232.0.11")
    assert api_probe_host(p["nodes"][0]["argv"]) == "10.232.0.11"


def test_env_file_lines():
    env = plan({"tp": 2})["nodes"][0]["env"]
    assert env_file_line("VLLM_CPU_OMP_THREADS_BIND", env["VLLM_CPU_OMP_THREADS_BIND"]) == \
        'VLLM_CPU_OMP_THREADS_BIND="0|1"'
    assert env_file_line("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1") == 'NCCL_IB_HCA="=mlx5_0:1,mlx5_1:1"'
    assert env_file_line("X", 'a "b" $c `d` \\e') == 'X="a \\"b\\" \\$c \\`d\\` \\\\e"'
    with pytest.raises(StageError, match="name '1BAD' is not valid"):
        env_file_line("1BAD", "x")
    with pytest.raises(StageError, match="line break"):
        env_file_line("X", "a\nb")
