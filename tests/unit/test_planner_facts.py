"""Facts drive the planner's defaults: NVLink from the gathered topology or the GPU's name, a pinned DP that
overrides a throughput need says so, and RoPE scaling sets the max_model_len limit the way vLLM sets it.

Each test's docstring says what it catches: the behaviour before these rules (``--nvlink`` true whatever the GPU,
a pinned ``dp`` silently winning over a need while the decision says no need was given, ``max_position_embeddings``
as the limit whatever the RoPE scaling) fails it.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi import summarize_gpus
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi_query import parse_query_xml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi_topo import parse_topo_matrix
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import (
    PlanError,
    PlanRequest,
    build_plan,
    plan,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.gpu_names import nvlink_from_name

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "bin" / "vllm-cluster"
GPU_FIXTURES = REPO / "tests" / "fixtures" / "gpu"
L40S_MIB = 46068  # memory.total of the captured L40S (tests/fixtures/gpu/public/csv-query-gpu-l40s-load.txt)
H100_MIB = 81559


def nodes(name, count, memory_mib, nvlink="unset", n=1):
    gpus = {"count": count, "name": name, "memory_total_mib": memory_mib}
    if nvlink != "unset":
        gpus["nvlink"] = nvlink
    return [{"name": f"node{i}", "address": f"10.0.0.{i + 1}", "gpus": dict(gpus)} for i in range(n)]


def cli_json(*args):
    result = subprocess.run([sys.executable, str(CLI), "plan", *args, "--json"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def cluster_line(planned):
    return next(line for line in planned["decision"] if line.startswith("Cluster:"))


# --------------------------------------------------------------------------- NVLink


# Real nvidia-smi names: the public captures in tests/fixtures/gpu/public, and names the product pages give.
@pytest.mark.parametrize(("name", "nvlink"), [
    ("NVIDIA H100 80GB HBM3", True),  # H100 SXM5 (csv-query-gpu-h100-80gb-hbm3-load.txt)
    ("NVIDIA H200", True),  # tests/fixtures/gpu/h200x2
    ("NVIDIA A100-SXM4-80GB", True),  # telegraf-a100-sxm4-80gb-mig.xml
    ("NVIDIA B200", True),
    ("NVIDIA GB200", True),
    ("NVIDIA H100 NVL", True),  # a bridged pair
    ("NVIDIA L40S", False),  # csv-query-gpu-l40s-load.txt
    ("NVIDIA L40", False),
    ("NVIDIA L4", False),
    ("NVIDIA A10", False),
    ("NVIDIA A10G", False),  # telegraf-a10g.xml
    ("Tesla T4", False),  # telegraf-tesla-t4.xml
    ("NVIDIA RTX 6000 Ada Generation", False),
    ("NVIDIA RTX 4000 SFF Ada Generation", False),  # telegraf-rtx4000-sff-ada-schema-v13.xml
    ("NVIDIA H100 PCIe", False),
    ("NVIDIA A100-PCIE-40GB", False),
    ("NVIDIA A100 80GB PCIe", False),
    ("Tesla V100S-PCIE-32GB", False),  # datakit-8x-v100s-pcie-32gb-driver460.xml
    ("NVIDIA GH200 480GB", None),  # not in the table: not read as H200
    ("Tesla K80", None),
    ("Acme X1", None),
])
def test_the_name_table_reads_the_form_factor(name, nvlink):
    """A name read the wrong way (L4 as L40S, A10 as A100, GH200 as H200, a PCIe H100 as SXM) fails here."""
    assert nvlink_from_name(name, 2)[0] is nvlink


def test_bridged_cards_share_nvlink_only_as_far_as_the_bridge_reaches():
    """H100 NVL bridges pairs, H200 NVL up to 4 cards: more GPUs per node share no NVLink."""
    assert nvlink_from_name("NVIDIA H100 NVL", 2)[0] is True
    assert nvlink_from_name("NVIDIA H100 NVL", 4) == (False, "H100 NVL cards are bridged in pairs, so NVLink does "
                                                             "not join all 4")
    assert nvlink_from_name("NVIDIA H200 NVL", 4)[0] is True
    assert nvlink_from_name("NVIDIA H200 NVL", 8)[0] is False


def test_a_pcie_gpu_name_plans_dp_replicas_not_tp():
    """The issue's case: a model that fits one L40S but misses the per-replica target on 2x L40S (PCIe).

    Before, an unset nvlink was refused in a request and was true on the command line, so the CLI planned TP=2 under
    the "NVLink exception"; now the name says PCIe, and the plan is DP replicas of TP=1 and says where that came from.
    """
    planned = build_plan("llama-3.1-8b", nodes("NVIDIA L40S", 2, L40S_MIB),
                         {"max_model_len": 32768, "concurrency_target": 12})
    assert (planned["strategy"], planned["tp"], planned["dp"]) == ("dp_replicas", 1, 2)
    assert (planned["cluster"]["nvlink"], planned["cluster"]["nvlink_source"]) == (False, "gpu name")
    assert "NVLink: no (from the GPU name: a PCIe card without NVLink)" in cluster_line(planned)
    assert any(line.startswith("TP over PCIe avoided") for line in planned["decision"])

    cli = cli_json("--model", "llama-3.1-8b", "--gpus-per-node", "2", "--gpu-memory-gib", "45",
                   "--gpu-name", "NVIDIA L40S", "--max-model-len", "32768", "--concurrency-target", "12")
    assert (cli["strategy"], cli["tp"], cli["dp"]) == ("dp_replicas", 1, 2)


def test_an_sxm_gpu_name_keeps_the_nvlink_exception():
    """H100 SXM without a stated nvlink: NVLink from the name, so TP inside the node meets the per-replica target."""
    planned = build_plan("llama-3.1-8b", nodes("NVIDIA H100 80GB HBM3", 8, H100_MIB), {"max_model_len": 32768})
    assert (planned["strategy"], planned["tp"]) == ("tp", 2)
    assert (planned["cluster"]["nvlink"], planned["cluster"]["nvlink_source"]) == (True, "gpu name")
    assert "NVLink: yes (from the GPU name: an HGX Hopper SXM module)" in cluster_line(planned)


def test_a_declared_nvlink_wins_over_the_name():
    """A stated nvlink is the user's word: L40S declared with NVLink plans TP=2 as before, and says "declared"."""
    planned = build_plan("llama-3.1-8b", nodes("NVIDIA L40S", 2, L40S_MIB, nvlink=True),
                         {"max_model_len": 32768, "concurrency_target": 12})
    assert (planned["strategy"], planned["tp"]) == ("tp", 2)
    assert planned["cluster"]["nvlink_source"] == "declared"
    assert "NVLink: yes (declared)" in cluster_line(planned)
    cli = cli_json("--model", "llama-3.1-8b", "--gpus-per-node", "2", "--gpu-memory-gib", "45", "--gpu-name",
                   "NVIDIA L40S", "--nvlink", "--max-model-len", "32768", "--concurrency-target", "12")
    assert cli["tp"] == 2


