"""The seed's checklist (7.1) as checks: pass / fail / n/a with evidence, on real captures.

The healthy case is the evidence doctor.yml saved on the lab (2-node mp TP=2,
CPU platform; tests/fixtures/doctor/lab/healthy), with the benchmark stages
that benchmark.yml records built from real vllm bench serve results
(tests/fixtures/bench). GPU items use real nvidia-smi and NCCL captures.
"""

import copy
import json
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import report as bench_report
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import checklist as seed
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import evidence_from_registered
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts import nvidia_smi, nvidia_smi_query
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan
from test_doctor_public_logs import healthy_cluster

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "tests" / "fixtures" / "doctor" / "lab"
BENCH = REPO / "tests" / "fixtures" / "bench"


def lab_evidence(case="healthy"):
    data = json.loads((LAB / "cases" / f"{case}.json").read_text(encoding="utf-8"))
    hosts = [{"host": h, "gather": g, "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    return evidence_from_registered(data["plan"], hosts)


@pytest.fixture(scope="module")
def recorded_stages(tmp_path_factory):
    """results/<deployment>/ as benchmark.yml leaves it: a TP=1 baseline and a TP=2 stage (real runs)."""
    results = tmp_path_factory.mktemp("results")
    profile = {"input_len": 64, "output_len": 32, "num_prompts": 32, "request_rate": "inf", "max_concurrency": 8,
               "seed": 7}
    for stage, baseline in (("tp1", True), ("tp2", False)):
        folder = BENCH / f"controller-{stage}"
        record = bench_report.build_stage_record({
            "stage": stage, "baseline": baseline, "profile": profile,
            "plan": json.loads((folder / "plan.json").read_text()),
            "result": (folder / "result.json").read_text(),
            "samples": {"controller": (folder / "samples.jsonl").read_text()},
        })
        bench_report.write_stage_record(str(results), record)
    return results


def by_id(report):
    return {item["id"]: item for item in report["items"]}


def test_the_healthy_lab_passes_every_applicable_item(recorded_stages):
    evidence = lab_evidence()
    evidence["results"] = seed.read_results(str(recorded_stages))
    report = seed.evaluate(evidence)
    items = by_id(report)
    assert report["summary"]["failed"] == 0, {k: v["evidence"] for k, v in items.items() if v["status"] == "fail"}
    for item in ("decision_tree", "baseline_recorded", "eager_first", "world_size_logged", "nccl_network_env",
                 "rank_layout"):
        assert items[item]["status"] == "pass", (item, items[item])
    for item in ("memory_balanced", "scaling_gain", "ib_traffic", "linear_scaling", "ep_logged", "eplb_balance",
                 "tp_only_comparison"):
        assert items[item]["status"] == "n/a", (item, items[item])
    assert any("world_size=2 rank=1 local_rank=0" in line for line in items["world_size_logged"]["evidence"])
    assert any("GLOO_SOCKET_IFNAME" in line for line in items["nccl_network_env"]["evidence"])
    assert items["baseline_recorded"]["evidence"][0].startswith("stage tp1: TTFT P50")
    assert [phase for phase, _ in seed.PHASES] == ["decision", "single_node", "multi_node", "moe"]
    markdown = seed.render_markdown(report)
    assert "## Decision (决策阶段)" in markdown and "| pass |" in markdown


def test_no_recorded_baseline_fails_the_decision_phase():
    report = seed.evaluate(lab_evidence())
    item = by_id(report)["baseline_recorded"]
    assert item["status"] == "fail"
    assert "vllm_benchmark_baseline: true" in item["note"]


def test_a_start_that_never_reached_the_process_group_fails_the_world_size_item():
    evidence = lab_evidence()
    for node in evidence["nodes"].values():
        node["gather"]["journal"]["vllm.service"] = [
            line for line in node["gather"]["journal"]["vllm.service"] if "world_size=" not in line
        ]
    item = by_id(seed.evaluate(evidence))["world_size_logged"]
    assert item["status"] == "fail"
    assert "expected world_size=2" in item["evidence"][0]


def test_a_wrong_nic_in_the_env_fails_the_network_item():
    evidence = lab_evidence()
    gather = evidence["nodes"]["node2"]["gather"]
    for info in gather["env_files"].values():
        if "GLOO_SOCKET_IFNAME" in info["vars"]:
            info["vars"]["GLOO_SOCKET_IFNAME"] = "eth0"
            info["lines"]["GLOO_SOCKET_IFNAME"] = [info["lines"]["GLOO_SOCKET_IFNAME"][0], "GLOO_SOCKET_IFNAME=eth0"]
    item = by_id(seed.evaluate(evidence))["nccl_network_env"]
    assert item["status"] == "fail"
    assert any("GLOO_SOCKET_IFNAME=eth0" in line and "expected eth1" in line for line in item["evidence"])


def test_gpu_memory_balance_on_a_real_loaded_h200_pair():
    evidence = healthy_cluster("mp")
    xml = (REPO / "tests/fixtures/gpu/h200x2-load/nvidia-smi-q-load.xml").read_text(encoding="utf-8")
    facts = nvidia_smi.summarize_gpus(nvidia_smi_query.parse_query_xml(xml))
    used = [gpu["memory_used_mib"] for gpu in facts["gpus"]]
    for node in evidence["nodes"].values():
        node["gpu"] = copy.deepcopy(facts)
        node["gpu"]["processes"] = []
    evidence["plan"] = copy.deepcopy(evidence["plan"])
    for node in evidence["plan"]["nodes"]:
        node["local_gpus"] = [0, 1]
    item = by_id(seed.evaluate(evidence))["memory_balanced"]
    assert any(f"{used[0]} MiB used" in line for line in item["evidence"])
    spread = abs(used[0] - used[1]) / (sum(used) / 2)
    assert item["status"] == ("pass" if spread <= 0.10 else "fail")


def test_ib_traffic_is_proven_by_nccl_lines_where_ib_is_declared():
    evidence = healthy_cluster("mp", ib=True)
    ib_lines = (REPO / "tests/fixtures/nccl/public/nccl707-a100-ib-gdrdma-excerpt.log").read_text().splitlines()
    evidence["nodes"]["node1"]["gather"]["journal"]["vllm.service"] = ib_lines
    item = by_id(seed.evaluate(evidence))["ib_traffic"]
    assert item["status"] == "pass", item
    assert all("via NET/IB" in line for line in item["evidence"])
    socket_lines = (REPO / "tests/fixtures/nccl/public/nccl1232-2node-socket-shm-excerpt.log").read_text().splitlines()
    evidence["nodes"]["node2"]["gather"]["journal"]["vllm.service"] = socket_lines
    item = by_id(seed.evaluate(evidence))["ib_traffic"]
    assert item["status"] == "fail"
    assert any("via NET/Socket" in line for line in item["evidence"])


def test_ib_traffic_without_nccl_debug_lines_asks_for_them():
    item = by_id(seed.evaluate(healthy_cluster("mp", ib=True)))["ib_traffic"]
    assert item["status"] == "fail"
    assert "NCCL_DEBUG=INFO" in item["evidence"][-1]


def test_the_expert_parallel_line_of_a_real_run_proves_the_planned_ep_size():
    config = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 128,
              "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 2048, "torch_dtype": "bfloat16",
              "num_local_experts": 4, "num_experts_per_tok": 2}
    nodes = [{"name": "node1", "address": "10.232.9.11",
              "gpus": {"count": 2, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}}]
    plan = build_plan({"config": config}, nodes, {"max_model_len": 512}, {"tp": 2, "ep": 2}, model_path="/srv/models/tiny-mixtral")
    assert plan["enable_expert_parallel"] and plan["ep"] == 2
    gather = {"units": {"vllm.service": {"LoadState": "loaded", "ActiveState": "active", "SubState": "running"}},
              "journal": {"vllm.service": (LAB / "vllm-cpu-moe-tp2-ep.log").read_text().splitlines()}}
    evidence = {"plan": plan, "nodes": {"node1": {"gather": gather}}}
    items = by_id(seed.evaluate(evidence))
    assert items["ep_logged"]["status"] == "pass", items["ep_logged"]
    assert items["ep_logged"]["evidence"][0].startswith("node1: [EP Rank 0/2] 2/4 experts")
    assert items["tp_only_comparison"]["status"] == "fail"  # no benchmark stages recorded


def test_dense_models_and_single_nodes_make_their_phases_not_applicable():
    report = seed.evaluate(healthy_cluster("mp"))
    items = by_id(report)
    for item in ("ep_logged", "eplb_balance", "tp_only_comparison"):
        assert items[item]["status"] == "n/a"
        assert "dense" in items[item]["evidence"][0]
    assert report["summary"]["passed"] + report["summary"]["failed"] + report["summary"]["not_applicable"] == len(
        seed.ITEMS)
