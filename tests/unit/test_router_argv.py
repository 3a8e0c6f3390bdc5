"""vllm-router's argv from the role's variables (plugins/module_utils/router/argv.py).

The flags are checked against a real capture of `vllm-router --help` of the pinned version
(tests/fixtures/router/, with its .source.txt); the settings are the role's own defaults
(roles/vllm_router/defaults/main.yml); the plans are the planner's (test_monitoring_targets.lab_plan).
"""

from __future__ import annotations

import re

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.filter.router import router_argv as router_argv_filter
from ansible_collections.vllm_ops.cluster.plugins.filter.router import router_exec_start
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router import argv
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.workers import RouterError
from test_facts_modules import REPO
from test_monitoring_targets import lab_plan

HELP = (REPO / "tests" / "fixtures" / "router" / "vllm-router-0.1.17-help.txt").read_text()
DEFAULTS = yaml.safe_load((REPO / "roles" / "vllm_router" / "defaults" / "main.yml").read_text())
WORKERS = ["http://10.77.1.1:8000", "http://10.77.1.2:8000"]


def settings(**changes):
    """The role's defaults as the settings the role hands the filter (vllm_router_ left off)."""
    values = {setting.name: DEFAULTS[f"vllm_router_{setting.name}"] for setting in argv.SETTINGS}
    values["prometheus_address"] = "10.77.1.9"  # the role fills the empty default with the cluster address
    return {**values, **changes}


def help_flags():
    options = HELP.split("\noptions:\n", 1)[1]
    return {match.group(1) for match in re.finditer(r"^  --([a-z0-9-]+)", options, re.M)}


def test_the_known_flags_are_exactly_the_pinned_versions_help():
    assert argv.VERSION == DEFAULTS["vllm_router_version"]
    assert set(argv.KNOWN_FLAGS) == help_flags() - {"help"}
    assert {setting.flag[2:] for setting in argv.SETTINGS} <= argv.KNOWN_FLAGS
    assert set(argv.REFUSED_EXTRA) <= argv.KNOWN_FLAGS
    # The policies and log levels are the help's choices.
    assert "{" + ",".join(argv.POLICIES) + "}" in HELP and "{" + ",".join(argv.LOG_LEVELS) + "}" in HELP


def test_the_defaults_make_an_argv_with_every_setting_and_the_workers_and_no_key():
    words = argv.router_argv(settings(), WORKERS, "router1")
    assert words[:6] == ["--host", "0.0.0.0", "--port", "8080", "--policy", "cache_aware"]
    assert words[-3:] == ["--worker-urls", *WORKERS]
    pairs = dict(zip(words[:-3:2], words[1:-3:2], strict=True))
    assert pairs["--health-check-interval-secs"] == "5" and pairs["--health-failure-threshold"] == "2"
    assert pairs["--prometheus-host"] == "10.77.1.9" and pairs["--prometheus-port"] == "29000"
    assert pairs["--retry-backoff-multiplier"] == "2.0" and pairs["--request-timeout-secs"] == "1800"
    # Booleans that are false leave their store-true flag out; every flag written is one the version prints.
    assert "--disable-retries" not in words and "--disable-circuit-breaker" not in words
    assert {word[2:] for word in words if word.startswith("--")} <= help_flags()
    assert "--api-key" not in words and not any("key" in word.lower() for word in words)


def test_a_true_boolean_is_its_flag_alone():
    words = argv.router_argv(settings(disable_retries=True), WORKERS, "router1")
    assert words.count("--disable-retries") == 1
    assert words[words.index("--disable-retries") + 1].startswith("--")


@pytest.mark.parametrize(("name", "value", "message"), [
    ("policy", "least_loaded", r"host router1: vllm_router_policy='least_loaded' is not one of vllm-router 0.1.17's "
                               r"--policy values; expected one of random, round_robin, cache_aware"),
    ("port", 70000, r"host router1: vllm_router_port=70000 is out of range; expected 1 to 65535"),
    ("health_failure_threshold", 0, r"vllm_router_health_failure_threshold=0 is out of range; expected at least 1"),
    ("retry_jitter_factor", 1.5, r"vllm_router_retry_jitter_factor=1.5 is out of range; expected 0.0 to 1.0"),
    ("queue_size", "lots", r"vllm_router_queue_size='lots' is not an integer"),
    ("queue_size", 2.5, r"vllm_router_queue_size=2.5 is not an integer"),
    ("disable_retries", "yes", r"vllm_router_disable_retries='yes' is not a boolean; expected true or false"),
    ("health_check_endpoint", "health", r"vllm_router_health_check_endpoint='health' is not an HTTP path"),
    ("listen_address", "router1.example", r"vllm_router_listen_address='router1.example' is not an IP address"),
    ("log_level", "verbose", r"vllm_router_log_level='verbose' is not one of"),
])
def test_a_bad_value_names_the_host_the_variable_the_value_and_the_expectation(name, value, message):
    with pytest.raises(RouterError, match=message):
        argv.router_argv(settings(**{name: value}), WORKERS, "router1")


