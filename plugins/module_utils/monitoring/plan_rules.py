"""Recording rules that carry what the plans say into Prometheus: planned replicas, the TTFT target.

Pure Python (3.11+); imports nothing from Ansible. The role ``vllm_monitoring`` writes the result as
/etc/prometheus/rules/vllm-cluster-plan.rules.yml next to the fixed alert rules
(roles/vllm_monitoring/files/rules/vllm-cluster.rules.yml), which compare live series with them:

- ``vllm_cluster:replicas_planned{deployment}``: the plan's DP size (``plan['dp']``), the number of
  replicas the deployment should serve;
- ``vllm_cluster:ttft_p99_target_seconds{deployment}``: the P99 time to first token the deployment must
  stay under (the role's variable, per deployment or one for all; a plan has no latency target).

A recording rule, not a target label: PromQL cannot turn a label's value into a number to compare
with, and a rule is one series per deployment whatever the number of targets.
"""

from __future__ import annotations

import json
import math

from ansible_collections.vllm_ops.cluster.plugins.module_utils.monitoring.targets import (
    TargetError,
    unique_plans,
)

GROUP = "vllm-cluster-plan"
REPLICAS_PLANNED = "vllm_cluster:replicas_planned"
TTFT_TARGET = "vllm_cluster:ttft_p99_target_seconds"


def _seconds(value, where):
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TargetError(f"{where} must be a number of seconds, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise TargetError(f"{where} must be a number of seconds above 0, got {value!r}")
    return number


def plan_rules(plans, ttft_p99_seconds, ttft_p99_by_deployment=None):
    """A Prometheus rules file (a dict: ``{groups: [...]}``) with the plan's numbers per deployment."""
    plans = unique_plans(plans)
    by_deployment = dict(ttft_p99_by_deployment or {})
    names = [plan["deployment"] for plan in plans]
    unknown = sorted(set(by_deployment) - set(names))
    if unknown:
        raise TargetError(f"vllm_monitoring_ttft_p99_seconds_by_deployment names {', '.join(unknown)}, which no "
                          f"plan of this run has; the deployments: {', '.join(names) or 'none'}")
    default = _seconds(ttft_p99_seconds, "vllm_monitoring_ttft_p99_seconds")
    rules = []
    for plan in plans:
        name = plan["deployment"]
        target = (_seconds(by_deployment[name], f"vllm_monitoring_ttft_p99_seconds_by_deployment[{name}]")
                  if name in by_deployment else default)
        rules.append({"record": REPLICAS_PLANNED, "expr": f"vector({int(plan.get('dp') or 1)})",
                      "labels": {"deployment": name}})
        rules.append({"record": TTFT_TARGET, "expr": f"vector({json.dumps(target)})", "labels": {"deployment": name}})
    return {"groups": [{"name": GROUP, "rules": rules}]}
