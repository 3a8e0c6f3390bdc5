"""The signature catalog is data: it loads, it is validated, and every signature can fire."""

import ast
import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.catalog import (
    FAMILIES,
    LOG_SOURCES,
    CatalogError,
    load_catalog,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.diagnosis import diagnose
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations import OBSERVATIONS
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.report import (
    render_markdown,
    render_report,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import vllm_versions

REPO = Path(__file__).resolve().parents[2]
CATALOG_FILE = REPO / "roles" / "doctor" / "files" / "signatures.yml"
RAW = yaml.safe_load(CATALOG_FILE.read_text(encoding="utf-8"))
CATALOG = load_catalog(RAW)
IDS = {sig["id"] for sig in CATALOG["signatures"]}


def nccl_failure_evidence():
    """One node whose vLLM unit failed with NCCL's unhandled system error."""
    return {
        "plan": {},
        "nodes": {"n1": {"gather": {
            "units": {"vllm.service": {"LoadState": "loaded", "ActiveState": "failed", "SubState": "failed",
                                       "Result": "exit-code"}},
            "journal": {"vllm.service": ["RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO "
                                         "for details)"]},
        }}},
    }


def test_the_catalog_covers_the_issue_and_the_seed_map():
    required = {
        # the seed's failure map (7.2)
        "ray_not_running", "ray_version_mismatch", "gpu_held_by_foreign_process", "gpu_memory_busy", "port_in_use",
        "socket_ifname_wrong_nic", "rendezvous_port_blocked", "driver_mismatch", "nccl_socket_where_ib_declared",
        "tp_across_nodes", "nccl_p2p_disabled",
        # issue 23, item 7: the start-up failures of the public excerpts
        "kv_cache_too_small", "max_model_len_exceeds_model", "trust_remote_code_required", "runtime_too_old_for_model",
        "model_weights_corrupt", "model_fetched_from_hub", "path_permission_denied", "cuda_driver_too_old",
        "gpu_compute_capability_unsupported",
        # the issue's list
        "vllm_host_ip_mismatch", "gloo_connect_failed", "placement_group_unsatisfiable", "world_size_exceeds_gpus",
        "heads_not_divisible", "model_missing", "nccl_watchdog_timeout", "shm_too_small", "memlock_too_small",
        "fabric_manager_down", "ib_port_down",
    }
    assert required <= IDS, sorted(required - IDS)
    families = {sig["family"] for sig in CATALOG["signatures"]}
    assert families == set(FAMILIES)


def test_every_signature_says_symptom_checks_cause_fix_and_how_to_verify():
    for sig in CATALOG["signatures"]:
        assert sig["symptom"] and sig["cause"] and sig["fix"] and sig["checks"] and sig["verify"], sig["id"]
        assert sig["rules"], sig["id"]


def test_every_verify_is_a_check_an_operator_can_run():
    """Issue 23, item 5: each fix comes with what shows it worked: a command (in backticks) or a named playbook."""
    for sig in CATALOG["signatures"]:
        verify = sig["verify"]
        assert "`" in verify or ".yml" in verify, f"{sig['id']}: verify names no command: {verify!r}"
        assert verify != sig["fix"], sig["id"]


def test_placeholders_are_filled_by_the_signatures_own_rules_or_defaults():
    """Every {name} in a title/cause/fix comes from a named group, an observation value, a default or the plan."""
    plan_values = {"tp", "pp", "dp", "world_size", "model_path", "heads", "backend", "head_node", "head_address",
                   "nodes", "node", "port_api", "port_master", "port_dp_rpc", "gpus_per_node"}
    observation_values = {
        "port_held_by_foreign_process": {"port", "port_name", "process", "pid"},
        "gpu_held_by_foreign_process": {"gpu", "pid", "process", "memory_mib"},
        "unit_failed": {"unit", "last_error"}, "unit_stopped": {"unit"}, "unit_missing": {"unit"},
        "ray_node_not_alive": {"address", "ray_state"},
        "ray_gpus_below_plan": {"address", "gpus", "planned_gpus", "unit", "running_gpus", "dropins"},
        "version_mismatch": {"package", "version", "expected", "versions"},
        "socket_ifname_mismatch": {"var", "value", "expected", "path"},
        "host_ip_mismatch": {"value", "expected"}, "model_missing": {"path"},
        "rendezvous_probe": {"address", "port", "port_name", "result"},
        "firewall_drops_port": {"port", "port_name"}, "shm_small": {"size_gib"}, "ib_declared": {"hca"},
        "ib_port_down": {"hca", "state"}, "memlock_limited": {"unit", "limit"},
        "driver_mismatch": {"driver", "versions", "expected"}, "fabric_manager_not_ready": {"state"},
        "unit_argv_differs": {"differences", "dropins"}, "env_differs": {"differences"}, "tp_across_nodes": {"tp", "gpus_per_node"},
        "env_flag": {"name", "value"}, "gpu_count_below_plan": {"count", "needed", "visible"}, "node_unreachable": set(),
        "gpu_facts_failed": {"error"}, "api_unanswered_from_client": {"url", "probe", "error"},
        "chat_template_missing": {"url", "probe", "error"},
        # Compared facts (issue 23, item 3; test_doctor_compare.py checks these are the values the hits carry)
        "fabric_mtu_differs": {"interface", "mtu", "expected", "mtus"}, "fabric_link_down": {"interface", "state"},
        "route_to_peer_wrong": {"address", "peer", "interface", "device", "problem"},
        "unit_overridden": {"unit", "dropins", "overrides"}, "unit_limits_differ": {"unit", "limit", "value", "expected"},
        "process_state": {"unit", "pid", "comm", "state", "ppid", "wchan"},
        "service_user_access": {"user", "path", "need", "denied", "remedy", "check"},
        "disk_low": {"path", "free_gib", "free_inodes", "min_free_gib"}, "api_key_differs": {"path", "problem"},
        "address_missing": {"address", "interface", "cidr", "current"},
        # vLLM's start-up phases (test_doctor_startup.py checks the values the hits carry)
        "startup_stalled": {"phase", "phase_title", "stall", "phase_checks", "since"},
        # What Prometheus knows (issue 19, item 5; test_doctor_metrics.py checks these are the values the hits carry)
        "kv_saturated": {"replica", "moments", "kv_pct", "waiting", "lookback", "kv_full_pct", "url"},
        "alert_firing": {"alertname", "severity", "summary", "url"}, "metrics_unreadable": {"url", "error"},
        # The router's view (issue 18, item 4; test_doctor_router.py checks the values the hits carry)
        "router_unreachable": {"router", "router_url", "error"},
        "router_worker_missing": {"router", "router_url", "worker_url", "worker_host", "listed"},
        "router_worker_unhealthy": {"router", "router_url", "worker_url", "worker_host", "vllm_state", "suspect"},
        # Ray's own start-up failures (test_doctor_ray_logs.py checks the values the hits carry)
        "ray_port_in_use": {"port", "component", "port_name", "unit", "process", "pid"},
        "ray_gcs_unreachable": {"address", "port", "port_name", "seconds", "whose", "unit", "what", "target", "hint"},
        "ray_log_version_mismatch": {"package", "version", "expected", "versions", "address"},
        "ray_node_ip_wrong": {"address", "unit", "addresses", "why", "ray_address_note"},
    }
    assert set(observation_values) == set(OBSERVATIONS)
    for sig in CATALOG["signatures"]:
        for rule in sig["rules"]:
            available = set(plan_values) | set(sig["defaults"])
            if "log" in rule:
                available |= set(rule["log"]["regex"].groupindex)
            else:
                available |= observation_values[rule["observation"]]
            for field in ("title", "cause", "fix", "verify"):
                for name in re.findall(r"\{(\w+)\}", sig[field]):
                    assert name in available, f"{sig['id']}.{field}: {{{name}}} is not set when rule {rule} matches"


def test_explains_only_points_at_lower_priority_signatures():
    by_id = {sig["id"]: sig for sig in CATALOG["signatures"]}
    for sig in CATALOG["signatures"]:
        for other in sig["explains"]:
            assert by_id[other]["priority"] < sig["priority"], f"{sig['id']} explains {other} of a higher priority"


def test_every_log_pattern_is_searched_in_known_sources():
    for sig in CATALOG["signatures"]:
        for rule in sig["rules"]:
            if "log" in rule:
                assert set(rule["log"]["sources"]) <= set(LOG_SOURCES)


def broken(mutate):
    data = copy.deepcopy(RAW)
    mutate(data)
    return data


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(catalog_version=2), "catalog_version must be 1"),
        (lambda d: d.update(signatures=[]), "'signatures' must be a non-empty list"),
        (lambda d: d["signatures"][0].update(id="Bad Id"), "'id' must match"),
        (lambda d: d["signatures"][1].update(id=d["signatures"][0]["id"]), "the id is used twice"),
        (lambda d: d["signatures"][0].update(family="network"), "'family' must be one of"),
        (lambda d: d["signatures"][0].update(priority=0), "'priority' must be an integer 1-100"),
        (lambda d: d["signatures"][0].update(severity="fatal"), "'severity' must be one of"),
        (lambda d: d["signatures"][0].pop("fix"), "'fix' must be a non-empty string"),
        (lambda d: d["signatures"][0].pop("verify"), "'verify' must be a non-empty string"),
        (lambda d: d["signatures"][2].update(verify="  "), "'verify' must be a non-empty string"),
        (lambda d: d["signatures"][0].update(checks=[]), "'checks' must be a non-empty list"),
        (lambda d: d["signatures"][0].update(colour="red"), "unknown keys ['colour']"),
        (lambda d: d["signatures"][0]["match"]["any"].append({"observation": "moon_phase"}),
         "unknown observation 'moon_phase'"),
        (lambda d: d["signatures"][0]["match"]["any"].append({"log": {"pattern": "unclosed ("}}),
         "is not a valid regular expression"),
        (lambda d: d["signatures"][0]["match"]["any"].append({"log": {"pattern": "x", "sources": ["kernel"]}}),
         "'log.sources' must be a list of"),
        (lambda d: d["signatures"][0]["match"]["any"].append({"log": {"pattern": "x"}, "observation": "shm_small"}),
         "exactly one of 'log' or 'observation'"),
        (lambda d: d["signatures"][0]["match"]["any"].append({"log": {"pattern": "x"}, "requires": ["nope"]}),
         "'requires' names the unknown observation 'nope'"),
        (lambda d: d["signatures"][0].update(explains=["no_such_signature"]),
         "'explains' names the unknown signature 'no_such_signature'"),
        (lambda d: d["signatures"][0].update(match={"all": []}), "'match' must be a mapping with only 'any'"),
        (lambda d: d["signatures"][0].update(defaults={"port": 8000}), "'defaults' must map placeholder names"),
    ],
)
def test_a_malformed_catalog_is_refused_naming_the_signature_and_field(mutate, message):
    with pytest.raises(CatalogError) as error:
        load_catalog(broken(mutate))
    assert message in str(error.value)
    if "signature" in str(error.value):
        assert str(error.value).startswith(("signature ", "catalog"))


