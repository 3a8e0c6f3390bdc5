"""vllm-cluster's API guard (roles/vllm_service/files/vllm_cluster_api_guard.py): the middleware vLLM loads.

The lab walks every route of the running vLLM through it (tests/lab/test_hardening.py); here each rule alone,
and the ASGI exchange a request goes through. What would make these fail: an admin route served to a client,
/metrics to an address outside the list, a route other than the open ones without the key, a key compared
by prefix, a 401 without its WWW-Authenticate header.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import types
from pathlib import Path

import pytest

GUARD = Path(__file__).resolve().parents[2] / "roles" / "vllm_service" / "files" / "vllm_cluster_api_guard.py"
spec = importlib.util.spec_from_file_location("vllm_cluster_api_guard", GUARD)
guard = importlib.util.module_from_spec(spec)
spec.loader.exec_module(guard)

KEY = "s3cret-KEY"
GOOD = f"Bearer {KEY}"


@pytest.fixture
def policy():
    return guard.Policy(KEY, ["/health"], "10.232.1.14, 10.9.0.0/16")


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize", "/version", "/load", "/ping", "/invocations",
                                  "/v1/models", "/v1/completions", "/inference/v1/generate", "/no/such/route",
                                  "/openapi.json", "/docs", "/"])
def test_every_other_route_needs_the_key(policy, path):
    assert policy.decide(path, "192.0.2.7", None)[0] == 401
    assert policy.decide(path, "192.0.2.7", "Bearer wrong")[0] == 401
    assert policy.decide(path, "192.0.2.7", KEY)[0] == 401  # no scheme
    assert policy.decide(path, "192.0.2.7", f"Bearer {KEY}x")[0] == 401
    assert policy.decide(path, "192.0.2.7", f"Bearer {KEY[:-1]}")[0] == 401
    assert policy.decide(path, "192.0.2.7", GOOD)[0] is None
    assert policy.decide(path, "192.0.2.7", f"bearer {KEY}")[0] is None


def test_the_open_paths_answer_anyone(policy):
    assert policy.decide("/health", "192.0.2.7", None) == (None, "open path")
    assert policy.decide("/health/", "192.0.2.7", None)[0] == 401  # exact paths only


@pytest.mark.parametrize("path", ["/scale_elastic_ep", "/is_scaling_elastic_ep", "/fault_tolerance/status",
                                  "/fault_tolerance/apply", "/sleep", "/wake_up", "/collective_rpc",
                                  "/reset_prefix_cache", "/start_profile", "/v1/load_lora_adapter", "/update_weights"])
def test_admin_routes_answer_no_client_even_with_the_key(policy, path):
    for client in ("192.0.2.7", "10.232.1.14"):
        for authorization in (None, "Bearer wrong", GOOD):
            assert policy.decide(path, client, authorization)[0] == 403, (path, client, authorization)
    assert policy.decide(path, "127.0.0.1", None)[0] == 403
    assert policy.decide(path, "127.0.0.1", GOOD)[0] is None  # the operator on the node, with the key
    assert policy.decide(path, "::1", GOOD)[0] is None


def test_an_admin_route_is_known_by_the_module_that_registers_it(policy):
    def endpoint_of(module):
        def endpoint():
            return None
        endpoint.__module__ = module
        return endpoint
    routes = [types.SimpleNamespace(endpoint=endpoint_of("vllm.entrypoints.serve.elastic_ep.api_router"),
                                    path_regex=re.compile("^/a_new_scaling_route$")),
              types.SimpleNamespace(endpoint=endpoint_of("vllm.entrypoints.openai.completion.api_router"),
                                    path_regex=re.compile("^/v1/completions$")),
              types.SimpleNamespace(app=object(), path_regex=re.compile("^/metrics"))]
    patterns = guard.admin_patterns_of(routes)
    assert len(patterns) == 1
    assert policy.decide("/a_new_scaling_route", "192.0.2.7", GOOD, patterns)[0] == 403
    assert policy.decide("/a_new_scaling_route", "192.0.2.7", GOOD)[0] is None  # unknown without the app's routes
    assert policy.decide("/v1/completions", "192.0.2.7", GOOD, patterns)[0] is None


def test_metrics_answer_the_monitoring_hosts_and_the_node_only(policy):
    for client in ("10.232.1.14", "10.9.3.4", "::ffff:10.232.1.14", "127.0.0.1", "::1"):
        assert policy.decide("/metrics", client, None)[0] is None, client
        assert policy.decide("/metrics/", client, None)[0] is None, client
    for client in ("10.232.1.15", "192.0.2.7", None, "not-an-address"):
        assert policy.decide("/metrics", client, GOOD)[0] == 403, client


def test_without_a_key_only_the_admin_and_metrics_rules_hold():
    policy = guard.Policy("", ["/health"], "")
    assert policy.decide("/tokenize", "192.0.2.7", None)[0] is None
    assert policy.decide("/sleep", "192.0.2.7", None)[0] == 403
    assert policy.decide("/sleep", "127.0.0.1", None)[0] is None
    assert policy.decide("/metrics", "192.0.2.7", None)[0] == 403


def test_the_policy_is_read_from_the_units_environment():
    policy = guard.Policy.from_environment({"VLLM_API_KEY": KEY, "API_GUARD_OPEN_PATHS": "/health, /version",
                                            "API_GUARD_METRICS_FROM": "10.0.0.5"})
    assert policy.decide("/version", "192.0.2.7", None)[0] is None
    assert policy.decide("/metrics", "10.0.0.5", None)[0] is None
    assert policy.decide("/tokenize", "192.0.2.7", GOOD)[0] is None
    defaults = guard.Policy.from_environment({})
    assert defaults.open_paths == {"/health"} and defaults.key_hash is None and defaults.metrics_from == []
    with pytest.raises(ValueError):
        guard.Policy.from_environment({"API_GUARD_METRICS_FROM": "10.0.0.300"})


def exchange(middleware, path, authorization=None, client=("192.0.2.7", 4000), app_routes=None, root_path=""):
    """One HTTP request through the middleware: (status, headers, body, whether the app was called)."""
    sent, called = [], []

    async def app(scope, receive, send):
        called.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}
    headers = [(b"authorization", authorization.encode())] if authorization else []
    scope = {"type": "http", "path": root_path + path, "root_path": root_path, "headers": headers, "client": client,
             "method": "GET"}
    if app_routes is not None:
        scope["app"] = types.SimpleNamespace(routes=app_routes)
    middleware.app = app
    asyncio.run(middleware(scope, receive, send))
    start = sent[0]
    return start["status"], dict(start["headers"]), sent[1]["body"], bool(called)


def test_the_asgi_exchange(policy):
    middleware = guard.ApiGuard(None, policy)
    status, headers, body, called = exchange(middleware, "/tokenize")
    assert (status, called) == (401, False)
    assert headers[b"www-authenticate"] == b"Bearer" and b"Unauthorized" in body
    assert headers[b"content-length"] == str(len(body)).encode()
    assert exchange(middleware, "/tokenize", GOOD)[0::3] == (200, True)
    assert exchange(middleware, "/health")[0::3] == (200, True)
    status, headers, body, called = exchange(middleware, "/metrics", GOOD)
    assert (status, called) == (403, False) and b"monitoring hosts" in body and b"www-authenticate" not in headers
    assert exchange(middleware, "/metrics", client=("10.232.1.14", 5000))[0::3] == (200, True)
    assert exchange(middleware, "/tokenize", root_path="/api")[0] == 401
    assert exchange(middleware, "/health", root_path="/api")[0] == 200


def test_lifespan_passes_untouched(policy):
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])
    asyncio.run(guard.ApiGuard(app, policy)({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]


def test_the_apps_own_admin_routes_are_read_once_from_the_scope(policy):
    def endpoint():
        return None
    endpoint.__module__ = "vllm.entrypoints.serve.fault_tolerance.api_router"
    routes = [types.SimpleNamespace(endpoint=endpoint, path_regex=re.compile("^/ft_moved$"))]
    middleware = guard.ApiGuard(None, policy)
    assert exchange(middleware, "/ft_moved", GOOD)[0] == 200  # no app in the scope: nothing read, nothing kept
    assert exchange(middleware, "/ft_moved", GOOD, app_routes=routes)[0] == 403
    assert exchange(middleware, "/ft_moved", GOOD, app_routes=[])[0] == 403  # kept from the first read


# --- the plan's side: vllm_cluster_api_guard puts the middleware into every node's argv --------------------------
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import (  # noqa: E402
    PlanError,
    plan_from_request,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.nodes import API_GUARD_MIDDLEWARE  # noqa: E402


def two_node_request(**extra):
    h100 = {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}
    nodes = [{"name": f"n{k}", "address": f"10.0.0.{k}", "gpus": dict(h100)} for k in (1, 2)]
    return {"model": "llama-3.1-405b", "cluster": nodes, **extra}


def test_the_plan_names_the_guard_in_every_nodes_argv_unless_turned_off():
    for guarded in (plan_from_request(two_node_request()), plan_from_request(two_node_request(api_guard=True))):
        assert guarded["api_guard"] is True and len(guarded["nodes"]) == 2  # on by default
        for node in guarded["nodes"]:
            at = node["argv"].index("--middleware")
            assert node["argv"][at + 1] == API_GUARD_MIDDLEWARE == "vllm_cluster_api_guard.ApiGuard"
            assert GUARD.stem == API_GUARD_MIDDLEWARE.split(".")[0] and hasattr(guard, API_GUARD_MIDDLEWARE.split(".")[1])
    plain = plan_from_request(two_node_request(api_guard=False))
    assert plain["api_guard"] is False and all("--middleware" not in node["argv"] for node in plain["nodes"])
    with pytest.raises(PlanError, match="api_guard must be true or false"):
        plan_from_request(two_node_request(api_guard="yes"))
