"""plugins/module_utils/render/nft_policy.py: the node firewall's nftables table, built from the plan."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.render.nft_policy import (
    FirewallError,
    api_mode,
    build_policy,
    controller_addresses,
    merge_spans,
    protected_spans,
    render_ruleset,
    split_networks,
    trusted_addresses,
)
from hypothesis import given
from hypothesis import strategies as st

# The lab's 2-node mp plan (node3 is in the inventory, not in the plan).
MP_PLAN = {
    "deployment": "lab-tiny-llama",
    "nodes": [
        {"host": "node1", "address": "10.232.2.11", "node_rank": 0},
        {"host": "node2", "address": "10.232.2.12", "node_rank": 1},
    ],
    "ports": {"api": 8000, "master": 29501, "dp_rpc": 29550},
    "cluster": {"nodes": [{"name": "node1", "address": "10.232.2.11"}, {"name": "node2", "address": "10.232.2.12"},
                          {"name": "node3", "address": "10.232.2.13"}]},
}


def nft_check(text: str, tmp_path) -> subprocess.CompletedProcess:
    """nftables' own parser in check mode (`nft -c`): nothing is loaded."""
    path = tmp_path / "policy.nft"
    path.write_text(text)
    return subprocess.run([shutil.which("nft") or "/usr/sbin/nft", "-c", "-f", str(path)],
                          capture_output=True, text=True, timeout=30, check=False)


def test_scope_deployment_is_every_planned_host_and_scope_plan_the_ranked_ones():
    everyone = build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=[])
    assert everyone["scope"] == "deployment"
    assert everyone["cluster_addresses"] == ["10.232.2.11", "10.232.2.12", "10.232.2.13"]
    ranked = build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=[], scope="plan")
    assert ranked["cluster_addresses"] == ["10.232.2.11", "10.232.2.12"]
    assert "Cluster nodes (scope plan): node1 10.232.2.11, node2 10.232.2.12." in ranked["ruleset"]
    with pytest.raises(FirewallError, match="scope 'all': expected one of deployment, plan"):
        build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=[], scope="all")


def test_mp_plan_protects_master_dp_rpc_ray_and_ephemeral_ports():
    policy = build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=["0.0.0.0/0"], scope="plan")
    assert policy["api_port"] == 8000
    assert policy["cluster_addresses"] == ["10.232.2.11", "10.232.2.12"]
    assert policy["protected_ports"] == ["6379-6384", "8265", "10001-10999", "29501", "29550",
                                         "32768-60999"]
    # 52365 (dashboard agent) is inside the ephemeral range: merged away, still protected.
    text = policy["ruleset"]
    assert "elements = { 10.232.2.11, 10.232.2.12 }" in text
    assert "tcp dport 8000 ip saddr @api_v4 accept" in text
    assert "tcp dport { 6379-6384, 8265, 10001-10999, 29501, 29550, 32768-60999 } counter drop" in text
    # The order is the policy: API decisions before the cluster's blanket accept, drops last.
    order = [text.index(s) for s in ("ct state established,related accept", "tcp dport 8000 counter drop",
                                     "\n    ip saddr @cluster_v4 accept", "tcp dport { 6379")]
    assert order == sorted(order)


def test_ruleset_replaces_its_table_atomically_and_keeps_policy_accept():
    text = build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=[])["ruleset"]
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body[:3] == ["table inet vllm_cluster", "delete table inet vllm_cluster", "table inet vllm_cluster {"]
    assert "policy accept;" in text
    assert "policy drop" not in text


