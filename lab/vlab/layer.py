"""The doubles layer: nvidia-smi/ibstat doubles, their fixtures, the /dev/vlab-gpu<i> unit and the netns sysfs fix.

/var/cache/vllm-cluster-lab/layer-<digest>, the top read-only layer of every
node's overlay; the digest covers every file in it, so it is rebuilt (in
milliseconds) whenever lab/doubles or tests/fixtures change.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from .images import complete, marker, prune, remove_tree
from .shell import file_lock, write_atomic
from .spec import CACHE_ROOT, REPO

GPU_DEVICES_UNIT = """\
[Unit]
Description=vllm-cluster lab: device files /dev/vlab-gpu<i> for the nvidia-smi double
DefaultDependencies=no
After=systemd-tmpfiles-setup-dev.service
Before=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/vlab-gpu-devices

[Install]
WantedBy=sysinit.target
"""

# systemd-nspawn mounts the node's /sys before it joins the node's network
# namespace, so /sys/class/net lists the host's links, not eth0/eth1: Ansible's
# interface facts (and anything else reading sysfs) would be wrong. A sysfs
# mounted from inside the node shows the node's own links; bind its net parts.
NETNS_SYSFS_UNIT = """\
[Unit]
Description=vllm-cluster lab: this node's own network links in /sys/class/net
DefaultDependencies=no
Before=sysinit.target network-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -ec 'mkdir -p /run/vlab-sysfs; \\
  mountpoint -q /run/vlab-sysfs || mount -t sysfs -o ro,nosuid,nodev,noexec sysfs /run/vlab-sysfs; \\
  mountpoint -q /sys/class/net || mount --bind /run/vlab-sysfs/class/net /sys/class/net; \\
  mountpoint -q /sys/devices/virtual/net || mount --bind /run/vlab-sysfs/devices/virtual/net /sys/devices/virtual/net'

[Install]
WantedBy=sysinit.target
"""

DOUBLES_DIR = REPO / "lab" / "doubles"
FIXTURES_DIR = REPO / "tests" / "fixtures"
LAYER_FILES = {  # source under lab/doubles -> path in the node, mode
    "nvidia-smi": ("usr/local/bin/nvidia-smi", 0o755),
    "ibstat": ("usr/local/sbin/ibstat", 0o755),
    "vlab-gpu-devices": ("usr/local/sbin/vlab-gpu-devices", 0o755),
    "labhw.py": ("usr/local/lib/vllm-lab/labhw.py", 0o644),
}
LAYER_FIXTURE_SETS = ("gpu", "ib")
NODE_FIXTURES = "usr/share/vllm-lab/fixtures"


def layer_sources() -> list[tuple[Path, str, int]]:
    """(source file, path inside the node, mode) for everything in the doubles layer."""
    entries = [(DOUBLES_DIR / src, dst, mode) for src, (dst, mode) in LAYER_FILES.items()]
    for fixture_set in LAYER_FIXTURE_SETS:
        for path in sorted((FIXTURES_DIR / fixture_set).rglob("*")):
            if path.is_file():
                rel = path.relative_to(FIXTURES_DIR)
                entries.append((path, f"{NODE_FIXTURES}/{rel}", 0o644))
    return entries


def layer_digest() -> str:
    digest = hashlib.sha256(GPU_DEVICES_UNIT.encode() + NETNS_SYSFS_UNIT.encode())
    for src, dst, mode in layer_sources():
        digest.update(f"{dst}\0{mode}\0".encode())
        digest.update(src.read_bytes())
    return digest.hexdigest()[:16]


def ensure_layer() -> Path:
    """Return the doubles layer for the current lab/doubles and fixtures, building it when missing."""
    target = CACHE_ROOT / f"layer-{layer_digest()}"
    if complete(target):
        return target
    with file_lock(CACHE_ROOT / ".layer.lock"):
        if complete(target):
            return target
        building = target.with_name(target.name + ".building")
        remove_tree(building)
        remove_tree(target)
        marker(target).unlink(missing_ok=True)
        for src, dst, mode in layer_sources():
            out = building / dst
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out)
            os.chmod(out, mode)
        wants = building / "etc" / "systemd" / "system" / "sysinit.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        for name, text in (("vlab-gpu-devices.service", GPU_DEVICES_UNIT),
                           ("vlab-netns-sysfs.service", NETNS_SYSFS_UNIT)):
            unit = building / "etc" / "systemd" / "system" / name
            write_atomic(unit, text)
            (wants / name).symlink_to(f"../{name}")
        # The overlay copies each directory's mode from the topmost layer that has it:
        # give the layer's directories the image's modes so / stays 0755.
        for directory in [building, *[p for p in building.rglob("*") if p.is_dir() and not p.is_symlink()]]:
            os.chmod(directory, 0o755)
        building.rename(target)
        marker(target).write_text(f"{layer_digest()}\n")
    prune(prefix="layer-", keep=target)
    return target
