"""What a role needs to know about a node before it changes anything, read in one module run (module host_state).

Paths (exists, kind, executable, sha256 of a regular file), users (passwd
entry), systemd units (load, active and unit-file state, stopped processes) and systemd's
version: the reads that were one task each.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import stat

from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import health
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.systemd import parse_systemctl_show

UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "UnitFileState", "FragmentPath", "ControlGroup", "MainPID")
_SYSTEMD_VERSION = re.compile(r"^systemd (\d+)")


def systemd_major(version_output: str) -> int:
    """`systemctl --version`'s first line 'systemd 252 (252.33-1~deb12u1)' -> 252; 0 when unreadable."""
    match = _SYSTEMD_VERSION.match((version_output or "").strip())
    return int(match.group(1)) if match else 0


def path_state(path: str, checksum: bool) -> dict:
    """exists, kind (file, directory, link, other), executable by someone, and sha256 of a regular file when asked."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return {"exists": os.path.islink(path), "kind": "link" if os.path.islink(path) else None,
                "executable": False, "sha256": None}
    kind = "file" if stat.S_ISREG(info.st_mode) else "directory" if stat.S_ISDIR(info.st_mode) else "other"
    digest = None
    if checksum and kind == "file":
        hasher = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                hasher.update(block)
        digest = hasher.hexdigest()
    return {"exists": True, "kind": kind, "executable": kind == "file" and bool(info.st_mode & 0o111),
            "sha256": digest}


def nearest_existing(path: str, stat=os.stat) -> str:
    """The path, or the nearest directory above it that exists."""
    while path and path != "/":
        try:
            stat(path)
            return path
        except OSError:
            path = os.path.dirname(path)
    return "/"


def free_space(path: str) -> dict:
    """The filesystem that holds path (its nearest existing directory: a cache directory vLLM has not created yet
    counts where it will be created): its device, bytes free for an unprivileged user and in all, inodes free and
    in all. The vllm stage's preflight and the doctor's disk_low read it."""
    checked = nearest_existing(os.path.abspath(path))
    st, vfs = os.stat(checked), os.statvfs(checked)
    return {"checked": checked, "device": st.st_dev, "free_bytes": vfs.f_bavail * vfs.f_frsize,
            "total_bytes": vfs.f_blocks * vfs.f_frsize, "free_inodes": vfs.f_favail, "total_inodes": vfs.f_files}


def user_state(name: str) -> dict | None:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return {"uid": entry.pw_uid, "gid": entry.pw_gid, "home": entry.pw_dir, "shell": entry.pw_shell}


def unit_state(show_output: str, cgroup_root: str = health.CGROUP_ROOT, proc: str = health.PROC) -> dict:
    """`systemctl show -p LoadState -p ActiveState ...` -> load_state, active_state, sub_state, unit_file_state, path,
    and stopped_pids: the unit's processes in state T (frozen: running, yet answering nothing)."""
    values = parse_systemctl_show(show_output)
    return {
        "stopped_pids": health.stopped_pids(health.unit_pids(values, cgroup_root, proc), proc),
        "load_state": values.get("LoadState", "unknown"),
        "active_state": values.get("ActiveState", "unknown"),
        "sub_state": values.get("SubState", "unknown"),
        "unit_file_state": values.get("UnitFileState", ""),
        "fragment_path": values.get("FragmentPath", ""),
    }
