"""PlanError and the checks every planning input goes through (the message names the input).

Pure Python, no Ansible import.
"""

from __future__ import annotations

import math
import re

GIB = 1024**3
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class PlanError(ValueError):
    """No layout fits, or an input breaks a rule; the message names the numbers."""


def from_text(value, kind):
    """A number or a boolean given as text ("4", "0.9", "true": ``-e key=value``, a quoted YAML value) as that value.

    The one rule for quoted numbers, wherever the planner reads one (its inputs, vllm_cluster_gpus,
    vllm_cluster_gpu_ids, ports): ``kind`` ``int`` takes "4" as 4, ``number`` takes "0.9" as 0.9, ``bool``
    takes true/false/yes/no. Anything else is returned as it is, for the check that names it.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if kind == "int" and re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if kind == "number" and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
        return float(text)
    if kind == "bool" and text.lower() in ("true", "false", "yes", "no"):
        return text.lower() in ("true", "yes")
    return value


def kind_of(value):
    """What a value is, in words a user knows (never a Python type name, least of all Ansible's tagged ones)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "a value of another kind"


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def integer(value, what, minimum=1, maximum=None):
    if not is_int(value) or value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise PlanError(f"{what} must be an integer {bound}, got {value!r}")
    return value


def optional_integer(value, what, minimum=1):
    return None if value is None else integer(value, what, minimum)


def positive(value, what):
    if not is_number(value) or value <= 0:
        raise PlanError(f"{what} must be a positive number, got {value!r}")
    return float(value)


def boolean(value, what):
    if not isinstance(value, bool):
        raise PlanError(f"{what} must be true or false, got {value!r}")
    return value


def mapping(value, what, allowed):
    """A dict whose keys are all in ``allowed``, with None values dropped."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PlanError(f"{what} must be a mapping, got {kind_of(value)}: {value!r}")
    unknown = sorted(str(key) for key in value if key not in allowed)
    if unknown:
        raise PlanError(f"unknown {what} keys {unknown}; expected some of {sorted(allowed)}")
    return {key: val for key, val in value.items() if val is not None}


def gib(value):
    return round(value / GIB, 2)
