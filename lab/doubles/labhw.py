"""Shared core of the lab's nvidia-smi and ibstat doubles (Python 3.11 stdlib only).

Installed in every lab node as /usr/local/lib/vllm-lab/labhw.py; `lab` on the
host imports it too, to validate `lab hw set` before writing a node's config.

The doubles REPLAY real captures (tests/fixtures, copied into the node image
under /usr/share/vllm-lab/fixtures). A node's /etc/vllm-lab/hardware.json says
which capture and how to shape it; it is read at every call, so a change is
live. Shaping never invents a value: GPU elements of the real capture are
replicated or trimmed (each copy gets its own index, minor number, bus id, UUID
and serial), version strings are replaced where the capture prints them, IB
port state lines take the exact strings of real Down/Polling/Disabled
captures, and GPU processes are the real processes that hold /dev/vlab-gpu<i>
open. What a capture cannot answer ends with exit 2 and a message.

Environment (for running the doubles outside a node, e.g. in tests):
  VLLM_LAB_HARDWARE    hardware.json path   (default /etc/vllm-lab/hardware.json)
  VLLM_LAB_FIXTURES    fixtures root        (default /usr/share/vllm-lab/fixtures)
  VLLM_LAB_DEVICE_DIR  where vlab-gpu<i> are (default /dev)
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HARDWARE_FILE = Path(os.environ.get("VLLM_LAB_HARDWARE", "/etc/vllm-lab/hardware.json"))
FIXTURES_ROOT = Path(os.environ.get("VLLM_LAB_FIXTURES", "/usr/share/vllm-lab/fixtures"))
DEVICE_DIR = Path(os.environ.get("VLLM_LAB_DEVICE_DIR", "/dev"))
DEVICE_PREFIX = "vlab-gpu"
MAX_GPUS = 64

# The (State, Physical state) pairs that real ibstat captures in tests/fixtures/ib show.
IB_PORT_STATES = {
    "Active/LinkUp": ("Active", "LinkUp"),        # gpud-ibstat-*-all-active
    "Down/Polling": ("Down", "Polling"),          # gpud-ibstat-h100-12hca-down-polling, mail-linux-rdma-*
    "Down/Disabled": ("Down", "Disabled"),        # gpud-ibstat-h100-12hca-3-down-disabled
}

DEFAULTS: dict = {
    "gpu_fixture": "gpu/h200x2",
    "gpu_count": 2,
    "driver_version": None,      # None: the capture's
    "cuda_version": None,        # None: the capture's
    "gpu_uuid_seed": "",         # "": the capture's UUIDs/serials; lab sets "<lab>/<node>"
    "ib_fixture": "ib/public/gpud-ibstat-h100-9hca-all-active.txt",
    "ib_hcas": None,             # None: one HCA per GPU (rail-optimised), at most the capture's CAs
    "ib_ports": {},              # "mlx5_0/1" -> one of IB_PORT_STATES
    "fabric_mtu": 9000,          # applied to eth1 by `lab` on the host
    "fabric_link": "up",         # "down" pulls eth1's cable (host side)
}
SETTABLE = ("gpu_fixture", "gpu_count", "driver_version", "cuda_version", "ib_fixture", "ib_hcas",
            "fabric_mtu", "fabric_link")


class DoubleError(Exception):
    """Something the capture cannot answer, or a bad configuration (exit 2)."""


# --------------------------------------------------------------------------- config

def load_config(path: Path | None = None) -> dict:
    path = path or HARDWARE_FILE
    config = copy.deepcopy(DEFAULTS)
    if path.exists():
        try:
            stored = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise DoubleError(f"{path} is not valid JSON: {exc}") from exc
        config.update(stored)
    return config


def validate(config: dict, fixtures_root: Path | None = None) -> dict:
    """Check a whole hardware config; raise DoubleError naming the key, the value and what is expected."""
    root = fixtures_root or FIXTURES_ROOT
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise DoubleError(f"unknown hardware keys {unknown}; known: {sorted(DEFAULTS)}")
    gpu_fixture(config, root)  # raises when missing
    count = config["gpu_count"]
    if not isinstance(count, int) or not 1 <= count <= MAX_GPUS:
        raise DoubleError(f"gpu_count={count!r}: expected an integer 1..{MAX_GPUS}")
    for key in ("driver_version", "cuda_version"):
        value = config[key]
        if value is not None and not re.fullmatch(r"[0-9]+(\.[0-9]+){1,3}", str(value)):
            raise DoubleError(f"{key}={value!r}: expected a dotted version like 580.159.04, or empty for the capture's")
    if not isinstance(config["gpu_uuid_seed"], str):
        raise DoubleError(f"gpu_uuid_seed={config['gpu_uuid_seed']!r}: expected a string")
    hcas = config["ib_hcas"]
    if hcas is not None and (not isinstance(hcas, int) or hcas < 1):
        raise DoubleError(f"ib_hcas={hcas!r}: expected a positive integer, or empty for one HCA per GPU")
    if config["ib_fixture"] != "none":
        cas = ib_cas(config, root)  # raises on a missing fixture or too many HCAs
        ports = {f"{ca.name}/{num}" for ca in cas for num in ca.ports}
        for port, state in config["ib_ports"].items():
            if port not in ports:
                raise DoubleError(f"ib_port.{port}: no such port among this node's HCAs {sorted(ports)}")
            if state not in IB_PORT_STATES:
                raise DoubleError(f"ib_port.{port}={state!r}: expected one of {sorted(IB_PORT_STATES)}")
    elif config["ib_ports"]:
        raise DoubleError("ib_port overrides need an ib_fixture; this node has ib_fixture=none")
    mtu = config["fabric_mtu"]
    if not isinstance(mtu, int) or not 1280 <= mtu <= 65535:
        raise DoubleError(f"fabric_mtu={mtu!r}: expected an integer 1280..65535")
    if config["fabric_link"] not in ("up", "down"):
        raise DoubleError(f"fabric_link={config['fabric_link']!r}: expected up or down")
    return config


def apply_assignment(config: dict, assignment: str) -> dict:
    """Apply one `key=value` of `lab hw set` to config (a copy is returned). Empty value = default."""
    if "=" not in assignment:
        raise DoubleError(f"{assignment!r}: expected key=value")
    key, value = assignment.split("=", 1)
    config = copy.deepcopy(config)
    if key.startswith("ib_port."):
        port = key[len("ib_port."):]
        if "/" not in port:
            port += "/1"
        if value:
            config["ib_ports"][port] = value
        else:
            config["ib_ports"].pop(port, None)
        return config
    if key not in SETTABLE:
        raise DoubleError(f"{key!r} cannot be set; settable keys: {', '.join(SETTABLE)}, ib_port.<ca>[/<port>]")
    if value == "":
        config[key] = DEFAULTS[key]
    elif key in ("gpu_count", "ib_hcas", "fabric_mtu"):
        try:
            config[key] = int(value)
        except ValueError as exc:
            raise DoubleError(f"{key}={value!r}: expected an integer") from exc
    else:
        config[key] = value
    if key == "ib_fixture" and value == "none":
        config["ib_ports"] = {}
    return config


# --------------------------------------------------------------------------- GPU captures

@dataclass
class GpuFixture:
    name: str
    xml: Path
    directory: Path | None  # the text captures beside the XML, when the fixture is a capture directory

    def text(self, filename: str, command: str) -> str:
        if self.directory is None or not (self.directory / filename).exists():
            raise DoubleError(f"the GPU fixture {self.name} has no capture of `{command}` "
                              f"(only its -q -x XML); the lab replays captures, it does not make them up")
        return (self.directory / filename).read_text()


def gpu_fixture(config: dict, root: Path | None = None) -> GpuFixture:
    root = root or FIXTURES_ROOT
    name = config["gpu_fixture"]
    path = root / name
    if ".." in Path(name).parts:
        raise DoubleError(f"gpu_fixture={name!r}: expected a path inside the fixtures")
    if path.is_dir() and (path / "nvidia-smi-q.xml").exists():
        return GpuFixture(name, path / "nvidia-smi-q.xml", path)
    if path.is_file() and path.suffix == ".xml":
        return GpuFixture(name, path, None)
    raise DoubleError(f"gpu_fixture={name!r}: expected a capture directory with nvidia-smi-q.xml "
                      f"(e.g. gpu/h200x2) or an nvidia-smi -q -x file under {root}")


@dataclass
class GpuProcess:
    gpu: int
    pid: int
    name: str
    used_mib: int


def gpu_processes(count: int) -> list[GpuProcess]:
    """The real processes that hold /dev/vlab-gpu<i> open, found by scanning /proc/*/fd."""
    wanted = {str(DEVICE_DIR / f"{DEVICE_PREFIX}{i}"): i for i in range(count)}
    found: list[GpuProcess] = []
    me = os.getpid()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        holds: set[int] = set()
        try:
            for fd in (proc / "fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target in wanted:
                    holds.add(wanted[target])
        except OSError:
            continue
        if not holds:
            continue
        try:
            argv0 = (proc / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
            name = argv0 or (proc / "comm").read_text().strip()
            rss_kib = next((int(line.split()[1]) for line in (proc / "status").read_text().splitlines()
                            if line.startswith("VmRSS:")), 0)
        except OSError:
            continue
        for gpu in sorted(holds):
            found.append(GpuProcess(gpu, int(proc.name), name, max(1, -(-rss_kib // 1024))))
    return sorted(found, key=lambda p: (p.gpu, p.pid))


def _personal_hex(seed: str, index: int, length: int) -> str:
    return hashlib.sha256(f"{seed}/{index}".encode()).hexdigest()[:length]


def _xml_doctype(text: str) -> str:
    match = re.search(r"<!DOCTYPE[^>]*>", text)
    return match.group(0) + "\n" if match else ""


@dataclass
class GpuView:
    """The node's GPUs: the capture's XML shaped by the hardware config, plus live processes."""
    config: dict
    fixture: GpuFixture
    root: ET.Element
    doctype: str
    gpus: list[ET.Element] = field(default_factory=list)
    captured_driver: str = ""
    captured_cuda: str = ""
    processes: list[GpuProcess] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def driver(self) -> str:
        return self.root.findtext("driver_version", "")

    @property
    def cuda(self) -> str:
        return self.root.findtext("cuda_version", "")


def _set(element: ET.Element, path: str, value: str) -> None:
    node = element.find(path)
    if node is not None:
        node.text = value


def gpu_view(config: dict, root: Path | None = None, with_processes: bool = True) -> GpuView:
    fixture = gpu_fixture(config, root)
    text = fixture.xml.read_text()
    tree_root = ET.fromstring(text)
    captured = tree_root.findall("gpu")
    if not captured:
        raise DoubleError(f"the GPU fixture {fixture.name} has no <gpu> element")
    view = GpuView(config, fixture, tree_root, _xml_doctype(text),
                   captured_driver=tree_root.findtext("driver_version", ""),
                   captured_cuda=tree_root.findtext("cuda_version", ""))
    first = list(tree_root).index(captured[0])
    for element in captured:
        tree_root.remove(element)
    buses = [(element.findtext("pci/pci_bus_id") or element.get("id", "")) for element in captured]
    last_device = max(int(bus.split(":")[2].split(".")[0], 16) for bus in buses)
    seed = config["gpu_uuid_seed"]
    for index in range(config["gpu_count"]):
        template = captured[index % len(captured)]
        gpu = copy.deepcopy(template)
        if index >= len(captured):
            domain_bus, _device_function = buses[index % len(captured)].rsplit(":", 1)
            device = last_device + index - len(captured) + 1
            bus_id = f"{domain_bus}:{device:02X}.0"
            gpu.set("id", bus_id)
            _set(gpu, "pci/pci_bus_id", bus_id)
            _set(gpu, "pci/pci_device", f"{device:02X}")
        _set(gpu, "minor_number", str(index))
        if seed or index >= len(captured):
            uuid = gpu.findtext("uuid", "GPU-00000000-0000-0000-0000-000000000000")
            _set(gpu, "uuid", uuid[:-12] + _personal_hex(seed, index, 12))
            serial = gpu.findtext("serial", "")
            if serial.isdigit():
                _set(gpu, "serial", str(int(_personal_hex(seed, index, 12), 16))[-len(serial):].zfill(len(serial)))
        tree_root.insert(first + index, gpu)
        view.gpus.append(gpu)
    _set(tree_root, "attached_gpus", str(config["gpu_count"]))
    _set(tree_root, "timestamp", time.strftime("%a %b %d %H:%M:%S %Y"))
    if config["driver_version"]:
        _set(tree_root, "driver_version", config["driver_version"])
        for gpu in view.gpus:
            if gpu.findtext("gsp_firmware_version") == view.captured_driver:
                _set(gpu, "gsp_firmware_version", config["driver_version"])
    if config["cuda_version"]:
        _set(tree_root, "cuda_version", config["cuda_version"])
    if with_processes:
        view.processes = gpu_processes(view.count)
        _attach_processes(view)
    return view


def mib(text: str | None) -> int | None:
    match = re.fullmatch(r"\s*(\d+)\s*MiB\s*", text or "")
    return int(match.group(1)) if match else None


def _attach_processes(view: GpuView) -> None:
    for index, gpu in enumerate(view.gpus):
        mine = [p for p in view.processes if p.gpu == index]
        if not mine:
            continue
        holder = gpu.find("processes")
        if holder is None:
            holder = ET.SubElement(gpu, "processes")
        for process in mine:
            info = ET.SubElement(holder, "process_info")
            for tag, value in (("gpu_instance_id", "N/A"), ("compute_instance_id", "N/A"),
                               ("pid", str(process.pid)), ("type", "C"), ("process_name", process.name),
                               ("used_memory", f"{process.used_mib} MiB")):
                ET.SubElement(info, tag).text = value
        used, free = mib(gpu.findtext("fb_memory_usage/used")), mib(gpu.findtext("fb_memory_usage/free"))
        taken = sum(p.used_mib for p in mine)
        if used is not None and free is not None:
            _set(gpu, "fb_memory_usage/used", f"{used + taken} MiB")
            _set(gpu, "fb_memory_usage/free", f"{max(0, free - taken)} MiB")


def render_xml(view: GpuView, ids: list[int] | None = None) -> str:
    root = copy.deepcopy(view.root)
    if ids is not None:
        for index, gpu in enumerate(root.findall("gpu")):
            if index not in ids:
                root.remove(gpu)
    ET.indent(root, space="\t")
    body = ET.tostring(root, encoding="unicode").replace("\t</gpu>\n", "\t</gpu>\n\n")  # the tool's blank line
    return '<?xml version="1.0" ?>\n' + view.doctype + body + "\n"


# --------------------------------------------------------------------------- IB captures

@dataclass
class HostChannelAdapter:
    name: str
    lines: list[str]
    ports: dict[int, tuple[int, int]]  # port number -> (index of "State:" line, index of "Physical state:" line)


@dataclass
class IbCapture:
    cas: list[HostChannelAdapter]
    trailer: list[str]  # e.g. the ibpanic line a failing ibstat printed after its CAs


def parse_ibstat(text: str) -> IbCapture:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("CA '")), None)
    if start is None:
        raise DoubleError("the IB fixture has no \"CA '...'\" block: it is not an ibstat capture")
    cas: list[HostChannelAdapter] = []
    trailer: list[str] = []
    port = None
    for line in lines[start:]:
        if line.startswith("CA '"):
            cas.append(HostChannelAdapter(line[4:line.rindex("'")], [line], {}))
            port = None
        elif line.startswith((" ", "\t")) and cas and not trailer:
            ca = cas[-1]
            stripped = line.strip()
            match = re.fullmatch(r"Port (\d+):", stripped)
            if match:
                port = int(match.group(1))
            elif port is not None and stripped.startswith("State:"):
                ca.ports[port] = (len(ca.lines), -1)
            elif port is not None and stripped.startswith("Physical state:"):
                ca.ports[port] = (ca.ports[port][0], len(ca.lines))
            ca.lines.append(line)
        elif line.strip():
            trailer.append(line)
    return IbCapture(cas, trailer)


def ib_capture(config: dict, root: Path | None = None) -> IbCapture:
    root = root or FIXTURES_ROOT
    name = config["ib_fixture"]
    path = root / name
    if ".." in Path(name).parts or not path.is_file():
        raise DoubleError(f"ib_fixture={name!r}: expected an ibstat capture under {root} "
                          "(e.g. ib/public/gpud-ibstat-h100-9hca-all-active.txt) or none")
    return parse_ibstat(path.read_text())


def ib_cas(config: dict, root: Path | None = None) -> list[HostChannelAdapter]:
    """The node's HCAs: the capture's first ib_hcas CA blocks with the port-state overrides applied."""
    capture = ib_capture(config, root)
    wanted = config["ib_hcas"]
    if wanted is None:
        wanted = min(config["gpu_count"], len(capture.cas))
    if wanted > len(capture.cas):
        raise DoubleError(f"ib_hcas={wanted}: the IB fixture {config['ib_fixture']} has only "
                          f"{len(capture.cas)} CAs (set ib_hcas, or pick a larger capture)")
    cas = [copy.deepcopy(ca) for ca in capture.cas[:wanted]]
    for ca in cas:
        for number, (state_at, physical_at) in ca.ports.items():
            override = config["ib_ports"].get(f"{ca.name}/{number}")
            if override in IB_PORT_STATES:
                state, physical = IB_PORT_STATES[override]
                ca.lines[state_at] = re.sub(r"State: .*", f"State: {state}", ca.lines[state_at])
                if physical_at >= 0:
                    ca.lines[physical_at] = re.sub(r"Physical state: .*", f"Physical state: {physical}",
                                                   ca.lines[physical_at])
    return cas
