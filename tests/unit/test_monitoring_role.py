"""Role vllm_monitoring without the lab: its templates rendered with real plans pass Debian's promtool.

`promtool check config` reads the rendered prometheus.yml, the targets the role writes (file_sd, from the
planner's plans) and the rule files it installs, as Prometheus would load them. The lab proof (the role run on
the lab's nodes, changed=0 on a re-run, alerts firing) is tests/lab's, not here.
"""

from __future__ import annotations

import json
import re
import shutil

import jinja2
import yaml
from ansible_collections.vllm_ops.cluster.plugins.filter.monitoring_targets import (
    monitoring_plan_rules,
    monitoring_router_targets,
    monitoring_targets,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan
from test_facts_modules import REPO
from test_monitoring_rules import RULES, promtool
from test_monitoring_targets import H100, lab_plan

ROLE = REPO / "roles" / "vllm_monitoring"


def render(name, **variables):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    env.filters["comment"] = lambda text: "# " + text
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    return env.get_template(name).render(ansible_managed="Ansible managed", **{**defaults, **variables})


def test_the_rendered_configuration_targets_and_rules_pass_promtool(tmp_path):
    plans = [lab_plan({"tp": 2}, deployment="lab-a"), lab_plan({"tp": 1, "dp": 2}, deployment="lab-b")]
    file_sd = tmp_path / "file_sd" / "vllm-cluster.json"
    rules = tmp_path / "rules"
    file_sd.parent.mkdir()
    rules.mkdir()
    # The router on lab-a's head (its address from its plan), as the role adds it.
    routers = monitoring_router_targets({"vllm_router": ["node1"]}, {"node1": {"vllm_cluster_plan": plans[0]}})
    assert routers == [{"targets": [f"{plans[0]['nodes'][0]['address']}:29000"],
                        "labels": {"component": "router", "node": "node1", "role": "router", "fronts": "*"}}]
    file_sd.write_text(json.dumps(monitoring_targets(plans, 9100, 9400) + routers, indent=2))  # DCGM on 9400
    shutil.copy(RULES, rules / RULES.name)
    (rules / "vllm-cluster-plan.rules.yml").write_text(yaml.safe_dump(monitoring_plan_rules(plans, 2.0)))
    config = tmp_path / "prometheus.yml"
    config.write_text(render("prometheus.yml.j2", __vllm_monitoring_file_sd=str(file_sd),
                             __vllm_monitoring_rules_dir=str(rules), __vllm_monitoring_hostport="10.77.1.9:9090"))
    code, output = promtool("check", "config", config)
    assert code == 0, output
    assert "SUCCESS: 2 rule files found" in output and "SUCCESS: 9 rules found" in output and "4 rules found" in output
    jobs = {job["job_name"] for job in yaml.safe_load(config.read_text())["scrape_configs"]}
    assert jobs == {"prometheus", "vllm", "node", "ray", "dcgm", "router"}


def test_both_services_listen_on_the_given_address_only():
    text = render("prometheus.default.j2", __vllm_monitoring_hostport="10.77.1.9:9090")
    assert 'ARGS="--web.listen-address=10.77.1.9:9090 --storage.tsdb.retention.time=15d"' in text
    text = render("prometheus-node-exporter.default.j2", __vllm_monitoring_node_hostport="10.77.1.2:9100")
    # No backslash: Debian's environment file and systemd would each unescape one.
    assert ('ARGS="--web.listen-address=10.77.1.2:9100 --collector.systemd '
            '--collector.systemd.unit-include=(vllm(-.+)?|ray-head|ray-worker)[.]service"') in text
    assert "\\" not in text
    dropin = render("prometheus.dropin.conf.j2", __vllm_monitoring_storage="/var/lib/prometheus")
    assert "ProtectSystem=strict" in dropin and "ReadWritePaths=/var/lib/prometheus" in dropin
    assert "NoNewPrivileges=yes" in dropin


def relabel(labels, configs):
    """Prometheus's relabelling (action replace, replacement $1: what the vllm job's metric_relabel_configs use)
    of one series' labels: the source labels joined with ';', the regex anchored, the target set to group 1."""
    labels = dict(labels)
    for config in configs:
        assert set(config) == {"source_labels", "regex", "target_label"}, config
        value = ";".join(labels.get(name, "") for name in config["source_labels"])
        match = re.fullmatch(config["regex"], value)
        if match is not None:
            labels[config["target_label"]] = match.group(1)
    return labels


def vllm_metric_relabels():
    """The rendered prometheus.yml's metric_relabel_configs of the vllm job."""
    config = yaml.safe_load(render("prometheus.yml.j2", __vllm_monitoring_file_sd="/x.json",
                                   __vllm_monitoring_rules_dir="/r", __vllm_monitoring_hostport="10.77.1.9:9090"))
    [job] = [job for job in config["scrape_configs"] if job["job_name"] == "vllm"]
    return job["metric_relabel_configs"]


def series_replicas(plan, engines_per_server):
    """``{node: [replica of each engine]}``: what the vllm job makes of a series of each engine of each API server."""
    rules = vllm_metric_relabels()
    servers = [group["labels"] for group in monitoring_targets([plan]) if group["labels"]["component"] == "vllm"]
    return {labels["node"]: [relabel({**labels, "engine": str(engine), "model_name": "m"}, rules)["replica"]
                             for engine in range(engines_per_server)] for labels in servers}


def test_independent_servers_number_their_engines_from_0_and_each_series_gets_its_planned_replica():
    # The lab's three TP=1 replicas: three `vllm serve`, each with its one engine 0.
    assert series_replicas(lab_plan({"tp": 1, "dp": 3}), 1) == {"node1": ["0"], "node2": ["1"], "node3": ["2"]}
    # Eight replicas per server (vLLM's DP inside each node, engines 0-7 on both): sixteen distinct replicas.
    cluster = [{"name": f"n{k}", "address": f"10.1.0.{k + 1}", "fabric_interface": "ib0", "gpus": H100}
               for k in range(2)]
    plan = build_plan("llama-3.1-8b", cluster, {"max_model_len": 8192}, {"tp": 1, "dp": 16}, deployment="d")
    assert plan["data_parallel"]["mode"] == "independent"
    assert series_replicas(plan, 8) == {"n0": [str(rank) for rank in range(8)],
                                        "n1": [str(rank) for rank in range(8, 16)]}


def test_one_api_server_of_vllms_dp_keeps_the_engine_as_the_replica():
    rules = vllm_metric_relabels()
    # vLLM's DP behind one API server numbers its engines by DP rank: 0-31, past the 16 entries read too.
    target = {"deployment": "moe", "node": "n0", "replica": ",".join(str(rank) for rank in range(32))}
    assert [relabel({**target, "engine": str(e)}, rules)["replica"] for e in range(32)] == [str(e) for e in range(32)]
    # A series without an engine (process metrics) keeps the target's replicas.
    assert relabel(target, rules)["replica"] == target["replica"]
    assert relabel({"replica": "1", "engine": ""}, rules)["replica"] == "1"