def test_an_empty_cluster_has_nothing_to_report():
    report = diagnose(CATALOG, {"plan": {}, "nodes": {}})
    assert report["faults"] == 0 and report["findings"] == []
    assert report["signatures_checked"] == len(CATALOG["signatures"])
    assert render_report(report)[-1].startswith("No fault found")


def test_ranking_puts_the_cause_before_what_it_explains_whatever_the_priorities():
    data = copy.deepcopy(RAW)
    for sig in data["signatures"]:
        if sig["id"] == "unit_failed":
            sig["priority"] = 100  # even a loud consequence goes after a matched cause
    catalog = load_catalog(data)
    evidence = nccl_failure_evidence()
    report = diagnose(catalog, evidence)
    assert [f["id"] for f in report["findings"]] == ["nccl_system_error", "unit_failed"]
    assert report["findings"][1]["rank_priority"] == report["findings"][0]["priority"] - 1


def test_the_report_prints_the_check_after_the_fix():
    evidence = nccl_failure_evidence()
    report = diagnose(CATALOG, evidence)
    finding = report["findings"][0]
    assert finding["id"] == "nccl_system_error"
    assert "Init COMPLETE" in finding["verify"] and "n1" in finding["verify"]
    lines = render_report(report)
    fix = next(index for index, line in enumerate(lines) if line.startswith("   fix: "))
    assert lines[fix + 1] == f"   check it worked: {finding['verify']}"
    markdown = render_markdown(report)
    assert f"**Fix.** {finding['fix']}\n\n**Check it worked.** {finding['verify']}" in markdown