def test_ruleset_parses_with_nft(tmp_path):
    policy = build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=["10.231.2.0/24", "2001:db8::/32"],
                          extra_protected_ports=["9000-9010", "9100"], extra_cluster_addresses=["fd00::5"])
    checked = nft_check(policy["ruleset"], tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "elements = { 2001:db8::/32 }" in policy["ruleset"]
    assert "elements = { fd00::5 }" in policy["ruleset"]


def test_empty_sets_parse_with_nft(tmp_path):
    policy = build_policy(table="t1", plan=MP_PLAN, api_cidrs=[], include_ray_defaults=False, ephemeral_range=None)
    assert policy["protected_ports"] == ["29501", "29550"]
    checked = nft_check(policy["ruleset"], tmp_path)
    assert checked.returncode == 0, checked.stderr


def test_ray_plan_ports_win_over_ray_defaults():
    plan = dict(MP_PLAN, ports={"api": 8000, "ray_gcs": 7000, "ray_dashboard": 7001, "ray_min_worker": 20000,
                                "ray_max_worker": 20100})
    spans = build_policy(table="vllm_cluster", plan=plan, api_cidrs=[], ephemeral_range=None)["protected_ports"]
    assert "7000-7001" in spans
    assert "20000-20100" in spans
    assert "6380-6384" in spans          # the Ray defaults the plan does not set stay protected


def test_api_port_inside_a_protected_range_is_refused():
    plan = dict(MP_PLAN, ports={"api": 40000, "master": 29501})
    with pytest.raises(FirewallError, match="API port 40000 falls inside a protected port range"):
        build_policy(table="vllm_cluster", plan=plan, api_cidrs=[])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"api_cidrs": ["10.0.0.300/8"]}, "API CIDR: '10.0.0.300/8' is not an IP address or CIDR"),
    ({"table": "bad-name"}, "table name 'bad-name'"),
    ({"ephemeral_range": [60999, 32768]}, "port range 60999-32768"),
    ({"extra_protected_ports": ["70000"]}, "port extra port 0=70000: expected 1-65535"),
])
def test_bad_inputs_name_the_value(kwargs, message):
    arguments = {"table": "vllm_cluster", "plan": MP_PLAN, "api_cidrs": []} | kwargs
    with pytest.raises(FirewallError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_policy(**arguments)


def test_scope_deployment_needs_the_plans_cluster_nodes():
    plan = {key: value for key, value in MP_PLAN.items() if key != "cluster"}
    with pytest.raises(FirewallError, match="plan cluster.nodes: empty"):
        build_policy(table="vllm_cluster", plan=plan, api_cidrs=[])


def test_plan_without_nodes_is_refused():
    with pytest.raises(FirewallError, match="expected the deployment plan with nodes and ports"):
        build_policy(table="vllm_cluster", plan={"ports": {"api": 8000}}, api_cidrs=[])


def test_no_cluster_address_is_refused():
    with pytest.raises(FirewallError, match="none given"):
        render_ruleset(table="t", cluster_addresses=[], api_port=8000, api_cidrs=[], protected=[(1, 2)])


def test_split_networks_normalises_and_deduplicates():
    assert split_networks(["10.0.0.5", "10.0.0.5/32", "10.1.2.3/16", "::1"], "x") == (
        ["10.0.0.5", "10.1.0.0/16"], ["::1"])


def test_protected_spans_refuses_half_a_ray_worker_range():
    with pytest.raises(FirewallError, match="ray_min_worker and ray_max_worker"):
        protected_spans({"ray_min_worker": 10002}, api_port=8000, include_ray_defaults=False)


@given(st.lists(st.tuples(st.integers(1, 65535), st.integers(0, 200)), max_size=30))
def test_merged_spans_cover_exactly_the_same_ports_without_overlap(raw):
    spans = [(low, min(low + width, 65535)) for low, width in raw]
    merged = merge_spans(spans)
    covered = {port for low, high in spans for port in range(low, high + 1)}
    assert {port for low, high in merged for port in range(low, high + 1)} == covered
    assert all(merged[i][1] + 1 < merged[i + 1][0] for i in range(len(merged) - 1))


# A second deployment on node3 (disjoint GPUs, vllm_cluster_gpu_ids): its own API and master ports.
SHARED_PLAN = {
    "deployment": "lab-b",
    "nodes": [{"host": "node3-b", "address": "10.232.2.13", "node_rank": 0}],
    "ports": {"api": 8001, "master": 29511, "dp_rpc": 29560},
    "cluster": {"nodes": [{"name": "node3-b", "address": "10.232.2.13"}]},
}
OTHER_ON_NODE3 = {
    "deployment": "lab-c",
    "nodes": [{"host": "node3-c", "address": "10.232.2.13", "node_rank": 0}],
    "ports": {"api": 8002, "master": 29512, "dp_rpc": 29561},
    "cluster": {"nodes": [{"name": "node3-c", "address": "10.232.2.13"}, {"name": "node4", "address": "10.232.2.14"}]},
}


def test_one_table_covers_every_deployment_on_a_shared_machine(tmp_path):
    """Deployments sharing a machine get one table: each API port open as the plan's own is, every cluster node of
    either deployment trusted, every protected port of either kept. Fails if a deployment's rules replace another's
    (node3 would drop lab-c's API, or lab-c's node4 NCCL traffic)."""
    alone = build_policy(table="vllm_cluster", plan=SHARED_PLAN, api_cidrs=["10.0.0.0/8"])
    both = build_policy(table="vllm_cluster", plan=SHARED_PLAN, api_cidrs=["10.0.0.0/8"],
                        machine_plans=[SHARED_PLAN, OTHER_ON_NODE3])
    assert both["api_ports"] == [8001, 8002] and both["deployments"] == ["lab-b", "lab-c"]
    assert both["cluster_addresses"] == ["10.232.2.13", "10.232.2.14"]
    assert "29511-29512" in both["protected_ports"] and "29560-29561" in both["protected_ports"]
    for port in (8001, 8002):
        assert f'tcp dport {port} counter drop comment "vLLM API from outside the allowed CIDRs"' in both["ruleset"]
        assert f"tcp dport {port} ip saddr @api_v4 accept" in both["ruleset"]
    assert "8002" not in alone["ruleset"]
    assert "firewall of deployments lab-b, lab-c" in both["ruleset"]
    # lab-c's run renders the very same table (found on the lab: an own-first order made each run rewrite it).
    assert build_policy(table="vllm_cluster", plan=OTHER_ON_NODE3, api_cidrs=["10.0.0.0/8"],
                        machine_plans=[SHARED_PLAN, OTHER_ON_NODE3]) == both
    # The same plan alone, given as its own machine-mate, renders exactly as before (no change on a converged node).
    assert build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=[], machine_plans=[MP_PLAN]) == \
        build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=[])
    result = nft_check(both["ruleset"], tmp_path)
    assert result.returncode == 0, result.stderr


