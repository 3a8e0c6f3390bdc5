"""The plan in words: the strategy, the path through the seed's decision tree, and the warnings.

Pure Python, no Ansible import.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import memory
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import GIB, gib
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.gpu_names import mxfp4_kernel
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.inputs import DEFAULT_CONCURRENCY_TARGET
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.layout import (
    Candidate,
    target_words,
    tp_rule_violation,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.memory import evaluate, summary
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.nodes import data_parallel


def strategy(cand):
    if cand.ep_on:
        return "ep_dp"
    if cand.dp > 1:
        return "dp_replicas"
    if cand.pp > 1:
        return "tp_pp"
    if cand.tp > 1:
        return "tp"
    return "single"


def _preamble(inputs):
    spec = inputs.spec
    kind = "MoE" if spec["is_moe"] else "dense"
    attention = {"mla": "MLA", "gqa": "GQA", "mha": "MHA", "given": "KV bytes as given"}[spec["attention"]]
    quant = f", {spec['quantization']} weights" if spec["quantization"] else ""
    lines = [
        f"Model {spec['name']} ({spec['architecture']}): {kind}, {attention}, {spec['layers']} layers, "
        + (f"{spec['heads']} heads / {spec['kv_heads']} KV heads, " if spec["kv_heads"]
           else f"{spec['heads']} heads, " if spec["heads"] else "heads unknown, ")
        + ("shapes not read, " if spec.get("opaque") else f"{spec['params'] / 1e9:.2f}B params, ")
        + f"{spec['dtype']}{quant}: {spec['weights_gib']} GiB of weights."
    ]
    if inputs.device == "cuda":
        per_gpu = inputs.gpu_memory_bytes * inputs.gpu_memory_utilization
        lines.append(
            f"Cluster: {inputs.n_nodes} node(s) x {inputs.gpus_per_node} x {inputs.gpu_name} "
            f"({gib(inputs.gpu_memory_bytes)} GiB); usable {gib(per_gpu)} GiB per GPU, "
            f"{gib(per_gpu * inputs.gpus_per_node)} GiB per node at gpu_memory_utilization "
            f"{inputs.gpu_memory_utilization:g}; {_nvlink_words(inputs)}."
        )
    else:
        lines.append(
            f"Cluster: {inputs.n_nodes} node(s) x {inputs.gpus_per_node} CPU worker slot(s) of "
            f"{gib(inputs.gpu_memory_bytes)} GiB; KV cache fixed at VLLM_CPU_KVCACHE_SPACE="
            f"{inputs.cpu_kvcache_space_gib} GiB per worker."
        )
    target = f"{inputs.concurrency_target:g} concurrent requests of {inputs.max_model_len:,} tokens per replica"
    if inputs.target_is_default:
        target += " (default target)"
    if inputs.kv_tokens_target is not None:
        target += f", at least {inputs.kv_tokens_target:,} KV tokens"
    lines.append(f"Target: {target}.")
    if inputs.pins:
        pins = ", ".join(f"{k}={v}" for k, v in sorted(inputs.pins.items()))
        lines.append(f"Overrides pin {pins}; the tree below only decides what they leave open.")
    return lines


def _nvlink_words(inputs):
    """Whether the GPUs share NVLink, and where that came from (plan/inputs.py: _nvlink)."""
    answer = "yes" if inputs.nvlink else "no"
    source = inputs.nvlink_source
    if source == "gathered":
        return f"NVLink: {answer} (gathered: nvidia-smi topo -m)"
    if source == "single GPU":
        return "NVLink: none (one GPU per node)"
    if source == "gpu name":
        return f"NVLink: {answer} (from the GPU name: {inputs.nvlink_why})"
    if source == "assumed":
        return "NVLink: no (assumed: the GPU name is not in the planner's table)"
    return f"NVLink: {answer} (declared)"


# How to state NVLink, by where the request came from (plan/request.py: PlanRequest.origin).
NVLINK_SETTING = {
    "cli": "--nvlink or --no-nvlink",
    "inventory": "nvlink in vllm_cluster_gpus, or gather the GPU facts (gpu_facts reads nvidia-smi topo -m)",
    "request": "gpus.nvlink of each cluster node",
}


def decision(inputs, cand, ev, trace, default_missed, q2):
    """The path through the seed's tree, as sentences."""
    spec = inputs.spec
    lines = _preamble(inputs)
    single = next(((c, e) for c, e in trace if c.step == "single"), None)
    if single is not None:
        _, e = single
        if e["meets_target"]:
            answer = f"yes: {summary(inputs, e)}"
        elif e["fits"]:
            answer = f"not with the target: {summary(inputs, e)}"
        else:
            answer = f"no: {e['why']}"
        lines.append(f"Q1 Does it fit on one GPU? {answer}.")
    steps = [c.step for c, _ in trace]
    rule = getattr(inputs, "one_gpu_rule", None)
    if rule is not None:
        lines += _one_gpu_rule_lines(inputs, rule, cand, ev)
    elif cand.step == "single":
        if q2 is None and cand.dp > 1:
            pin = inputs.request.setting("overrides.dp", cand.dp)
            lines.append(f"Q2 Is one GPU fast enough? No throughput need was given; {pin} plans {cand.dp} replicas.")
        elif q2 is None:
            lines.append("Q2 Is one GPU fast enough? No throughput need was given, so one replica is planned.")
    elif cand.step == "ep_dp":
        tried = _tried(inputs, [(c, e) for c, e in trace if c.step == "ep_dp"])
        lines.append(
            f"MoE branch: EP + DP with attention TP inside each DP group, EP = TP x DP = {cand.tp * cand.dp}. "
            f"Tried {tried}."
        )
        if spec["attention"] == "mla":
            lines.append(
                "MLA keeps one latent KV that TP does not shard, so attention TP > 1 only copies the KV cache: "
                "the smallest TP that fits wins."
            )
        comparison = _tp_only_comparison(inputs, cand)
        if comparison:
            lines.append(comparison)
    else:
        in_node = [(c, e) for c, e in trace if c.step in ("tp_in_node", "tp_pp_in_node")]
        if spec["is_moe"] and "ep_dp" in steps:
            lines.append("MoE branch: no EP + DP layout fits, so the TP/PP path is taken without expert parallel.")
        if in_node:
            answer = "yes" if cand.step in ("tp_in_node", "tp_pp_in_node") else "no"
            lines.append(f"Q3 Does it fit on one node? {answer}. Tried {_tried(inputs, in_node)}.")
        if cand.step == "multi_node":
            lines.append(
                f"Across nodes: TP stays inside a node and PP spans nodes: {cand.label()} on {cand.r} nodes "
                f"({cand.local} ranks per node); {summary(inputs, ev)}."
            )
        if single is not None and not single[1]["fits"] and _over_pcie(inputs, cand) and "tp" not in inputs.pins:
            lines.append(
                f"TP over PCIe: the GPUs share no NVLink, but TP=1 does not fit, so TP={cand.tp} is needed; "
                "every all-reduce crosses PCIe."
            )
    if q2 is not None:
        lines.append(q2)
    if default_missed and rule is None:
        lines.append(
            f"No layout reaches the default target; the first layout that fits is planned: {cand.label()} "
            f"with {ev['concurrency']:.1f} concurrent requests."
        )
    if cand.tp_across:
        lines.append(
            f"TP={cand.tp} spans {cand.tp // cand.local} nodes because allow_tp_across_nodes is set: "
            "every TP all-reduce crosses the network."
        )
    if cand.dp > 1:
        lines.append(data_parallel(inputs, cand)["why"])
    if inputs.independent_replicas(cand):
        lines.append(inputs.mode.decision_sentence(1, inputs.nodes[0]["address"]).replace(
            "on one node", f"on each of the {cand.nnodes} node(s)", 1))
    else:
        lines.append(inputs.mode.decision_sentence(cand.nnodes, inputs.nodes[0]["address"]))
    lines.append(
        f"Plan: {strategy(cand)}, {cand.label()}, world_size {cand.world} on {cand.nnodes} node(s); per GPU "
        f"{gib(ev['weights_max'])} GiB of weights and {gib(ev['kv_bytes_min'])} GiB of KV cache: "
        f"{ev['tokens']:,} KV tokens per replica, {ev['concurrency']:.2f} requests of {inputs.max_model_len:,} tokens."
    )
    return lines