# --------------------------------------------------------------------------- the vLLM release the advice names

VLLM_RELEASES = {path.stem: json.loads(path.read_text()) for path in
                 sorted((REPO / "tests" / "fixtures" / "vllm" / "versions").glob("*.json"))}
# The advice (signatures.yml, subsystems.yml, the observations' and start-up phases' words): every text but the
# patterns and module paths that match a log or a frame.
ADVICE_FILES = (REPO / "roles" / "doctor" / "files" / "signatures.yml", REPO / "roles" / "doctor" / "files" /
                "subsystems.yml")
ADVICE_CODE = (*sorted((REPO / "plugins" / "module_utils" / "doctor").glob("*.py")),
               REPO / "plugins" / "module_utils" / "parsers" / "vllm_phases.py")
NOT_ADVICE = {"match", "prefixes", "messages", "exceptions", "passes_on", "unmapped", "errno"}
# Flags the advice names of other commands than `vllm serve`.
OTHER_COMMANDS = {
    "ray start": ("--address", "--block", "--dashboard-agent-grpc-port", "--dashboard-agent-listen-port",
                  "--dashboard-port", "--head", "--metrics-export-port", "--node-ip-address", "--node-manager-port",
                  "--num-gpus", "--object-manager-port", "--port", "--ray-client-server-port",
                  "--runtime-env-agent-port", "--temp-dir"),
    "ray list": ("--detail",), "nvidia-smi": ("--format", "--query-compute-apps", "--query-gpu"),
    "ps": ("--ppid",), "journalctl": ("--since",), "systemctl show": ("--value",), "ansible-playbook": ("--limit",),
    "a container runtime": ("--ipc", "--shm-size"), "vllm-router": ("--worker-urls",), "py-spy dump": ("--pid",),
    "vllm-cluster doctor": ("--json", "--log"),
}
# The collection's own variables the advice names (not vLLM's).
OWN_VARIABLES = ("VLLM_CLUSTER_API_KEY",)


