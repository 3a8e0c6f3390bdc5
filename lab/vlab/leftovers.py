"""What a lab has on the host, found from its name alone (so it works even without lab.json)."""
from __future__ import annotations

from pathlib import Path

from . import cgroups, network
from .machines import NSPAWN_PROPAGATE
from .shell import mounts
from .spec import STATE_ROOT, check_name


def lab_processes(name: str) -> dict[int, str]:
    """Processes of the lab: its supervisors and systemd-nspawn instances, and everything in its cgroups."""
    prefix = f"{name}-node"
    found: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = proc.joinpath("cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv if w]
        if not words:
            continue
        is_supervisor = (len(words) > 2 and words[1].endswith("/supervise.sh") and words[2].startswith(prefix))
        machines = [b for a, b in zip(words, words[1:], strict=False) if a == "-M"]
        machines += [w.split("=", 1)[1] for w in words if w.startswith("--machine=")]
        is_nspawn = Path(words[0]).name == "systemd-nspawn" and any(m.startswith(prefix) for m in machines)
        if is_supervisor or is_nspawn:
            found[int(proc.name)] = " ".join(words)[:120]
    for pid in cgroups.pids(cgroups.lab_dirs(name)):
        if pid not in found:
            try:
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace").strip()[:120]
            except OSError:
                continue
    return found


def find(name: str) -> dict[str, list[str]]:
    """Everything of lab `name` on this host: processes, netns, links, mounts, cgroups, state."""
    check_name(name)
    prefix = f"{name}-"
    state = STATE_ROOT / name
    found: dict[str, list[str]] = {
        "processes": [f"{pid} {cmd}" for pid, cmd in sorted(lab_processes(name).items())],
        "netns": [ns for ns in network.netns_list() if ns.startswith(prefix)],
        "links": [link["ifname"] for link in network.host_links() if link["ifname"].startswith(prefix)],
        "mounts": [point for point, _, _ in mounts() if point.startswith(f"{state}/") or point == str(state)],
        "cgroups": [str(d) for d in cgroups.lab_dirs(name) if d.exists()],
        "nspawn_runtime": [str(p) for p in NSPAWN_PROPAGATE.glob(f"{prefix}node*")],
        "state": [str(state)] if state.exists() else [],
    }
    return {kind: items for kind, items in found.items() if items}


def describe(found: dict[str, list[str]]) -> str:
    return "\n".join(f"  {kind}: {', '.join(items)}" for kind, items in found.items())