def gathered_h200x2(topology=True):
    """gpu_facts' summary of the captured 2x H200 node (tests/fixtures/gpu/h200x2), with or without topo -m."""
    parsed = parse_query_xml((GPU_FIXTURES / "h200x2" / "nvidia-smi-q.xml").read_text())
    topo = parse_topo_matrix((GPU_FIXTURES / "h200x2" / "topo.txt").read_text()) if topology else None
    return summarize_gpus(parsed, topo=topo)


def test_gathered_topology_wins_over_the_name():
    """The captured topology (NV18) says NVLink, and it is shown as gathered; where the topology says no NVLink
    (links down), that wins over the SXM name. Before, the source was not shown at all."""
    facts = gathered_h200x2()
    assert facts["nvlink"] is True
    cluster = [{"name": "h200", "address": "10.0.0.1", "gpus": facts}]
    planned = build_plan("llama-3.1-8b", cluster, {"max_model_len": 32768})
    assert (planned["cluster"]["nvlink"], planned["cluster"]["nvlink_source"]) == (True, "gathered")
    assert "NVLink: yes (gathered: nvidia-smi topo -m)" in cluster_line(planned)

    cluster[0]["gpus"] = dict(facts, nvlink=False)  # as topo -m shows when the NVLinks are down
    planned = build_plan("llama-3.1-8b", cluster, {"max_model_len": 32768})
    assert (planned["cluster"]["nvlink"], planned["cluster"]["nvlink_source"]) == (False, "gathered")


def test_facts_gathered_without_the_topology_fall_back_to_the_name():
    """gpu_facts with collect=[] leaves nvlink null: before, the planner refused the node; now the name decides."""
    facts = gathered_h200x2(topology=False)
    assert facts["nvlink"] is None
    planned = build_plan("llama-3.1-8b", [{"name": "h200", "address": "10.0.0.1", "gpus": facts}])
    assert (planned["cluster"]["nvlink"], planned["cluster"]["nvlink_source"]) == (True, "gpu name")


