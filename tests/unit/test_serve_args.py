"""vLLM's own flags (serve_args): the argv they give, the plan's own refused, the memory ones fed to the planner."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import serve_args as sa
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import (
    PlanError,
    PlanRequest,
    build_plan,
    plan,
)

CLI = Path(__file__).resolve().parents[2] / "bin" / "vllm-cluster"
H100 = {"count": 1, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}
T4 = {"count": 1, "name": "Tesla T4", "memory_total_mib": 15360, "nvlink": False}


def nodes(count=1, gpus=H100):
    return [{"name": f"node{i}", "address": f"10.0.0.{i + 1}", "gpus": dict(gpus)} for i in range(count)]


def cpu_nodes(count):
    gpus = {"count": 1, "name": "cpu", "memory_total_mib": 8192, "nvlink": False}
    return [{"name": f"lab{i}", "address": f"10.213.1.{11 + i}", "gpus": dict(gpus)} for i in range(count)]


def tail(argv, first):
    """The words from ``first`` on."""
    return argv[argv.index(first):]


# --------------------------------------------------------------------------- argv


def test_flags_are_sorted_after_the_plan_s_own_and_before_the_executor_s_on_every_node():
    given = {"max_num_seqs": 128, "kv-cache-dtype": "fp8", "enable-prefix-caching": True,
             "enable-chunked-prefill": False, "lora-modules": ["a=/srv/a", "b=/srv/b"],
             "compilation-config": {"mode": 3, "cudagraph_capture_sizes": [1, 2]}, "seed": 7}
    result = build_plan("llama-3.1-70b", nodes(2, dict(H100, count=4)), overrides={"pp": 2, "tp": 4},
                        serve_args=given)
    head, worker = (node["argv"] for node in result["nodes"])
    assert tail(head, "--kv-cache-dtype")[:16] == [
        "--kv-cache-dtype", "fp8", "--middleware", "vllm_cluster_api_guard.ApiGuard", "--served-model-name", "vllm",
        "--compilation-config", '{"cudagraph_capture_sizes":[1,2],"mode":3}',
        "--no-enable-chunked-prefill", "--enable-prefix-caching", "--lora-modules", "a=/srv/a", "b=/srv/b",
        "--max-num-seqs", "128", "--seed"]
    assert tail(head, "--seed")[:3] == ["--seed", "7", "--distributed-executor-backend"]
    # Headless workers parse the same flags: the argv differs only in the node's own executor words.
    cut = head.index("--distributed-executor-backend")
    assert worker[:cut] == head[:cut]
    assert result["serve_args"]["max-num-seqs"] == 128
    assert list(result["serve_args"]) == sorted(result["serve_args"])


def test_the_order_does_not_depend_on_the_mapping_s_order():
    one = build_plan("llama-3.1-8b", nodes(), serve_args={"b-flag": 1, "a-flag": "x", "max-num-seqs": 64})
    two = build_plan("llama-3.1-8b", nodes(), serve_args={"max-num-seqs": 64, "a-flag": "x", "b-flag": 1})
    assert one == two
    assert tail(one["nodes"][0]["argv"], "--served-model-name") == [
        "--served-model-name", "vllm", "--a-flag", "x", "--b-flag", "1", "--max-num-seqs", "64"]


@pytest.mark.parametrize(("given", "words"), [
    ({"enable-prefix-caching": True}, ["--enable-prefix-caching"]),
    ({"enable-prefix-caching": False}, ["--no-enable-prefix-caching"]),
    ({"disable-log-stats": True}, ["--disable-log-stats"]),
    ({"disable-log-stats": False}, []),  # a store-true flag has no --no- form
    ({"allowed-origins": ["a", "b"]}, ["--allowed-origins", "a", "b"]),
    ({"hf-overrides": {"b": 1, "a": {"c": None}}}, ["--hf-overrides", '{"a":{"c":null},"b":1}']),
    ({"max_num_seqs": 3}, ["--max-num-seqs", "3"]),
    ({"q": "fp8"}, ["--quantization", "fp8"]),
    ({"tool-call-parser": "hermes", "enable-auto-tool-choice": True},
     ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]),
])
def test_values_render_as_vllm_parses_them(given, words):
    argv = build_plan("llama-3.1-8b", nodes(), serve_args=given)["nodes"][0]["argv"]
    assert tail(argv, "--served-model-name")[2:] == words


# --------------------------------------------------------------------------- refused


@pytest.mark.parametrize(("given", "message"), [
    ({"tensor-parallel-size": 2}, "serve_args.tensor-parallel-size=2: --tensor-parallel-size is set by the plan; "
                                  "use overrides.tp instead"),
    ({"tp": 2}, "serve_args.tp=2: -tp is set by the plan; use overrides.tp instead"),
    ({"pp": 2}, "serve_args.pp=2: -pp is set by the plan; use overrides.pp instead"),
    ({"dp": 2}, "serve_args.dp=2: -dp is set by the plan; use overrides.dp instead"),
    ({"data-parallel-size-local": 1}, "use overrides.dp instead (the plan sets every data-parallel flag)"),
    ({"data_parallel_address": "10.0.0.1"}, "--data-parallel-address is set by the plan; use overrides.dp"),
    ({"dph": True}, "-dph is set by the plan; use overrides.dp instead"),
    ({"port": 8080}, "serve_args.port=8080: --port is set by the plan; use ports.api instead"),
    ({"host": "0.0.0.0"}, "--host is set by the plan; use api_host instead"),
    ({"max-model-len": 4096}, "--max-model-len is set by the plan; use targets.max_model_len instead"),
    ({"gpu-memory-utilization": 0.8}, "use targets.gpu_memory_utilization instead"),
    ({"nnodes": 2}, "--nnodes is set by the plan; use backend instead (the plan sets the multi-node flags"),
    ({"node-rank": 1}, "--node-rank is set by the plan"),
    ({"master-addr": "x"}, "--master-addr is set by the plan"),
    ({"master-port": 1}, "use ports.master instead"),
    ({"headless": True}, "--headless is set by the plan"),
    ({"distributed-executor-backend": "ray"}, "use backend instead"),
    ({"enable-expert-parallel": True}, "use overrides.ep instead"),
    ({"enable-eplb": True}, "use enable_eplb instead"),
    ({"no-enforce-eager": True}, "--no-enforce-eager is set by the plan; use enforce_eager instead"),
    ({"enforce-eager": False}, "use enforce_eager instead"),
    ({"load-format": "dummy"}, "use load_format instead"),
    ({"model": "/srv/x"}, "use model_path instead"),
    ({"kv-cache-memory-bytes": 10}, "the plan sizes the KV cache"),
    ({"decode-context-parallel-size": 2}, "context parallel is not modelled"),
    ({"api-key": "secret-value"}, "serve_args.api-key=(hidden): --api-key is refused: the API key is "
                                  "vllm_cluster_api_key"),
    ({"--max-num-seqs": 3}, "name the flag without its dashes (max-num-seqs)"),
    ({"Max-Num-Seqs": 3}, "a vLLM flag name is lower-case letters, digits and '-'"),
    ({"max-num-seqs": 3, "max_num_seqs": 4}, "sets --max-num-seqs twice (max-num-seqs and max_num_seqs)"),
    ({"max-num-seqs": "lots"}, "serve_args.max-num-seqs=lots: --max-num-seqs must be an integer >= 1"),
    ({"enable-prefix-caching": None}, "needs a value (true for a switch)"),
    ({"no-enable-prefix-caching": False}, "write enable-prefix-caching: true"),
    ({"chat-template": "a\nb"}, "must be one line"),
    ({"allowed-origins": []}, "at least one"),
])
def test_a_plan_owned_or_malformed_flag_is_refused_naming_what_to_use(given, message):
    with pytest.raises(PlanError) as error:
        build_plan("llama-3.1-8b", nodes(), serve_args=given)
    assert message in str(error.value)
    assert "secret-value" not in str(error.value)


def test_refusals_name_the_variable_and_host_from_an_inventory_and_the_flag_on_the_command_line():
    variables = {"vllm_cluster_model": "llama-3.1-8b", "vllm_cluster_serve_args": {"tensor-parallel-size": 4}}
    with pytest.raises(PlanError) as error:
        plan(PlanRequest.from_variables(variables, nodes(), "node0"))
    assert str(error.value) == ("vllm_cluster_serve_args.tensor-parallel-size=4 on node0: --tensor-parallel-size is "
                                "set by the plan; use vllm_cluster_tp instead")
    variables["vllm_cluster_serve_args"] = {"port": 80}
    with pytest.raises(PlanError, match=r"^vllm_cluster_serve_args.port=80 on node0: --port is set by the plan; "
                                        r"use vllm_cluster_ports.api instead$"):
        plan(PlanRequest.from_variables(variables, nodes(), "node0"))
    variables["vllm_cluster_serve_args"] = "max-num-seqs=3"
    with pytest.raises(PlanError, match=r"^vllm_cluster_serve_args on node0 must be a mapping"):
        plan(PlanRequest.from_variables(variables, nodes(), "node0"))
    with pytest.raises(PlanError, match=r"^--serve-arg tp=2: -tp is set by the plan; use --tp instead$"):
        plan(PlanRequest.from_flags({"model": "llama-3.1-8b", "serve_args": sa.parse_cli(["tp=2"])}, nodes()))


# --------------------------------------------------------------------------- memory


def test_max_num_batched_tokens_shrinks_the_profile_batch_and_the_reserve_on_an_h100():
    default = build_plan("llama-3.1-8b", nodes())
    small = build_plan("llama-3.1-8b", nodes(), serve_args={"max-num-batched-tokens": 2048})
    batch = small["memory"]["inputs"]["profile_batch"]
    assert default["memory"]["inputs"]["profile_batch"]["max_num_batched_tokens"] == 8192
    assert (batch["max_num_batched_tokens"], batch["max_num_seqs"]) == (2048, 1024)
    reserve = small["memory"]["inputs"]["reserve_gib"]["total_gib"]
    assert reserve < default["memory"]["inputs"]["reserve_gib"]["total_gib"]
    assert small["memory"]["kv_cache_tokens"] > default["memory"]["kv_cache_tokens"]


def test_max_num_seqs_caps_the_sampler_rows():
    default = build_plan("llama-3.1-8b", nodes())
    few = build_plan("llama-3.1-8b", nodes(), serve_args={"max-num-seqs": 64})
    assert few["memory"]["inputs"]["profile_batch"]["max_num_seqs"] == 64
    assert few["memory"]["inputs"]["profile_batch"]["sampler_gib"] < \
        default["memory"]["inputs"]["profile_batch"]["sampler_gib"]
    with pytest.raises(PlanError, match="must be greater than or equal to max_num_seqs"):
        build_plan("llama-3.1-8b", nodes(), serve_args={"max-num-seqs": 512, "max-num-batched-tokens": 256})


def test_max_num_batched_tokens_sets_the_sliding_window_s_tokens_in_flight():
    default = build_plan("gpt-oss-20b", nodes())
    small = build_plan("gpt-oss-20b", nodes(), serve_args={"max-num-batched-tokens": 2048})
    in_flight = small["memory"]["inputs"]["kv_cache_groups"]["in_flight_tokens"]
    assert in_flight == 2 * 2048  # PP=1 + async scheduling
    assert in_flight < default["memory"]["inputs"]["kv_cache_groups"]["in_flight_tokens"]
    assert small["memory"]["inputs"]["blocks_per_request"] < default["memory"]["inputs"]["blocks_per_request"]


def test_block_size_changes_the_blocks_and_is_checked_per_platform():
    default = build_plan("llama-3.1-8b", nodes())
    wide = build_plan("llama-3.1-8b", nodes(), serve_args={"block-size": 32})
    assert (default["memory"]["block_size"], wide["memory"]["block_size"]) == (16, 32)
    assert wide["memory"]["inputs"]["num_blocks"] == default["memory"]["inputs"]["num_blocks"] // 2
    assert wide["memory"]["inputs"]["blocks_per_request"] == 8192 // 32
    with pytest.raises(PlanError, match="multiple of 16 on CUDA"):
        build_plan("llama-3.1-8b", nodes(), serve_args={"block-size": 24})
    cpu = build_plan({"config": TINY}, cpu_nodes(1), device="cpu", model_path="/srv/m",
                     targets={"max_model_len": 512}, serve_args={"block-size": 48})
    assert cpu["memory"]["block_size"] == 48
    assert any("not a multiple of 32" in warning for warning in cpu["warnings"])


def test_cpu_offload_gb_lowers_the_weights_per_gpu_and_lets_a_model_fit():
    with pytest.raises(PlanError, match="no layout"):
        build_plan("llama-3.1-8b", nodes(1, T4), targets={"max_model_len": 4096})
    offloaded = build_plan("llama-3.1-8b", nodes(1, T4), targets={"max_model_len": 4096},
                           serve_args={"cpu-offload-gb": 6})
    on_h100 = build_plan("llama-3.1-8b", nodes())
    assert offloaded["memory"]["weights_gib_per_gpu"] == pytest.approx(on_h100["memory"]["weights_gib_per_gpu"] - 6,
                                                                       abs=0.01)
    assert offloaded["memory"]["inputs"]["cpu_offload_gib_per_gpu"] == 6
    assert "--cpu-offload-gb" in offloaded["nodes"][0]["argv"]
    assert any("--cpu-offload-gb" in warning for warning in offloaded["warnings"])
    with pytest.raises(PlanError, match="the CPU platform keeps its weights"):
        build_plan({"config": TINY}, cpu_nodes(1), device="cpu", model_path="/srv/m", serve_args={"cpu-offload-gb": 1})


def test_kv_cache_dtype_in_serve_args_equals_the_input():
    by_input = build_plan("llama-3.1-8b", nodes(), kv_cache_dtype="fp8")
    by_flag = build_plan("llama-3.1-8b", nodes(), serve_args={"kv-cache-dtype": "fp8"})
    assert by_flag["serve_args"] == {"kv-cache-dtype": "fp8"}
    assert {**by_flag, "serve_args": {}} == by_input
    assert build_plan("llama-3.1-8b", nodes(), kv_cache_dtype="fp8", serve_args={"kv-cache-dtype": "fp8"})["memory"] \
        == by_input["memory"]
    with pytest.raises(PlanError, match=r"serve_args.kv-cache-dtype=fp8 differs from kv_cache_dtype=auto"):
        build_plan("llama-3.1-8b", nodes(), kv_cache_dtype="auto", serve_args={"kv-cache-dtype": "fp8"})
    with pytest.raises(PlanError, match="must be one the planner models"):
        build_plan("llama-3.1-8b", nodes(), serve_args={"kv-cache-dtype": "nvfp4"})


def test_online_fp8_quantization_stores_linear_weights_in_one_byte():
    bf16 = build_plan("llama-3.1-8b", nodes())
    fp8 = build_plan("llama-3.1-8b", nodes(), serve_args={"quantization": "fp8"})
    assert fp8["model"]["quantization"] == "fp8 (online)"
    assert fp8["model"]["weight_bytes_per_param"] == 1.0
    # The embedding and the head stay bf16: 2 x 128256 x 4096 x 2 bytes = 1.96 GiB of the 14.96.
    assert fp8["memory"]["weights_gib_per_gpu"] == pytest.approx((14.96 - 1.96) / 2 + 1.96, abs=0.02)
    assert fp8["memory"]["kv_cache_tokens"] > bf16["memory"]["kv_cache_tokens"]
    assert tail(fp8["nodes"][0]["argv"], "--served-model-name")[2:] == ["--quantization", "fp8"]
    with pytest.raises(PlanError, match="online quantization with awq is not modelled .*weights_gib"):
        build_plan("llama-3.1-8b", nodes(), serve_args={"quantization": "awq"})
    with pytest.raises(PlanError, match=r"quantized with fp8; vLLM refuses another method"):
        build_plan("deepseek-v3", nodes(8, dict(H100, count=8)), serve_args={"quantization": "awq"})
    given = build_plan({"name": "llama-3.1-8b", "weights_gib": 9.0}, nodes(), serve_args={"quantization": "awq"})
    assert given["model"]["weights_gib"] == 9.0


def test_unmodelled_memory_flags_are_passed_through_with_a_warning():
    result = build_plan("llama-3.1-8b", nodes(), serve_args={"enable-lora": True, "max-lora-rank": 64})
    assert ["--enable-lora", "--max-lora-rank", "64"] == tail(result["nodes"][0]["argv"], "--enable-lora")
    assert any(warning.startswith("--enable-lora, --max-lora-rank change memory the planner does not model")
               for warning in result["warnings"])


# --------------------------------------------------------------------------- served name


def test_the_served_name_defaults_to_the_deployment_and_serve_args_override_it():
    default = build_plan("llama-3.1-8b", nodes())
    assert default["served_model_name"] == "vllm"
    named = build_plan("llama-3.1-8b", nodes(), deployment="chat-prod")
    assert named["served_model_name"] == "chat-prod"
    assert tail(named["nodes"][0]["argv"], "--served-model-name")[:2] == ["--served-model-name", "chat-prod"]
    own = build_plan("llama-3.1-8b", nodes(), deployment="chat-prod", serve_args={"served-model-name": "llama"})
    assert own["served_model_name"] == "llama"
    assert own["nodes"][0]["argv"].count("--served-model-name") == 1
    several = build_plan("llama-3.1-8b", nodes(), serve_args={"served_model_name": ["llama", "default"]})
    assert several["served_model_name"] == "llama"
    assert tail(several["nodes"][0]["argv"], "--served-model-name")[:3] == ["--served-model-name", "llama", "default"]
    with pytest.raises(PlanError, match="names without spaces"):
        build_plan("llama-3.1-8b", nodes(), serve_args={"served-model-name": "my model"})


def test_every_node_of_a_multi_node_plan_serves_the_same_name():
    result = build_plan({"config": TINY}, cpu_nodes(2), device="cpu", model_path="/srv/m",
                        targets={"max_model_len": 512}, overrides={"pp": 2}, deployment="lab-x")
    for node in result["nodes"]:
        assert tail(node["argv"], "--served-model-name")[:2] == ["--served-model-name", "lab-x"]


# --------------------------------------------------------------------------- command line


def test_parse_cli_reads_values_like_yaml_scalars():
    assert sa.parse_cli(["max-num-seqs=128", "enable-prefix-caching=true", "x=false", "ratio=0.5", "name=a=b",
                         "list=[1, \"a\"]", "map={\"k\": 1}", "bad-json=[1", "empty="]) == {
        "max-num-seqs": 128, "enable-prefix-caching": True, "x": False, "ratio": 0.5, "name": "a=b",
        "list": [1, "a"], "map": {"k": 1}, "bad-json": "[1", "empty": ""}
    assert sa.parse_cli(None) is None
    with pytest.raises(PlanError, match="must be KEY=VALUE"):
        sa.parse_cli(["max-num-seqs"])
    with pytest.raises(PlanError, match="given twice"):
        sa.parse_cli(["a=1", "a=2"])


def test_the_command_line_takes_serve_arg_repeated():
    base = [sys.executable, str(CLI), "plan", "--model", "llama-3.1-8b", "--gpus-per-node", "1",
            "--gpu-memory-gib", "80", "--gpu-name", "NVIDIA H100 80GB HBM3", "--json", "--full"]
    done = subprocess.run([*base, "--serve-arg", "max-num-seqs=128", "--serve-arg", "enable-prefix-caching=true",
                           "--serve-arg", "served-model-name=llama"], capture_output=True, text=True, timeout=60,
                          check=True)
    result = json.loads(done.stdout)
    assert result["served_model_name"] == "llama"
    assert tail(result["nodes"][0]["argv"], "--served-model-name") == [
        "--served-model-name", "llama", "--enable-prefix-caching", "--max-num-seqs", "128"]
    refused = subprocess.run([*base, "--serve-arg", "tp=2"], capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2
    assert "--serve-arg tp=2: -tp is set by the plan; use --tp instead" in refused.stderr


TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}
