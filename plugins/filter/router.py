"""Filters for the fleet's front door (vllm-router): its workers from the plans, its argv and its ExecStart.

One file, three filters: each one's documentation is the .yml of its name beside this file
(router_workers.yml, router_argv.yml, router_exec_start.yml). The logic is plugins/module_utils/router/.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router import argv, workers


def _plain(value):
    # hostvars hand out lazy mappings; the logic wants lists and dicts.
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "keys"):
        return {key: _plain(value[key]) for key in value.keys()}
    return value


def router_workers(plans, deployments=None):
    """[{deployment, host, url, served_model_name, replicas}] of every API server the router fronts."""
    try:
        return workers.router_workers(_plain(plans), _plain(deployments))
    except workers.RouterError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def router_argv(settings, worker_list, host="?", extra=None, plans=None):
    """The router's arguments (no key) from the role's settings and the workers (their dicts or URLs)."""
    urls = [item["url"] if isinstance(item, dict) else item for item in _plain(worker_list) or []]
    settings = _plain(settings)
    try:
        ports = {name: settings.get(name) for name in ("port", "prometheus_port")} if isinstance(settings, dict) else {}
        problems = argv.port_problems(_plain(plans) or [], host, ports)
        if problems:
            raise workers.RouterError("; ".join(problems))
        return argv.router_argv(settings, urls, host, _plain(extra))
    except workers.RouterError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def router_exec_start(router_args, launcher):
    """The unit's ExecStart= value: the launcher, then the arguments, quoted for systemd."""
    try:
        return argv.exec_start(launcher, _plain(router_args))
    except workers.RouterError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    """vllm_ops.cluster router filters (documentation: router_workers.yml, router_argv.yml, router_exec_start.yml)."""

    def filters(self):
        return {"router_workers": router_workers, "router_argv": router_argv, "router_exec_start": router_exec_start}