def test_an_unknown_name_assumes_no_nvlink_and_says_how_to_state_it():
    """An unknown name: no NVLink assumed (the seed's answer without its NVLink exception), and a warning names the
    GPU and the setting, in the words of each caller. Before, the CLI assumed NVLink silently."""
    planned = build_plan("llama-3.1-8b", nodes("Acme X1", 2, H100_MIB), {"max_model_len": 32768})
    assert (planned["cluster"]["nvlink"], planned["cluster"]["nvlink_source"]) == (False, "assumed")
    assert "NVLink: no (assumed: the GPU name is not in the planner's table)" in cluster_line(planned)
    warning = next(w for w in planned["warnings"] if "NVLink table" in w)
    assert "'Acme X1'" in warning and "gpus.nvlink of each cluster node" in warning

    cli = cli_json("--model", "llama-3.1-8b", "--gpus-per-node", "2", "--gpu-memory-gib", "80")
    assert any("GPU name 'unknown GPU'" in w and "--nvlink or --no-nvlink" in w for w in cli["warnings"])

    variables = {"vllm_cluster_model": "llama-3.1-8b"}
    inventory = plan(PlanRequest.from_variables(variables, nodes("Acme X1", 2, H100_MIB), host="node0"))
    assert any("nvlink in vllm_cluster_gpus" in w for w in inventory["warnings"])


def test_one_gpu_per_node_needs_no_nvlink_and_no_warning():
    """One GPU per node: NVLink does not matter, so an unknown name is no reason to warn."""
    planned = build_plan("llama-3.1-8b", nodes("Acme X1", 1, H100_MIB))
    assert (planned["cluster"]["nvlink"], planned["cluster"]["nvlink_source"]) == (False, "single GPU")
    assert "NVLink: none (one GPU per node)" in cluster_line(planned)
    assert not any("NVLink table" in w for w in planned["warnings"])


# --------------------------------------------------------------------------- a pinned DP and a throughput need


def q2_line(planned):
    return next(line for line in planned["decision"] if line.startswith("Q2"))


def test_a_pinned_dp_below_the_need_is_a_warning_naming_both():
    """Before, dp=4 won silently and the decision said "No throughput need was given"."""
    planned = build_plan("qwen2.5-7b", nodes("NVIDIA H100 80GB HBM3", 4, H100_MIB), {"throughput_need_tok_s": 100000},
                         {"dp": 4})
    assert planned["dp"] == 4
    assert not any("No throughput need was given" in line for line in planned["decision"])
    assert q2_line(planned).startswith("Q2 Are the 4 pinned replicas fast enough? No: 100,000 tok/s needed")
    assert "dp=4 is pinned and wins over the need" in q2_line(planned)
    assert ("The pinned dp=4 overrides the throughput need of 100,000 tok/s (throughput_need_tok_s=100000): the need "
            "asks for 18 replicas, 4 are planned.") in planned["warnings"]
    cli = cli_json("--model", "qwen2.5-7b", "--gpus-per-node", "4", "--gpu-memory-gib", "80", "--gpu-name",
                   "NVIDIA H100 80GB HBM3", "--dp", "4", "--throughput-need", "100000")
    assert any(w.startswith("The pinned --dp 4 overrides the throughput need of 100,000 tok/s (--throughput-need "
                            "100000)") for w in cli["warnings"])


def test_a_pinned_dp_that_meets_the_need_says_so_without_a_warning():
    """Enough pinned replicas: the decision checks the need against them, and nothing is overridden."""
    planned = build_plan("qwen2.5-7b", nodes("NVIDIA H100 80GB HBM3", 4, H100_MIB),
                         {"throughput_need_tok_s": 8000, "replica_throughput_tok_s": 5000}, {"dp": 4})
    assert q2_line(planned) == ("Q2 Are the 4 pinned replicas fast enough? Yes: 8,000 tok/s needed, the measured "
                                "baseline of 5,000 tok/s per replica: 2 replicas would do.")
    assert not any("pinned" in w for w in planned["warnings"])


def test_a_pinned_dp_without_a_need_does_not_claim_one_replica():
    """Before: "No throughput need was given, so one replica is planned" above a plan of 4 replicas."""
    planned = build_plan("qwen2.5-7b", nodes("NVIDIA H100 80GB HBM3", 4, H100_MIB), None, {"dp": 4})
    assert q2_line(planned) == "Q2 Is one GPU fast enough? No throughput need was given; dp=4 plans 4 replicas."


