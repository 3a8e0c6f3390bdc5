"""vllm-router's command line (without the API key) from the role's variables, each value checked first.

Pure Python (3.11+); imports nothing from Ansible. The filter ``router_argv`` and the role ``vllm_router`` use it.

``SETTINGS`` maps each ``vllm_router_<name>`` variable to the flag of ``vllm-router --help`` (0.1.17) it sets.
``vllm_router_extra_args`` passes any other flag of that version (``{flag-name: value}``); the flags the role
owns, the worker list (from the plans), the modes it does not run (P/D, Kubernetes discovery, MiniLB) and
``--api-key`` are refused there. The key never enters the argv: the launcher reads it from systemd's
credential (roles/vllm_router/files/vllm-router-launch).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ansible_collections.vllm_ops.cluster.plugins.module_utils.render.vllm_unit import systemd_quote
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.workers import RouterError

VERSION = "0.1.17"
POLICIES = ("random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
            "sticky_least_loaded")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# Every flag `vllm-router --help` (0.1.17) prints, without its dashes.
KNOWN_FLAGS = frozenset((
    "host", "port", "worker-urls", "enable-program-scheduling", "program-scheduling-config-json", "policy",
    "prefill-policy", "decode-policy", "router-temperature", "kv-penalty-host", "kv-penalty-external",
    "kv-penalty-disk", "kv-aware-session-affinity-ttl-secs", "kv-event-source", "kv-event-replay-source",
    "kv-event-block-size", "kv-event-model", "pd-kv-events", "mini-lb", "vllm-pd-disaggregation", "prefill", "decode",
    "worker-startup-timeout-secs", "worker-startup-check-interval", "cache-threshold", "balance-abs-threshold",
    "balance-rel-threshold", "eviction-interval-secs", "max-tree-size", "max-payload-size", "wasm-middleware",
    "wasm-middleware-sha256", "wasm-middleware-route", "intra-node-data-parallel-size", "enable-igw", "api-key",
    "log-dir", "log-level", "service-discovery", "selector", "service-discovery-port", "service-discovery-namespace",
    "prefill-selector", "decode-selector", "vllm-discovery-address", "kv-connector", "prometheus-port",
    "prometheus-host", "request-id-headers", "request-timeout-secs", "retry-max-retries", "retry-initial-backoff-ms",
    "retry-max-backoff-ms", "retry-backoff-multiplier", "retry-jitter-factor", "disable-retries",
    "cb-failure-threshold", "cb-success-threshold", "cb-timeout-duration-secs", "cb-window-duration-secs",
    "disable-circuit-breaker", "health-failure-threshold", "health-success-threshold", "health-check-timeout-secs",
    "health-check-interval-secs", "health-check-endpoint", "max-concurrent-requests", "queue-size",
    "queue-timeout-secs", "rate-limit-tokens-per-second", "cors-allowed-origins",
))
# Flags vllm_router_extra_args may not pass, and why.
REFUSED_EXTRA = {
    "api-key": "the key would show in ps and the unit; it is vllm_router_api_key, read from a root-only file",
    "worker-urls": "the workers come from the plans (vllm_router_deployments selects the deployments)",
    "mini-lb": "MiniLB is vllm-router's debugging balancer",
    "vllm-pd-disaggregation": "prefill/decode disaggregation is not planned yet",
    "prefill": "prefill/decode disaggregation is not planned yet",
    "decode": "prefill/decode disaggregation is not planned yet",
    "service-discovery": "the workers come from the plans, not from Kubernetes",
    "log-dir": "the router logs to the journal (a log directory would need a writable path in the sandbox)",
}


@dataclass(frozen=True)
class Setting:
    name: str  # vllm_router_<name>
    flag: str
    kind: str  # int, float, bool, choice, path, address, port
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple = ()


SETTINGS = (
    Setting("listen_address", "--host", "address"),
    Setting("port", "--port", "port"),
    Setting("policy", "--policy", "choice", choices=POLICIES),
    Setting("worker_startup_timeout_secs", "--worker-startup-timeout-secs", "int", 1),
    Setting("worker_startup_check_interval", "--worker-startup-check-interval", "int", 1),
    Setting("health_check_interval_secs", "--health-check-interval-secs", "int", 1),
    Setting("health_check_timeout_secs", "--health-check-timeout-secs", "int", 1),
    Setting("health_failure_threshold", "--health-failure-threshold", "int", 1),
    Setting("health_success_threshold", "--health-success-threshold", "int", 1),
    Setting("health_check_endpoint", "--health-check-endpoint", "path"),
    Setting("retry_max_retries", "--retry-max-retries", "int", 1),
    Setting("retry_initial_backoff_ms", "--retry-initial-backoff-ms", "int", 0),
    Setting("retry_max_backoff_ms", "--retry-max-backoff-ms", "int", 0),
    Setting("retry_backoff_multiplier", "--retry-backoff-multiplier", "float", 1.0),
    Setting("retry_jitter_factor", "--retry-jitter-factor", "float", 0.0, 1.0),
    Setting("disable_retries", "--disable-retries", "bool"),
    Setting("cb_failure_threshold", "--cb-failure-threshold", "int", 1),
    Setting("cb_success_threshold", "--cb-success-threshold", "int", 1),
    Setting("cb_timeout_duration_secs", "--cb-timeout-duration-secs", "int", 1),
    Setting("cb_window_duration_secs", "--cb-window-duration-secs", "int", 1),
    Setting("disable_circuit_breaker", "--disable-circuit-breaker", "bool"),
    Setting("max_concurrent_requests", "--max-concurrent-requests", "int", 1),
    Setting("queue_size", "--queue-size", "int", 0),
    Setting("queue_timeout_secs", "--queue-timeout-secs", "int", 1),
    Setting("request_timeout_secs", "--request-timeout-secs", "int", 1),
    Setting("prometheus_address", "--prometheus-host", "address"),
    Setting("prometheus_port", "--prometheus-port", "port"),
    Setting("log_level", "--log-level", "choice", choices=LOG_LEVELS),
)
OWNED_FLAGS = {setting.flag[2:]: setting.name for setting in SETTINGS}


def _where(host, name, value):
    shown = repr(value) if isinstance(value, str) else value
    return f"host {host}: vllm_router_{name}={shown}"


def _number(setting, value, host):
    number_type = int if setting.kind == "int" else float
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RouterError(f"{_where(host, setting.name, value)} is not a number; expected "
                          f"{'an integer' if number_type is int else 'a number'}")
    try:
        number = number_type(value)
    except ValueError:
        raise RouterError(f"{_where(host, setting.name, value)} is not "
                          f"{'an integer' if number_type is int else 'a number'}") from None
    if number_type is int and isinstance(value, float) and value != number:
        raise RouterError(f"{_where(host, setting.name, value)} is not an integer")
    low, high = setting.minimum, setting.maximum
    if (low is not None and number < low) or (high is not None and number > high):
        bounds = f"{low} to {high}" if high is not None else f"at least {low}"
        raise RouterError(f"{_where(host, setting.name, value)} is out of range; expected {bounds}")
    return number


def checked_value(setting, value, host="?"):
    """The value of one setting as vllm-router takes it; a RouterError names the host, the value and the expectation."""
    if setting.kind in ("int", "float"):
        return _number(setting, value, host)
    if setting.kind == "port":
        port = _number(Setting(setting.name, setting.flag, "int", 1, 65535), value, host)
        return port
    if setting.kind == "bool":
        if not isinstance(value, bool):
            raise RouterError(f"{_where(host, setting.name, value)} is not a boolean; expected true or false")
        return value
    if setting.kind == "choice":
        if value not in setting.choices:
            raise RouterError(f"{_where(host, setting.name, value)} is not one of vllm-router {VERSION}'s "
                              f"{setting.flag} values; expected one of {', '.join(setting.choices)}")
        return value
    if setting.kind == "path":
        if not isinstance(value, str) or not value.startswith("/") or any(c.isspace() for c in value):
            raise RouterError(f"{_where(host, setting.name, value)} is not an HTTP path; expected one like /health")
        return value
    if setting.kind == "address":
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise RouterError(f"{_where(host, setting.name, value)} is not an IP address; expected one of this "
                              "host's addresses (0.0.0.0 for every IPv4 address)") from None
    raise RouterError(f"setting {setting.name}: unknown kind {setting.kind}")


def _extra_words(extra, host):
    if extra in (None, {}):
        return []
    if not isinstance(extra, dict):
        raise RouterError(f"host {host}: vllm_router_extra_args={extra!r} is not a mapping; expected "
                          "{flag-name: value} (flags of vllm-router --help without their dashes)")
    words = []
    for raw in sorted(extra):
        flag = str(raw).lstrip("-").replace("_", "-")
        value = extra[raw]
        where = f"host {host}: vllm_router_extra_args {raw}"
        if flag in REFUSED_EXTRA:
            shown = "" if flag == "api-key" else f"={value!r}"
            raise RouterError(f"{where}{shown} is refused: {REFUSED_EXTRA[flag]}")
        if flag in OWNED_FLAGS:
            raise RouterError(f"{where}={value!r} is set by vllm_router_{OWNED_FLAGS[flag]}; expected that "
                              "variable instead")
        if flag not in KNOWN_FLAGS:
            raise RouterError(f"{where}={value!r} is not a flag of vllm-router {VERSION} (vllm-router --help); "
                              "expected a flag name without its dashes")
        if value is True:
            words.append(f"--{flag}")
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            words += [f"--{flag}", *(str(item) for item in value)]
        elif isinstance(value, dict):
            raise RouterError(f"{where}={value!r} is a mapping; expected a scalar, a list or true/false")
        else:
            words += [f"--{flag}", str(value)]
    return words


def router_argv(settings, worker_urls, host="?", extra=None):
    """The router's arguments after its launcher: every setting, then ``--worker-urls`` and the extra flags.

    ``settings`` maps each ``SETTINGS`` name (``vllm_router_`` left off) to its value; every one is required.
    """
    if not isinstance(settings, dict):
        raise RouterError(f"host {host}: the router's settings must be a mapping, got {type(settings).__name__}")
    missing = [setting.name for setting in SETTINGS if setting.name not in settings]
    if missing:
        raise RouterError(f"host {host}: no value for {', '.join('vllm_router_' + name for name in missing)}; "
                          "expected every one (roles/vllm_router/defaults/main.yml)")
    values = {setting.name: checked_value(setting, settings[setting.name], host) for setting in SETTINGS}
    problems = []
    if values["health_check_timeout_secs"] > values["health_check_interval_secs"]:
        problems.append(f"vllm_router_health_check_timeout_secs={values['health_check_timeout_secs']} is over "
                        f"vllm_router_health_check_interval_secs={values['health_check_interval_secs']}; expected a "
                        "check to end before the next starts")
    if values["retry_max_backoff_ms"] < values["retry_initial_backoff_ms"]:
        problems.append(f"vllm_router_retry_max_backoff_ms={values['retry_max_backoff_ms']} is below "
                        f"vllm_router_retry_initial_backoff_ms={values['retry_initial_backoff_ms']}; expected the "
                        "cap at or above the first backoff")
    if values["port"] == values["prometheus_port"]:
        problems.append(f"vllm_router_port and vllm_router_prometheus_port are both {values['port']}; expected two "
                        "ports (clients, metrics)")
    if problems:
        raise RouterError(f"host {host}: " + "; ".join(problems))
    if not isinstance(worker_urls, (list, tuple)) or not worker_urls:
        raise RouterError(f"host {host}: the router has no workers; expected the API servers of the fronted "
                          "deployments (filter router_workers)")
    argv = []
    for setting in SETTINGS:
        value = values[setting.name]
        if setting.kind == "bool":
            argv += [setting.flag] if value else []
        else:
            argv += [setting.flag, str(value)]
    argv += ["--worker-urls", *(str(worker) for worker in worker_urls)]
    return argv + _extra_words(extra, host)


def exec_start(launcher, argv):
    """``ExecStart=`` value: the launcher (an absolute path), then the router's arguments, quoted for systemd."""
    if not str(launcher).startswith("/"):
        raise RouterError(f"the router's launcher must be an absolute path for systemd, got {launcher!r}")
    return " ".join(systemd_quote(word) for word in [launcher, *argv])


def port_problems(plans, host, ports):
    """Lines for the router's ports that a deployment's vLLM on the same inventory host already uses.

    ``ports`` maps a role variable name (``port``, ``prometheus_port``) to its port; ``plans`` are the run's plans.
    """
    problems = []
    for plan in plans:
        if not any(node.get("host") == host for node in plan.get("nodes") or []):
            continue
        for port_name, port in sorted((plan.get("ports") or {}).items()):
            for name, value in ports.items():
                if str(value) == str(port):
                    problems.append(f"host {host}: vllm_router_{name}={value} is also port {port_name} of "
                                    f"deployment {plan.get('deployment')} on this host; expected a free port")
    return problems
