"""Read-only image directories under /var/cache/vllm-cluster-lab: completion markers, removal, pruning."""
from __future__ import annotations

import shutil
from pathlib import Path

from .shell import LabError, log, mounts, run
from .spec import CACHE_ROOT, STATE_ROOT


def marker(image: Path) -> Path:
    """An image is usable once its marker exists; the marker sits beside it, not in the node's /."""
    return image.with_name(image.name + ".complete")


def complete(image: Path) -> bool:
    return marker(image).exists() and image.is_dir()


def umount_below(path: Path) -> None:
    """Unmount whatever a failed debootstrap left mounted inside path (innermost first)."""
    for point, _, _ in reversed(mounts()):
        if point == str(path) or point.startswith(str(path) + "/"):
            run(["umount", point], check=False)


def remove_tree(path: Path) -> None:
    if path.exists():
        umount_below(path)
        if any(p == str(path) or p.startswith(str(path) + "/") for p, _, _ in mounts()):
            raise LabError(f"{path} still has mounts inside; not removing it")
        shutil.rmtree(path)


def prune(prefix: str, keep: Path) -> None:
    """Remove older images of the same kind that no mounted node uses any more."""
    in_use = " ".join(options for _, fstype, options in mounts() if fstype == "overlay")
    for record in STATE_ROOT.glob("*/lab.json"):  # labs that are down or powered off still need theirs
        in_use += " " + record.read_text()
    for old in CACHE_ROOT.glob(prefix + "*"):
        if old == keep or not old.is_dir() or old.name.endswith(".building") or str(old) in in_use:
            continue
        log(f"removing unused lab image {old.name}")
        marker(old).unlink(missing_ok=True)
        remove_tree(old)
