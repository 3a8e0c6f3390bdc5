"""What verification must find: ``plan['expect']``, the lines and counts vLLM's own logs will show.

Per worker its rank line, per node and replica its ``rank ... is assigned as``
line, per engine its KV line, and the numbers verify compares (world_size, ranks
per node, KV tokens within ``kv_tolerance``). vllm_verify and the doctor read it;
verify/topology_check.py compares it with what the journals hold.

Pure Python, no Ansible import.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.memory import kv_tolerance

ASSIGNMENT_KEYS = ("rank", "node", "local_rank", "dp", "pp", "tp", "ep", "process", "engine", "log_rank",
                   "log_world_size")


def _assigned_lines(rows):
    assigned = []
    for row in rows:
        if row["local_rank"] == 0:
            ep = "N/A" if row["log_ep_rank"] is None else row["log_ep_rank"]
            eplb = "N/A" if row["log_eplb_rank"] is None else row["log_eplb_rank"]
            assigned.append(
                {
                    "node": row["node"],
                    "line": (
                        f"rank {row['log_rank']} in world size {row['log_world_size']} is assigned as "
                        f"DP rank {row['log_dp_rank']}, PP rank {row['pp']}, PCP rank 0, TP rank {row['tp']}, "
                        f"ETP rank {row['tp']}, EP rank {ep}, EPLB rank {eplb}"
                    ),
                }
            )
    return assigned


def _engines(inputs, cand, ev, rows, nodes):
    device_word = "GPU" if inputs.device == "cuda" else "CPU"
    engines = []
    leaders = {}  # each DP rank's first rank of local rank 0 in stage 0: one pass, not one per DP rank
    for row in rows:
        if row["local_rank"] == 0 and row["pp"] == 0:
            leaders.setdefault(row["dp"], row)
    for d in range(cand.dp):
        leader = leaders[d]
        engines.append(
            {
                "engine": leader["engine"],
                "node": inputs.mode.engine_node(nodes, leader["node"]),
                "dp_rank": d,
                "kv_cache_tokens": ev["tokens"],
                "max_concurrency": round(ev["concurrency"], 2),
                "kv_line": (
                    f"{device_word} KV cache size: {ev['tokens']:,} tokens, Maximum concurrency for "
                    f"{inputs.max_model_len:,} tokens per request: {ev['concurrency']:.2f}x"
                ),
            }
        )
    return engines


def headless_launch(cand, node):
    """Which of vLLM's two headless start-ups a node runs (entrypoints/cli/serve.py)."""
    within_replica = node["node_rank"] % cand.r if cand.r > 1 else 0
    if within_replica > 0:
        return {"node": node["host"], "kind": "multiproc_executor", "dp_engines": 0}
    return {"node": node["host"], "kind": "dp_engines", "dp_engines": len(node["dp_ranks"])}


def expect(inputs, cand, ev, rows, nodes):
    shared = inputs.moe_shared_dp(cand)
    result = {
        "world_size": cand.world,
        "workers": cand.world * cand.dp,
        "worker_log_world_size": cand.world * cand.dp if shared else cand.world,
        "dp_shares_world": shared,
        "distributed_backend": "gloo" if inputs.device == "cpu" else "nccl",
        "executor": inputs.mode.executor(inputs.device, cand.world, shared),
        "ranks_by_node": {node["host"]: node["ranks"] for node in nodes},
        "ranks_by_node_exact": inputs.mode.ranks_by_node_exact(len(nodes)),
        "rank_assignments": [{key: row[key] for key in ASSIGNMENT_KEYS} for row in rows],
        "assigned_lines": _assigned_lines(rows),
        "engines": _engines(inputs, cand, ev, rows, nodes),
        "kv_cache_tokens": ev["tokens"],
        "max_concurrency": round(ev["concurrency"], 2),
        "kv_lines_exact": inputs.device == "cpu",
        "kv_tolerance": 0.0 if inputs.device == "cpu" else kv_tolerance(ev),
        "headless_launches": [headless_launch(cand, node) for node in nodes if node["headless"]],
    }
    if cand.ep_on:
        ep = cand.tp * cand.dp
        experts = inputs.spec["experts"]
        result["expert_parallel"] = {
            "size": ep,
            "global_experts": experts,
            "placement": "linear",
            "local_experts_by_ep_rank": [experts // ep + (1 if rank < experts % ep else 0) for rank in range(ep)],
            "eplb": inputs.eplb,
        }
    return result