def test_an_api_port_inside_a_machine_mates_protected_range_is_refused():
    inside = dict(OTHER_ON_NODE3, ports={"api": 29511, "master": 29600})
    with pytest.raises(FirewallError, match=r"the API port 29511 falls inside a protected port range of a "
                                            r"deployment on this machine"):
        build_policy(table="vllm_cluster", plan=SHARED_PLAN, api_cidrs=[], machine_plans=[inside])


def test_router_client_port_opens_like_the_api_and_observability_ports_stay_inside(tmp_path):
    # node1 of the lab as router and monitor: node exporter, the router's metrics and Prometheus kept inside.
    policy = build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=["192.0.2.0/24"], client_ports=[8080],
                          extra_protected_ports=["9100", "29000", "9090"])
    text = policy["ruleset"]
    assert policy["client_ports"] == [8080] and policy["api_from_cidrs"] is True
    assert "tcp dport 8080 ip saddr @api_v4 accept" in text
    assert 'tcp dport 8080 counter drop comment "router from outside the allowed CIDRs"' in text
    assert "tcp dport 8000 ip saddr @api_v4 accept" in text
    assert {"9090", "9100", "29000"} <= set(policy["protected_ports"])
    assert nft_check(text, tmp_path).returncode == 0, nft_check(text, tmp_path).stderr


def test_api_from_the_router_only_drops_client_cidrs_on_the_vllm_port(tmp_path):
    policy = build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=["192.0.2.0/24"], client_ports=[8080],
                          api_from_cidrs=False, extra_cluster_addresses=["10.232.2.50"])
    text = policy["ruleset"]
    assert "tcp dport 8000 ip saddr @api_v4 accept" not in text  # clients no longer reach vLLM directly
    assert "tcp dport 8000 ip saddr @cluster_v4 accept" in text
    assert 'tcp dport 8000 counter drop comment "vLLM API from outside the cluster"' in text
    assert "tcp dport 8080 ip saddr @api_v4 accept" in text  # ... but they reach the router
    assert "10.232.2.50" in policy["cluster_addresses"]
    assert nft_check(text, tmp_path).returncode == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"client_ports": [8000]}, "client port 8000 is also a vLLM API port"),
    ({"client_ports": [29501]}, r"the client port 29501 \(the router's\) falls inside a protected port range"),
    ({"client_ports": [0]}, r"port client=0: expected 1-65535"),
])
def test_bad_client_ports_are_refused_by_value(kwargs, message):
    with pytest.raises(FirewallError, match=message):
        build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=[], **kwargs)


def test_trusted_addresses_are_the_router_and_monitor_hosts_outside_the_cluster():
    members = {"node1": "10.232.2.11", "router1": "10.232.2.50", "mon1": "10.232.2.60", "again": "10.232.2.50"}
    assert trusted_addresses(members, ["node1", "node2"]) == ["10.232.2.50", "10.232.2.60"]
    with pytest.raises(FirewallError, match=r"host mon1 \(in group vllm_monitor\) is not a node of the deployment "
                                            r"and has no vllm_cluster_fabric_address"):
        trusted_addresses({"mon1": None}, ["node1"], "group vllm_monitor")
    with pytest.raises(FirewallError, match="vllm_cluster_fabric_address of mon1: 'mon1.example' is not an IP"):
        trusted_addresses({"mon1": "mon1.example"}, ["node1"])


