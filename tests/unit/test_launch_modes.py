"""Launch modes (plugins/module_utils/launch/): each mode says in one place what the others used to ask the
backend string for, and no code outside launch/ compares plan['backend'] with a mode's name."""

import re

import pytest
from ansible_collections.vllm_ops.cluster.plugins.filter.launch_mode import launch_mode
from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import PlanError, build_plan
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.topology_check import readiness_targets
from test_facts_modules import REPO

GPUS = {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}
CLUSTER = [{"name": f"n{k}", "address": f"10.1.0.{k + 1}", "fabric_interface": "ib0", "gpus": GPUS} for k in range(2)]
# A comparison of the backend with a mode's name, in Python, Jinja or YAML, either way round.
NAMES = "|".join(launch.MODES)
COMPARISON = re.compile(
    rf"backend['\"]?\]?\)?(?:\s*\|\s*default\([^)]*\))?\)?\s*(?:==|!=|\bin\b|\bnot in\b)\s*[(\[]?\s*['\"](?:{NAMES})\b"
    rf"|['\"](?:{NAMES})['\"]\s*(?:==|!=)\s*[^\n]{{0,40}}backend"
)
SCANNED = ("plugins", "roles", "playbooks", "bin", "deploy.yml", "lab", "molecule")


def plan_of(backend):
    return build_plan("llama-3.1-405b", CLUSTER, overrides={"backend": backend})


def test_the_registry_knows_mp_and_ray_and_names_the_choices():
    assert launch.names() == ["mp", "ray"] and launch.DEFAULT == "mp"
    assert launch.of_plan({}) is launch.get("mp")
    with pytest.raises(launch.UnknownLaunchMode, match=r"backend must be 'mp' or 'ray', got 'slurm'"):
        launch.get("slurm")
    with pytest.raises(PlanError, match=r"backend must be 'mp' or 'ray', got 'slurm'"):
        build_plan("llama-3.1-8b", CLUSTER, overrides={"backend": "slurm"})
    # Every port of every mode has one default; the API port is everyone's.
    assert launch.DEFAULT_PORTS["api"] == 8000
    for mode in launch.MODES.values():
        assert "api" in mode.ports and set(mode.ports) <= set(launch.DEFAULT_PORTS)


def test_each_mode_decides_the_nodes_roles_argv_and_expectations():
    mp, ray = plan_of("mp"), plan_of("ray")
    assert [(n["runs_vllm"], n["headless"]) for n in mp["nodes"]] == [(True, False), (True, True)]
    assert [(n["runs_vllm"], n["headless"]) for n in ray["nodes"]] == [(True, False), (False, False)]
    assert "--nnodes" in mp["nodes"][1]["argv"] and mp["nodes"][1]["argv"][-1] == "--headless"
    assert ray["nodes"][0]["argv"][-2:] == ["--distributed-executor-backend", "ray"]
    assert "ray_start_argv" in ray["nodes"][1] and "ray_start_argv" not in mp["nodes"][1]
    assert (mp["expect"]["executor"], ray["expect"]["executor"]) == ("mp", "ray")
    assert {e["node"] for e in ray["expect"]["engines"]} == {"n0"}
    # Verify waits for each worker's lines where the mode writes them: mp on its node, ray on the head.
    assert [readiness_targets(mp, n)["workers"] for n in ("n0", "n1")] == [8, 8]
    assert [readiness_targets(ray, n)["workers"] for n in ("n0", "n1")] == [16, 0]
    assert launch.get("mp").units_on(1, True) == ["vllm.service"]
    assert launch.get("ray").units_on(0, True) == ["vllm.service", "ray-head.service"]
    assert launch.get("ray").units_on(1, False) == ["ray-worker.service"]


def test_the_roles_filter_gives_the_mode_s_facts():
    assert launch_mode(plan_of("mp")) == {
        "name": "mp", "stage": None, "stage_role": None, "cluster_units": [], "headless_follow_head": True,
        "vllm_part_of_cluster_unit": False, "placement_from_cluster": False, "ports": ["api", "master", "dp_rpc"]}
    ray = launch_mode(plan_of("ray"))
    assert (ray["stage"], ray["stage_role"], ray["cluster_units"]) == ("ray", "ray_cluster",
                                                                      ["ray-head.service", "ray-worker.service"])
    assert ray["vllm_part_of_cluster_unit"] and ray["placement_from_cluster"] and not ray["headless_follow_head"]


def _comparisons(text):
    return [m.group(0) for m in COMPARISON.finditer(text)]


def test_the_scanner_finds_the_comparisons_it_forbids():
    planted = [
        'if plan["backend"] == "ray":',
        "ray_backend = self.plan.get('backend') != 'mp'",
        "{% if vllm_service_plan['backend'] == 'ray' %}",
        "{{ (vllm_cluster_plan['backend'] | default('mp')) == 'ray' }}",
        "if backend in ('mp', 'ray'):",
    ]
    assert all(_comparisons(line) for line in planted), [line for line in planted if not _comparisons(line)]
    assert not _comparisons("if params['backend'] == 'nccl':") and not _comparisons('"backend": plan["backend"],')


def test_no_code_outside_the_launch_modes_compares_the_backend_with_a_mode_name():
    found = []
    for part in SCANNED:
        base = REPO / part
        for path in [base] if base.is_file() else sorted(base.rglob("*")):
            if not path.is_file() or path.suffix not in ("", ".py", ".yml", ".yaml", ".j2", ".sh"):
                continue
            rel = path.relative_to(REPO)
            if rel.parts[:3] == ("plugins", "module_utils", "launch"):
                continue
            found += [f"{rel}: {hit}" for hit in _comparisons(path.read_text(errors="replace"))]
    assert not found, "ask the launch mode (launch.of_plan(plan) / filter launch_mode) instead:\n" + "\n".join(found)