def _over_pcie(inputs, cand):
    return inputs.device == "cuda" and not inputs.nvlink and cand.tp > 1


def _one_gpu_rule_lines(inputs, rule, cand, ev):
    """The seed's "fits, but not enough" branch: DP replicas of TP=1; TP inside the node only over NVLink."""
    single_ev = rule["single"][1]
    asked = target_words(inputs, "concurrent requests")
    default = " (the default target)" if inputs.target_is_default else ""
    lines = [
        f"Q2 Is one GPU enough for the target? No: TP=1 fits with room for a full request, but its "
        f"{single_ev['concurrency']:.1f} concurrent requests ({single_ev['tokens']:,} KV tokens) fall short of "
        f"the {asked}{default}."
    ]
    if rule["answer"] == "tp":
        lines.append(
            f"NVLink exception to the seed's DP answer: the GPUs share NVLink, so TP inside the node is tried first "
            f"for the per-replica target (its all-reduce stays on NVLink) and {cand.label()} meets it; on PCIe-only "
            f"GPUs DP replicas of TP=1 would be planned. Tried {_tried(inputs, rule['tried'])}."
        )
        return lines
    if rule["nvlink"] and rule["tried"]:
        lines.append(
            f"TP inside the node (NVLink) does not reach the target either: tried {_tried(inputs, rule['tried'])}."
        )
    if not rule["nvlink"] and any(c.tp > 1 for c in rule["avoided"]):
        lines.append(
            "TP over PCIe avoided: the GPUs share no NVLink, so a larger TP would send every layer's all-reduce "
            "over PCIe; on PCIe TP > 1 is planned only when TP=1 does not fit (pin overrides.tp to choose it anyway)."
        )
    if rule["answer"] == "single":
        why = rule["refusal"] or f"the cluster has a single GPU ({rule['need']} replicas needed)"
        lines.append(
            f"The model fits one GPU, so the seed's answer is DP replicas, but they cannot be planned: {why}; one "
            "TP=1 replica is planned below the default target."
        )
        return lines
    dp = rule["dp"]
    total = f"{dp * single_ev['concurrency']:.1f} concurrent requests ({dp * single_ev['tokens']:,} KV tokens)"
    if rule["short"]:
        lines.append(
            f"The model fits one GPU, so the seed's answer is DP replicas: {rule['need']} replicas of TP=1 would "
            f"reach the default target, but the cluster places at most {dp}, which hold {total} behind a "
            "load balancer."
        )
    else:
        rounded = f" (rounded up from {rule['need']} so they split evenly over the nodes)" if rule["rounded"] else ""
        lines.append(
            f"The model fits one GPU, so the seed's answer is DP replicas, not a larger TP: {dp} replicas of "
            f"TP=1{rounded} hold {total} behind a load balancer, meeting the target together."
        )
    return lines


