"""Running commands, locking and writing files for the lab (stdlib only)."""
from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path


class LabError(Exception):
    """A failure with one message that says what, where and what was expected."""


VERBOSE = os.environ.get("VLLM_LAB_VERBOSE", "0") == "1"


def log(message: str) -> None:
    print(f"[lab] {message}", file=sys.stderr, flush=True)


def debug(message: str) -> None:
    if VERBOSE:
        log(message)


def run(argv: Sequence[str], *, check: bool = True, capture: bool = True, timeout: float = 120,
        input_text: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run argv; on failure raise LabError with the command and its stderr."""
    debug("$ " + " ".join(argv))
    try:
        proc = subprocess.run(list(argv), capture_output=capture, text=True, timeout=timeout,
                              input=input_text, env=env, check=False)
    except FileNotFoundError as exc:
        raise LabError(f"{argv[0]} is not installed on this host (needed for: {' '.join(argv)})") from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"timed out after {timeout:.0f}s: {' '.join(argv)}") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip() if capture else ""
        raise LabError(f"command failed (exit {proc.returncode}): {' '.join(argv)}" + (f"\n{detail}" if detail else ""))
    return proc


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on path for the duration of the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write text to path through a temporary file and a rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def pid_alive(pid: int) -> bool:
    """True when pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def children_of(pid: int) -> list[int]:
    """Direct children of pid (from /proc/<pid>/task/*/children)."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            kids.extend(int(x) for x in (task / "children").read_text().split())
    return kids


def mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, super options) for every mount in this namespace, innermost last."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            left, right = line.split(" - ", 1)
            point = left.split()[4].replace("\\040", " ")
            fstype, _source, options = (right.split() + ["", ""])[:3]
            found.append((point, fstype, options))
    return found


def is_mountpoint(path: Path) -> bool:
    return any(point == str(path) for point, _, _ in mounts())
