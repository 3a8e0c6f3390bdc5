"""Role vllm_monitoring without the lab: its templates rendered with real plans pass Debian's promtool.

`promtool check config` reads the rendered prometheus.yml, the targets the role writes (file_sd, from the
planner's plans) and the rule files it installs, as Prometheus would load them. The lab proof (the role run on
the lab's nodes, changed=0 on a re-run, alerts firing) is tests/lab's, not here.
"""

from __future__ import annotations

import json
import shutil

import jinja2
import yaml
from ansible_collections.vllm_ops.cluster.plugins.filter.monitoring_targets import (
    monitoring_plan_rules,
    monitoring_router_targets,
    monitoring_targets,
)
from test_facts_modules import REPO
from test_monitoring_rules import RULES, promtool
from test_monitoring_targets import lab_plan

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
