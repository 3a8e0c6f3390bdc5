"""Launch modes: how vLLM's ranks start across nodes, one module each (mp.py, ray.py).

Every part that depends on the launch mode asks it here instead of comparing
``plan['backend']`` with a string: ``of_plan(plan).units_on(...)``. Adding a
mode is a module with a ``LaunchMode`` subclass (launch/base.py documents each
attribute) and one line in ``MODES`` (docs/architecture.md, "Adding a launch mode").
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils.launch import mp, ray

#: Every launch mode, the default first.
MODES = {mode.name: mode for mode in (mp.MODE, ray.MODE)}
DEFAULT = mp.MODE.name
#: Every port a plan may set, with its default (the API port is common to every mode).
DEFAULT_PORTS = {"api": 8000}
for _mode in MODES.values():
    DEFAULT_PORTS.update(_mode.default_ports)
#: Every mode's own cluster units (the doctor looks for them on every node, whatever the plan).
CLUSTER_UNITS = tuple(unit for _mode in MODES.values() for unit in _mode.cluster_units)


class UnknownLaunchMode(ValueError):
    pass


def names():
    return list(MODES)


def get(name):
    """The mode called ``name``; UnknownLaunchMode names the choices."""
    try:
        return MODES[name]
    except (KeyError, TypeError):
        choices = " or ".join(repr(known) for known in MODES)
        raise UnknownLaunchMode(f"backend must be {choices}, got {name!r}") from None


def of_plan(plan):
    """The mode of a plan (a plan without a backend is mp's: the planner's default)."""
    return get((plan or {}).get("backend") or DEFAULT)
