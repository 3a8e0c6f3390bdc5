"""Lab nodes: disk-backed overlay roots, per-node identity, boot under a supervisor, poweroff.

A node's disk is an overlay: lower = the doubles layer over the cached rootfs
(read-only, shared), upper/work = /var/lib/vllm-cluster-lab/<lab>/<node>/. So
whatever Ansible installs on a node survives a node reboot and goes at `down`.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from . import cgroups
from .shell import LabError, children_of, is_mountpoint, log, mounts, pid_alive, read_pid, run, write_atomic
from .spec import REPO, LabSpec, node_number

SUPERVISOR = Path(__file__).with_name("supervise.sh")
WHEELHOUSE = REPO / ".cache" / "wheelhouse"
NODE_WHEELHOUSE = "/srv/wheelhouse"
NODE_SHARED = "/srv/shared"  # spec.shared_dir on every node
HARDWARE_PATH = "etc/vllm-lab/hardware.json"
BOOT_TIMEOUT_S = 180
STOP_TIMEOUT_S = 60
NSPAWN_PROPAGATE = Path("/run/systemd/nspawn/propagate")

SSH_OPTIONS = ["-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5"]


def ssh_key(spec: LabSpec) -> Path:
    return spec.inventory / "ssh" / "id_ed25519"


def ssh_argv(spec: LabSpec, node: str, *, tty: bool = False) -> list[str]:
    address = spec.management_address(node_number(node))
    return ["ssh", "-i", str(ssh_key(spec)), *SSH_OPTIONS, *(["-t"] if tty else []), f"root@{address}"]


def ensure_ssh_key(spec: LabSpec) -> Path:
    key = ssh_key(spec)
    if not key.exists() or not key.with_suffix(".pub").exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(key.parent, 0o700)
        key.unlink(missing_ok=True)
        key.with_suffix(".pub").unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"vllm-cluster-lab-{spec.name}", "-f", str(key)])
    return key


# --------------------------------------------------------------------------- disk

def mount_root(spec: LabSpec, node: str, rootfs: Path, layer: Path) -> None:
    base = spec.node_dir(node)
    merged = spec.node_root(node)
    if is_mountpoint(merged):
        return
    for sub in ("upper", "work", "root"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    options = f"lowerdir={layer}:{rootfs},upperdir={base / 'upper'},workdir={base / 'work'}"
    run(["mount", "-t", "overlay", f"vllm-lab-{spec.name}-{node}", "-o", options, str(merged)])


def unmount_root(spec: LabSpec, node: str) -> None:
    merged = spec.node_root(node)
    if is_mountpoint(merged):
        run(["umount", str(merged)])


def provision(spec: LabSpec, node: str, public_key: str, default_hardware: dict) -> None:
    """Give a fresh node its identity, once, like an installer; later boots keep what the node changed.

    Only the controller's key is re-checked at every boot (added back if missing),
    so the lab can always reach its nodes.
    """
    root = spec.node_root(node)
    ssh_dir = root / "root/.ssh"
    authorized = ssh_dir / "authorized_keys"
    marker = spec.node_dir(node) / "provisioned"
    if not marker.exists():
        write_atomic(root / "etc/hostname", f"{node}\n")
        hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
                 f"# lab {spec.name}: node names resolve to the management network, as DNS would"]
        hosts += [f"{spec.management_address(i)}\tnode{i}" for i in range(1, spec.nodes + 1)]
        write_atomic(root / "etc/hosts", "\n".join(hosts) + "\n")
        resolv = root / "etc/resolv.conf"
        if resolv.is_symlink():
            resolv.unlink()
        write_atomic(resolv, "# lab node: no DNS server; node names are in /etc/hosts\n")
        write_atomic(root / "etc/machine-id", secrets.token_hex(16) + "\n", 0o444)
        host_key = root / "etc/ssh/ssh_host_ed25519_key"
        host_key.unlink(missing_ok=True)
        host_key.with_suffix(".pub").unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{node}", "-f", str(host_key)])
        config = dict(default_hardware, gpu_uuid_seed=f"{spec.name}/{node}", fabric_mtu=spec.fabric_mtu)
        write_atomic(root / HARDWARE_PATH, json.dumps(config, indent=2, sort_keys=True) + "\n")
        ssh_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(ssh_dir, 0o700)
        write_atomic(authorized, public_key, 0o600)
        marker.write_text("provisioned by lab/lab\n")
    present = authorized.read_text() if authorized.exists() else ""
    if public_key.strip() not in present:
        ssh_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(authorized, present + ("" if present.endswith("\n") or not present else "\n") + public_key,
                     0o600)


def read_hardware(spec: LabSpec, node: str) -> dict:
    path = spec.node_root(node) / HARDWARE_PATH
    return json.loads(path.read_text())


def write_hardware(spec: LabSpec, node: str, config: dict) -> None:
    write_atomic(spec.node_root(node) / HARDWARE_PATH, json.dumps(config, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- processes

def supervisor_pidfile(spec: LabSpec, node: str) -> Path:
    return spec.node_dir(node) / "supervisor.pid"


def supervisor_pid(spec: LabSpec, node: str) -> int | None:
    pid = read_pid(supervisor_pidfile(spec, node))
    if pid is None:
        return None
    try:  # a recycled pid is not our supervisor
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    return pid if words[1:3] == [str(SUPERVISOR), spec.machine(node)] else None


def nspawn_pid(spec: LabSpec, node: str) -> int | None:
    supervisor = supervisor_pid(spec, node)
    if supervisor is None:
        return None
    for child in children_of(supervisor):
        try:
            if Path(f"/proc/{child}/comm").read_text().strip() == "systemd-nspawn":
                return child
        except OSError:
            continue
    return None


def leader_pid(spec: LabSpec, node: str) -> int | None:
    """PID (on the host) of the node's systemd, i.e. PID 1 inside the node."""
    nspawn = nspawn_pid(spec, node)
    if nspawn is None:
        return None
    kids = [c for c in children_of(nspawn) if pid_alive(c)]
    return kids[0] if kids else None


