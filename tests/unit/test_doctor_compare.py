"""Every gathered fact is compared (issue 23, item 3): with the plan, the templates or the other nodes.

The base is the lab's real healthy evidence (tests/fixtures/doctor/lab/cases/healthy.json: 2-node mp deployment
lab-tiny-llama, node1 the head, eth1 the fabric at MTU 9000). That file was saved before doctor_gather read the
compared facts, so ``healthy()`` adds them as the current gatherer reports them on that deployment, from the
templates the deployment writes (vllm.service.j2: LimitNOFILE=1048576, LimitMEMLOCK=infinity, Environment=HOME and
TMPDIR; ray-node.service.j2: LimitNOFILE=65536) and what the lab's nodes are (the vllm user, every process sleeping,
room on the disk, the key file on the head matching the inventory's). Each case changes one fact on one node and
checks that the new signature is the first fault, on that node, with a fix that fits; the base unchanged gives no
new finding. The gather helpers that parse what a node prints are tested on samples captured for real.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat as stat_mod
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import diagnosis
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
    Cluster,
    evidence_from_registered,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations import OBSERVATIONS
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_config import (
    TEMPLATE_ENVIRONMENT,
    limit_value,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.render.vllm_unit import env_file_line
from ansible_collections.vllm_ops.cluster.plugins.modules import doctor_gather
from test_doctor_lab_cases import CASES, CATALOG

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3
# The signatures of the compared facts (the block "Compared facts (issue 23 item 3)" of signatures.yml).
NEW = {"fabric_link_down", "route_to_peer_wrong", "fabric_mtu_differs", "vllm_process_stopped", "vllm_process_zombie",
       "vllm_process_uninterruptible", "service_user_cannot_access", "disk_full_where_vllm_writes", "unit_overridden",
       "unit_limits_differ", "api_key_differs"}
HOME = "/var/lib/vllm-cluster"
MODEL = "/srv/models/tiny-llama"


def healthy():
    """The lab's healthy evidence with the compared facts as the current doctor_gather reports them there."""
    data = json.loads((CASES / "healthy.json").read_text(encoding="utf-8"))
    addresses = {node["host"]: node["address"] for node in data["plan"]["nodes"]}
    for host, gathered in zip(data["hosts"], data["gather"], strict=True):
        ev = gathered["evidence"]
        units = ev["units"]
        units["vllm.service"].update(
            LimitNOFILE="1048576", LimitNOFILESoft="1048576", LimitMEMLOCK="infinity", MemoryMax="infinity",
            MemoryHigh="infinity", WorkingDirectory=HOME, Environment=f"HOME={HOME} TMPDIR={HOME}/tmp")
        ray_env = (f"HOME={HOME}/ray RAY_USAGE_STATS_ENABLED=0 RAY_DASHBOARD_STARTUP_TIMEOUT_S=120 "
                   "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT=120")
        for name in ("ray-head.service", "ray-worker.service"):
            if units[name].get("LoadState") == "loaded":
                units[name].update(LimitNOFILE="65536", LimitNOFILESoft="65536", LimitMEMLOCK="infinity",
                                   Environment=ray_env)
        ev["unit_environment"] = {name: doctor_gather.parse_environment(info["Environment"])
                                  for name, info in units.items() if info.get("Environment")}
        ev["dropins"] = {}
        ev["processes"] = {unit: [{"pid": pid, "comm": "python3", "state": "S", "samples": "S", "ppid": 1}
                                  for pid in pids] for unit, pids in ev["unit_pids"].items()}
        ev["process_limits"] = {"vllm.service": {"pid": int(units["vllm.service"]["MainPID"]),
                                                 "open_files": [1048576, 1048576],
                                                 "locked_memory": ["unlimited", "unlimited"]}}
        ev["access"] = {"user": "vllm", "uid": 999, "gids": [999], "paths": [
            {"purpose": "model", "path": MODEL, "need": "r", "exists": True, "ok": True, "denied": None,
             "owner": "vllm", "group": "vllm", "mode": "0755", "checked": 5, "unreadable": 0, "denied_files": []},
            {"purpose": "home", "path": HOME, "need": "w", "exists": True, "ok": True, "denied": None,
             "owner": "vllm", "group": "vllm", "mode": "0750"},
            {"purpose": "TMPDIR", "path": f"{HOME}/tmp", "need": "w", "exists": True, "ok": True, "denied": None,
             "owner": "vllm", "group": "vllm", "mode": "0700"}]}
        ev["disk"] = [
            {"path": MODEL, "purpose": "model", "device": 2049, "free_bytes": 40 * GIB, "total_bytes": 100 * GIB,
             "free_inodes": 5_000_000, "total_inodes": 6_553_600},
            {"path": HOME, "purpose": "home", "device": 2049, "free_bytes": 40 * GIB, "total_bytes": 100 * GIB,
             "free_inodes": 5_000_000, "total_inodes": 6_553_600}]
        head = host == data["plan"]["nodes"][0]["host"]
        ev["api_key"] = {"path": "/etc/vllm-cluster/api-key.env", "exists": head, "has_key": head, "compared": True,
                         "inventory_has_key": True, "matches": True if head else None}
        ev["expected"] = {"mtu": None, "limits": {
            "vllm.service": {"LimitNOFILE": "1048576", "LimitMEMLOCK": "infinity", "MemoryMax": "infinity",
                             "MemoryHigh": "infinity"},
            "ray-head.service": {"LimitNOFILE": "65536", "LimitMEMLOCK": "infinity"},
            "ray-worker.service": {"LimitNOFILE": "65536", "LimitMEMLOCK": "infinity"}}}
        # The role now asks every node for its route to every other node of the plan.
        for peer, address in addresses.items():
            if peer != host:
                ev["routes"][address] = "eth1"
        ev["route_details"] = {address: {"dev": dev, "gateway": None, "prefsrc": addresses[host], "type": None}
                               for address, dev in ev["routes"].items()}
    return data