def _tried(inputs, attempts, shown=4):
    """The layouts a step tried, in order; long lists end with a count."""
    text = "; ".join(f"{c.label()}: {summary(inputs, e)}" for c, e in attempts[:shown])
    rest = attempts[shown:]
    if rest:
        smallest = min(e["weights_max"] for _, e in rest)
        fitting = sum(1 for _, e in rest if e["meets_target"])
        text += f"; and {len(rest)} more TP x PP layouts ({fitting} meeting the target, smallest {gib(smallest)} GiB/GPU)"
    return text


def _tp_only_comparison(inputs, cand):
    """The seed's control: the same GPUs with TP only (no --enable-expert-parallel)."""
    gpus = cand.tp * cand.dp
    if gpus > inputs.gpus_per_node or tp_rule_violation(inputs.spec, gpus):
        return None
    other = Candidate(gpus, 1, 1, False, 1, gpus, False, "comparison")
    other.nnodes, other.rpn = 1, 1
    ev_other = evaluate(inputs, other)
    ev_this = evaluate(inputs, cand)
    total_ep = ev_this["tokens"] * cand.dp
    if not ev_other["fits"]:
        return f"TP-only on the same {gpus} GPUs does not fit ({ev_other['why']}); EP + DP does."
    return (
        f"Compared with TP-only on the same {gpus} GPUs (TP={gpus}: {summary(inputs, ev_other)}), "
        f"EP + DP holds {total_ep:,} KV tokens over {cand.dp} replicas vs {ev_other['tokens']:,}."
    )


