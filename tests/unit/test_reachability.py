"""plugins/module_utils/verify/reachability.py: interface, ports, MTU, InfiniBand and all-pairs verdicts.

InfiniBand port lists come from the real ibstat captures in tests/fixtures/ib
through the real parser, as ib_facts reports them on a node.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.ibstat import parse_ibstat, summarize_ib
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.reachability import (
    FabricError,
    check_ib,
    check_mtu,
    check_pairs,
    fabric_address,
    probe_ports,
    tcp_targets,
)

REPO = Path(__file__).resolve().parents[2]
PLAN_PORTS_MP = {"api": 8000, "dp_rpc": 29550, "master": 29501}
ETH1 = {"device": "eth1", "active": True, "mtu": 9000,
        "ipv4": {"address": "10.232.0.11", "netmask": "255.255.255.0", "network": "10.232.0.0"}}


def ib_ports(fixtures_dir, name: str) -> list[dict]:
    text = (fixtures_dir / "ib" / "public" / name).read_text(encoding="utf-8")
    return summarize_ib(parse_ibstat(text))["ports"]


# --------------------------------------------------------------------------- interface


def test_fabric_address_from_the_interface_facts():
    found = fabric_address("node1", "eth1", ["lo", "eth0", "eth1"], ETH1)
    assert found == {"address": "10.232.0.11", "mtu": 9000, "netmask": "255.255.255.0", "network": "10.232.0.0"}


def test_a_missing_interface_names_host_interface_and_what_exists():
    with pytest.raises(FabricError) as error:
        fabric_address("node2", "eth9", ["lo", "eth1", "eth0"], None)
    assert str(error.value).startswith("node2: fabric interface 'eth9' does not exist; interfaces on node2: eth0, eth1, lo")


def test_an_interface_without_ipv4_or_link_fails():
    with pytest.raises(FabricError, match=r"node1: fabric interface eth1 has no IPv4 address"):
        fabric_address("node1", "eth1", ["eth1"], {"device": "eth1", "active": True, "mtu": 9000})
    with pytest.raises(FabricError, match=r"node1: fabric interface eth1 \(10.232.0.11\) is down"):
        fabric_address("node1", "eth1", ["eth1"], {**ETH1, "active": False})


# --------------------------------------------------------------------------- ports


def test_plan_ports_become_sorted_named_entries():
    assert probe_ports(PLAN_PORTS_MP) == [
        {"name": "api", "port": 8000}, {"name": "master", "port": 29501}, {"name": "dp_rpc", "port": 29550}]


def test_the_ray_worker_range_is_probed_at_its_ends_and_shared_numbers_merge():
    ports = probe_ports({"ray_min_worker": 10002, "ray_max_worker": 10999, "a": 7, "b": 7})
    assert ports == [{"name": "a/b", "port": 7}, {"name": "ray_min_worker", "port": 10002},
                     {"name": "ray_max_worker", "port": 10999}]


def test_a_plain_list_of_ports_is_accepted():
    assert probe_ports([29501, 22]) == [{"name": "port 22", "port": 22}, {"name": "port 29501", "port": 29501}]


@pytest.mark.parametrize("bad", [{"api": 0}, {"api": 70000}, {"api": "8000"}, {"api": True}])
def test_bad_ports_are_refused_with_name_and_value(bad):
    with pytest.raises(FabricError, match=r"port api=.* is not a TCP port number"):
        probe_ports(bad)


def test_targets_are_every_other_node_on_every_port():
    nodes = [{"host": f"node{k}", "address": f"10.232.0.1{k}"} for k in (1, 2, 3)]
    targets = tcp_targets(nodes, "node2", probe_ports(PLAN_PORTS_MP))
    assert [(t["host"], t["port"]) for t in targets] == [
        ("node1", 8000), ("node1", 29501), ("node1", 29550), ("node3", 8000), ("node3", 29501), ("node3", 29550)]
    assert targets[0] == {"host": "node1", "address": "10.232.0.11", "port": 8000, "name": "api"}


def test_targets_of_an_unknown_source_fail():
    with pytest.raises(FabricError, match="node9 is not one of the nodes"):
        tcp_targets([{"host": "node1", "address": "10.0.0.1"}], "node9", [])


# --------------------------------------------------------------------------- MTU


def test_equal_mtus_pass():
    assert check_mtu({"node1": 9000, "node2": 9000}, {"node1": "eth1", "node2": "eth1"}) == \
        {"ok": True, "expected": 9000, "message": ""}


def test_a_different_mtu_names_the_node_its_interface_and_value():
    result = check_mtu({"node1": 9000, "node2": 9000, "node3": 1500}, dict.fromkeys(["node1", "node2", "node3"], "eth1"))
    assert not result["ok"]
    assert result["message"].startswith(
        "fabric MTU mismatch: expected 9000 (the MTU of the first node, node1); node3 (eth1) has 1500.")


def test_a_prescribed_mtu_applies_to_every_node():
    result = check_mtu({"node1": 1500, "node2": 1500}, {"node1": "ib0", "node2": "ib0"}, expected=4092)
    assert "expected 4092 (nccl_network_mtu); node1 (ib0) has 1500, node2 (ib0) has 1500" in result["message"]


# --------------------------------------------------------------------------- InfiniBand


def test_nodes_that_declare_nothing_are_not_checked(fixtures_dir):
    down = ib_ports(fixtures_dir, "gpud-ibstat-h100-12hca-down-polling.txt")
    assert check_ib({"node1": {"ib_hcas": [], "expect_ib": False, "ib_ports": down}}, 400)["ok"]


def test_all_active_ports_at_the_expected_rate_pass(fixtures_dir):
    ports = ib_ports(fixtures_dir, "gpud-ibstat-h100-9hca-all-active.txt")
    hcas = sorted({p["ca"] for p in ports if p["link_layer"] == "InfiniBand"})
    assert check_ib({"node1": {"ib_hcas": hcas, "ib_ports": ports}}, 400) == {"ok": True, "problems": [], "message": ""}


def test_down_ports_of_a_real_capture_are_named_with_their_state(fixtures_dir):
    ports = ib_ports(fixtures_dir, "gpud-ibstat-h100-12hca-3-down-disabled.txt")
    down = [p for p in ports if p["state"] != "Active"]
    assert down, "the capture has down ports"
    result = check_ib({"node2": {"ib_hcas": [], "expect_ib": True, "ib_ports": ports}}, None)
    assert not result["ok"]
    for port in down:
        assert f"node2: {port['name']} is {port['state']}/{port['physical_state']}; expected Active/LinkUp" \
            in result["message"]
    assert result["message"].startswith(f"InfiniBand check failed on {len(down)} port")


def test_a_declared_port_selects_one_port_and_a_missing_hca_is_named(fixtures_dir):
    ports = ib_ports(fixtures_dir, "gpud-ibstat-h100-9hca-all-active.txt")
    result = check_ib({"node1": {"ib_hcas": ["mlx5_0:1", "mlx5_42"], "ib_ports": ports}}, 400)
    assert result["problems"] == [
        f"node1: HCA mlx5_42 is not present; ibstat lists {', '.join(sorted({p['ca'] for p in ports}))}"]


def test_a_port_at_the_wrong_rate_is_named(fixtures_dir):
    ports = ib_ports(fixtures_dir, "gpud-ibstat-h100-9hca-all-active.txt")
    result = check_ib({"node1": {"ib_hcas": ["mlx5_0"], "ib_ports": ports}}, 200)
    assert result["problems"] == ["node1: mlx5_0/1 runs at 400 Gb/s; expected 200 Gb/s"]


def test_declared_ib_without_any_port_fails():
    result = check_ib({"node3": {"ib_hcas": ["mlx5_0"], "ib_ports": []}}, 400)
    assert result["problems"] == ["node3 declares HCAs mlx5_0 but ibstat reports no InfiniBand port"]


# --------------------------------------------------------------------------- pairs


def results_for(nodes: list[str], ports: list[int], fail: set[tuple[str, str, int]] = frozenset()) -> dict:
    """port_probe results of an all-pairs run where the (source, destination, port) in ``fail`` timed out."""
    out = {}
    for source in nodes:
        out[source] = [
            {"kind": "tcp", "host": dest, "address": f"10.232.0.1{dest[-1]}", "port": port, "name": f"p{port}",
             "ok": (source, dest, port) not in fail,
             "error": "timed out after 3 s (packets dropped: firewall or no path)"
             if (source, dest, port) in fail else None}
            for dest in nodes if dest != source for port in ports
        ]
    return out


NODES = ["node1", "node2", "node3"]
IFACES = dict.fromkeys(NODES, "eth1")


def test_every_pair_connected_passes():
    result = check_pairs(results_for(NODES, [29501, 8000]), IFACES, NODES)
    assert result == {"ok": True, "checked": 12, "failures": [], "table": "", "message": ""}


def test_one_blocked_port_on_one_node_is_a_table_naming_both_nodes_port_and_interface():
    fail = {("node1", "node2", 29501), ("node3", "node2", 29501)}
    result = check_pairs(results_for(NODES, [29501, 8000], fail), IFACES, NODES)
    assert not result["ok"]
    lines = result["table"].splitlines()
    assert re.split(r"\s{2,}", lines[0]) == ["source", "destination", "address:port", "interface", "error"]
    assert re.split(r"\s{2,}", lines[1]) == ["node1", "node2", "10.232.0.12:29501 (p29501)", "eth1 -> eth1",
                                             "timed out after 3 s (packets dropped: firewall or no path)"]
    assert re.split(r"\s{2,}", lines[2])[:3] == ["node3", "node2", "10.232.0.12:29501 (p29501)"]
    assert result["message"].startswith("fabric reachability failed for 2 of 12 TCP connections:\n")
    assert "likely cause: every node fails to reach node2 on port 29501: a firewall rule on node2" in result["message"]


def test_a_node_unreachable_on_every_port_is_called_out():
    fail = {(s, "node3", p) for s in ("node1", "node2") for p in (29501, 8000)}
    result = check_pairs(results_for(NODES, [29501, 8000], fail), IFACES, NODES)
    assert "likely cause: node3 is unreachable on every port from every node" in result["message"]


def test_a_single_failing_pair_gets_no_guess():
    result = check_pairs(results_for(NODES, [29501], {("node1", "node3", 29501)}), IFACES, NODES)
    assert "likely cause" not in result["message"]
    assert len(result["failures"]) == 1


def test_a_node_that_sent_no_results_is_named():
    results = results_for(NODES, [29501])
    del results["node3"]
    result = check_pairs(results, IFACES, NODES)
    assert not result["ok"]
    assert result["message"] == "no probe results from node3 (the node failed or was unreachable earlier)"


def test_a_failed_path_mtu_probe_is_reported_beside_the_tcp_count():
    results = results_for(NODES, [29501])
    results["node1"].append({"kind": "mtu", "host": "node2", "address": "10.232.0.12", "port": 29597,
                             "name": "path MTU 9000", "ok": False,
                             "error": "9000-byte packets with Don't Fragment get no echo while 64-byte ones do"})
    result = check_pairs(results, IFACES, NODES)
    assert result["checked"] == 6
    assert result["message"].startswith("fabric reachability failed for 1 path-MTU probe:\n")
    assert "10.232.0.12:29597 (path MTU 9000)" in result["table"]


# --------------------------------------------------------------------------- the modules, for real


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def marked_processes(run_id: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[3:5] == [b"vllm-cluster-port-probe", run_id.encode()]:
            pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="module")
def module_runs(tmp_path_factory) -> dict:
    """fabric_env, fabric_check and port_probe through ansible-playbook on localhost; results by task name.

    port_probe listens and connects on 127.0.0.1 only, under a run id of its own.
    """
    root = tmp_path_factory.mktemp("fabric-modules")
    run_id = f"unit-{os.getpid()}"
    bound, closed = free_ports(2), free_ports(1)[0]
    interfaces = ["lo", "eth0", "eth1"]
    probe = {"run_id": run_id, "address": "127.0.0.1"}
    tasks = [
        ("env", "fabric_env", {"host": "node1", "interface": "eth1", "interfaces": interfaces,
                               "interface_facts": ETH1, "ib_hcas": ["mlx5_0", "mlx5_1"],
                               "extra_env": {"NCCL_IB_GID_INDEX": 3}}),
        ("env-missing", "fabric_env", {"host": "node1", "interface": "eth9", "interfaces": interfaces}),
        ("env-override", "fabric_env", {"host": "node1", "interface": "eth1", "interfaces": interfaces,
                                        "interface_facts": ETH1, "extra_env": {"VLLM_HOST_IP": "10.0.0.1"}}),
        ("env-declared", "fabric_env", {"host": "node1", "interface": "eth1", "interfaces": interfaces,
                                        "interface_facts": ETH1, "declared_address": "10.232.0.99"}),
        ("check-mtu", "fabric_check", {"checks": ["mtu", "ib"], "nodes": {
            "node1": {"interface": "eth1", "mtu": 9000}, "node2": {"interface": "eth1", "mtu": 1500}}}),
        ("listen", "port_probe", {**probe, "action": "listen", "identity": "other", "udp_port": bound[1],
                                  "ports": {"master": bound[0]}, "lifetime": 60}),
        ("connect", "port_probe", {**probe, "action": "connect", "identity": "self",
                                   "peers": {"other": "127.0.0.1", "ghost": "127.0.0.1"},
                                   "ports": {"master": bound[0], "closed": closed},
                                   "udp_port": bound[1], "mtu": 9000, "timeout": 2}),
        ("stop", "port_probe", {**probe, "action": "stop"}),
        ("stop-again", "port_probe", {**probe, "action": "stop"}),
    ]
    playbook = root / "modules.yml"
    playbook.write_text(json.dumps([{"name": "Fabric modules", "hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": name, f"vllm_ops.cluster.{module}": args, "ignore_errors": True} for name, module, args in tasks]}]),
        encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOCAL_TEMP=str(root / "tmp"),
               ANSIBLE_HOME=str(root / "home"), ANSIBLE_NOCOLOR="1")
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    try:
        completed = subprocess.run(
            [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
             "-e", f"ansible_python_interpreter={python}", str(playbook)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        report = json.loads(completed.stdout)
    finally:
        left = marked_processes(run_id)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    results = {task["task"]["name"]: task["hosts"]["localhost"] for task in report["plays"][0]["tasks"]}
    return {"results": results, "ports": bound, "closed": closed, "left": left}


def test_fabric_env_module_derives_the_env_with_extras(module_runs):
    result = module_runs["results"]["env"]
    assert not result.get("failed"), result.get("msg")
    assert result["env"] == {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "=mlx5_0,mlx5_1",
                             "NCCL_SOCKET_IFNAME": "eth1", "TP_SOCKET_IFNAME": "eth1", "VLLM_HOST_IP": "10.232.0.11"}
    assert (result["address"], result["mtu"], result["changed"]) == ("10.232.0.11", 9000, False)


def test_fabric_env_module_failures_name_host_interface_and_key(module_runs):
    results = module_runs["results"]
    assert results["env-missing"]["msg"].startswith(
        "node1: fabric interface 'eth9' does not exist; interfaces on node1: eth0, eth1, lo")
    assert results["env-override"]["msg"].startswith("node1: extra_env sets VLLM_HOST_IP, which are derived from")
    assert results["env-declared"]["msg"].startswith(
        "node1: vllm_cluster_fabric_address is 10.232.0.99 but eth1 has 10.232.0.11")


def test_fabric_check_module_fails_with_the_mtu_message(module_runs):
    result = module_runs["results"]["check-mtu"]
    assert result["failed"]
    assert result["msg"].startswith("fabric MTU mismatch: expected 9000 (the MTU of the first node, node1); "
                                    "node2 (eth1) has 1500.")
    assert result["ib"] == {"ok": True, "problems": []}


def test_port_probe_listens_connects_and_stops(module_runs):
    results, (tcp, udp), closed = module_runs["results"], module_runs["ports"], module_runs["closed"]
    listen = results["listen"]
    assert not listen.get("failed"), listen.get("msg")
    assert (listen["bound"], listen["in_use"], listen["udp_bound"]) == ([tcp], [], udp)
    by_key = {(r["kind"], r["host"], r["port"]): r for r in results["connect"]["results"]}
    assert by_key[("tcp", "other", tcp)]["ok"] and by_key[("tcp", "other", tcp)]["reached"] == "other"
    assert by_key[("tcp", "other", closed)]["error"].startswith("connection refused")
    assert by_key[("tcp", "ghost", tcp)]["error"].startswith("reached the listener of other instead of ghost")
    assert by_key[("mtu", "other", udp)]["ok"] and by_key[("mtu", "other", udp)]["size"] == 9000 - 28
    assert results["stop"]["stopped"] == [listen["pid"]]
    assert results["stop-again"]["stopped"] == []
    assert module_runs["left"] == []
