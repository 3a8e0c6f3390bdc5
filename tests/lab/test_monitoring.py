"""Prometheus and node exporter on the lab (issue 19): the role vllm_monitoring proven on live metrics.

The layout is test_router's: one deployment of the lab's tiny Llama, `vllm_cluster_tp: 1`, `vllm_cluster_dp: 3`
on node1, node2 and node3 (a dense model: three independent servers, one replica each), vllm-router on node1 in
front of them; handed on by the run's front module before this one (conftest FRONT_MODULES; deploy.yml and
router.yml then change nothing), or deployed here when this module runs alone. playbooks/monitoring.yml puts node exporter on every node and Prometheus on node3 (the inventory's
group vllm_monitor). Debian's `prometheus` and `prometheus-node-exporter` are in the lab's node image
(lab/vlab/rootfs.py), disabled, since the nodes cannot reach a mirror: the role's `apt: state=present` finds them
and the role is the one that configures, enables and starts them.

Prometheus listens on node3's fabric address, which the controller cannot reach (the fabric bridge has no host
address): the test reads its HTTP API through an SSH tunnel to node3 (`ssh -L`), as an operator would.

Proved: monitoring.yml converges, a second run changes nothing and `--check --diff` on the converged lab reports
nothing; every target is up (node exporter on every node, each replica's API server); after a bounded load
through the router (`vllm bench serve`, a fixed number of prompts), every panel query of every dashboard returns
at least one series (a failure names dashboard, panel and expression) and every replica counted requests;
(extended) `systemctl stop` of node2's vLLM fires VllmApiServerDown (the replica-gone alert) for node2 within its `for:`
plus one scrape and one evaluation interval, not before its `for:`, and it resolves once node2's vLLM is back;
Prometheus's and node exporter's ports are dropped from outside the cluster. The last test leaves the lab as
test_deploy leaves it (no vLLM, no router, no Prometheus, no node exporter, the lab inventory's firewall).

What could make it fail: a metric name that drifted in vLLM (a panel with no series), a sandbox drop-in that
Prometheus or node exporter cannot start under inside nspawn, a task that is not idempotent, targets that miss
a replica, an alert whose `for:` or labels are wrong.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench.profile import bench_argv
from ansible_collections.vllm_ops.cluster.plugins.module_utils.monitoring import promql
from test_hardening import connect, connect_from
from test_router import (
    LAYOUT_SWITCH,
    assert_no_unit_active,
    assert_router_torn_down,
    changed,
    front_inventory,
    play,
)
from vlab.machines import SSH_OPTIONS  # lab/lab's own (conftest.py puts lab/ on the path)

# In CI it follows test_router, which hands the front on (an extended run: test_scale_replicas between them).
extended = pytest.mark.lab_extended

# Out of CI's budget (433 s in a clean-clone CI run): the role's templates, targets, rules (promtool) and
# dashboards are tested in tests/unit; the front's teardown is test_router's when no front module follows.
pytestmark = [pytest.mark.lab, pytest.mark.lab_extended, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "collections" / "ansible_collections" / "vllm_ops" / "cluster" / "roles" / "vllm_monitoring"
DASHBOARDS = sorted((ROLE / "files" / "dashboards").glob("*.json"))
RULES = ROLE / "files" / "rules" / "vllm-cluster.rules.yml"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
DEPLOYMENT = "lab-tiny-llama"
REPLICAS = ("node1", "node2", "node3")
ROUTER_HOST, ROUTER_PORT, ROUTER_METRICS_PORT = "node1", 8080, 29000
MONITOR = "node3"
VICTIM = "node2"
PROMETHEUS_PORT = DEFAULTS["vllm_monitoring_port"]
NODE_EXPORTER_PORT = DEFAULTS["vllm_monitoring_node_exporter_port"]
REPLICA_GONE = "VllmApiServerDown"
# The bounded load: a fixed number of prompts at a fixed rate through the router; it stops by itself.
LOAD = {"input_len": 32, "output_len": 16, "num_prompts": 60, "request_rate": 4, "max_concurrency": 4, "seed": 0,
        "num_warmups": 0}
RECOVERY_TIMEOUT_S = 900  # a vLLM start on the lab's two shared cores


def seconds(duration: str) -> float:
    """A Prometheus duration of one unit ("15s", "1m", "2h") in seconds."""
    found = re.fullmatch(r"(\d+)(ms|s|m|h)", str(duration).strip())
    assert found, f"not a one-unit Prometheus duration: {duration!r}"
    return int(found.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[found.group(2)]


@pytest.fixture(scope="module")
def started():
    """The module's wall time, printed at its end (issue 21: which lab modules fit CI's budget)."""
    begin = time.monotonic()
    yield begin
    print(f"\ntest_monitoring: module wall time {time.monotonic() - begin:.0f} s")


@pytest.fixture(scope="module")
def fleet(started, shared_lab, tiny_model, tmp_path_factory):
    """The lab's hosts as three TP=1 replicas (group replicas), the router on node1, the monitor group on node3."""
    lab, inventory = front_inventory(shared_lab, tmp_path_factory)  # test_router's: replicas and the router
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["vllm_monitor"] = {"hosts": {MONITOR: None}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    return lab, inventory


@pytest.fixture(scope="module")
def runs(fleet):
    """deploy.yml and router.yml (test_router's layout), then monitoring.yml, again, and with --check --diff."""
    return {
        "deploy": play(fleet, "deploy.yml", *LAYOUT_SWITCH).stdout,
        "router": play(fleet, "playbooks/router.yml").stdout,
        "monitoring": play(fleet, "playbooks/monitoring.yml").stdout,
        "monitoring_again": play(fleet, "playbooks/monitoring.yml").stdout,
        "monitoring_check": play(fleet, "playbooks/monitoring.yml", "--check", "--diff").stdout,
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def prometheus(fleet, runs):
    """The lab Prometheus's URL on the controller: an SSH tunnel to node3's fabric address (`ssh -L`)."""
    lab, _ = fleet
    port = free_port()
    tunnel = subprocess.Popen(
        ["ssh", "-i", str(lab.key), *SSH_OPTIONS, "-o", "ExitOnForwardFailure=yes", "-N",
         "-L", f"127.0.0.1:{port}:{lab.fabric_address(MONITOR)}:{PROMETHEUS_PORT}",
         f"root@{lab.management_address(MONITOR)}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert tunnel.poll() is None, f"the SSH tunnel to {MONITOR} ended: {tunnel.stderr.read()}"
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as answer:
                    if answer.status == 200:
                        break
            assert time.monotonic() < deadline, f"Prometheus on {MONITOR} not ready through the tunnel at {url}"
            time.sleep(1)
        yield url
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=30)


def api(url: str, path: str, **params) -> dict:
    address = f"{url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(address, timeout=30) as answer:
        body = json.loads(answer.read().decode())
    assert body["status"] == "success", body
    return body["data"]


def series(url: str, expr: str) -> list[dict]:
    return promql.query(url, expr)["result"]


def firing(url: str, alertname: str) -> list[dict]:
    return [a for a in api(url, "/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == alertname]


def router_url(lab) -> str:
    return f"http://{lab.management_address(ROUTER_HOST)}:{ROUTER_PORT}"


def bounded_load(lab, tmp_path: Path) -> dict:
    """`vllm bench serve` through the router with LOAD; its result."""
    argv = bench_argv(LOAD, router_url(lab), DEPLOYMENT, str(REPO / ".cache" / "models" / "tiny-llama"),
                      result_dir=str(tmp_path), result_filename="bench.json",
                      vllm=str(REPO / ".venv-runtime" / "bin" / "vllm"))
    env = dict(os.environ, OPENAI_API_KEY=lab.api_key, HF_HUB_OFFLINE="1")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return json.loads((tmp_path / "bench.json").read_text())


def panels(dashboard: dict):
    """Every panel of a dashboard, rows' nested panels too."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panels(panel)


def variable_values(url: str, variable: dict, known: dict) -> list[str]:
    """What Grafana offers for a query variable `label_values(<selector>, <label>)`, from the live Prometheus."""
    query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
    found = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", query)
    assert found, f"variable {variable['name']}: not a label_values() query: {query}"
    selector, label = promql.substitute(found.group(1), known), found.group(2)
    return sorted({s["metric"][label] for s in series(url, selector) if label in s["metric"]})


# --- tests --------------------------------------------------------------------------------------------------------
def test_monitoring_converges_a_rerun_changes_nothing_and_check_diff_reports_nothing(fleet, runs):
    lab, _ = fleet
    first = changed(runs["monitoring"])
    assert set(first) >= set(REPLICAS), first
    assert first[MONITOR] > 0, first  # the first run configured and started something
    for name in ("monitoring_again", "monitoring_check"):
        counts = changed(runs[name])
        assert set(counts) >= set(REPLICAS) and all(v == 0 for v in counts.values()), (name, counts)
        assert "changed: [" not in runs[name], name
    assert not re.search(r"^[-+]{3} (before|after)", runs["monitoring_check"], re.M), "--diff showed a change"
    for node in REPLICAS:
        assert lab.ssh(node, "systemctl is-enabled prometheus-node-exporter.service").stdout.strip() == "enabled"
        assert lab.ssh(node, "systemctl is-active prometheus-node-exporter.service").stdout.strip() == "active"
    assert lab.ssh(MONITOR, "systemctl is-active prometheus.service").stdout.strip() == "active"
    # Nothing but the monitor runs Prometheus (the image has it installed, disabled).
    for node in set(REPLICAS) - {MONITOR}:
        shown = lab.ssh(node, "systemctl is-enabled prometheus.service", check=False).stdout.strip()
        assert shown == "disabled", (node, shown)
    # Bound to the fabric address only, never every address.
    listening = lab.ssh(MONITOR, "ss -H -ltn").stdout
    assert f"{lab.fabric_address(MONITOR)}:{PROMETHEUS_PORT}" in listening, listening
    assert not re.search(rf"(\*|0\.0\.0\.0|\[::\]):({PROMETHEUS_PORT}|{NODE_EXPORTER_PORT})\s", listening), listening


def test_every_target_is_up_node_exporter_on_every_node(fleet, prometheus):
    lab, _ = fleet
    deadline = time.monotonic() + 4 * seconds(DEFAULTS["vllm_monitoring_scrape_interval"])
    while True:
        targets = api(prometheus, "/api/v1/targets", state="active")["activeTargets"]
        down = [(t["labels"].get("job"), t["labels"].get("node"), t["health"], t.get("lastError"))
                for t in targets if t["health"] != "up"]
        if not down or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert down == [], down
    by_job: dict[str, set] = {}
    for target in targets:
        by_job.setdefault(target["labels"]["job"], set()).add(target["labels"].get("node"))
    assert by_job.get("node") == set(REPLICAS), by_job
    assert by_job.get("vllm") == set(REPLICAS), by_job
    assert by_job.get("router") == {ROUTER_HOST}, by_job  # vllm-router's own metrics, from the router's group
    for target in targets:
        labels = target["labels"]
        if labels["job"] in ("vllm", "node"):
            assert labels["deployment"] == DEPLOYMENT and labels["role"] in ("head", "worker"), labels
    # node exporter's systemd collector sees each node's vLLM unit (alert VllmRankUnitDown reads it).
    # (a node target's series carry its vllm_unit label; `name` is the unit the series describes)
    units = series(prometheus, f'node_systemd_unit_state{{job="node", deployment="{DEPLOYMENT}", state="active"}} == 1')
    assert {s["metric"]["node"] for s in units if s["metric"]["name"] == s["metric"].get("vllm_unit")} == set(REPLICAS), \
        units


@extended
def test_every_panel_query_of_every_dashboard_returns_a_series_after_a_bounded_load(fleet, prometheus, tmp_path):
    lab, _ = fleet
    result = bounded_load(lab, tmp_path)
    assert result["completed"] == LOAD["num_prompts"], result.get("errors")
    time.sleep(2 * seconds(DEFAULTS["vllm_monitoring_scrape_interval"]))  # the load's last samples are scraped
    # Every replica served part of the load, as Prometheus saw it.
    served = series(prometheus, f'sum by (node) (increase(vllm:request_success_total{{deployment="{DEPLOYMENT}"}}[5m]))')
    assert {s["metric"]["node"] for s in served if float(s["value"][1]) > 0} == set(REPLICAS), served
    # Grafana's $__rate_interval for a 15 s scrape is 4 scrapes (1m).
    rate_interval = f"{4 * seconds(DEFAULTS['vllm_monitoring_scrape_interval']):.0f}s"
    empty, asked = [], 0
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        known = {"deployment": DEPLOYMENT}  # the deployment an operator picks; then the replicas Grafana offers
        for variable in dashboard.get("templating", {}).get("list", []):
            if variable.get("type") == "query" and variable["name"] != "deployment":
                values = variable_values(prometheus, variable, known)
                assert values, f"{path.name}: variable {variable['name']} offers nothing"
                if variable["name"] == "replica":  # three independent servers, each its engine 0: three replicas
                    assert sorted(values) == ["0", "1", "2"], f"{path.name}: replica offers {values}"
                known[variable["name"]] = values[0]
        for panel in panels(dashboard):
            for target in panel.get("targets", []):
                if not target.get("expr"):
                    continue
                expr = promql.substitute(target["expr"], known, interval=rate_interval)
                asked += 1
                for why in promql.empty_queries(prometheus, [expr]).values():
                    empty.append(f"{path.name} / panel {panel.get('title')!r} / {expr}: {why}")
    print(f"{asked} panel queries over {len(DASHBOARDS)} dashboards, {len(empty)} empty")
    assert asked >= 30 and len(DASHBOARDS) == 3, (asked, DASHBOARDS)
    assert empty == [], "\n".join(empty)


@extended  # 127 s in a clean-clone CI run (the alert's `for:`, then its recovery); promtool tests the rules in CI
def test_stopping_a_replica_fires_the_replica_gone_alert_in_time_and_it_resolves(fleet, prometheus):
    lab, _ = fleet
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if r.get("alert") == REPLICA_GONE)
    hold = seconds(rule["for"])
    scrape = seconds(DEFAULTS["vllm_monitoring_scrape_interval"])
    evaluation = seconds(DEFAULTS["vllm_monitoring_evaluation_interval"])
    assert firing(prometheus, REPLICA_GONE) == []
    # `systemctl stop` returns once vLLM has exited (its graceful shutdown takes seconds, /metrics may answer
    # meanwhile): the target is down from somewhere between the command's start and its return.
    stopping = time.monotonic()
    lab.ssh(VICTIM, "systemctl stop vllm.service")
    stopped = time.monotonic()
    try:
        pending_s = None
        while True:
            alerts = [a for a in firing(prometheus, REPLICA_GONE) if a["labels"].get("node") == VICTIM]
            if alerts and pending_s is None:
                pending_s = time.monotonic() - stopped
            if any(a["state"] == "firing" for a in alerts):
                break
            assert time.monotonic() - stopped < hold + 4 * scrape, f"{REPLICA_GONE} never fired for {VICTIM}"
            time.sleep(0.5)
        fired_s = time.monotonic() - stopped
        print(f"{REPLICA_GONE}: `systemctl stop` took {stopped - stopping:.1f} s; pending {pending_s:.1f} s, "
              f"firing {fired_s:.1f} s after it returned (for: {rule['for']}, scrape {scrape:.0f} s, evaluation "
              f"{evaluation:.0f} s)")
        alert = next(a for a in firing(prometheus, REPLICA_GONE) if a["labels"].get("node") == VICTIM)
        assert alert["labels"]["deployment"] == DEPLOYMENT and alert["labels"]["severity"] == "critical", alert
        others = [a["labels"].get("node") for a in firing(prometheus, REPLICA_GONE)]
        assert others == [VICTIM], others  # the other replicas keep serving
        # Not before its `for:` (counted from the stop's start, the earliest the target can be down); within
        # `for:` plus one scrape (the failed one) and one rule evaluation (the rule group runs on its own 15 s
        # clock, so the first evaluation that sees the failed scrape can come one evaluation interval later),
        # plus this loop's polling, counted from the stop's return (the latest the target is down).
        assert hold <= stopped - stopping + fired_s, (stopped - stopping, fired_s, hold)
        assert fired_s <= hold + scrape + evaluation + 2, (fired_s, hold, scrape, evaluation)
    finally:
        lab.ssh(VICTIM, "systemctl start vllm.service")
    back = time.monotonic()
    while any(a["labels"].get("node") == VICTIM for a in firing(prometheus, REPLICA_GONE)):
        assert time.monotonic() - back < RECOVERY_TIMEOUT_S, f"{REPLICA_GONE} for {VICTIM} never resolved"
        time.sleep(2)
    print(f"{REPLICA_GONE}: resolved {time.monotonic() - back:.0f} s after `systemctl start`")
    assert [s["metric"]["node"] for s in series(prometheus, f'up{{job="vllm", node="{VICTIM}"}} == 1')] == [VICTIM]


def test_prometheus_and_node_exporter_ports_are_dropped_from_outside_the_cluster(fleet, prometheus):
    """node_firewall keeps node exporter's port inside on every node and Prometheus's on the monitor host (the
    inventory's vllm_monitor; deploy.yml's firewall stage read it), the way test_hardening proves Ray's ports.

    Both listen on the fabric address only, so from the controller (outside the cluster) a connect to a node's
    management address would be refused without the firewall: `dropped` is the firewall's own answer. Inside,
    node1 reaches Prometheus on node3's fabric address, and Prometheus scrapes every node exporter (the targets
    test: all up)."""
    lab, _ = fleet
    probes = [(node, NODE_EXPORTER_PORT) for node in REPLICAS] + [(MONITOR, PROMETHEUS_PORT)]
    outside = {(node, port): connect(lab.management_address(node), port) for node, port in probes}
    assert outside == dict.fromkeys(outside, "dropped"), outside
    assert connect_from(lab, "node1", lab.fabric_address(MONITOR), (PROMETHEUS_PORT, NODE_EXPORTER_PORT)) == \
        dict.fromkeys((PROMETHEUS_PORT, NODE_EXPORTER_PORT), "open")
    up = series(prometheus, 'up{job="node"} == 1')
    assert {s["metric"]["node"] for s in up} == set(REPLICAS), up
    # The drops were counted by the project's table, on the monitor host for both ports.
    table = lab.ssh(MONITOR, "nft list table inet vllm_cluster").stdout
    assert re.search(rf"\b{PROMETHEUS_PORT}\b", table) and re.search(rf"\b{NODE_EXPORTER_PORT}\b", table), table
    assert re.search(r"counter packets [1-9]\d* bytes \d+ drop", table), table

def test_the_lab_is_left_as_test_deploy_leaves_it(fleet):
    """For the modules after this one: no vLLM, no router, no Prometheus and no node exporter running, the lab
    inventory's firewall on every node. teardown.yml takes every deployment down, so the router (its unit and key
    gone) and monitoring go with them: Prometheus and node exporter stopped and disabled, the targets and the
    project's rules removed (the packages stay, as in the image). What could make it fail: a teardown that leaves
    Prometheus scraping a removed deployment, or node exporter listening on a node nothing watches."""
    lab, _ = fleet
    play(fleet, "playbooks/teardown.yml", timeout=900)
    assert_router_torn_down(lab)
    for node in REPLICAS:
        shown = lab.ssh(node, "systemctl is-enabled prometheus.service prometheus-node-exporter.service",
                        check=False).stdout.split()
        assert "enabled" not in shown, f"{node}: {shown}"
    assert lab.ssh(MONITOR, "ls /etc/prometheus/file_sd/vllm-cluster.json /etc/prometheus/rules/vllm-cluster.rules.yml",
                   check=False).returncode != 0
    lab.ansible_playbook("deploy.yml", "--tags", "firewall", timeout=900)
    assert_no_unit_active(lab, "vllm*.service", "prometheus*.service")
