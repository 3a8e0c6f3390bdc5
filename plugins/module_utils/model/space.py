"""The free-disk check before any download: does what is still to fetch, plus a margin, fit on the node?

Files already present and complete (a resumed transfer) are not fetched again and need no new
space; the margin keeps the filesystem from ending full (vLLM's caches and logs share it).
host_state's free_space gives the node's free bytes; manifest.complete_bytes the bytes present.

Pure Python, no Ansible import.
"""

from __future__ import annotations

import math

GIB = 1024 ** 3
DEFAULT_MARGIN_FRACTION = 0.05
DEFAULT_MARGIN_MIN_BYTES = 2 * GIB


def gib(count: int) -> str:
    """Bytes as GiB, or as MiB below 1 GiB (a small model or a nearly full disk still reads as a number)."""
    if count < GIB:
        return f"{count / 1024 ** 2:.1f} MiB"
    return f"{count / GIB:.2f} GiB"


def space_check(host: str, path: str, total_bytes: int, free_bytes: int, present_bytes: int = 0,
                margin_fraction: float = DEFAULT_MARGIN_FRACTION,
                margin_min_bytes: int = DEFAULT_MARGIN_MIN_BYTES) -> dict:
    """{fits, need_bytes, free_bytes, remaining_bytes, margin_bytes, message}. need_bytes is what is still to
    fetch (total_bytes - present_bytes) plus the margin (margin_fraction of the model, at least
    margin_min_bytes); nothing to fetch fits whatever the free space. message is the error text when it does
    not fit (naming the host, the path, the need and the free space in GiB), else a one-line summary."""
    for name, value in (("total_bytes", total_bytes), ("free_bytes", free_bytes), ("present_bytes", present_bytes),
                        ("margin_min_bytes", margin_min_bytes)):
        if type(value) is not int or value < 0:
            raise ValueError(f"{name} must be a whole number of bytes of at least 0, not {value!r}")
    if not 0 <= margin_fraction < 1:
        raise ValueError(f"margin_fraction must be at least 0 and below 1, not {margin_fraction!r}")
    if present_bytes > total_bytes:
        raise ValueError(f"host {host}: {path}: {present_bytes} bytes present of a model of {total_bytes}: "
                         "the bytes present are counted from the manifest's complete files, never more than it")
    remaining = total_bytes - present_bytes
    margin = max(math.ceil(total_bytes * margin_fraction), margin_min_bytes) if remaining else 0
    need = remaining + margin
    fits = need <= free_bytes
    fetch = (f"{gib(remaining)} still to fetch of {gib(total_bytes)}" if present_bytes
             else f"the model's {gib(total_bytes)}")
    if fits:
        message = (f"host {host}: {path}: {gib(free_bytes)} free, {gib(need)} needed" if remaining
                   else f"host {host}: {path}: the model is complete, nothing to fetch")
    else:
        message = (f"host {host}: {path} needs {gib(need)} ({fetch}, plus a margin of {gib(margin)}) and its "
                   f"filesystem has {gib(free_bytes)} free: {gib(need - free_bytes)} short, before any download")
    return {"fits": fits, "need_bytes": need, "free_bytes": free_bytes, "remaining_bytes": remaining,
            "margin_bytes": margin, "message": message}
