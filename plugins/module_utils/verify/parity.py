"""Cross-node parity: which keys differ between the nodes of one replica, and one message that says so.

Every node of a vLLM replica must match: same driver, CUDA, GPU model, count and
memory, same Python/vLLM/Ray/NCCL/torch. A mismatch is found once, on the
controller, over the facts of all nodes; the failure names every differing node
and its value, so the operator fixes all of them in one pass.

Input is ``{host: {key: value}}``. A key is compared in one of two ways:

* parity (the default): every node must report the same value. The reference is
  the value most nodes report (ties go to the value of the earliest host), so
  the message points at the odd nodes out rather than at the first host.
* expectation (``expected={key: value}``): every node that reports the key
  must report that value, e.g. ``persistence_mode: True`` or
  ``foreign_processes: []``; a node without the key is one where the check
  does not apply (``fabric_state`` on a node without NVSwitch).

Pure Python (3.11+); imports nothing from Ansible.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

MISSING = "(not reported)"


class ParityError(ValueError):
    """The input is not ``{host: {key: value}}``."""


class _MissingType:
    """Marks a key a host did not report (distinct from a reported None)."""

    def __repr__(self) -> str:
        return MISSING


_Missing = _MissingType()


def _identity(value):
    """A hashable stand-in for any JSON-like value, so lists and dicts can be grouped."""
    if value is _Missing:
        return ("missing",)
    if isinstance(value, str | int | float | bool) or value is None:
        return (type(value) is bool, value)  # keeps True apart from 1
    return ("json", json.dumps(value, sort_keys=True, default=str))


def format_value(value) -> str:
    """How a value reads in a message: lists joined, empty lists as 'none'."""
    if value is _Missing:
        return MISSING
    if value is None:
        return "none"
    if isinstance(value, list | tuple):
        return ", ".join(format_value(item) for item in value) if value else "none"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _hosts_phrase(hosts: Sequence[str]) -> str:
    return ", ".join(hosts)


def _has(hosts: Sequence[str], value) -> str:
    """'node2 has X' / 'node1, node3 have X'."""
    return f"{_hosts_phrase(hosts)} {'has' if len(hosts) == 1 else 'have'} {format_value(value)}"


def _groups(per_host: Mapping[str, object]) -> list[tuple[object, list[str]]]:
    """Hosts grouped by value, in host order of first appearance."""
    groups: dict = {}
    for host, value in per_host.items():
        key = _identity(value)
        if key not in groups:
            groups[key] = (value, [])
        groups[key][1].append(host)
    return list(groups.values())


def compare(
    values: Mapping[str, Mapping[str, object]],
    keys: Sequence[str] | None = None,
    expected: Mapping[str, object] | None = None,
    labels: Mapping[str, str] | None = None,
    hints: Mapping[str, str] | None = None,
    subject: str = "the nodes",
) -> dict:
    """Compare ``values`` ({host: {key: value}}) across hosts.

    ``keys``: the keys to compare, in report order; default every key any host
    reports, in order of first appearance. ``expected``: keys whose value is
    prescribed. ``labels``: human names of keys for the message. ``hints``:
    what to do about a key, appended to its line. ``subject``: what the hosts
    are, for the first line ("the 3 nodes of vllm_nodes").

    Returns ``{"ok", "differing", "reference", "odd_hosts", "message"}``:
    ``differing`` maps each failing key to every host's value (missing keys as
    ``None`` in ``differing``, "(not reported)" in the message), ``reference``
    the expected or majority value, ``odd_hosts`` the hosts that differ from it,
    and ``message`` one text naming each odd host and its value ("" when ok).
    """
    if not isinstance(values, Mapping) or not values:
        raise ParityError(f"values must be a non-empty mapping of host to facts, got {values!r}")
    for host, facts in values.items():
        if not isinstance(facts, Mapping):
            raise ParityError(f"values[{host!r}] must be a mapping of key to value, got {facts!r}")
    expected = dict(expected or {})
    labels = dict(labels or {})
    hints = dict(hints or {})
    if keys is None:
        ordered: list[str] = []
        for facts in values.values():
            ordered.extend(key for key in facts if key not in ordered)
        ordered.extend(key for key in expected if key not in ordered)
        keys = ordered

    differing: dict = {}
    reference: dict = {}
    odd_hosts: dict = {}
    lines: list[str] = []
    hosts = list(values)
    for key in keys:
        per_host = {host: values[host].get(key, _Missing) for host in hosts}
        label = labels.get(key, key)
        if key in expected:
            want = expected[key]
            # A host that does not report an expected key is one where the check does not apply.
            odd = [host for host, value in per_host.items()
                   if value is not _Missing and _identity(value) != _identity(want)]
            if not odd:
                continue
            detail = "; ".join(_has(group_hosts, value) for value, group_hosts in _groups({h: per_host[h] for h in odd}))
            line = f"{label}: expected {format_value(want)}; {detail}"
        else:
            groups = _groups(per_host)
            if len(groups) <= 1:
                continue
            # Majority value is the reference; a tie goes to the group seen first (host order).
            ref_value, ref_hosts = max(groups, key=lambda group: len(group[1]))
            want = ref_value
            odd = [host for host in hosts if host not in ref_hosts]
            detail = "; ".join(_has(group_hosts, value) for value, group_hosts in groups if group_hosts is not ref_hosts)
            line = f"{label} differs: {detail}, while {_has(ref_hosts, ref_value)}"
        if key in hints:
            line += f" ({hints[key]})"
        differing[key] = {host: (None if value is _Missing else value) for host, value in per_host.items()}
        reference[key] = None if want is _Missing else want
        odd_hosts[key] = odd
        lines.append(line)

    message = ""
    if lines:
        every_odd = [host for host in hosts if any(host in odd for odd in odd_hosts.values())]
        message = (
            f"{len(lines)} check{'s' if len(lines) > 1 else ''} failed across {subject} "
            f"(nodes at fault: {_hosts_phrase(every_odd)}):\n" + "\n".join(f"- {line}" for line in lines)
        )
    return {
        "ok": not lines,
        "differing": differing,
        "reference": reference,
        "odd_hosts": odd_hosts,
        "message": message,
    }
