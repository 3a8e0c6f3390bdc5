"""Which drop-ins of a deployment unit are foreign: the one rule the deploy and the doctor share.

A drop-in is foreign when it sits in the unit's own drop-in directory
(``/etc/systemd/system/<unit>.d/`` or ``/run/systemd/system/<unit>.d/``),
vllm-cluster did not write it, and the inventory does not declare it wanted
(``vllm_service_dropins_wanted``, ``ray_cluster_dropins_wanted``: file names
or full paths). Machine-wide drop-ins (``service.d/``) and the vendor's
directories (``/usr/lib/systemd/system``) are never foreign: the deploy leaves
them, the doctor names those the other nodes lack.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

import os

# Where an administrator (or a tool) drops a unit's own overrides; the deploy removes foreign ones only here.
DROPIN_ROOTS = ("/etc/systemd/system", "/run/systemd/system")


def unit_dropin_dir(path, unit, roots=DROPIN_ROOTS):
    """The unit's own drop-in directory the path is in (``/etc/systemd/system/vllm.service.d``), else ''."""
    parent = os.path.dirname(os.path.normpath(str(path)))
    for root in roots:
        if parent == os.path.join(root, f"{unit}.d"):
            return parent
    return ""


def dropin_wanted(path, wanted):
    """Whether the inventory declares the drop-in wanted: its file name or its full path is in the list."""
    names = {str(item).strip() for item in wanted or () if str(item).strip()}
    return os.path.basename(str(path)) in names or os.path.normpath(str(path)) in {os.path.normpath(n) for n in names}


def foreign_dropins(paths, unit, wanted=(), ours=(), roots=DROPIN_ROOTS):
    """The paths among ``paths`` that are foreign to the unit: in its own drop-in directory, not written by the
    deployment (``ours``), not declared wanted."""
    own = {os.path.normpath(str(path)) for path in ours or ()}
    return [path for path in paths
            if unit_dropin_dir(path, unit, roots) and os.path.normpath(str(path)) not in own
            and not dropin_wanted(path, wanted)]


def dropin_settings(text, limit=200):
    """A drop-in's text in one line, as a message quotes it: '[Service] CPUQuota=3%' (comments and blanks left out)."""
    lines = [line.strip() for line in str(text or "").splitlines()]
    summary = " ".join(line for line in lines if line and not line.startswith(("#", ";")))
    return summary if len(summary) <= limit else summary[: limit - 3] + "..."


def removal_message(host, path, text, variable, check_mode=False):
    """What the deploy says of one foreign drop-in it removes (or would remove, in check mode)."""
    settings = dropin_settings(text)
    verb = "would remove" if check_mode else "removed"
    return (f"{host}: {verb} {path}" + (f" ({settings})" if settings else " (empty)")
            + f": not written by vllm-cluster and not in {variable}")


def present_dropins(unit, roots=DROPIN_ROOTS):
    """Every file (or link) in the unit's own drop-in directories, sorted; a missing directory has none."""
    found = []
    for root in roots:
        directory = os.path.join(root, f"{unit}.d")
        try:
            names = sorted(os.listdir(directory))
        except (FileNotFoundError, NotADirectoryError):
            continue
        found += [os.path.join(directory, name) for name in names
                  if os.path.islink(os.path.join(directory, name)) or os.path.isfile(os.path.join(directory, name))]
    return found


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(65536)
    except OSError as error:
        return f"# unreadable: {error.strerror or error}\n"


def remove_foreign_dropins(unit, wanted=(), ours=(), host="", variable="", check_mode=False, roots=DROPIN_ROOTS):
    """Remove (check mode: only name) the unit's foreign drop-ins.

    -> {changed, removed: [{path, content, message}], kept: [wanted paths], diff: [{before, after, headers}], msg}.
    """
    present = present_dropins(unit, roots)
    foreign = foreign_dropins(present, unit, wanted, ours, roots)
    removed, diff = [], []
    for path in foreign:
        content = _read(path)
        message = removal_message(host, path, content, variable, check_mode)
        if not check_mode:
            os.unlink(path)
        removed.append({"path": path, "content": content, "message": message})
        diff.append({"before": content, "after": "", "before_header": path, "after_header": f"{path} (removed)"})
    kept = [path for path in present if path not in foreign and dropin_wanted(path, wanted)]
    if not check_mode:
        for root in roots:
            directory = os.path.join(root, f"{unit}.d")
            if removed and os.path.isdir(directory) and not os.listdir(directory):
                os.rmdir(directory)
    msg = "; ".join(entry["message"] for entry in removed) or f"{host}: {unit} has no foreign drop-in"
    return {"changed": bool(removed), "removed": removed, "kept": kept, "diff": diff, "msg": msg}