def test_a_pinned_dp_with_a_need_it_cannot_estimate_is_planned_with_a_warning():
    """No replica throughput to compare with (an unknown GPU, no baseline): the pin decides and a warning says the
    need was not checked; the need alone would be refused (it cannot size replicas)."""
    planned = build_plan("qwen2.5-7b", nodes("Acme X1", 4, H100_MIB, nvlink=True), {"throughput_need_tok_s": 3000},
                         {"dp": 4})
    assert planned["dp"] == 4
    assert any(w.startswith("The pinned dp=4 decides the replicas; the throughput need of 3,000 tok/s "
                            "(throughput_need_tok_s=3000) was not checked against it") for w in planned["warnings"])
    with pytest.raises(PlanError, match="cannot estimate one replica's throughput on 'Acme X1'"):
        build_plan("qwen2.5-7b", nodes("Acme X1", 4, H100_MIB, nvlink=True), {"throughput_need_tok_s": 3000})


# --------------------------------------------------------------------------- RoPE scaling and max_model_len


def tiny(**changes):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
              "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
    config.update(changes)
    return {"config": config}


def plan_tiny(max_model_len, **changes):
    return build_plan(tiny(**changes), nodes("NVIDIA H100 80GB HBM3", 1, H100_MIB), {"max_model_len": max_model_len},
                      model_path="/m")


@pytest.mark.parametrize("rope", [{"rope_type": "linear", "factor": 4.0}, {"type": "linear", "factor": 4.0},
                                  {"rope_type": "dynamic", "factor": 4}])
def test_linear_and_dynamic_scaling_raise_the_limit(rope):
    """vLLM multiplies max_position_embeddings by a linear or dynamic factor: 4 x 4,096 is accepted there.
    Before, 16,384 was refused as longer than max_position_embeddings."""
    planned = plan_tiny(16384, rope_scaling=rope)
    assert planned["targets"]["max_model_len"] == 16384
    assert planned["model"]["max_model_len_limit"] == 16384
    with pytest.raises(PlanError, match=r"max_model_len 16,385 exceeds the model's limit 16,384 "
                                        r"\(max_position_embeddings 4,096 x rope_scaling factor 4, (linear|dynamic)\)"):
        plan_tiny(16385, rope_scaling=rope)


@pytest.mark.parametrize("rope", [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 1024},
    {"rope_type": "longrope", "factor": 4.0, "short_factor": [1.0], "long_factor": [4.0]},
])
def test_scaling_types_whose_length_is_scaled_already_keep_the_limit(rope):
    """yarn, llama3 and longrope configs state the scaled length: vLLM applies no factor, so neither may the planner
    (a factor applied to every rope_scaling fails here; before, the plan had no max_model_len_limit)."""
    assert plan_tiny(4096, rope_scaling=rope)["model"]["max_model_len_limit"] == 4096
    with pytest.raises(PlanError, match="exceeds the model's max_position_embeddings 4,096"):
        plan_tiny(4097, rope_scaling=rope)


def test_gemma3_is_never_scaled():
    """gemma-3-27b's config has linear factor 8, which vLLM skips for Gemma 3 (its 128K is scaled already)."""
    spec = mc.load_model("gemma-3-27b")
    assert (spec["max_position_embeddings"], spec["max_model_len_limit"]) == (131072, 131072)


def test_rope_parameters_per_layer_type_and_a_null_factor():
    """transformers 5's rope_parameters (nested by layer type: the last type with a factor wins) and a null factor
    (counted as 1), as vLLM reads them."""
    nested = {"full_attention": {"rope_type": "linear", "factor": 2.0},
              "sliding_attention": {"rope_type": "default"}}
    assert mc.load_model(tiny(rope_parameters=nested), "/m")["max_model_len_limit"] == 8192
    assert mc.load_model(tiny(rope_scaling={"rope_type": "linear", "factor": None}), "/m")["max_model_len_limit"] == 4096
    with pytest.raises(mc.ModelConfigError, match="rope_scaling.factor must be a positive number, got 'x'"):
        mc.load_model(tiny(rope_scaling={"rope_type": "linear", "factor": "x"}), "/m")


def test_the_default_max_model_len_follows_the_scaled_limit():
    """The planner's default (8,192, capped by the model) is capped by the scaled limit, not the unscaled one."""
    planned = build_plan(tiny(max_position_embeddings=2048, rope_scaling={"rope_type": "linear", "factor": 4.0}),
                         nodes("NVIDIA H100 80GB HBM3", 1, H100_MIB), model_path="/m")
    assert planned["targets"]["max_model_len"] == 8192