def test_the_filter_finds_a_router_of_another_deployment_by_its_own_plan():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.vllm_ops.cluster.plugins.filter.firewall import firewall_trusted_addresses

    # A fleet: the router on node1 (deployment a), deployment b on node4 and node5; the monitor outside vllm_nodes.
    plan_a = {"deployment": "a", "nodes": [{"host": "node1"}],
              "cluster": {"nodes": [{"name": "node1", "address": "10.0.0.1"}]}}
    plan_b = {"deployment": "b", "nodes": [{"host": "node4"}, {"host": "node5"}],
              "cluster": {"nodes": [{"name": "node4", "address": "10.0.0.4"}, {"name": "node5", "address": "10.0.0.5"}]}}
    groups = {"vllm_router": ["node1"], "vllm_monitor": ["mon"]}
    hostvars = {"node1": {"vllm_cluster_plan": plan_a}, "node4": {"vllm_cluster_plan": plan_b},
                "mon": {"vllm_cluster_fabric_address": "10.0.0.9"}}
    assert firewall_trusted_addresses(groups, hostvars, ["vllm_router", "vllm_monitor"], plan_b) == [
        "10.0.0.1", "10.0.0.9"]
    # For deployment a, node1 is its own node: only the monitor is added; a missing group is empty.
    assert firewall_trusted_addresses(groups, hostvars, ["vllm_router", "vllm_monitor", "absent"], plan_a) == [
        "10.0.0.9"]
    assert firewall_trusted_addresses(groups, hostvars, ["vllm_monitor"], plan_a, ["192.0.2.7"]) == [
        "192.0.2.7", "10.0.0.9"]
    del hostvars["mon"]["vllm_cluster_fabric_address"]
    with pytest.raises(AnsibleFilterError, match=r"host mon \(in group vllm_router and group vllm_monitor\)"):
        firewall_trusted_addresses(groups, hostvars, ["vllm_router", "vllm_monitor"], plan_b)


def test_the_firewalls_port_defaults_are_the_other_roles_defaults():
    """node_firewall follows vllm_router's and vllm_monitoring's ports; its fallbacks must be their defaults."""
    import re
    from pathlib import Path

    import yaml

    roles = Path(__file__).resolve().parents[2] / "collections/ansible_collections/vllm_ops/cluster/roles"

    def defaults(role):
        return yaml.safe_load((roles / role / "defaults" / "main.yml").read_text())

    firewall = {**defaults("vllm_router"), **defaults("vllm_monitoring"), **defaults("vllm_runtime")}
    mine = defaults("node_firewall")
    pairs = {"node_firewall_node_exporter_port": "vllm_monitoring_node_exporter_port",
             "node_firewall_prometheus_port": "vllm_monitoring_port",
             "node_firewall_router_port": "vllm_router_port",
             "node_firewall_router_metrics_port": "vllm_router_prometheus_port",
             "node_firewall_model_share_port": "vllm_runtime_model_share_port",
             "node_firewall_router_group": "vllm_router_hosts",
             "node_firewall_monitor_group": "vllm_monitoring_hosts"}
    for name, theirs in pairs.items():
        found = re.fullmatch(r"\{\{ (\w+) \| default\('?([\w]+)'?\) \}\}", mine[name])
        assert found, f"{name}: {mine[name]!r} does not follow another role's variable"
        assert found.group(1) == theirs and found.group(2) == str(firewall[theirs]), (name, mine[name], firewall[theirs])


# --- one door: who reaches the API port behind a router, and the controller's own address --------------------------

def test_the_controller_reaches_the_api_port_behind_a_router_and_nothing_else(tmp_path):
    policy = build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=["192.0.2.0/24"], api_from_cidrs=False,
                          admin_addresses=["10.231.2.1"])
    text = policy["ruleset"]
    assert policy["admin_addresses"] == ["10.231.2.1"]
    assert "elements = { 10.231.2.1 }" in text
    rules = [line.strip() for line in text.splitlines()]
    # In the API port's rules, before its drop: the controller; the client CIDRs are not there.
    api_rules = [rule for rule in rules if rule.startswith("tcp dport 8000 ")]
    assert api_rules == ["tcp dport 8000 ip saddr @admin_v4 accept", "tcp dport 8000 ip6 saddr @admin_v6 accept",
                         "tcp dport 8000 ip saddr @cluster_v4 accept", "tcp dport 8000 ip6 saddr @cluster_v6 accept",
                         'tcp dport 8000 counter drop comment "vLLM API from outside the cluster"']
    # The controller is no cluster node: the protected ports stay closed to it (no rule accepts @admin_v4 alone).
    assert "ip saddr @admin_v4 accept" not in rules and "10.231.2.1" not in policy["cluster_addresses"]
    assert nft_check(text, tmp_path).returncode == 0, nft_check(text, tmp_path).stderr


