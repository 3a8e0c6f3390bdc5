"""The lab itself, on a real 3-node nspawn lab: nodes, links, inventory, doubles, faults, reboot, down."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import time
import xml.etree.ElementTree as ET
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

LAB_NAME = "tlab"
LAB_NODES = 3
REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "tests" / "fixtures" / "gpu" / "h200x2"
IB_DEFAULT = REPO / "tests" / "fixtures" / "ib" / "public" / "gpud-ibstat-h100-9hca-all-active.txt"
PERSONAL = {"timestamp", "uuid", "serial"}  # per node and per call; everything else is the capture's


def flatten(element: ET.Element, path: str = "") -> list[tuple[str, str]]:
    here = f"{path}/{element.tag}" + "".join(f"[@{k}={v}]" for k, v in sorted(element.attrib.items()))
    items = [(here, (element.text or "").strip())] if element.tag not in PERSONAL else []
    for child in element:
        items += flatten(child, here)
    return items


def ca_blocks(text: str) -> list[str]:
    return ["CA '" + block for block in text.split("CA '")[1:]]


def test_up_is_idempotent_and_keeps_nodes_running(lab):
    before = {n["node"]: n["leader_pid"] for n in lab.status()["nodes"]}
    again = lab.run("up", "--nodes", str(LAB_NODES))
    assert "3 nodes up" in again.stdout
    after = {n["node"]: n["leader_pid"] for n in lab.status()["nodes"]}
    assert after == before, "a second `lab up` must not restart running nodes"
    resized = lab.run("up", "--nodes", "4", check=False)
    assert resized.returncode == 1 and "is up with 3 nodes" in resized.stderr


def test_every_node_answers_ssh_and_runs_systemd(lab):
    status = lab.status()
    assert status["healthy"] is True and status["leftovers"] == {}
    for node in lab.nodes:
        out = lab.ssh(node, "hostname; systemctl is-system-running; cat /proc/1/comm").stdout.split()
        assert out[0] == node
        assert out[1] in ("running", "degraded")
        assert out[2] == "systemd"


def test_each_node_has_management_and_fabric_links(lab):
    gateway = lab.gateway
    for node in lab.nodes:
        links = {e["ifname"]: e for e in json.loads(lab.ssh(node, "ip -j addr show").stdout)}
        eth0 = [a for a in links["eth0"]["addr_info"] if a["family"] == "inet"][0]
        eth1 = [a for a in links["eth1"]["addr_info"] if a["family"] == "inet"][0]
        assert (eth0["local"], eth0["prefixlen"], links["eth0"]["mtu"]) == (lab.management_address(node), 24, 1500)
        assert (eth1["local"], eth1["prefixlen"], links["eth1"]["mtu"]) == (lab.fabric_address(node), 24, 9000)
        route = json.loads(lab.ssh(node, "ip -j route show default").stdout)
        assert route[0]["gateway"] == gateway and route[0]["dev"] == "eth0"
    # A jumbo frame crosses the fabric unfragmented; the fabric has no host address.
    jumbo = lab.ssh("node1", f"ping -c 1 -W 2 -M do -s 8972 {lab.fabric_address('node2')}")
    assert " 0% packet loss" in jumbo.stdout
    host_addresses = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, check=True).stdout
    fabric_prefix = lab.fabric_address("node1").rsplit(".", 1)[0] + "."
    assert fabric_prefix not in host_addresses


def test_inventory_describes_the_lab_and_ansible_reaches_every_node(lab):
    hosts = yaml.safe_load((lab.inventory / "hosts.yml").read_text())
    group = hosts["all"]["children"]["vllm_nodes"]
    assert list(group["hosts"]) == lab.nodes  # node1 first: the head
    assert [h["ansible_host"] for h in group["hosts"].values()] == [lab.management_address(n) for n in lab.nodes]
    assert group["vars"]["ansible_user"] == "root"
    assert group["vars"]["ansible_python_interpreter"] == "/usr/bin/python3"
    assert Path(group["vars"]["ansible_ssh_private_key_file"]) == lab.key
    assert lab.key.stat().st_mode & 0o077 == 0
    for node in lab.nodes:
        host_vars = yaml.safe_load((lab.inventory / "host_vars" / f"{node}.yml").read_text())
        assert host_vars["vllm_cluster_fabric_interface"] == "eth1"
        assert host_vars["lab_fabric_address"] == lab.fabric_address(node)
        assert host_vars["lab_management_address"] == lab.management_address(node)
        assert host_vars["lab_name"] == lab.name
    # "all", with the project's ansible.cfg alone: the key files (ssh/, secrets/) are no hosts, and the API
    # key is never printed (the ini parser took it for a host name before ignore_patterns named secrets/).
    assert (lab.inventory / "secrets" / "vllm-api-key").stat().st_mode & 0o077 == 0
    env = {k: v for k, v in lab.ansible_env().items() if k != "ANSIBLE_INVENTORY_IGNORE_REGEX"}
    ping = subprocess.run([str(REPO / ".venv" / "bin" / "ansible"), "-i", str(lab.inventory), "all",
                           "-m", "ansible.builtin.ping", "-o"], capture_output=True, text=True, timeout=180,
                          env=env, cwd=REPO, check=False)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert sorted(re.findall(r"^(node\d+) \| SUCCESS", ping.stdout, re.M)) == lab.nodes
    assert lab.api_key not in ping.stdout + ping.stderr


def test_nvidia_smi_replays_the_real_h200_capture(lab):
    xml = lab.ssh("node1", "nvidia-smi -q -x").stdout
    root = ET.fromstring(xml)
    assert root.findtext("driver_version") == "580.159.04"
    assert [g.findtext("product_name") for g in root.findall("gpu")] == ["NVIDIA H200", "NVIDIA H200"]
    assert flatten(root) == flatten(ET.parse(H200 / "nvidia-smi-q.xml").getroot())
    assert lab.ssh("node1", "nvidia-smi topo -m").stdout == (H200 / "topo.txt").read_text()
    assert lab.ssh("node1", "nvidia-smi dmon").stdout == (H200 / "dmon.txt").read_text()
    table = lab.ssh("node1", "nvidia-smi").stdout.splitlines()
    assert table[1:] == (H200 / "nvidia-smi.txt").read_text().splitlines()[1:]
    fields = ("index,uuid,name,pci.bus_id,driver_version,memory.total,memory.used,memory.free,"
              "utilization.gpu,compute_cap,persistence_mode,mig.mode.current")
    csv = lab.ssh("node1", f"nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits").stdout
    without_uuid = [line.split(", ")[:1] + line.split(", ")[2:] for line in csv.splitlines()]
    captured = [line.split(", ")[:1] + line.split(", ")[2:] for line in (H200 / "query-gpu.csv").read_text().splitlines()]
    assert without_uuid == captured
    # Each node's GPUs have their own UUIDs, as real GPUs do.
    uuids = {node: lab.ssh(node, "nvidia-smi --query-gpu=uuid --format=csv,noheader").stdout.split()
             for node in lab.nodes}
    assert len({u for per_node in uuids.values() for u in per_node}) == 2 * LAB_NODES
    unsupported = lab.ssh("node1", "nvidia-smi -q", check=False)
    assert unsupported.returncode == 2 and "not replayed" in unsupported.stderr and unsupported.stdout == ""


def test_ibstat_replays_the_real_capture(lab):
    out = lab.ssh("node1", "ibstat").stdout
    assert out == "".join(ca_blocks(IB_DEFAULT.read_text())[:2])  # one HCA per GPU by default
    assert lab.ssh("node1", "ibstat -l").stdout.split() == ["mlx5_0", "mlx5_1"]


def test_per_node_hardware_change_is_live(lab):
    lab.hw_set("node2", driver_version="575.57.08", gpu_count=4, ib_port__mlx5_1="Down/Polling")
    try:
        root = ET.fromstring(lab.ssh("node2", "nvidia-smi -q -x").stdout)
        gpus = root.findall("gpu")
        assert root.findtext("driver_version") == "575.57.08" and root.findtext("attached_gpus") == "4"
        assert [g.findtext("minor_number") for g in gpus] == ["0", "1", "2", "3"]
        assert len({g.findtext("uuid") for g in gpus}) == 4
        assert len({g.findtext("pci/pci_bus_id") for g in gpus}) == 4
        assert lab.ssh("node2", "ls /dev/vlab-gpu*").stdout.split() == [f"/dev/vlab-gpu{i}" for i in range(4)]
        port = lab.ssh("node2", "ibstat mlx5_1").stdout
        assert re.search(r"\n\s+State: Down\n\s+Physical state: Polling\n", port), port
        # The other nodes keep the capture's hardware.
        for node in ("node1", "node3"):
            assert lab.ssh(node, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split() == \
                ["580.159.04", "580.159.04"]
            assert "Down" not in lab.ssh(node, "ibstat").stdout
        rejected = lab.run("hw", "set", "node2", "ib_port.mlx5_1=Down", check=False)
        assert rejected.returncode == 1 and "Down/Polling" in rejected.stderr
    finally:
        lab.hw_reset("node2")
    assert lab.hw_show("node2")["gpu_count"] == 2
    assert lab.ssh("node2", "ls /dev/vlab-gpu*").stdout.split() == ["/dev/vlab-gpu0", "/dev/vlab-gpu1"]


def test_a_process_holding_a_gpu_is_listed(lab):
    pid = lab.ssh("node3", "setsid sleep 300 </dev/vlab-gpu0 >/dev/null 2>&1 & echo $!").stdout.strip()
    try:
        apps = lab.ssh("node3", "nvidia-smi --query-compute-apps=pid,process_name,gpu_bus_id --format=csv,noheader")
        assert apps.stdout.splitlines() == [f"{pid}, sleep, 00000000:00:06.0"]
        root = ET.fromstring(lab.ssh("node3", "nvidia-smi -q -x").stdout)
        held = [(i, p.findtext("pid")) for i, g in enumerate(root.findall("gpu")) for p in g.iter("process_info")]
        assert held == [(0, pid)]
        assert re.search(rf"\|\s+0\s+N/A\s+N/A\s+{pid}\s+C\s+sleep\s+\d+MiB \|", lab.ssh("node3", "nvidia-smi").stdout)
    finally:
        lab.ssh("node3", f"kill {pid}")
    assert lab.ssh("node3", "nvidia-smi --query-compute-apps=pid --format=csv,noheader").stdout == ""


def test_fabric_port_blocked_inside_one_node_is_really_blocked(lab):
    server, client = "node2", "node1"
    address = lab.fabric_address(server)
    probe = f"timeout 3 bash -c 'echo ok >/dev/tcp/{address}/29500'"
    lab.ssh(server, "setsid timeout 60 nc -lk 29500 </dev/null >/dev/null 2>&1 &")
    time.sleep(0.5)
    assert lab.ssh(client, probe, check=False).returncode == 0
    lab.ssh(server, "nft add table inet vlabfault && nft add chain inet vlabfault input "
                    "'{ type filter hook input priority 0; }' && "
                    "nft add rule inet vlabfault input iifname eth1 tcp dport 29500 drop")
    try:
        assert lab.ssh(client, probe, check=False).returncode != 0
    finally:
        lab.ssh(server, "nft delete table inet vlabfault; pkill -f '^nc -lk 29500' || true")


def test_node_reboot_keeps_its_disk(lab):
    boot_before = lab.ssh("node3", "echo survives > /root/reboot-marker; cat /proc/sys/kernel/random/boot_id").stdout
    leader_before = next(n for n in lab.status()["nodes"] if n["node"] == "node3")["leader_pid"]
    lab.node("node3", "reboot")
    assert lab.ssh("node3", "cat /root/reboot-marker").stdout == "survives\n"
    # A new boot id, which is what ansible.builtin.reboot waits for.
    assert lab.ssh("node3", "cat /proc/sys/kernel/random/boot_id").stdout != boot_before
    status = lab.status()
    node3 = next(n for n in status["nodes"] if n["node"] == "node3")
    assert node3["leader_pid"] != leader_before and node3["state"] in ("running", "degraded")
    assert lab.ssh("node3", "journalctl --list-boots --no-pager | wc -l").stdout.strip() == "3"  # header + 2 boots
    lab.node("node3", "poweroff")
    assert next(n for n in lab.status()["nodes"] if n["node"] == "node3")["state"] == "poweroff"
    lab.node("node3", "start")
    assert lab.ssh("node3", "cat /root/reboot-marker").stdout == "survives\n"


def test_a_second_lab_runs_beside_the_first_and_apart_from_it(lab, make_lab):
    with make_lab("tlab2", 1) as other:
        assert other.inventory != lab.inventory and other.inventory.parent.name == "tlab2"
        assert other.management_address("node1").split(".")[2] != lab.management_address("node1").split(".")[2]
        assert other.ssh("node1", "hostname").stdout.strip() == "node1"
        crossing = lab.ssh("node1", f"ping -c 1 -W 1 {other.fabric_address('node1')}", check=False)
        assert crossing.returncode != 0, "two labs' fabrics must not be connected"
    assert lab.status()["healthy"] is True


def test_a_stale_lab_of_another_checkout_is_replaced_not_reused(make_lab, tmp_path):
    # What CI met: a lab of the same name recorded by a run in another clone, its nodes dead.
    lab_cli = [str(REPO / "lab" / "lab")]
    elsewhere = tmp_path / "other-checkout" / ".cache" / "labs" / "tlab3" / "inventory"
    try:
        subprocess.run([*lab_cli, "up", "--name", "tlab3", "--nodes", "1", "--inventory", str(elsewhere)],
                       capture_output=True, text=True, timeout=900, check=True)
        subprocess.run([*lab_cli, "node", "node1", "poweroff", "--name", "tlab3"],
                       capture_output=True, text=True, timeout=300, check=True)
        with make_lab("tlab3", 1) as ours:
            assert ours.inventory.resolve().is_relative_to(REPO), ours.inventory
            assert not (elsewhere / "hosts.yml").exists(), "the other checkout's lab was reused, not replaced"
            assert ours.ssh("node1", "hostname").stdout.strip() == "node1"
    finally:
        subprocess.run([*lab_cli, "down", "--name", "tlab3"], capture_output=True, text=True, timeout=300,
                       check=False)


def test_down_leaves_nothing_behind(lab):
    inventory = lab.inventory
    state = Path("/var/lib/vllm-cluster-lab") / lab.name
    assert state.is_dir()
    lab.down()
    prefix = f"{lab.name}-"
    nspawn = subprocess.run(["pgrep", "-af", f"systemd-nspawn .*-M {prefix}"], capture_output=True, text=True)
    assert nspawn.stdout == ""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert prefix not in netns
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True).stdout
    assert not [line for line in links.splitlines() if line.startswith(prefix)]
    assert str(state) not in Path("/proc/self/mountinfo").read_text()
    assert not state.exists()
    assert not list(Path("/sys/fs/cgroup").glob(f"*/vllm-cluster-lab/{lab.name}"))
    assert not (inventory / "hosts.yml").exists() and not (inventory / "ssh").exists()
    again = lab.down()
    assert "nothing remains" in again.stdout


# --- the doubles on their own (no lab needed: run from the repository with a config file) ---

DOUBLES = REPO / "lab" / "doubles"


def run_double(tmp_path: Path, name: str, config: dict, *args: str) -> subprocess.CompletedProcess:
    hardware = tmp_path / "hardware.json"
    hardware.write_text(json.dumps(config))
    (tmp_path / "dev").mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "VLLM_LAB_HARDWARE": str(hardware),
           "VLLM_LAB_FIXTURES": str(REPO / "tests" / "fixtures"), "VLLM_LAB_DEVICE_DIR": str(tmp_path / "dev")}
    return subprocess.run(["/usr/bin/python3", str(DOUBLES / name), *args], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def test_a_single_xml_capture_is_replicated_but_never_extended(tmp_path):
    config = {"gpu_fixture": "gpu/public/telegraf-a10g.xml", "gpu_count": 3}
    listed = run_double(tmp_path, "nvidia-smi", config, "-L").stdout.splitlines()
    assert [line.split(" (UUID")[0] for line in listed] == [f"GPU {i}: NVIDIA A10G" for i in range(3)]
    assert len({line.split("UUID: ")[1] for line in listed}) == 3
    table = run_double(tmp_path, "nvidia-smi", config)
    assert table.returncode == 2 and "has no capture of `nvidia-smi`" in table.stderr and table.stdout == ""
    cap = run_double(tmp_path, "nvidia-smi", config, "--query-gpu=name,compute_cap", "--format=csv")
    assert cap.returncode == 2 and "compute_cap" in cap.stderr and cap.stdout == ""


def test_ibstat_replays_a_capture_that_ended_in_an_error(tmp_path):
    capture = (REPO / "tests/fixtures/ib/public/gpud-ibstat-a100-8hca-ibpanic.txt").read_text()
    result = run_double(tmp_path, "ibstat", {"ib_fixture": "ib/public/gpud-ibstat-a100-8hca-ibpanic.txt",
                                             "ib_hcas": 8})
    assert result.returncode == 255
    assert result.stdout + result.stderr == capture.rstrip("\n") + "\n"
    assert result.stderr.startswith("ibpanic: ")


def test_process_rows_use_the_layout_of_a_real_capture():
    loader = SourceFileLoader("nvidia_smi_double", str(DOUBLES / "nvidia-smi"))
    double = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(double)
    capture = (REPO / "tests/fixtures/gpu/public/nvgpuexp-capture-h200-drv590.txt").read_text()
    rows = re.findall(r"^\|\s+\d+\s+N/A\s+N/A\s+\d+\s+C\s+.*\|$", capture, re.M)
    assert len(rows) == 3
    for row in rows:
        gpu, _, _, pid, kind, name, memory = row.strip("| ").split()
        assert double.PROCESS_ROW.format(gpu=int(gpu), gi="N/A", ci="N/A", pid=int(pid), kind=kind, name=name,
                                         memory=memory) == row
