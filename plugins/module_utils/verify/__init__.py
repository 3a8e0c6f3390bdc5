"""Verification: vLLM's own log lines, rank placement, parity, reachability, NCCL and Ray state."""
