"""vllm-cluster's guard in front of every route of vLLM's API server (`vllm serve --middleware`).

vLLM's own `--api-key` (VLLM_API_KEY) guards only /v1, /v2, /inference and /cohere; every other route it
registers (/tokenize, /metrics, /version, /load, the elastic-EP and fault-tolerance routes...) answers anyone
who reaches the port, and a router forwards them. This ASGI middleware, added by `--middleware
vllm_cluster_api_guard.ApiGuard`, decides before any route runs:

- an admin route (elastic EP, fault tolerance, sleep, collective RPC, cache resets, profiling, LoRA loading,
  RL weight updates): 403 to every client; with the key, from the node itself only (loopback);
- an open path (API_GUARD_OPEN_PATHS, comma-separated; /health by default): served to anyone;
- /metrics: served to the addresses of API_GUARD_METRICS_FROM (addresses or CIDRs, comma-separated:
  the Prometheus hosts) and loopback, 403 to the rest;
- everything else, unknown paths included: 401 without VLLM_API_KEY as a bearer token.

Admin routes are found by the module that registers them in vLLM (read from the app's own routes at the first
request), and by their paths as a fallback, so a route moved to another path stays closed. Without a key
(vllm_service_allow_no_api_key) only the admin and /metrics rules apply. Standard library only: it runs in
vLLM's own venv, shipped by the vllm_service role.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os

# vLLM's packages whose routes change the server rather than serve a client.
ADMIN_MODULES = (
    "vllm.entrypoints.serve.elastic_ep",
    "vllm.entrypoints.serve.fault_tolerance",
    "vllm.entrypoints.serve.dev",
    "vllm.entrypoints.serve.profile",
    "vllm.entrypoints.serve.lora",
    "vllm.entrypoints.rl",
)
# The same routes by path (read from vLLM 0.32's routers), for a route whose module moved: it stays closed.
ADMIN_PATH_PREFIXES = (
    "/scale_elastic_ep", "/is_scaling_elastic_ep", "/fault_tolerance", "/sleep", "/wake_up", "/is_sleeping",
    "/collective_rpc", "/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/server_info",
    "/start_profile", "/stop_profile", "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/abort_requests",
    "/pause", "/resume", "/is_paused", "/release_kv_cache_memory", "/get_world_size", "/weight_checker",
    "/weight_info", "/update_weights", "/update_weight_version", "/start_weight_update", "/finish_weight_update",
    "/start_draft_weight_update", "/init_weight_transfer_engine", "/shutdown_weight_transfer_engine",
)
METRICS_PATH = "/metrics"


def _networks(text: str) -> list:
    found = []
    for item in (part.strip() for part in (text or "").split(",")):
        if item:
            found.append(ipaddress.ip_network(item, strict=False))
    return found


def _address(host: str | None):
    try:
        address = ipaddress.ip_address((host or "").split("%")[0])
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def admin_path(path: str, admin_patterns=()) -> bool:
    """Whether ``path`` is one of vLLM's admin routes (by a pattern of the app's own routes, or by name)."""
    if any(pattern.match(path) for pattern in admin_patterns):
        return True
    return any(path == prefix or path.startswith(prefix + "/") for prefix in ADMIN_PATH_PREFIXES)


def admin_patterns_of(routes) -> list:
    """The path patterns of the routes that vLLM's admin modules registered (``routes``: the app's own)."""
    patterns = []
    for route in routes or []:
        module = getattr(getattr(route, "endpoint", None), "__module__", "") or ""
        if module.startswith(ADMIN_MODULES) and getattr(route, "path_regex", None) is not None:
            patterns.append(route.path_regex)
    return patterns


class Policy:
    """Who may call what; built from the environment (the unit's), or given explicitly in tests."""

    def __init__(self, key: str = "", open_paths=("/health",), metrics_from: str = ""):
        self.key_hash = hashlib.sha256(key.encode()).digest() if key else None
        self.open_paths = frozenset(path for path in open_paths if path)
        self.metrics_from = _networks(metrics_from)

    @classmethod
    def from_environment(cls, environ=None) -> Policy:
        environ = os.environ if environ is None else environ
        open_paths = [part.strip() for part in environ.get("API_GUARD_OPEN_PATHS", "/health").split(",")]
        return cls(environ.get("VLLM_API_KEY", ""), open_paths, environ.get("API_GUARD_METRICS_FROM", ""))

    def key_matches(self, authorization: str | None) -> bool:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        return hmac.compare_digest(hashlib.sha256(token.strip().encode()).digest(), self.key_hash)

    def decide(self, path: str, client_host: str | None, authorization: str | None, admin_patterns=()):
        """(status, reason): status None lets the request through, else 401 or 403 with the reason."""
        address = _address(client_host)
        local = address is not None and address.is_loopback
        keyed = self.key_hash is None or self.key_matches(authorization)
        if admin_path(path, admin_patterns):
            if local and keyed:
                return None, "admin route from the node itself, with the key"
            return 403, "an admin route of vLLM: not served to clients (vllm-cluster's API guard)"
        if path in self.open_paths:
            return None, "open path"
        if path == METRICS_PATH or path.startswith(METRICS_PATH + "/"):
            if local or (address is not None and any(address in net for net in self.metrics_from)):
                return None, "metrics to a monitoring host"
            return 403, "/metrics answers the monitoring hosts only (vllm-cluster's API guard)"
        if keyed:
            return None, "key"
        return 401, "Unauthorized"


class ApiGuard:
    """The ASGI middleware vLLM adds with `--middleware vllm_cluster_api_guard.ApiGuard` (no arguments)."""

    def __init__(self, app, policy: Policy | None = None):
        self.app = app
        self.policy = policy or Policy.from_environment()
        self._admin_patterns = None

    def _patterns(self, scope) -> list:
        if self._admin_patterns is None:
            routes = getattr(scope.get("app"), "routes", None)
            if routes is None:
                return []  # no app in the scope yet: the paths alone decide, and the next request looks again
            self._admin_patterns = admin_patterns_of(routes)
        return self._admin_patterns

    async def __call__(self, scope, receive, send):
        if scope.get("type") not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", [])}
        client = scope.get("client") or (None, None)
        status, reason = self.policy.decide(path, client[0], headers.get("authorization"), self._patterns(scope))
        if status is None:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = json.dumps({"error": reason}).encode()
        response_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            response_headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": body})
        return None
