"""The doctor on a log alone: a vLLM log pasted from a deployment this collection did not make.

``evidence_from_log(text, backend="mp", unit=None)`` builds the evidence of one
node ("the node") whose unit (``vllm.service`` unless told, or a Ray unit) holds
the log as its journal since its last start. The unit failed when the log ends
in an error (a traceback, an ERROR or CRITICAL line, an exception line, systemd
saying the unit failed) that no later step of the start-up follows; it runs
otherwise. Nothing else is known: no plan (only the backend the caller names),
no ports, GPUs, env files or facts, so only the catalog's log rules, the unit's
failure and the start-up phases can match. ``diagnose_log(...)`` runs the
catalog (``roles/doctor/files/signatures.yml``) on it and returns the findings,
most likely cause first; ``diagnose_log_report`` returns the whole report, as
``report.render_report`` prints it. A placeholder the log cannot fill (the API
port, the head's address, the model's path) is left as a named blank, ``<API
port>``, never a value that was not in the log. A log that stops in the middle
of the start-up without an error is ``startup_stalled`` ("the log stops in
phase X").

Pure Python 3.11, no Ansible import (PyYAML to read the catalog).
"""

from __future__ import annotations

import os
import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import RAY_UNITS, VLLM_UNIT
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import vllm_phases
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.traceback import (
    error_lines,
    parse_tracebacks,
    split_line,
)

BACKENDS = ("mp", "ray")
UNITS = (VLLM_UNIT, *RAY_UNITS)
NODE = "the node"
CATALOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "roles", "doctor", "files",
                       "signatures.yml")
# What a placeholder stands for when the log cannot fill it: a named blank an operator fills in.
BLANKS = {
    "port_api": "<API port>", "port_master": "<master port>", "port_dp_rpc": "<data-parallel RPC port>",
    "port": "<port>", "port_name": "<port's role>", "head_address": "<head address>", "head_node": "<head node>",
    "model_path": "<model path>", "tp": "<TP size>", "pp": "<PP size>", "dp": "<DP size>",
    "world_size": "<world size>", "heads": "<attention heads>", "gpus_per_node": "<GPUs per node>",
}
FINDING_FIELDS = ("title", "cause", "fix", "verify", "symptom")

# What the parser of tracebacks and error lines does not count as an error, but ends a pasted log in one: a
# traceback's first line (a paste cut before its exception), pydantic's validation error, systemd's word on the unit.
_MORE_ERRORS = re.compile(
    r"^Traceback \(most recent call last\):|\d+ validation errors? for \w+|^Value error, "
    r"|\.service: (?:Failed with result|Main process exited, code=\w+, status=(?!0/))")
_PASTE_JUNK = re.compile(r"^[\s>|`]+")


def _error_lines(lines):
    """Indexes of the lines that say something failed: those of traceback.error_lines (a Python warning aside)
    and the exception lines of tracebacks, then _MORE_ERRORS."""
    found = {record["line"] for record in parse_tracebacks(lines)}
    found.update(item["line"] for item in error_lines(lines) if item["kind"] != "Python warning")
    for index, line in enumerate(lines):
        if _MORE_ERRORS.search(_PASTE_JUNK.sub("", split_line(line)[3])):
            found.add(index)
    return sorted(found)


def ended_in_error(lines, phases=None):
    """Whether the log ends in a failure: an error line after the start-up's last step forward.

    An error that the start-up went on after (a later phase, the API server coming up) did not end it.
    """
    errors = _error_lines(lines)
    if not errors:
        return False
    phases = phases or vllm_phases.read_phases(lines)
    progress = max((entry["line_index"] for entry in phases["processes"]), default=-1)
    return errors[-1] > progress


def evidence_from_log(text, backend="mp", unit=None, node=NODE):
    """The evidence of one node whose ``unit`` journal holds the log; ValueError on a log or argument it cannot read."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    unit = unit or VLLM_UNIT
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {unit!r}")
    if not isinstance(text, str):
        raise ValueError("the log must be text")
    if "\x00" in text:
        raise ValueError("the log holds NUL bytes: not a text log")
    lines = [line.rstrip("\r") for line in text.splitlines()]
    while lines and not lines[-1].strip():
        lines.pop()
    if not any(line.strip() for line in lines):
        raise ValueError("the log is empty")
    if ended_in_error(lines):
        state = {"ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "ExecMainStatus": "1"}
    else:
        state = {"ActiveState": "active", "SubState": "running", "Result": "success", "ExecMainStatus": "0"}
    gather = {
        "units": {unit: {"Id": unit, "LoadState": "loaded", "NRestarts": "0", **state}},
        "journal": {unit: lines},
        "unit_pids": {},
        "log_only": True,  # the log is all there is: no time of reading, no facts
    }
    return {"plan": {"backend": backend}, "nodes": {node: {"reachable": True, "gather": gather, "gpu": {}, "ib": {}}},
            "client": {}}


def load_catalog(path=None):
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.catalog import load_catalog_file

    return load_catalog_file(path or CATALOG)


def _blank(match):
    name = match.group(1)
    return BLANKS.get(name) or f"<{name.replace('_', ' ')}>"


def fill_blanks(report):
    """Every placeholder the log could not fill, named as a blank (``<API port>``) in each finding."""
    for finding in report["findings"]:
        for key in FINDING_FIELDS:
            finding[key] = re.sub(r"\{(\w+)\}", _blank, finding[key])
        finding["checks"] = [re.sub(r"\{(\w+)\}", _blank, check) for check in finding["checks"]]
    return report


def diagnose_log_report(text, backend="mp", unit=None, catalog=None):
    """The doctor's report (``diagnosis.diagnose``) on a log alone; catalog: a loaded catalog, else the collection's."""
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.diagnosis import diagnose

    evidence = evidence_from_log(text, backend, unit)
    return fill_blanks(diagnose(catalog or load_catalog(), evidence))


def diagnose_log(text, backend="mp", unit=None, catalog=None):
    """The findings on a log alone, most likely cause first (each as ``diagnosis.diagnose`` makes it)."""
    return diagnose_log_report(text, backend, unit, catalog)["findings"]


def finding_json(finding):
    """A finding as ``vllm-cluster doctor --log --json`` prints it."""
    return {
        "id": finding["id"], "title": finding["title"], "severity": finding["severity"], "cause": finding["cause"],
        "evidence": [item["line"] for item in finding["evidence"]], "fix": finding["fix"], "verify": finding["verify"],
    }
