"""Filters for a rolling change behind vllm-router: how a deployment's change runs, and the checks of one server.

One file, three filters: each one's documentation is the .yml of its name beside this file (router_roll.yml,
vllm_stop_timeout_problem.yml, vllm_running_argv_problem.yml). The logic is plugins/module_utils/router/roll.py.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router import roll


def _plain(value):
    # hostvars hand out lazy mappings; the logic wants lists and dicts.
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "keys"):
        return {key: _plain(value[key]) for key in value.keys()}
    return value


def router_roll(new, previous_by_host, routers=None, allow_layout_switch=False):
    """roll_plan: {action, why, servers, one_at_a_time, order, workers, routers, ...} of a deployment's change."""
    try:
        switch = boolean(allow_layout_switch, strict=True)  # `-e ...=false` is the string "false": off, not on
    except TypeError as exc:
        raise AnsibleFilterError(f"vllm_cluster_allow_layout_switch must be true or false: {exc}") from exc
    try:
        return roll.roll_plan(_plain(new), _plain(previous_by_host), _plain(routers), switch)
    except roll.RouterError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def vllm_stop_timeout_problem(argv, host, stop_timeout_s):
    """'' when TimeoutStopSec covers vLLM's --shutdown-timeout, else the problem."""
    return roll.stop_timeout_problem(host, _plain(argv), int(stop_timeout_s))


def vllm_running_argv_problem(cmdline, host, planned_argv):
    """'' when the running vLLM's arguments are the planned ones, else what differs."""
    return roll.running_argv_problem(host, _plain(cmdline), _plain(planned_argv))


class FilterModule:
    """vllm_ops.cluster rolling-change filters (documentation: router_roll.yml and the two *_problem.yml)."""

    def filters(self):
        return {"router_roll": router_roll, "vllm_stop_timeout_problem": vllm_stop_timeout_problem,
                "vllm_running_argv_problem": vllm_running_argv_problem}