def advice_strings(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in NOT_ADVICE:
                yield from advice_strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from advice_strings(item)
    elif isinstance(node, str):
        yield node


def advice_names():
    """{flag or VLLM_ variable: the files whose advice names it}."""
    texts = [(path, text) for path in ADVICE_FILES for text in advice_strings(yaml.safe_load(path.read_text()))]
    for path in ADVICE_CODE:
        texts += [(path, node.value) for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    names = {}
    for path, text in texts:
        for name in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]|\bVLLM_[A-Z0-9_]*[A-Z0-9]\b", text):
            names.setdefault(name, set()).add(path.name)
    return names


def test_every_vllm_flag_and_variable_the_advice_names_is_in_both_releases():
    # No advice depends on the release: whatever vLLM flag or variable it names, 0.32 and 0.33 both have.
    assert set(VLLM_RELEASES) == {"0.32", "0.33"}
    other = {flag for flags in OTHER_COMMANDS.values() for flag in flags}
    names = advice_names()
    assert {"--enforce-eager", "--gpu-memory-utilization", "VLLM_HOST_IP", "--node-ip-address"} <= set(names)
    for name, where in sorted(names.items()):
        if name in other or name in OWN_VARIABLES:
            continue
        key = "env" if name.startswith("VLLM_") else "flags"
        for release, captured in VLLM_RELEASES.items():
            assert name in captured[key], f"{sorted(where)} name {name}, which vLLM {release} lacks"
    assert not other - set(names), f"OTHER_COMMANDS lists what no advice names: {sorted(other - set(names))}"


def test_no_advice_names_what_one_release_dropped_or_lacks():
    # A flag or variable of vllm_versions' tables in the advice would be right for one release only: the advice would
    # then have to follow the plan's vllm_version.
    names = advice_names()
    for pattern, _ in vllm_versions.REMOVED_ENV["0.33"]:
        assert not [n for n in names if n == pattern or (pattern.endswith("*") and n.startswith(pattern[:-1]))]
    tables = set(vllm_versions.NEW_FLAGS).union(*vllm_versions.DEPRECATED_FLAGS.values())
    assert not {f"--{flag}" for flag in tables} & set(names)
    for release, captured in VLLM_RELEASES.items():
        assert not set(captured["deprecated_flags"]) & set(names), release
