"""A long transfer of a model's bytes, run on a node as a transient systemd unit and watched from the controller:
its state read from `systemctl show`, its progress from the bytes under its destination.

Pure Python, no Ansible import (the action plugin model_transfer runs it).
"""

from __future__ import annotations

import re
import shlex

from .space import gib

STATE_KEYS = ("LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus")
UNIT_PREFIX = "vllm-model-"
ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # systemctl colours its output on a terminal


def unit_name(name: str) -> str:
    """The transient unit's name, refused unless it is ours (vllm-model-<word>.service)."""
    base = name[:-len(".service")] if name.endswith(".service") else name
    word = base[len(UNIT_PREFIX):] if base.startswith(UNIT_PREFIX) else ""
    if not word or not all(char.isalnum() or char in "-_" for char in word):
        raise ValueError(f"the transfer's unit must be named {UNIT_PREFIX}<letters, digits, - or _>, not {name!r}")
    return base + ".service"


def probe_command(unit: str, dest: str) -> str:
    """One shell line: the unit's state (Key=Value lines), then BYTES=<bytes under dest>."""
    keys = " ".join(f"-p {key}" for key in STATE_KEYS)
    return (f"SYSTEMD_COLORS=0 SYSTEMD_PAGER= systemctl show {keys} {shlex.quote(unit)}; "
            f"echo BYTES=$(du -sb {shlex.quote(dest)} 2>/dev/null | cut -f1)")


def parse_probe(text: str) -> dict:
    """{LoadState, ActiveState, SubState, Result, ExecMainStatus, bytes} from probe_command's output."""
    state = {key: "" for key in STATE_KEYS}
    state["bytes"] = 0
    for line in ESCAPES.sub("", text).splitlines():
        key, _, value = line.strip().partition("=")
        if key in STATE_KEYS:
            state[key] = value
        elif key == "BYTES" and value.isdigit():
            state["bytes"] = int(value)
    return state


def phase(state: dict) -> str:
    """running, done (ended well), failed (ended badly) or gone (no such unit: never started, or stopped)."""
    if state["ActiveState"] in ("active", "activating", "reloading") and state["SubState"] != "exited":
        return "running"
    if state["ActiveState"] == "active" and state["SubState"] == "exited" and state["Result"] == "success":
        return "done"
    if state["ActiveState"] == "failed" or (state["Result"] not in ("", "success")):
        return "failed"
    return "gone"


def start_command(unit: str, argv: list[str], env: dict[str, str]) -> list[str]:
    """systemd-run's argv: the transfer as a transient unit that stays loaded after it ends (its result is read
    then), at a low CPU and I/O priority (a node may be serving)."""
    command = ["systemd-run", f"--unit={unit}", "--quiet", "--property=RemainAfterExit=yes",
               "--property=PrivateTmp=yes", "--property=Nice=5",
               "--property=IOSchedulingClass=best-effort", "--property=IOSchedulingPriority=7"]
    command += [f"--setenv={key}={value}" for key, value in sorted(env.items())]
    return command + ["--"] + list(argv)


def progress_line(host: str, what: str, done: int, total: int, elapsed_s: float, first: int) -> str:
    """'node2: copy from node1: 1.20 GiB of 4.00 GiB (30 %), 85.1 MiB/s, ETA 34 s'. The rate counts only the
    bytes moved since this run began watching (a resumed transfer's earlier bytes are not this run's rate)."""
    done = min(done, total) if total else done
    share = f" ({100 * done / total:.0f} %)" if total else ""
    rate = (done - first) / elapsed_s if elapsed_s > 0 else 0.0
    line = f"{host}: {what}: {gib(done)} of {gib(total)}{share}, {rate / 1024 ** 2:.1f} MiB/s"
    if rate > 0 and total > done:
        line += f", ETA {round((total - done) / rate)} s"
    return line
