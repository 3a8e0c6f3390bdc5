"""Launch mode ``mp``: vLLM's native multi-node launcher (vLLM >= 0.11.1, what vLLM recommends).

Every node of a replica runs ``vllm serve`` with the same sizes and
``--nnodes N --node-rank k --master-addr HEAD``; nodes 1..N-1 add ``--headless``
(no API server) and follow their head (vllm_service's head watch). One node:
a single ``vllm serve`` starts every worker itself. No cluster of its own.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils.launch.base import LaunchMode


class MpMode(LaunchMode):
    name = "mp"
    summary = "vLLM's native multi-node launcher: vllm serve on every node, --headless after the first"
    ports = ("api", "master", "dp_rpc")
    default_ports = {"master": 29501, "dp_rpc": 29550}
    headless_follow_head = True

    def headless(self, node_index):
        return node_index > 0

    def executor_argv(self, nnodes, dp, node_rank, head_address, ports):
        if nnodes <= 1:
            return []
        argv = [
            "--distributed-executor-backend",
            "mp",
            "--nnodes",
            str(nnodes),
            "--node-rank",
            str(node_rank),
            "--master-addr",
            head_address,
            "--master-port",
            str(ports["master"]),
        ]
        if dp > 1:
            argv += ["--data-parallel-rpc-port", str(ports["dp_rpc"])]
        if node_rank > 0:
            argv.append("--headless")
        return argv

    def decision_sentence(self, nnodes, head_address):
        if nnodes > 1:
            return (
                f"Backend mp (vLLM's native multi-node): every node runs vllm serve with the same sizes and "
                f"--nnodes {nnodes} --node-rank k --master-addr {head_address}; nodes 1..{nnodes - 1} "
                "add --headless."
            )
        return "Backend mp on one node: a single vllm serve starts every worker itself."


MODE = MpMode()
