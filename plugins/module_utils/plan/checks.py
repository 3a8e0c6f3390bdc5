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
        raise PlanError(f"{what} must be a mapping, got {type(value).__name__}")
    unknown = sorted(str(key) for key in value if key not in allowed)
    if unknown:
        raise PlanError(f"unknown {what} keys {unknown}; expected some of {sorted(allowed)}")
    return {key: val for key, val in value.items() if val is not None}


def gib(value):
    return round(value / GIB, 2)