def in_node(spec: LabSpec, node: str, argv: list[str], *, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess:
    """Run argv inside the running node (all its namespaces) without going through SSH."""
    leader = leader_pid(spec, node)
    if leader is None:
        raise LabError(f"lab {spec.name}: {node} is not running")
    return run(["nsenter", "-t", str(leader), "-m", "-u", "-i", "-n", "-p", "-C", "--", *argv],
               check=check, timeout=timeout)


def start(spec: LabSpec, node: str) -> int:
    """Boot the node under its supervisor (already running: no-op). Returns the supervisor pid."""
    running = supervisor_pid(spec, node)
    if running is not None:
        return running
    merged = spec.node_root(node)
    if not is_mountpoint(merged):
        raise LabError(f"lab {spec.name}: {node}'s root {merged} is not mounted")
    argv = ["systemd-nspawn", "--quiet", "-D", str(merged), "-M", spec.machine(node), f"--hostname={node}",
            "--boot", "--register=no", "--keep-unit", "--console=passive", "--link-journal=no",
            "--resolv-conf=off", "--timezone=off",
            # nspawn grants CAP_NET_ADMIN only with networks it makes itself; nodes need it for
            # nftables/iptables (fault injection, hardening) and MTU changes in their own namespace.
            "--capability=CAP_NET_ADMIN",
            f"--network-namespace-path=/run/netns/{spec.netns(node)}"]
    if WHEELHOUSE.is_dir():
        argv.append(f"--bind-ro={WHEELHOUSE}:{NODE_WHEELHOUSE}")
    else:
        log(f"warning: {WHEELHOUSE} is missing (run scripts/bootstrap); {node} has no offline wheelhouse")
    spec.shared_dir.mkdir(mode=0o755, exist_ok=True)
    argv.append(f"--bind={spec.shared_dir}:{NODE_SHARED}")
    kill_leftovers(spec, node, reason="left from a node whose supervisor died")
    dirs = cgroups.prepare(spec.name, node)
    logfile = spec.node_dir(node) / "nspawn.log"
    # /tmp on the node's disk, as on a Debian 12 server (nspawn would mount a tmpfs there).
    env = dict(os.environ, SYSTEMD_NSPAWN_TMPFS_TMP="0")
    with open(logfile, "ab") as out, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(["/bin/bash", str(SUPERVISOR), spec.machine(node), *argv],
                                stdin=devnull, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=lambda: cgroups.join(dirs))
    write_atomic(supervisor_pidfile(spec, node), f"{proc.pid}\n")
    return proc.pid


def request_poweroff(spec: LabSpec, node: str) -> None:
    """Ask the node to power off: nspawn turns SIGTERM into a clean systemd poweroff.

    Only once: a second SIGTERM makes nspawn kill the node on the spot.
    """
    supervisor = supervisor_pid(spec, node)
    if supervisor is not None:
        os.kill(supervisor, signal.SIGTERM)


def wait_stopped(spec: LabSpec, node: str, timeout: float = STOP_TIMEOUT_S) -> None:
    """Wait for the node's processes to end, kill what outlives timeout, remove its cgroups."""
    dirs = cgroups.node_dirs(spec.name, node)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and supervisor_pid(spec, node):
        time.sleep(0.2)
    settle = time.monotonic() + 5
    while time.monotonic() < settle and supervisor_pid(spec, node) is None and cgroups.pids(dirs):
        time.sleep(0.2)
    kill_leftovers(spec, node, reason="still alive after poweroff")
    supervisor_pidfile(spec, node).unlink(missing_ok=True)
    cgroups.remove(dirs)
    # nspawn leaves its mount-propagation directory behind when /run is not a tmpfs.
    propagate = NSPAWN_PROPAGATE / spec.machine(node)
    if propagate.is_dir() and not any(p.startswith(f"{propagate}/") or p == str(propagate)
                                      for p, _, _ in mounts()):
        shutil.rmtree(propagate, ignore_errors=True)


def kill_leftovers(spec: LabSpec, node: str, reason: str) -> None:
    """SIGKILL whatever is still in the node's cgroups (e.g. a node whose nspawn was killed)."""
    dirs = cgroups.node_dirs(spec.name, node)
    leftover = cgroups.pids(dirs)
    if not leftover:
        return
    log(f"{spec.name} {node}: killing {len(leftover)} processes {reason}")
    for pid in leftover:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and cgroups.pids(dirs):
        time.sleep(0.1)


def stop(spec: LabSpec, node: str, timeout: float = STOP_TIMEOUT_S) -> None:
    request_poweroff(spec, node)
    wait_stopped(spec, node, timeout)


# --------------------------------------------------------------------------- readiness

def port_open(address: str, port: int = 22, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def system_state(spec: LabSpec, node: str, *, wait: bool, timeout: float = 20) -> str:
    """`systemctl is-system-running` over SSH ('unreachable' when SSH does not answer)."""
    argv = [*ssh_argv(spec, node), "systemctl", "is-system-running"] + (["--wait"] if wait else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return "unreachable"
    state = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    return state or "unreachable"


def wait_ready(spec: LabSpec, nodes: list[str], timeout: float = BOOT_TIMEOUT_S) -> dict[str, str]:
    """Wait until every node answers SSH and its systemd reports running or degraded."""
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    for node in nodes:
        address = spec.management_address(node_number(node))
        while True:
            if supervisor_pid(spec, node) is None:
                raise LabError(f"lab {spec.name}: {node} stopped while booting; last lines of "
                               f"{spec.node_dir(node) / 'nspawn.log'}:\n{tail(spec.node_dir(node) / 'nspawn.log')}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise LabError(f"lab {spec.name}: {node} ({address}) did not reach running/degraded within "
                               f"{timeout:.0f}s (last state: {states.get(node, 'no SSH')}); see "
                               f"{spec.node_dir(node) / 'nspawn.log'} and `lab ssh {node} -- journalctl -b`")
            if port_open(address):
                states[node] = system_state(spec, node, wait=True, timeout=max(5.0, min(left, 60.0)))
                if states[node] in ("running", "degraded"):
                    break
            time.sleep(0.3)
    return states


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
