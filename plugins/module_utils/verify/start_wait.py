"""The deploy's wait for vLLM's start, one round at a time: where each node is, since when, and whether it stalled.

roles/vllm_service/tasks/wait_round.yml runs vllm_topology once per node per round (at most
vllm_service_progress_interval_s); each round ends with ``round_report``: the start-up phase the node is in now
(``parsers/vllm_phases.py``, the doctor's reader), since when, the stall bound of that phase, the round's
verdict (``up``, ``waiting``, ``stalled``, ``failed``) and one progress line for the play's output. A start is
stalled when no new phase arrives within the bound: ``stall_timeout_s`` when set, else the bound of the phase
under the profile (``vllm_phases.PROFILES``: gpu, lab). The report is passed back to the next round (``resume``),
so a phase whose line carries no time keeps the time it was first seen.

An ERROR line alone does not end the wait (``error_silence``): vLLM logs some errors it survives (a cache file it
could not write on a full disk) and starts on. A start whose unit still runs fails on an error only when the
journal stays silent after it for ``grace_s``; a start that came up with errors is up, its errors kept as warnings.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import vllm_phases

NO_PHASE_TITLE = "no vLLM start-up line yet"
STATES = ("up", "waiting", "stalled", "failed")


def stall_bound(phase_id, profile=vllm_phases.DEFAULT_PROFILE, stall_timeout_s=0):
    """Seconds a start may stay in one phase: stall_timeout_s when > 0, else the phase's bound under the profile.

    phase_id None (no start-up line yet) is bound like the first phase, 'starting'; the final phase has no bound.
    """
    if phase_id == vllm_phases.FINAL:
        return None
    if stall_timeout_s and int(stall_timeout_s) > 0:
        return int(stall_timeout_s)
    return vllm_phases.bounds(profile)[phase_id or vllm_phases.PHASE_IDS[0]]


def clock(epoch):
    """HH:MM:SS (UTC) of seconds since the epoch; '?' when unknown."""
    if epoch is None:
        return "?"
    return datetime.fromtimestamp(float(epoch), tz=UTC).strftime("%H:%M:%S")


def _since(phase_id, line_epoch, unit_started_epoch, resume, now):
    """When the node entered its current phase: the line's journal time, else the unit's start (no phase line
    yet), else when an earlier round first saw the phase, else now."""
    if line_epoch is not None:
        return float(line_epoch)
    if phase_id is None and unit_started_epoch is not None:
        return float(unit_started_epoch)
    if resume.get("phase", "") == phase_id and resume.get("since_epoch") is not None:
        return float(resume["since_epoch"])
    return float(now)


def error_silence(lines, has_errors, now, previous=None, grace_s=60):
    """Whether the start's errors ended it: ({lines, since_epoch} to pass to the next round, or None; fatal).

    lines: how many journal lines the start has logged so far; has_errors: whether any is an error line. The
    journal's silence is counted from the last round that saw a new line (previous); an error followed by more
    lines within grace_s (the next phase, a traceback then the exit that systemd reports) is not fatal by itself.
    """
    if not has_errors:
        return None, False
    if not previous or previous.get("lines") != lines or previous.get("since_epoch") is None:
        return {"lines": lines, "since_epoch": float(now)}, False
    return previous, now - float(previous["since_epoch"]) >= max(0, int(grace_s))


def title(phase_id):
    return NO_PHASE_TITLE if phase_id is None else vllm_phases.phase(phase_id)["title"]


def round_report(host, startup_phase, now, *, ended, unit=None, unit_started_epoch=None, unit_changed_epoch=None,
                 profile=vllm_phases.DEFAULT_PROFILE, stall_timeout_s=0, resume=None, silent_error=None):
    """One node's state after one round of the wait, with its progress line.

    startup_phase: vllm_topology's ``startup_phase`` (None before vLLM's first phase line), with ``since_epoch``.
    ended: why the round's wait ended - 'ready' (every expected line), 'server' (the API server started),
    'failed' (the unit stopped, or failed or errors with no restart left to sit out), 'deadline' (the round's
    time ran out). unit: {active_state, sub_state}; unit_changed_epoch: when it entered that state.
    Returns {host, phase, title, since_epoch, since, elapsed_s, bound_s, state, progress}.
    """
    resume = resume or {}
    unit = unit or {}
    phase_id = startup_phase["current"] if startup_phase else None
    complete = bool(startup_phase and startup_phase.get("complete"))
    since_epoch = _since(phase_id, (startup_phase or {}).get("since_epoch"), unit_started_epoch, resume, now)
    elapsed = max(0, int(now - since_epoch))
    bound = stall_bound(phase_id, profile, stall_timeout_s)
    previous = resume.get("phase", "")
    now_title = title(phase_id)
    moved = previous != "" and previous != phase_id
    where = f"{title(previous)} -> {now_title}" if moved else now_title
    if ended in ("ready", "server") or complete:
        state = "up"
        progress = f"{host}: up (every start-up line this node prints is in its journal)"
    elif ended == "failed" and silent_error:
        state = "failed"
        progress = (f"{host}: logged an error and nothing since {clock(silent_error['since_epoch'])} UTC "
                    f"(unit {unit.get('active_state') or 'unknown'}), in {now_title}: {silent_error['line']}")
    elif ended == "failed":
        state = "failed"
        changed = unit_changed_epoch if unit_changed_epoch is not None else now
        progress = (f"{host}: unit {unit.get('active_state') or 'unknown'} ({unit.get('sub_state') or 'unknown'}) "
                    f"since {clock(changed)} UTC, in {now_title} (since {clock(since_epoch)} UTC)")
    elif bound is not None and elapsed > bound:
        state = "stalled"
        progress = (f"{host}: stalled in {now_title}: no new start-up phase for {elapsed} s "
                    f"(since {clock(since_epoch)} UTC; bound {bound} s)")
    else:
        state = "waiting"
        progress = f"{host}: {where} (since {clock(since_epoch)} UTC, {elapsed} s"
        progress += f" of at most {bound} s)" if bound is not None else ")"
    return {
        "host": host, "phase": phase_id, "title": now_title, "since_epoch": since_epoch,
        "since": clock(since_epoch), "elapsed_s": elapsed, "bound_s": bound, "state": state, "progress": progress,
    }
