"""The plan as a short table: one line of layout, a row per node, the memory per GPU.

``playbooks/plan.yml`` prints it (filter ``plan_table``) and ``bin/vllm-cluster plan``
prints it inside its summary, so both show the same table.

Pure Python, no Ansible import.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch

ROW = "  {:<16} {:<7} {:<14} {:<16} {}"


def _ranks(ranks):
    if not ranks:
        return "-"
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


def _runs(mode, node):
    if node["headless"]:
        return "vllm serve --headless"
    return "vllm serve" if node["runs_vllm"] else mode.without_vllm


def layout_table(plan):
    """Lines: the layout, a row per node (role, ranks, GPUs, what it runs), the memory per GPU."""
    memory, mode = plan["memory"], launch.of_plan(plan)
    lines = [
        f"Layout: {plan['strategy']} ({plan['backend']}) TP={plan['tp']} PP={plan['pp']} DP={plan['dp']} "
        f"EP={plan['ep']} world_size={plan['world_size']} nodes={plan['nodes_used']}",
        ROW.format("node", "role", "ranks", "GPUs", "runs"),
    ]
    for node in plan["nodes"]:
        gpus = ",".join(str(gpu) for gpu in node["local_gpus"]) or "-"
        lines.append(ROW.format(node["host"], node["role"], _ranks(node["ranks"]), gpus, _runs(mode, node)))
    lines.append(
        f"Per GPU: {memory['weights_gib_per_gpu']} GiB weights, {memory['kv_cache_gib_per_gpu']} GiB KV cache "
        f"({memory['kv_bytes_per_token_per_gpu']:,} bytes/token); {memory['kv_cache_tokens']:,} KV tokens per "
        f"replica, {memory['max_concurrency']}x at {plan['targets']['max_model_len']:,} tokens"
    )
    return lines