def gather(data, host):
    return data["gather"][data["hosts"].index(host)]["evidence"]


def diagnose(data):
    hosts = [{"host": h, "gather": g, "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    return diagnosis.diagnose(CATALOG, evidence_from_registered(data["plan"], hosts))


def top_fault(report):
    faults = [f for f in report["findings"] if f["severity"] == "fault"]
    assert faults, [f["id"] for f in report["findings"]]
    return faults[0]


def evidence_text(finding):
    return "\n".join(f"{item['node']} [{item['source']}] {item['line']}" for item in finding["evidence"])


def assert_filled(report):
    for finding in report["findings"]:
        for field in ("title", "cause", "fix", "verify"):
            assert not re.search(r"\{\w+\}", finding[field]), (finding["id"], field, finding[field])


# --- the base: nothing new fires on a healthy deployment -------------------------------------------------------------


def test_the_healthy_deployment_with_every_compared_fact_has_no_new_finding():
    # Fails if a comparison fires on what the deployment itself writes (its limits, HOME/TMPDIR, the key file on the
    # head only, routes over eth1, MTU 9000 on both nodes): the doctor would then cry wolf on every healthy run.
    report = diagnose(healthy())
    assert report["faults"] == 0, [(f["id"], f["nodes"], evidence_text(f)) for f in report["findings"]]
    assert [f["id"] for f in report["findings"]] == ["tp_across_nodes"]


def test_the_lab_evidence_saved_before_the_compared_facts_has_no_new_finding_either():
    # The saved lab evidence lacks the new facts (and its units predate LimitNOFILE/LimitMEMLOCK in the templates);
    # fails if a missing fact, or the old LimitMEMLOCK=8388608 the same on both nodes, were read as a fault.
    for path in sorted(CASES.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert not NEW & {f["id"] for f in diagnose(data)["findings"]}, path.name


# --- fabric: MTU, link state, routes ---------------------------------------------------------------------------------


def test_one_node_with_another_fabric_mtu_is_named_with_the_value_of_the_others():
    # Fails if the MTU is not compared between nodes, if the tie of two nodes picks the smaller MTU as the reference,
    # or if the fix does not say which interface, node and value.
    data = healthy()
    gather(data, "node2")["interfaces"]["eth1"]["mtu"] = 1500
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("fabric_mtu_differs", ["node2"])
    assert "node2: eth1 has mtu 1500; the other nodes' fabric interfaces have 9000" in evidence_text(top)
    assert "Set the MTU of eth1 on node2 to 9000 like the others" in top["fix"]
    assert "`ip link show eth1` on each node shows the same mtu (9000)" in top["verify"]
    assert_filled(report)


def test_the_inventory_mtu_decides_when_it_is_given():
    # With nccl_network_mtu=1500 the node at 9000 is the odd one even though the tie would pick 9000; fails if the
    # expected MTU the role passes is ignored.
    data = healthy()
    for host in data["hosts"]:
        gather(data, host)["expected"]["mtu"] = 1500
    gather(data, "node2")["interfaces"]["eth1"]["mtu"] = 1500
    top = top_fault(diagnose(data))
    assert (top["id"], top["nodes"]) == ("fabric_mtu_differs", ["node1"])
    assert "nccl_network_mtu have 1500" in evidence_text(top)


def test_a_fabric_link_down_is_the_cause_of_the_timeout_and_its_fix_is_the_link_not_a_firewall():
    # eth1 DOWN on node2 and node2's probe of the head's master port timing out. Fails if the link is not first, if
    # the blocked port does not follow from it, or if the fix speaks of a firewall rule for a link that is down.
    data = healthy()
    worker = gather(data, "node2")
    worker["interfaces"]["eth1"]["state"] = "DOWN"
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("fabric_link_down", ["node2"])
    assert "node2: eth1 state DOWN (mtu 9000, 10.232.4.12/24" in evidence_text(top)
    assert "`ip link set eth1 up`" in top["fix"] and "firewall rule" not in top["fix"].lower()
    assert_filled(report)
    # The consequence as the lab shows it: the connect to the head times out.
    worker["probes"][0].update(result="timeout", detail="timed out", elapsed_ms=3000)
    report = diagnose(data)
    assert top_fault(report)["id"] == "fabric_link_down"
    blocked = next(f for f in report["findings"] if f["id"] == "rendezvous_port_blocked")
    assert ("fabric_link_down", "node2") in [(r["id"], r["node"]) for r in blocked["follows_from"]]


def test_a_route_to_a_peer_off_the_fabric_is_named_with_the_interface_and_gateway():
    # node2's route to the head goes out eth0 through the management gateway. Fails if routes to peers are not
    # compared with the fabric interface, or the finding does not name node, peer, device and gateway.
    data = healthy()
    worker = gather(data, "node2")
    worker["routes"]["10.232.4.11"] = "eth0"
    worker["route_details"]["10.232.4.11"] = {"dev": "eth0", "gateway": "10.231.4.1", "prefsrc": "10.231.4.12",
                                              "type": None}
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("route_to_peer_wrong", ["node2"])
    assert "node2 -> 10.232.4.11 (node1): leaves by eth0 via 10.231.4.1, not the fabric interface eth1" in \
        evidence_text(top)
    assert "`ip route get 10.232.4.11` on node2 says dev eth1" in top["verify"]
    assert_filled(report)


def test_no_route_at_all_to_a_peer_is_named():
    # Fails if a failed `ip route get` (Network is unreachable) is dropped instead of compared.
    data = healthy()
    head = gather(data, "node1")
    head["routes"]["10.232.4.12"] = None
    head["route_details"]["10.232.4.12"] = {"error": "exited 2: RTNETLINK answers: Network is unreachable"}
    top = top_fault(diagnose(data))
    assert (top["id"], top["nodes"]) == ("route_to_peer_wrong", ["node1"])
    assert "no route (exited 2: RTNETLINK answers: Network is unreachable)" in evidence_text(top)


def test_a_node_that_lost_its_address_is_named_with_the_command_that_gives_it_back():
    # `ip addr del 10.232.4.11/24 dev eth1` on the head (the unseen-fault suite): its routes to the peers then leave by
    # eth0 and VLLM_HOST_IP names an address no interface holds. Fails if the address is not compared with the
    # interfaces, if the consequences outrank it, or if the fix says to change VLLM_HOST_IP (the setting is right).
    data = healthy()
    head = gather(data, "node1")
    head["interfaces"]["eth1"]["addresses"] = [a for a in head["interfaces"]["eth1"]["addresses"]
                                               if not a.startswith("10.232.4.11/")]
    head["routes"]["10.232.4.12"] = "eth0"
    head["route_details"]["10.232.4.12"] = {"dev": "eth0", "gateway": "10.231.4.1", "prefsrc": "10.231.4.11"}
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("address_missing", ["node1"])
    assert "node1: the plan's address 10.232.4.11 is on none of its interfaces (eth1: state UP" in evidence_text(top)
    assert "`ip addr add 10.232.4.11/24 dev eth1`" in top["fix"]
    ids = [f["id"] for f in report["findings"]]
    assert "vllm_host_ip_mismatch" not in ids, report["findings"]
    route = next(f for f in report["findings"] if f["id"] == "route_to_peer_wrong")
    assert ("address_missing", "node1") in [(r["id"], r["node"]) for r in route["follows_from"]]
    assert_filled(report)


# --- drop-ins and Environment= ---------------------------------------------------------------------------------------


def test_a_drop_in_with_an_environment_override_on_one_node_is_named_with_its_settings():
    # A hand-made drop-in on node2 that adds NCCL_P2P_DISABLE=1 (the argv and the env files still match the plan).
    # Fails if drop-ins are only read when the argv differs, or the finding does not quote the drop-in's lines.
    data = healthy()
    worker = gather(data, "node2")
    path = "/etc/systemd/system/vllm.service.d/override.conf"
    worker["units"]["vllm.service"]["DropInPaths"] = path
    worker["units"]["vllm.service"]["Environment"] += " NCCL_P2P_DISABLE=1"
    worker["unit_environment"]["vllm.service"]["NCCL_P2P_DISABLE"] = "1"
    worker["dropins"] = {"vllm.service": {path: {"lines": ["[Service]", "Environment=NCCL_P2P_DISABLE=1"]}}}
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("unit_overridden", ["node2"])
    assert f"node2: vllm.service carries {path} [Environment=NCCL_P2P_DISABLE=1]" in evidence_text(top)
    assert "NCCL_P2P_DISABLE=1 (beyond the template's HOME, TMPDIR, PYTHONPATH" in evidence_text(top)
    assert f"remove the drop-in ({path}" in top["fix"]
    assert_filled(report)


def test_a_machine_wide_drop_in_every_node_has_is_not_an_override():
    # Containers and some distributions give every service a drop-in (service.d/); fails if that reads as drift.
    data = healthy()
    for host in data["hosts"]:
        gather(data, host)["units"]["vllm.service"]["DropInPaths"] = "/run/systemd/system/service.d/zzz-lxc-service.conf"
    assert not NEW & {f["id"] for f in diagnose(data)["findings"]}


def test_a_drop_in_the_inventory_wants_is_not_an_override_and_another_still_is():
    # vllm_service_dropins_wanted reaches the doctor as expected.dropins_wanted; fails if the doctor and the deploy
    # disagree on what is foreign (the deploy keeps wanted.conf and removes cpu.conf).
    data = healthy()
    worker = gather(data, "node2")
    wanted, foreign = "/etc/systemd/system/vllm.service.d/wanted.conf", "/run/systemd/system/vllm.service.d/cpu.conf"
    worker["units"]["vllm.service"]["DropInPaths"] = wanted
    worker["dropins"] = {"vllm.service": {wanted: {"lines": ["[Service]", "Nice=5"]}}}
    worker.setdefault("expected", {})["dropins_wanted"] = {"vllm.service": ["wanted.conf"]}
    assert "unit_overridden" not in {f["id"] for f in diagnose(data)["findings"]}
    worker["units"]["vllm.service"]["DropInPaths"] = f"{wanted} {foreign}"
    worker["dropins"]["vllm.service"][foreign] = {"lines": ["[Service]", "CPUQuota=3%"]}
    top = top_fault(diagnose(data))
    assert (top["id"], top["nodes"]) == ("unit_overridden", ["node2"])
    assert f"node2: vllm.service carries {foreign} [CPUQuota=3%]" in evidence_text(top)
    assert wanted not in evidence_text(top)


def test_a_drop_in_that_lowers_a_limit_explains_the_limit():
    # The drop-in sets LimitNOFILE=1024: both findings, the drop-in first and the limit following from it. Fails if
    # the limit ranks first (its fix would not say where the change comes from).
    data = healthy()
    worker = gather(data, "node2")
    path = "/etc/systemd/system/vllm.service.d/limits.conf"
    worker["units"]["vllm.service"].update(DropInPaths=path, LimitNOFILE="1024", LimitNOFILESoft="1024")
    worker["dropins"] = {"vllm.service": {path: {"lines": ["[Service]", "LimitNOFILE=1024"]}}}
    report = diagnose(data)
    ids = [(f["id"], f["nodes"]) for f in report["findings"]]
    assert ids[:2] == [("unit_overridden", ["node2"]), ("unit_limits_differ", ["node2"])], ids
    assert [r["id"] for r in report["findings"][1]["follows_from"]] == ["unit_overridden"]


def test_the_catalog_knows_the_environment_the_template_writes():
    # Fails when vllm.service.j2 gains or loses an Environment= line and the comparison is not told.
    template = (REPO / "roles" / "vllm_service" / "templates" / "vllm.service.j2").read_text(encoding="utf-8")
    assert sorted(re.findall(r"^Environment=(\w+)=", template, re.M)) == sorted(TEMPLATE_ENVIRONMENT["vllm.service"])


# --- limits ----------------------------------------------------------------------------------------------------------


def test_a_lower_open_files_limit_than_the_deployment_sets_is_named():
    # Fails if LimitNOFILE is not compared with the doctor role's expected_limits, or the fix names no value.
    data = healthy()
    gather(data, "node2")["units"]["vllm.service"].update(LimitNOFILE="1024", LimitNOFILESoft="1024")
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("unit_limits_differ", ["node2"])
    assert "node2: vllm.service LimitNOFILE=1024 (the deployment sets 1048576)" in evidence_text(top)
    assert "Set LimitNOFILE=1048576 for vllm.service on node2" in top["fix"]
    assert_filled(report)


def test_a_memory_cap_on_the_unit_is_named():
    # MemoryMax=8G on node1 (the templates set none). Fails if memory caps are not compared.
    data = healthy()
    gather(data, "node1")["units"]["vllm.service"]["MemoryMax"] = str(8 * GIB)
    top = top_fault(diagnose(data))
    assert (top["id"], top["nodes"]) == ("unit_limits_differ", ["node1"])
    assert f"MemoryMax={8 * GIB} (the deployment sets infinity)" in evidence_text(top)


def test_a_process_that_started_before_the_limit_was_raised_is_named():
    # The unit says 1048576 but its running main process still has the 20000 of this machine's default (captured
    # below). Fails if the running process's limits are not compared.
    data = healthy()
    gather(data, "node1")["process_limits"]["vllm.service"]["open_files"] = [20000, 20000]
    top = top_fault(diagnose(data))
    assert (top["id"], top["nodes"]) == ("unit_limits_differ", ["node1"])
    assert "runs with open files 20000/20000 (soft/hard)" in evidence_text(top)
    assert "it started before the change" in evidence_text(top)


def test_a_machine_that_caps_every_node_alike_is_not_a_process_that_started_before_the_change():
    # Found on the lab: systemd in the nspawn nodes runs vLLM with 20000 open files and 8 MiB locked memory whatever
    # the unit says (the container's ceiling), on every node. Fails if the running limits are judged alone again.
    data = healthy()
    for host in data["hosts"]:
        limits = gather(data, host)["process_limits"].get("vllm.service")
        if limits:
            limits.update(open_files=[20000, 20000], locked_memory=[8388608, 8388608])
    report = diagnose(data)
    assert "unit_limits_differ" not in [f["id"] for f in report["findings"]], report["findings"]


def test_without_the_role_s_expectation_the_limits_are_compared_between_nodes():
    # Evidence gathered without expected_limits (an older role): the node with the lower limit is named.
    data = healthy()
    for host in data["hosts"]:
        gather(data, host)["expected"] = {}
    gather(data, "node2")["units"]["vllm.service"]["LimitNOFILE"] = "1024"
    top = top_fault(diagnose(data))
    assert (top["id"], top["nodes"]) == ("unit_limits_differ", ["node2"])
    assert "(the other nodes have 1048576)" in evidence_text(top)


def test_too_many_open_files_in_the_journal_is_the_limit_but_vllm_s_startup_warning_is_not():
    # The healthy lab journal holds vLLM's warning that quotes "`OSError: [Errno 24] Too many open files`"; the real
    # error is the exception line. Fails if the warning matched (a fault on every lab run) or the error did not.
    data = healthy()
    assert any("[Errno 24]" in line for line in gather(data, "node1")["journal"]["vllm.service"])
    gather(data, "node1")["journal"]["vllm.service"].append(
        "(APIServer pid=2082) OSError: [Errno 24] Too many open files: '/proc/2082/fd'")
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("unit_limits_differ", ["node1"])
    assert_filled(report)


def test_limit_values_as_systemd_and_proc_print_them():
    assert limit_value("infinity") == limit_value("unlimited") > limit_value("1048576") == 1048576
    assert limit_value("64M") == 64 * 1024**2 and limit_value("8388608") == 8 * 1024**2
    assert limit_value("garbage") is None


def test_the_doctor_expects_the_limits_the_templates_set():
    # Fails when a template's limit changes and the doctor role still expects the old one.
    defaults = yaml.safe_load((REPO / "roles" / "doctor" / "defaults" / "main.yml").read_text(encoding="utf-8"))
    expected = defaults["doctor_expected_limits"]
    vllm = (REPO / "roles" / "vllm_service" / "templates" / "vllm.service.j2").read_text(encoding="utf-8")
    ray = (REPO / "roles" / "ray_cluster" / "templates" / "ray-node.service.j2").read_text(encoding="utf-8")
    assert "LimitNOFILE={{ vllm_service_limit_nofile }}" in vllm and "vllm_service_limit_nofile" in \
        expected["vllm.service"]["LimitNOFILE"]
    assert "LimitMEMLOCK={{ vllm_service_limit_memlock }}" in vllm and "vllm_service_limit_memlock" in \
        expected["vllm.service"]["LimitMEMLOCK"]
    assert "LimitNOFILE=65536" in ray and expected["ray-worker.service"]["LimitNOFILE"] == 65536
    assert "MemoryMax" not in vllm and expected["vllm.service"]["MemoryMax"] == "infinity"


# --- process states --------------------------------------------------------------------------------------------------


def set_state(data, host, state, samples=None, wchan=None):
    worker = gather(data, host)
    proc = worker["processes"]["vllm.service"][0]
    proc.update(state=state, samples=samples or state, comm="VLLM::Worker_TP", wchan=wchan)
    return proc


def test_a_stopped_vllm_process_is_named_with_kill_cont():
    # Fails if process states are not read, or the fix is not "kill -CONT <pid> or restart the unit".
    data = healthy()
    proc = set_state(data, "node2", "T", wchan="do_signal_stop")
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("vllm_process_stopped", ["node2"])
    assert f"node2: pid {proc['pid']} (VLLM::Worker_TP) of vllm.service is stopped (state T)" in evidence_text(top)
    assert f"`kill -CONT {proc['pid']}`" in top["fix"] and "systemctl restart vllm.service" in top["fix"]
    assert_filled(report)


def test_a_zombie_vllm_process_is_named_with_its_parent():
    # Fails if a zombie read at every sample is not a finding, or the fix pretends a zombie can be killed.
    data = healthy()
    proc = set_state(data, "node1", "Z", samples="ZZZ")
    proc["ppid"] = 2082
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("vllm_process_zombie", ["node1"])
    assert "its parent (pid 2082) has not reaped it" in top["cause"]
    assert "systemctl restart vllm.service" in top["fix"] and "kill -CONT" not in top["fix"]
    assert_filled(report)


def test_a_process_in_d_state_at_every_reading_is_named_with_where_it_waits():
    # Fails if D state is not compared, or the fix does not lead to the I/O it waits for.
    data = healthy()
    set_state(data, "node2", "D", samples="DDD", wchan="rpc_wait_bit_killable")
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("vllm_process_uninterruptible", ["node2"])
    assert "rpc_wait_bit_killable" in top["cause"] and "cat /proc/" in top["fix"]
    assert_filled(report)


def test_a_brief_d_or_z_state_is_not_a_finding():
    # A process reading a file is in D for a moment; fails if one reading of D (then S) counted.
    data = healthy()
    set_state(data, "node2", "D", samples="DSS")
    set_state(data, "node1", "Z", samples="Z--")
    assert not NEW & {f["id"] for f in diagnose(data)["findings"]}


# --- ownership and permissions as the service user; free space ---------------------------------------------------------


def test_model_files_the_service_user_cannot_read_are_named_with_owner_and_mode():
    # The lab story: the model directory read as root looked fine. Fails if the files are not judged as the unit's
    # User=, or the fix is not a chmod/chown that gives the service user read access.
    data = healthy()
    model = gather(data, "node2")["access"]["paths"][0]
    model.update(unreadable=1, denied_files=[f"{MODEL}/model.safetensors (mode 0600, owner root:root)"])
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("service_user_cannot_access", ["node2"])
    assert f"node2: vllm (User= of vllm.service) cannot read 1 of the 5 entries under {MODEL}" in evidence_text(top)
    assert f"`chmod -R a+rX {MODEL}`" in top["fix"]
    assert f"runuser -u vllm -- find {MODEL} ! -readable" in top["verify"]
    assert_filled(report)


def test_a_home_the_service_user_cannot_write_is_named():
    # Fails if the places vLLM writes are not judged as the service user, or the fix is not a chown to that user.
    data = healthy()
    home = gather(data, "node1")["access"]["paths"][1]
    home.update(ok=False, owner="root", group="root", mode="0755",
                denied=f"{HOME} (mode 0755, owner root:root): no write permission")
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("service_user_cannot_access", ["node1"])
    assert f"cannot write {HOME} (home of vllm.service)" in evidence_text(top)
    assert f"`chown -R vllm: {HOME}`" in top["fix"]
    assert_filled(report)


def test_a_full_filesystem_where_vllm_writes_is_named():
    # Fails if the free space of the home is not compared, or the model's (read-only) filesystem counts.
    data = healthy()
    gather(data, "node2")["disk"][1].update(free_bytes=200 * 1024**2)
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("disk_full_where_vllm_writes", ["node2"])
    assert f"node2: 0.20 GiB free (0%), 5000000 inodes free on the filesystem of {HOME}" in evidence_text(top)
    assert f"`df -h {HOME}`" in top["verify"]
    assert_filled(report)
    data = healthy()
    gather(data, "node2")["disk"][0].update(free_bytes=0)
    assert not NEW & {f["id"] for f in diagnose(data)["findings"]}


def test_no_space_left_in_the_journal_is_the_disk():
    # Fails if Errno 28 in the journal does not name the disk (with the path it names).
    data = healthy()
    gather(data, "node1")["journal"]["vllm.service"].append(
        f"OSError: [Errno 28] No space left on device: '{HOME}/tmp/torchinductor_vllm/x.so'")
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("disk_full_where_vllm_writes", ["node1"])
    assert f"`df -h {HOME}/tmp/torchinductor_vllm/x.so`" in top["verify"]
    assert_filled(report)


# --- the API key -----------------------------------------------------------------------------------------------------


def test_a_key_file_that_is_not_the_inventory_s_key_explains_the_401():
    # The head's key file holds another key; the controller's probes get 401. Fails if the key file is not compared,
    # or the silent API ranks first.
    data = healthy()
    gather(data, "node1")["api_key"]["matches"] = False
    data["client"] = None
    report = diagnose(data)
    top = top_fault(report)
    assert (top["id"], top["nodes"]) == ("api_key_differs", ["node1"])
    assert "holds another key than the inventory's vllm_cluster_api_key (their SHA-256 differ)" in evidence_text(top)
    assert "deploy.yml" in top["fix"]
    assert_filled(report)
    hosts = [{"host": h, "gather": g, "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    client = {"url": "http://10.231.4.11:8000", "probes": [
        {"probe": "GET /v1/models", "ok": False, "status": 401, "error": "HTTP Error 401: Unauthorized",
         "elapsed_s": 0}]}
    report = diagnosis.diagnose(CATALOG, evidence_from_registered(data["plan"], hosts, client))
    assert top_fault(report)["id"] == "api_key_differs"
    silent = next(f for f in report["findings"] if f["id"] == "api_unanswered_from_controller")
    assert [r["id"] for r in silent["follows_from"]] == ["api_key_differs"]


def test_a_missing_key_file_on_the_api_node_is_named_but_not_on_a_worker():
    # Fails if a headless worker (which never has the file) is flagged, or the API node without its file is not.
    data = healthy()
    gather(data, "node1")["api_key"].update(exists=False, has_key=False, matches=None)
    top = top_fault(diagnose(data))
    assert (top["id"], top["nodes"]) == ("api_key_differs", ["node1"])
    assert "does not exist: vLLM serves without the inventory's key" in evidence_text(top)


# --- the gather helpers, on what nodes really print ------------------------------------------------------------------

# /proc/<pid>/stat captured on this project's build machine (Debian 12, kernel of the CI host), 2026-12-02:
# a process stopped with SIGSTOP, a zombie child before its parent waited for it, and a process whose comm was
# set (prctl PR_SET_NAME) to "VLLM::Worker (1)" - truncated by the kernel to 15 characters, a space and a "(" in it.
STAT_STOPPED = ("19962 (bash) T 19959 19959 13085 0 -1 4194368 85 0 0 0 0 0 0 0 20 0 1 0 200307 4722688 396 "
                "18446744073709551615 94078485778432 94078486567837 140732077651328 0 0 0 65536 6 81920 1 0 0 17 0 0 0 "
                "0 0 0 94078486801136 94078486849380 94078822838272 140732077656957 140732077656972 140732077656972 "
                "140732077658090 19\n")
STAT_ZOMBIE = ("20013 (python3) Z 19968 19959 13085 0 -1 4227148 232 0 0 0 0 0 0 0 20 0 1 0 200395 0 0 "
               "18446744073709551615 0 0 0 0 0 0 0 16781312 2 1 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
STAT_PAREN = ("20017 (VLLM::Worker (1) S 19968 19959 13085 0 -1 4194304 1973 0 0 0 4 0 0 0 20 0 1 0 200425 17162240 3415 "
              "18446744073709551615 94300609507328 94300609507669 140735664361600 0 0 0 0 16781312 2 1 0 0 17 0 0 0 0 "
              "0 0 94300609519024 94300609519640 94301643616256 140735664367811 140735664367913 140735664367913 "
              "140735664369615 0\n")
# /proc/self/limits on the same machine (its open files limit of 20000 is what vLLM warned about on the lab).
LIMITS = """Limit                     Soft Limit           Hard Limit           Units     
Max cpu time              unlimited            unlimited            seconds   
Max file size             unlimited            unlimited            bytes     
Max data size             unlimited            unlimited            bytes     
Max stack size            8388608              unlimited            bytes     
Max core file size        0                    unlimited            bytes     
Max resident set          unlimited            unlimited            bytes     
Max processes             96363                96363                processes 
Max open files            20000                20000                files     
Max locked memory         8388608              8388608              bytes     
Max address space         unlimited            unlimited            bytes     
Max file locks            unlimited            unlimited            locks     
"""  # noqa: W291 - the kernel pads every column with spaces


def test_proc_stat_gives_the_state_letter_whatever_the_comm_holds():
    # Fails if the comm is split at its own ")" or space (the state would be read from the wrong field).
    assert doctor_gather.parse_proc_stat(STAT_STOPPED) == {"pid": 19962, "comm": "bash", "state": "T", "ppid": 19959}
    assert doctor_gather.parse_proc_stat(STAT_ZOMBIE)["state"] == "Z"
    assert doctor_gather.parse_proc_stat(STAT_PAREN) == {"pid": 20017, "comm": "VLLM::Worker (1", "state": "S",
                                                         "ppid": 19968}
    assert doctor_gather.parse_proc_stat("") is None and doctor_gather.parse_proc_stat("garbage") is None


def test_proc_limits_give_open_files_and_locked_memory():
    assert doctor_gather.parse_proc_limits(LIMITS) == {"open_files": [20000, 20000],
                                                        "locked_memory": [8388608, 8388608]}
    assert doctor_gather.parse_proc_limits("Max open files unlimited unlimited files\n") == {
        "open_files": ["unlimited", "unlimited"]}


def test_the_process_states_of_this_test_are_read_from_proc():
    # The module's reader on a live process: this one is running (R) or sleeping (S). Fails if /proc is misread.
    entry = doctor_gather.read_proc_stat(os.getpid())
    assert entry["pid"] == os.getpid() and entry["state"] in "RS" and entry["samples"] == entry["state"]


def test_environment_as_systemctl_prints_it_is_read_and_secrets_redacted():
    secret = re.compile("(?i)(token|secret|password|passwd|key)")
    parsed = doctor_gather.parse_environment(f'HOME={HOME} "EXTRA=a b" TMPDIR={HOME}/tmp')
    assert parsed == {"HOME": HOME, "EXTRA": "a b", "TMPDIR": f"{HOME}/tmp"}
    assert doctor_gather.redact_vars({"VLLM_API_KEY": "k", "A": "1"}, secret) == {"VLLM_API_KEY": "<redacted>", "A": "1"}
    line = doctor_gather.redact_setting("Environment=VLLM_API_KEY=abc NCCL_P2P_DISABLE=1", secret)
    assert "abc" not in line and "NCCL_P2P_DISABLE=1" in line
    assert doctor_gather.redact_setting("LimitNOFILE=1024", secret) == "LimitNOFILE=1024"
    # A drop-in that overrides ExecStart with a key on the command line (what vllm_service never does): fails if the
    # key reached the evidence.
    line = doctor_gather.redact_setting("ExecStart=/opt/vllm-cluster/venv/bin/vllm serve m --api-key abc --port 8000",
                                        secret)
    assert line == "ExecStart=/opt/vllm-cluster/venv/bin/vllm serve m --api-key <redacted> --port 8000"
    assert doctor_gather.redact_setting("ExecStart=/bin/x HF_TOKEN=abc", secret) == "ExecStart=/bin/x HF_TOKEN=<redacted>"
    assert doctor_gather.redact_setting("EnvironmentFile=/etc/vllm-cluster/api-key.env", secret) == \
        "EnvironmentFile=/etc/vllm-cluster/api-key.env"


@pytest.mark.parametrize("key", ["plainKey123", 'qu"ote', "dollar$HOME", "back\\slash", "tick`x", "all\\\"$`"])
def test_the_key_file_vllm_service_writes_gives_back_the_key(key):
    # The file as vllm_service renders it (env_file_line escapes \ " $ `); fails if the digest compared on the node
    # would be of another string than the inventory's key (every key with such a character would read as different).
    text = "# managed\n" + env_file_line("VLLM_API_KEY", key) + "\n"
    assert doctor_gather.env_file_value(text, "VLLM_API_KEY") == key
    assert doctor_gather.env_file_value("VLLM_API_KEY='a\\b'\n", "VLLM_API_KEY") == "a\\b"
    assert doctor_gather.env_file_value("VLLM_API_KEY=a\\ b\n", "VLLM_API_KEY") == "a b"


def fake_module(tmp_path, **params):
    base = {"plan_dir": str(tmp_path), "api_key_file": None, "api_key_sha256": None, "timeout": 5,
            "redact": "(?i)(token|secret|password|passwd|key)"}
    return SimpleNamespace(params={**base, **params}, get_bin_path=lambda name: None)


def test_the_key_file_is_compared_by_digest_and_neither_key_nor_digest_is_returned(tmp_path):
    # Fails if the module returns the key or its digest, or compares anything else than the SHA-256 of the key.
    key = "s3cr$t-\"key\""
    (tmp_path / "api-key.env").write_text(env_file_line("VLLM_API_KEY", key) + "\n")
    digest = hashlib.sha256(key.encode()).hexdigest()
    result = doctor_gather.Gatherer(fake_module(tmp_path, api_key_sha256=digest)).api_key()
    assert result == {"path": str(tmp_path / "api-key.env"), "exists": True, "has_key": True, "compared": True,
                      "inventory_has_key": True, "matches": True}
    other = doctor_gather.Gatherer(fake_module(tmp_path, api_key_sha256=hashlib.sha256(b"x").hexdigest())).api_key()
    assert other["matches"] is False
    assert key not in json.dumps(result) and digest not in json.dumps(result) and "s3cr" not in json.dumps(other)
    missing = doctor_gather.Gatherer(fake_module(tmp_path / "none", api_key_sha256=digest)).api_key()
    assert (missing["exists"], missing["matches"]) == (False, None)
    unchecked = doctor_gather.Gatherer(fake_module(tmp_path)).api_key()
    assert (unchecked["compared"], unchecked["matches"]) == (False, None)


def test_the_key_digest_is_hidden_in_ansible_s_output():
    # Fails if api_key_sha256 lost no_log in the module's argument spec (Ansible would print it with -v).
    source = (REPO / "plugins" / "modules" / "doctor_gather.py").read_text(encoding="utf-8")
    assert '"api_key_sha256": {"type": "str", "no_log": True}' in source


def fake_stat(table):
    """os.stat over a table {path: (mode, uid, gid)}; FileNotFoundError elsewhere."""
    def stat(path):
        if path not in table:
            raise FileNotFoundError(path)
        mode, uid, gid = table[path]
        return SimpleNamespace(st_mode=mode, st_uid=uid, st_gid=gid)
    return stat


DIR, FILE = stat_mod.S_IFDIR, stat_mod.S_IFREG


def test_access_is_judged_as_the_service_user_through_every_directory_above():
    # vllm is uid 999; root owns everything. Fails if a directory above without x, a model without r, or a home
    # without w is not found, or the owner's bits are not the only ones that count for the owner.
    table = {"/": (DIR | 0o755, 0, 0), "/srv": (DIR | 0o700, 0, 0), "/srv/models": (DIR | 0o755, 0, 0),
             "/srv/models/m": (DIR | 0o755, 0, 0), "/var": (DIR | 0o755, 0, 0), "/var/lib": (DIR | 0o755, 0, 0),
             "/var/lib/vllm-cluster": (DIR | 0o755, 0, 0), "/opt": (DIR | 0o755, 0, 0),
             "/opt/m": (DIR | 0o075, 999, 999)}
    access = lambda path, need, t=table: doctor_gather.path_access(path, 999, [999], need, stat=fake_stat(t),  # noqa: E731
                                                                   has_acl=lambda p: False)
    blocked = access("/srv/models/m", "r")
    assert blocked["ok"] is False and blocked["denied"] == "/srv (mode 0700, owner root:root): no search (x) permission"
    home = access("/var/lib/vllm-cluster", "w")
    assert home["ok"] is False and "no write permission" in home["denied"]
    assert access("/var/lib/vllm-cluster", "r")["ok"] is True
    owner_only = access("/opt/m", "r")  # group and others may, the owner (vllm) may not: the kernel says no
    assert owner_only["ok"] is False
    cache = access("/var/lib/vllm-cluster/.cache/huggingface", "w")
    assert cache["exists"] is False and cache["created_in"] == "/var/lib/vllm-cluster" and cache["ok"] is False
    assert access("/nowhere/model", "r")["ok"] is None  # a missing model is model_missing's finding
    acl = doctor_gather.path_access("/var/lib/vllm-cluster", 999, [999], "w", stat=fake_stat(table),
                                    has_acl=lambda p: p == "/var/lib/vllm-cluster")
    assert acl["ok"] is None and acl["acl"] is True  # an ACL may allow it: not judged by the mode bits


def test_the_model_tree_is_read_as_the_service_user_on_a_real_directory(tmp_path):
    # Real files with real modes, judged for a uid that owns none of them. Fails if an unreadable weight file or
    # an unsearchable subdirectory under the model directory is missed.
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_text("x")
    (model / "sub" / "tokenizer.json").write_text("{}")
    os.chmod(model / "config.json", 0o644)
    os.chmod(model / "model.safetensors", 0o600)
    os.chmod(model / "sub", 0o700)
    uid = os.getuid() + 4242
    found = doctor_gather.tree_access(str(model), uid, [uid])
    assert found["unreadable"] == 2 and found["checked"] == 3
    assert any(text.startswith(f"{model}/model.safetensors (mode 0600") for text in found["denied_files"])
    assert any(text.startswith(f"{model}/sub (mode 0700") for text in found["denied_files"])
    os.chmod(model / "sub", 0o755)
    os.chmod(model / "model.safetensors", 0o644)
    assert doctor_gather.tree_access(str(model), uid, [uid])["unreadable"] == 0


# The values each new observation's hits carry (test_doctor_catalog.py checks the older ones the same way).
NEW_OBSERVATION_VALUES = {
    "fabric_mtu_differs": {"interface", "mtu", "expected", "mtus"},
    "fabric_link_down": {"interface", "state"},
    "route_to_peer_wrong": {"address", "peer", "interface", "device", "problem"},
    "unit_overridden": {"unit", "dropins", "overrides"},
    "unit_limits_differ": {"unit", "limit", "value", "expected"},
    "process_state": {"unit", "pid", "comm", "state", "ppid", "wchan"},
    "service_user_access": {"user", "path", "need", "denied", "remedy", "check"},
    "disk_low": {"path", "free_gib", "free_inodes", "min_free_gib"},
    "api_key_differs": {"path", "problem"},
}


def test_every_placeholder_of_the_new_signatures_is_filled_by_each_of_their_rules():
    # Fails if a title, cause, fix or verify of the block names a value that one of its rules (an observation, or
    # a log pattern with its groups) does not give and the signature has no default for.
    plan_values = {"tp", "pp", "dp", "world_size", "model_path", "heads", "backend", "head_node", "head_address",
                   "nodes", "node", "port_api", "port_master", "port_dp_rpc", "gpus_per_node"}
    for sig in CATALOG["signatures"]:
        if sig["id"] not in NEW:
            continue
        for rule in sig["rules"]:
            available = plan_values | set(sig["defaults"])
            if "log" in rule:
                available |= set(rule["log"]["regex"].groupindex)
            else:
                available |= NEW_OBSERVATION_VALUES[rule["observation"]]
            for field in ("title", "cause", "fix", "verify"):
                for name in re.findall(r"\{(\w+)\}", sig[field]):
                    assert name in available, f"{sig['id']}.{field}: {{{name}}} is not set when rule {rule} matches"


def test_the_observations_return_the_values_the_placeholders_need():
    # Each observation's hits, on the cases above, carry exactly the values listed (a renamed value fails here).
    data = healthy()
    worker, head = gather(data, "node2"), gather(data, "node1")
    worker["interfaces"]["eth1"].update(mtu=1500)
    head["interfaces"]["eth1"]["state"] = "DOWN"
    worker["routes"]["10.232.4.11"] = "eth0"
    worker["units"]["vllm.service"]["DropInPaths"] = "/etc/systemd/system/vllm.service.d/x.conf"
    worker["units"]["vllm.service"]["LimitNOFILE"] = "1024"
    set_state(data, "node2", "T")
    worker["access"]["paths"][0].update(unreadable=1, denied_files=["x"])
    worker["disk"][1].update(free_bytes=0)
    head["api_key"]["matches"] = False
    hosts = [{"host": h, "gather": g, "gpu": p, "ib": i}
             for h, g, p, i in zip(data["hosts"], data["gather"], data["gpu"], data["ib"], strict=True)]
    cluster = Cluster(evidence_from_registered(data["plan"], hosts))
    for name, values in NEW_OBSERVATION_VALUES.items():
        hits = OBSERVATIONS[name](cluster, {})
        assert hits, name
        for hit in hits:
            assert set(hit["values"]) == values, (name, hit["values"])


def test_an_outgoing_rule_on_the_worker_is_quoted_as_the_drop():
    # `nft ... output ... ip daddr <head> tcp dport 29501 drop` on node2 (the unseen-fault suite): the head has no
    # rule, node2's own does. Fails if only the head's (incoming) rules are read for a blocked probe.
    data = healthy()
    worker = gather(data, "node2")
    worker["probes"][0].update(result="timeout", detail="timed out", elapsed_ms=3001)
    worker["firewall"] = {"tool": "nft list ruleset", "rules": ["ip daddr 10.232.4.11 tcp dport 29501 drop"],
                          "accepted_sources": {}}
    top = top_fault(diagnose(data))
    assert (top["id"], top["nodes"]) == ("rendezvous_port_blocked", ["node2"])
    assert ("ip daddr 10.232.4.11 tcp dport 29501 drop  <- node2 drops its own connections to 10.232.4.11:29501 "
            "(master) on the way out") in evidence_text(top)
    assert "10.232.4.11:29501" in top["fix"]
