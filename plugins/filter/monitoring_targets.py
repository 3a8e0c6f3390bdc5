"""Filters for monitoring a fleet: Prometheus's file-SD targets and the plan's recording rules.

One file, three filters; each one's documentation is the .yml of its name beside this file
(monitoring_targets.yml, monitoring_plan_rules.yml, monitoring_router_targets.yml). The logic is plugins/module_utils/monitoring/.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.monitoring import plan_rules, targets
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.front import inventory_address


def _plain(plans):
    # hostvars hand out lazy mappings; the logic wants lists and dicts.
    if isinstance(plans, (list, tuple)):
        return [dict(plan) if hasattr(plan, "keys") else plan for plan in plans]
    return plans


def monitoring_targets(plans, node_exporter_port=targets.NODE_EXPORTER_PORT, dcgm_exporter_port=0):
    """Prometheus file-SD target groups ([{targets, labels}]) of every deployment's plan."""
    try:
        return targets.target_groups(_plain(plans), node_exporter_port, dcgm_exporter_port)
    except targets.TargetError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def monitoring_plan_rules(plans, ttft_p99_seconds, ttft_p99_by_deployment=None):
    """A Prometheus rules file ({groups}) with each deployment's planned replicas and TTFT P99 target."""
    try:
        return plan_rules.plan_rules(_plain(plans), ttft_p99_seconds, ttft_p99_by_deployment)
    except targets.TargetError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def monitoring_router_targets(groups, hostvars, group="vllm_router"):
    """Prometheus file-SD target groups of the router's hosts (their vllm-router metrics)."""
    routers = []
    for host in groups.get(group) or []:
        variables = hostvars[host] if host in hostvars else {}
        routers.append({"host": host,
                        "address": variables.get("vllm_router_prometheus_address") or inventory_address(host, variables),
                        "port": variables.get("vllm_router_prometheus_port") or targets.ROUTER_METRICS_PORT,
                        "deployments": variables.get("vllm_router_deployments") or []})
    try:
        return targets.router_groups(routers)
    except targets.TargetError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    """vllm_ops.cluster monitoring filters (documentation: monitoring_targets.yml, monitoring_plan_rules.yml,
    monitoring_router_targets.yml)."""

    def filters(self):
        return {"monitoring_targets": monitoring_targets, "monitoring_plan_rules": monitoring_plan_rules,
                "monitoring_router_targets": monitoring_router_targets}