def test_without_a_router_the_controller_is_admitted_beside_the_client_cidrs(tmp_path):
    text = build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=["192.0.2.0/24"],
                        admin_addresses=["2001:db8::7"])["ruleset"]
    assert "tcp dport 8000 ip saddr @api_v4 accept" in text and "tcp dport 8000 ip6 saddr @admin_v6 accept" in text
    assert "elements = { 2001:db8::7 }" in text
    assert nft_check(text, tmp_path).returncode == 0


def test_a_bad_controller_address_is_refused_by_value():
    with pytest.raises(FirewallError, match=r"controller address: 'laptop' is not an IP address or CIDR"):
        build_policy(table="vllm_cluster", plan=MP_PLAN, api_cidrs=[], admin_addresses=["laptop"])


@pytest.mark.parametrize("setting, fronted, mode", [
    ("auto", True, "router"), ("auto", False, "clients"),
    ("clients", True, "clients"), ("router", True, "router"), ("router", False, "router"),
])
def test_auto_is_one_door_when_a_router_fronts_the_deployment(setting, fronted, mode):
    assert api_mode(setting, fronted) == mode


def test_an_unknown_mode_is_refused_with_the_choices():
    with pytest.raises(FirewallError, match=r"node_firewall_api_reachable_from 'router-only': expected one of "
                                            r"auto, clients, router"):
        api_mode("router-only", True)


class FakeSocket:
    """A UDP socket whose connect picks the source address a routing table would."""

    def __init__(self, source, error=None):
        self.source, self.error, self.closed = source, error, False

    def connect(self, address):
        if self.error:
            raise self.error

    def getsockname(self):
        return (self.source, 40000)

    def close(self):
        self.closed = True


def test_auto_is_the_address_the_controller_sends_from_towards_the_node():
    fake = FakeSocket("10.231.1.1")
    assert controller_addresses("auto", "127.0.0.1", "node1", opener=lambda family: fake) == ["10.231.1.1"]
    assert fake.closed
    # The real kernel, towards loopback: loopback itself.
    assert controller_addresses("auto", "127.0.0.1", "node1") == ["127.0.0.1"]


def test_no_route_or_no_name_is_refused_naming_the_host():
    unreachable = FakeSocket("0.0.0.0", OSError(101, "Network is unreachable"))
    with pytest.raises(FirewallError, match=r"host node2: node_firewall_controller_addresses is auto and the "
                                            r"controller's address towards '127.0.0.1': no route to it"):
        controller_addresses("auto", "127.0.0.1", "node2", opener=lambda family: unreachable)
    with pytest.raises(FirewallError, match=r"host node2: .*'node2.invalid': cannot resolve it"):
        controller_addresses("auto", "node2.invalid", "node2")


def test_a_listed_controller_address_is_checked_and_an_empty_list_admits_none():
    assert controller_addresses(["10.0.0.5", "10.1.0.0/16"], "x", "node1") == ["10.0.0.5", "10.1.0.0/16"]
    assert controller_addresses([], "x", "node1") == []
    with pytest.raises(FirewallError, match=r"host node1: node_firewall_controller_addresses: 'bastion' is not"):
        controller_addresses(["bastion"], "x", "node1")
    with pytest.raises(FirewallError, match=r"expected auto or a list"):
        controller_addresses("10.0.0.5", "x", "node1")


def test_the_api_mode_filter_reads_which_deployments_the_routers_front():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.vllm_ops.cluster.plugins.filter.firewall import firewall_api_mode

    plan = {"deployment": "chat", "nodes": [{"host": "node1"}],
            "cluster": {"nodes": [{"name": "node1", "address": "10.0.0.1"}]}}
    hostvars = {"node1": {"vllm_cluster_plan": plan}, "r1": {"vllm_cluster_fabric_address": "10.0.0.9"}}
    assert firewall_api_mode("auto", plan, {"vllm_router": ["r1"]}, hostvars) == "router"
    assert firewall_api_mode("auto", plan, {}, hostvars) == "clients"
    other = {**hostvars, "r1": {**hostvars["r1"], "vllm_router_deployments": ["embed"]}}
    assert firewall_api_mode("auto", plan, {"vllm_router": ["r1"]}, other) == "clients"  # it fronts another one
    assert firewall_api_mode("auto", plan, {"edge": ["r1"]}, hostvars, "edge") == "router"
    with pytest.raises(AnsibleFilterError, match="expected one of auto, clients, router"):
        firewall_api_mode("everyone", plan, {}, hostvars)
