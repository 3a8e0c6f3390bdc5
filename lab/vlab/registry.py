"""Which labs exist: /var/lib/vllm-cluster-lab/<name>/lab.json, and their subnet indexes."""
from __future__ import annotations

import json
from pathlib import Path

from .shell import LabError, write_atomic
from .spec import DEFAULT_NAME, MAX_INDEX, STATE_ROOT, LabSpec

LOCK = STATE_ROOT / ".locks" / "registry.lock"


def record_path(name: str) -> Path:
    return STATE_ROOT / name / "lab.json"


def load(name: str) -> dict | None:
    """The lab's record (spec fields plus the images it boots from), or None when it does not exist."""
    path = record_path(name)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise LabError(f"{path} is corrupt ({exc}); run `lab down --name {name}` to clean up") from exc


def load_spec(name: str) -> LabSpec | None:
    record = load(name)
    return LabSpec.from_json(record) if record else None


def save(spec: LabSpec, rootfs: Path, layer: Path) -> None:
    record = spec.to_json() | {"rootfs": str(rootfs), "layer": str(layer)}
    write_atomic(record_path(spec.name), json.dumps(record, indent=2) + "\n")


def all_records() -> list[dict]:
    records = []
    for path in sorted(STATE_ROOT.glob("*/lab.json")):
        try:
            records.append(json.loads(path.read_text()))
        except json.JSONDecodeError:
            continue
    return records


def allocate_index(name: str) -> int:
    """The default lab always gets index 0; any other lab the lowest index no other lab holds.

    Call with LOCK held, and save the lab's record before releasing it.
    """
    if name == DEFAULT_NAME:
        holders = [r["name"] for r in all_records() if r.get("index") == 0 and r.get("name") != name]
        if holders:
            raise LabError(f"lab index 0 (the default lab's subnets) is held by lab {holders[0]}; "
                           f"run `lab down --name {holders[0]}` first")
        return 0
    used = {int(r["index"]) for r in all_records() if r.get("name") != name}
    for index in range(1, MAX_INDEX + 1):
        if index not in used:
            return index
    raise LabError(f"all {MAX_INDEX} lab indexes are in use; bring some labs down")
