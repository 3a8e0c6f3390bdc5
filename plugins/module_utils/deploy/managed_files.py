"""A node's configuration files written in one module run (module managed_files).

Each file is compared with what is on the node (content, mode, owner, group)
and, when it differs, written to a temporary file in the same directory with
its final mode and owner already set, then renamed over the old one, so no
reader sees half a file or a secret file with a wider mode. A backup of the
file it replaces is kept when asked (the rollback puts it back).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import tempfile

STATES = ("present", "absent")


class ManagedFilesError(ValueError):
    """A request that cannot be carried out, said in the user's terms."""


def _mode(value, where: str) -> int:
    text = str(value)
    try:
        mode = int(text, 8)
    except ValueError:
        raise ManagedFilesError(f"{where}: mode {text!r} is not an octal number such as '0644'") from None
    if not 0 <= mode <= 0o7777:
        raise ManagedFilesError(f"{where}: mode {text!r} is out of range")
    return mode


def _ids(owner: str, group: str, where: str) -> tuple[int, int]:
    try:
        uid = pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise ManagedFilesError(f"{where}: owner {owner!r} does not exist on this node") from None
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise ManagedFilesError(f"{where}: group {group!r} does not exist on this node") from None
    return uid, gid


def normalize(files: list, directories: list, secrets: dict | None = None) -> tuple[list, list]:
    """The request with modes as numbers and owners as ids; ManagedFilesError names the bad entry.

    A file marked `secret` takes its text from secrets[dest] (passed apart, so it is never logged).
    """
    secrets = secrets or {}
    seen = set()
    wanted_dirs = []
    for entry in directories:
        path = entry["path"]
        if not os.path.isabs(path):
            raise ManagedFilesError(f"directory {path!r}: expected an absolute path")
        uid, gid = _ids(entry["owner"], entry["group"], f"directory {path}")
        wanted_dirs.append({"path": path, "mode": _mode(entry["mode"], f"directory {path}"), "uid": uid, "gid": gid})
    wanted_files = []
    for entry in files:
        dest = entry["dest"]
        where = f"file {dest}"
        if not os.path.isabs(dest):
            raise ManagedFilesError(f"{where}: expected an absolute path")
        if dest in seen:
            raise ManagedFilesError(f"{where}: listed twice")
        seen.add(dest)
        if entry["state"] not in STATES:
            raise ManagedFilesError(f"{where}: state {entry['state']!r}; expected one of {', '.join(STATES)}")
        wanted = {"dest": dest, "state": entry["state"], "backup": bool(entry["backup"])}
        if entry["state"] == "present":
            secret = bool(entry.get("secret"))
            if secret and entry.get("content") is not None:
                raise ManagedFilesError(f"{where}: a secret file takes its text from secrets, not content")
            if secret and secrets.get(dest) is None:
                raise ManagedFilesError(f"{where}: marked secret, but secrets has no text for it")
            if not secret and entry.get("content") is None:
                raise ManagedFilesError(f"{where}: no content (or secret: true with its text in secrets)")
            text = secrets[dest] if secret else entry["content"]
            uid, gid = _ids(entry["owner"], entry["group"], where)
            wanted.update(data=str(text).encode("utf-8"), secret=secret, diff=bool(entry["diff"]) and not secret,
                          mode=_mode(entry["mode"], where), uid=uid, gid=gid)
        wanted_files.append(wanted)
    return wanted_files, wanted_dirs


def differences(path: str, data: bytes, mode: int, uid: int, gid: int) -> tuple[list[str], bytes | None]:
    """What differs between the node's file and the wanted one (['created'] when it is missing), and its old bytes."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return ["created"], None
    if not stat.S_ISREG(info.st_mode):
        raise ManagedFilesError(f"file {path}: exists and is not a regular file; remove it or choose another path")
    with open(path, "rb") as handle:
        old = handle.read()
    reasons = []
    if old != data:
        reasons.append("content")
    if stat.S_IMODE(info.st_mode) != mode:
        reasons.append(f"mode {stat.S_IMODE(info.st_mode):04o} -> {mode:04o}")
    if (info.st_uid, info.st_gid) != (uid, gid):
        reasons.append(f"owner {info.st_uid}:{info.st_gid} -> {uid}:{gid}")
    return reasons, old


def write_atomically(path: str, data: bytes, mode: int, uid: int, gid: int, prepare=None) -> None:
    """Write `data` to a temporary file beside `path` with its final mode and owner, then rename it over `path`."""
    descriptor, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchown(handle.fileno(), uid, gid)
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        if prepare is not None:
            prepare(temporary, path)
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.remove(temporary)
        raise


def ensure_directory(entry: dict, check_mode: bool) -> bool:
    path = entry["path"]
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if not check_mode:
            os.makedirs(path, mode=entry["mode"], exist_ok=True)
            os.chown(path, entry["uid"], entry["gid"])
            os.chmod(path, entry["mode"])
        return True
    if not stat.S_ISDIR(info.st_mode):
        raise ManagedFilesError(f"directory {path}: exists and is not a directory")
    changed = stat.S_IMODE(info.st_mode) != entry["mode"] or (info.st_uid, info.st_gid) != (entry["uid"], entry["gid"])
    if changed and not check_mode:
        os.chown(path, entry["uid"], entry["gid"])
        os.chmod(path, entry["mode"])
    return changed


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", errors="replace")


def apply(files: list, directories: list, check_mode: bool, backup, prepare=None) -> dict:
    """Bring the node's directories and files to the normalized request.

    backup(path) -> the backup's path, called before a file is replaced when
    its entry asks for one; prepare(temporary, dest) may set what the rename
    keeps (an SELinux context). Returns {changed, directories, files, diff}.
    """
    result = {"changed": False, "directories": {}, "files": {}, "diff": []}
    for entry in directories:
        changed = ensure_directory(entry, check_mode)
        result["directories"][entry["path"]] = {"changed": changed}
        result["changed"] |= changed
    for entry in files:
        dest = entry["dest"]
        if entry["state"] == "absent":
            exists = os.path.lexists(dest)
            if exists and not check_mode:
                os.remove(dest)
            result["files"][dest] = {"changed": exists, "state": "absent", "reasons": ["removed"] if exists else []}
            result["changed"] |= exists
            continue
        reasons, old = differences(dest, entry["data"], entry["mode"], entry["uid"], entry["gid"])
        outcome = {"changed": bool(reasons), "state": "present", "reasons": reasons}
        if reasons and not check_mode:
            if entry["backup"] and old is not None:
                outcome["backup_file"] = backup(dest)
            write_atomically(dest, entry["data"], entry["mode"], entry["uid"], entry["gid"], prepare)
        if "content" in reasons or "created" in reasons:
            if entry["diff"]:
                result["diff"].append({"before_header": dest, "after_header": dest,
                                       "before": _text(old), "after": _text(entry["data"])})
            elif entry["secret"]:
                result["diff"].append({"prepared": f"{dest}: secret content {'written' if old is None else 'changed'}"
                                                   " (not shown)"})
        result["files"][dest] = outcome
        result["changed"] |= bool(reasons)
    return result