def warnings(inputs, cand, ev, default_missed):
    """Things that work but deserve a look, most important first."""
    spec, found = inputs.spec, []
    if default_missed:
        held = f"{ev['concurrency']:.1f}"
        if cand.dp > 1 and getattr(inputs, "one_gpu_rule", None) is not None:
            held = f"{cand.dp * ev['concurrency']:.1f} over {cand.dp} replicas"
        found.append(
            f"The default target of {DEFAULT_CONCURRENCY_TARGET} concurrent requests is not reached: "
            f"{held} at {inputs.max_model_len:,} tokens."
        )
    if inputs.nvlink_source == "assumed" and inputs.device == "cuda":
        found.append(
            f"GPU name {inputs.gpu_name!r} is not in the planner's NVLink table (plan/gpu_names.py): no NVLink is "
            "assumed, so TP > 1 is planned only where TP=1 does not fit; state it with "
            f"{NVLINK_SETTING[inputs.request.origin]}."
        )
    if cand.tp > 1 and not inputs.nvlink and inputs.device == "cuda":
        found.append(f"TP={cand.tp} runs without NVLink: every all-reduce crosses PCIe, expect poor TP scaling.")
    padding = memory.mxfp4_padding(inputs, memory.expert_shards(inputs, cand))
    if padding > 1:
        kernel, width, hidden = mxfp4_kernel(inputs.gpu_name)
        found.append(
            f"{spec['name']}'s MXFP4 experts run on vLLM's {kernel} MoE kernel on {inputs.gpu_name}, which pads them "
            f"(each rank's expert width to a multiple of {width}, the hidden size to {hidden}): {padding - 1:.1%} "
            "more expert memory than the checkpoint, counted in the weights per GPU."
        )
    if spec.get("opaque"):
        found.append(
            f"{spec['name']} is planned from the weights_gib and kv_bytes_per_token given, not from its shapes: "
            + ("its attention heads are unknown (only power-of-two TP sizes are planned), " if spec["heads"] is None
               else "")
            + ("pipeline parallel is not planned, " if spec["layers"] == 1 else "")
            + "the profile run's activations are not in the reserve (the KV figure is high by that much)."
        )
    elif spec["attention"] not in ("mla", "given") and cand.tp > spec["kv_heads"]:
        found.append(
            f"TP={cand.tp} exceeds the {spec['kv_heads']} KV heads: vLLM replicates KV heads, so KV capacity stops "
            "growing with TP."
        )
    if spec["attention"] == "mla" and cand.tp > 1:
        found.append(f"MLA KV is not sharded by TP: each of the {cand.tp} TP ranks stores the whole latent cache.")
    partition = mc.pp_partition(spec["layers"], cand.pp)
    if len(set(partition)) > 1:
        found.append(
            f"{spec['layers']} layers split unevenly over PP={cand.pp}: {partition} "
            "(vLLM logs 'Hidden layers were unevenly partitioned')."
        )
    unused = [node["name"] for node in inputs.nodes[cand.nnodes :]]
    if unused:
        found.append(f"Nodes not used by this plan: {', '.join(unused)}.")
    if cand.nnodes > 1:
        bare = [node["name"] for node in inputs.nodes[: cand.nnodes] if not node["fabric_interface"]]
        if bare:
            found.append(
                f"Multi-node plan but no fabric_interface on {', '.join(bare)}: NCCL, Gloo and vLLM will pick NICs "
                "on their own."
            )
    if cand.tp_across:
        found.append(f"TP={cand.tp} crosses nodes (allow_tp_across_nodes): a lab layout, not a production one.")
    if getattr(inputs, "pinned_dp_warning", None):
        found.append(inputs.pinned_dp_warning)
    if inputs.gpu_memory_utilization > 0.95 and inputs.device == "cuda":
        found.append(f"gpu_memory_utilization {inputs.gpu_memory_utilization} leaves little room for other processes.")
    if "chunked" in (spec.get("layer_attention") or ()):
        found.append(
            f"{spec['name']} has chunked local attention ({spec['attention_chunk_size']} tokens): vLLM turns its "
            "hybrid KV cache manager off for it by default, so every layer keeps every token, as planned here "
            "(VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 would hold more, and is not planned)."
        )
    if inputs.device == "cuda":
        found.append(
            f"The CUDA KV figure is an estimate ({ev['reserve']['total_gib']} GiB reserve assumed per GPU); "
            "vLLM measures it at start-up."
        )
    if inputs.device == "cpu" and spec["quantization"]:
        found.append(f"{spec['quantization']} weights on the CPU platform are not verified by this project.")
    found += inputs.mode.warnings()
    if inputs.eplb_disabled_reason:
        found.append(inputs.eplb_disabled_reason)
    if getattr(inputs, "cpu_offload_bytes", 0):
        found.append(
            f"--cpu-offload-gb keeps up to {inputs.cpu_offload_bytes / GIB:g} GiB of each GPU's weights in CPU "
            "memory: every forward pass reads them over the CPU-GPU link, expect slower decoding.")
    found += getattr(inputs, "serve_warnings", [])
    return found
