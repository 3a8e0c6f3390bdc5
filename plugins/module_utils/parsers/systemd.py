"""systemd as the nodes print it: ``systemctl show``, ExecStart's argv, EnvironmentFiles, the journal.

``select_invocation`` picks a unit's journal lines since its last start from
``journalctl -o json`` records (``READY_PATTERNS``: the lines that show a start
went through). Used on the nodes by ``doctor_gather`` and the deploy stages,
and on the controller by the doctor.

Pure Python, no Ansible import.
"""

from __future__ import annotations

import re
import shlex

from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import strip_ansi


def parse_systemctl_show(text):
    """``systemctl show -p A -p B unit`` -> {A: value, B: value}."""
    values = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def parse_exec_start(value):
    """The argv of the first command in systemctl's ExecStart property.

    systemctl prints ``{ path=/bin/x ; argv[]=/bin/x a b ; ignore_errors=no ; ... }``;
    argv[] is joined with spaces, so an argument that contained spaces cannot be
    told apart (none of ours do).
    """
    match = re.search(r"argv\[\]=(.*?) ; (?:ignore_errors|start_time|stop_time|pid|code|status)=", value or "")
    if not match:
        return []
    try:
        return shlex.split(match.group(1))
    except ValueError:
        return match.group(1).split()


def parse_env_file(text):
    """A systemd EnvironmentFile -> {"vars": {KEY: value}, "lines": {KEY: (number, text)}}.

    Later assignments win, as systemd reads them. Quotes around a value are
    removed; comments and blank lines are skipped.
    """
    variables = {}
    lines = {}
    for number, raw in enumerate((text or "").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        variables[key] = value
        lines[key] = [number, raw.rstrip()]
    return {"vars": variables, "lines": lines}


# Lines that show a start went through: a crash-looping unit is not read past them.
READY_PATTERNS = (
    r"Starting vLLM server on",
    r"init engine \(profile, create kv cache, warmup model\) took",
    r"Ray runtime started",
)
_RESTART_SCHEDULED = "Scheduled restart job"
_ERRORISH = re.compile(r"Error|Exception|Traceback|FAILED|failed with result", re.IGNORECASE)


def _message_text(entry):
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # journald stores non-UTF-8 messages as byte arrays
        message = bytes(value for value in message if isinstance(value, int)).decode("utf-8", "replace")
    return None if message is None else str(message)


def select_invocation(entries, invocation_id, ready_patterns=READY_PATTERNS):
    """Journal lines of a unit "since its last start", from ``journalctl -u UNIT -o json`` records.

    The lines of ``select_invocation_entries``, without their times.
    """
    return [line for line, _ in select_invocation_entries(entries, invocation_id, ready_patterns)]


def _realtime(entry):
    """The entry's journal timestamp (``__REALTIME_TIMESTAMP``, microseconds) in seconds; None without one."""
    value = entry.get("__REALTIME_TIMESTAMP")
    try:
        return int(value) / 1e6
    except (TypeError, ValueError):
        return None


def select_invocation_entries(entries, invocation_id, ready_patterns=READY_PATTERNS):
    """(line, journal time in seconds or None) of a unit "since its last start", from ``journalctl -o json``.

    Entries written by the unit's processes carry ``_SYSTEMD_INVOCATION_ID``,
    systemd's own lines about the unit ``INVOCATION_ID``; systemd also writes
    "Scheduled restart job" with the id of the attempt that failed. The last
    start is the unit's current invocation. When that invocation came from an
    automatic restart and has neither got far (no ready line) nor failed yet, the earlier
    attempts of the same start are included back to the first one or the first
    attempt that logged an error: a crash-looping unit is caught between two
    attempts most of the time. A manual (re)start begins a new chain. Without
    an id (a unit that never started) nothing is selected.
    """
    if not invocation_id:
        return []
    order, lines, restarted = [], {}, set()
    for entry in entries:
        invocation = entry.get("_SYSTEMD_INVOCATION_ID") or entry.get("INVOCATION_ID")
        message = _message_text(entry)
        if not invocation or message is None:
            continue
        if invocation not in lines:
            order.append(invocation)
            lines[invocation] = []
        if _RESTART_SCHEDULED in message and entry.get("INVOCATION_ID"):
            restarted.add(invocation)
        when = _realtime(entry)
        for part in message.splitlines() or [""]:
            lines[invocation].append((strip_ansi(part), when))
    if invocation_id not in lines:
        return []
    ready = [re.compile(pattern) for pattern in ready_patterns]
    chosen = [invocation_id]
    index = order.index(invocation_id)
    current = lines[invocation_id]
    got_far = any(r.search(line) for r in ready for line, _ in current)
    failed_itself = any(_ERRORISH.search(line) for line, _ in current)
    if not got_far and not failed_itself:
        while index > 0 and order[index - 1] in restarted:
            index -= 1
            chosen.insert(0, order[index])
            if any(_ERRORISH.search(line) for line, _ in lines[order[index]]):
                break
    return [item for invocation in chosen for item in lines[invocation]]
