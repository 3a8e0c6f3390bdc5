"""PromQL as the project's rules and dashboards write it: the metric names an expression reads, and the
expressions that return nothing from a live Prometheus.

Pure Python (3.11+); imports nothing from Ansible. Not a PromQL parser (promtool is the one the tests
use for syntax): the names are what is left of an expression once its strings, label matchers, ranges,
grouping clauses, function calls and keywords are taken out.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NAME = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(\s*\()?")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
            "offset", "inf", "nan", "atan2", "start", "end"}


def metric_names(expr):
    """The metric names ``expr`` reads, sorted (``up``, ``vllm:num_requests_running``, ...)."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _NAME.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS or re.fullmatch(r"\d+[smhdwy]?", name):
            continue
        names.add(name)
    return sorted(names)


def query(url, expr, timeout=10.0, opener=urllib.request.urlopen):
    """Prometheus's answer (``data``) to an instant query of ``expr`` at ``url`` (its /api/v1/query)."""
    address = url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with opener(address, timeout=timeout) as response:
        body = json.loads(response.read().decode("utf-8"))
    if body.get("status") != "success":
        raise ValueError(f"{expr}: Prometheus answered {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def empty_queries(url, exprs, timeout=10.0, opener=urllib.request.urlopen):
    """``{expr: why}`` for each expression that returns no series (or fails) at ``url``; {} when all do.

    The live check of the dashboards: after a bounded load, every panel must show something.
    Grafana's variables (``$deployment``) must be substituted before (``substitute``).
    """
    found = {}
    for expr in exprs:
        try:
            data = query(url, expr, timeout, opener)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            found[expr] = f"query failed: {exc}"
            continue
        if not data.get("result"):
            found[expr] = "no series"
    return found


def substitute(expr, variables, interval="1m"):
    """``expr`` with Grafana's variables replaced: ``$name``/``${name}`` by ``variables[name]`` (a regex
    matcher, so ``.*`` means all), ``$__rate_interval``/``$__interval`` by ``interval``."""
    expr = expr.replace("$__rate_interval", interval).replace("$__interval", interval)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: str(variables.get(m.group(1), m.group(0))), expr)