def test_settings_that_contradict_each_other_are_named_together():
    with pytest.raises(RouterError, match=r"host router1: vllm_router_health_check_timeout_secs=10 is over "
                                          r"vllm_router_health_check_interval_secs=5.*; vllm_router_retry_max_backoff_ms"
                                          r"=10 is below vllm_router_retry_initial_backoff_ms=100"):
        argv.router_argv(settings(health_check_timeout_secs=10, retry_max_backoff_ms=10), WORKERS, "router1")
    with pytest.raises(RouterError, match="vllm_router_port and vllm_router_prometheus_port are both 9000"):
        argv.router_argv(settings(port=9000, prometheus_port=9000), WORKERS, "router1")


def test_a_missing_setting_and_no_workers_are_errors():
    values = settings()
    del values["queue_size"]
    with pytest.raises(RouterError, match="host router1: no value for vllm_router_queue_size"):
        argv.router_argv(values, WORKERS, "router1")
    with pytest.raises(RouterError, match="host router1: the router has no workers"):
        argv.router_argv(settings(), [], "router1")


def test_extra_flags_pass_when_the_version_has_them():
    words = argv.router_argv(settings(), WORKERS, "router1", {"request-id-headers": ["x-request-id", "x-trace-id"],
                                                              "enable_igw": True, "cache-threshold": 0.5,
                                                              "rate-limit-tokens-per-second": None})
    # In the order of the flag names; None and false leave the flag out.
    assert words[-6:] == ["--cache-threshold", "0.5", "--enable-igw", "--request-id-headers", "x-request-id",
                          "x-trace-id"]
    assert "--rate-limit-tokens-per-second" not in words


@pytest.mark.parametrize(("extra", "message"), [
    ({"api-key": "s3cret-value"}, r"host router1: vllm_router_extra_args api-key is refused: the key would show in ps"),
    ({"worker-urls": ["http://x:1"]}, r"worker-urls=\['http://x:1'\] is refused: the workers come from the plans"),
    ({"vllm-pd-disaggregation": True}, r"is refused: prefill/decode disaggregation is not planned yet"),
    ({"policy": "random"}, r"vllm_router_extra_args policy='random' is set by vllm_router_policy"),
    ({"helth-check-interval-secs": 1}, r"is not a flag of vllm-router 0.1.17"),
    ({"selector": {"app": "x"}}, r"selector=\{'app': 'x'\} is a mapping"),
])
def test_extra_flags_that_are_refused_unknown_or_owned_fail(extra, message):
    with pytest.raises(RouterError, match=message):
        argv.router_argv(settings(), WORKERS, "router1", extra)


def test_the_refused_key_is_never_shown_in_the_message():
    with pytest.raises(RouterError) as raised:
        argv.router_argv(settings(), WORKERS, "router1", {"api-key": "s3cret-value"})
    assert "s3cret-value" not in str(raised.value)


def test_a_router_port_that_a_deployment_on_the_same_host_uses_is_refused():
    plan = lab_plan({"tp": 1})
    assert argv.port_problems([plan], "node1", {"port": 8000, "prometheus_port": 29000}) == [
        "host node1: vllm_router_port=8000 is also port api of deployment lab-tiny-llama on this host; expected a "
        "free port"]
    assert argv.port_problems([plan], "router1", {"port": 8000, "prometheus_port": 29000}) == []
    with pytest.raises(AnsibleFilterError, match="vllm_router_port=8000 is also port api"):
        router_argv_filter(settings(port=8000), [{"url": WORKERS[0]}], "node1", {}, [plan])


def test_the_exec_start_quotes_each_word_for_systemd():
    line = router_exec_start(["--health-check-endpoint", "/health", "--request-id-headers", "x 1", "100%"],
                             "/opt/vllm-router/venv/bin/vllm-router-launch")
    assert line == ('/opt/vllm-router/venv/bin/vllm-router-launch --health-check-endpoint /health '
                    '--request-id-headers "x 1" "100%%"')
    with pytest.raises(AnsibleFilterError, match="absolute path"):
        router_exec_start([], "vllm-router-launch")
