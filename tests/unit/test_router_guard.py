"""Role vllm_router's guard: the role's HAProxy configuration, rendered, run by the real HAProxy on loopback.

The configuration is roles/vllm_router/templates/vllm-router-guard.cfg.j2 with the role's defaults; HAProxy is
Debian's (scripts/bootstrap installs it, as the role does on a router host) and runs it as written (its user, its
chroot). Behind it, a small HTTP server stands where vllm-router listens and answers every request it gets with
200, so whatever reaches it shows as 200. A client is a connection from 127.0.0.2 (any address but 127.0.0.1 and
::1 is one to the guard); the router host itself is 127.0.0.1. The lab runs the same guard on a router node and
walks vLLM's routes through it from a client network namespace (tests/lab/test_router.py).

What could make these fail: a rule order that lets /health's allow or the key's pass reach an admin path, a key
compared by prefix or header field (req.hdr splits at commas), an admin path spelt another way (//, %-escapes, dot
segments), a template that puts the key into the configuration itself.
"""

from __future__ import annotations

import http.server
import re
import socket
import subprocess
import threading
import time

import jinja2
import pytest
import yaml
from test_facts_modules import REPO

ROLE = REPO / "roles" / "vllm_router"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
HAPROXY = DEFAULTS["vllm_router_guard_haproxy"]
KEY = "k-7f3a,b9#x"  # a comma and a hash: a header split at commas or a comment would cut it


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def template_env():
    """The role's templates with the Ansible filters they use."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    env.filters.update(comment=lambda text: "# " + text, bool=bool, regex_escape=re.escape)
    return env


def render(tmp_path, has_key=True, **variables):
    env = template_env()
    values = {**DEFAULTS, "vllm_router_listen_address": "127.0.0.1", **variables}
    keys = tmp_path / "guard-keys"
    keys.write_text(f"Bearer {KEY}\n")
    keys.chmod(0o600)
    return env.get_template("vllm-router-guard.cfg.j2").render(
        ansible_managed="Ansible managed", **values, __vllm_router_has_key=has_key,
        __vllm_router_guard_keys_path=str(keys),
        __vllm_router_guard_binds=[f"{values['vllm_router_listen_address']}:{values['vllm_router_port']}"])


class Backend(http.server.BaseHTTPRequestHandler):
    """Where vllm-router listens: 200 and the request line for anything that reaches it."""

    def answer(self):
        body = f"{self.command} {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = do_PUT = answer

    def log_message(self, *args):
        pass


@pytest.fixture
def guard(tmp_path, request):
    """(port, has_key): the guard on 127.0.0.1:<port>, the backend on its backend port; both stop at the end."""
    has_key = getattr(request, "param", True)
    port, backend_port = free_port(), free_port()
    config = tmp_path / "guard.cfg"
    config.write_text(render(tmp_path, has_key, vllm_router_port=port, vllm_router_guard_backend_port=backend_port))
    check = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True, timeout=30,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", backend_port), Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    proxy = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError(f"HAProxy did not listen on {port}: {proxy.stdout.read1().decode()[-2000:]}")
        yield port, has_key
    finally:
        proxy.kill()
        proxy.wait(timeout=10)
        backend.shutdown()


def ask(port, method, path, key=None, source="127.0.0.2"):
    """The status the guard answers, the request sent from `source` exactly as written (no path clean-up)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as conn:
        head = f"{method} {path} HTTP/1.1\r\nHost: router\r\nContent-Length: 2\r\nConnection: close\r\n"
        if key is not None:
            head += f"Authorization: Bearer {key}\r\n"
        conn.sendall(head.encode() + b"\r\n{}")
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


ADMIN = [(method, path) for path in DEFAULTS["vllm_router_guard_admin_paths"] for method in ("GET", "POST")]
SPELT_OTHERWISE = ["//list_workers", "/%6cist_workers", "/v1/../list_workers", "/./workers", "/workers/http%3A%2F%2Fx",
                   "/list_workers/", "/remove_worker?url=http://10.0.0.1:8000"]
KEYED = [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("POST", "/tokenize"),
         ("GET", "/readiness"), ("GET", "/get_server_info"), ("GET", "/version"), ("GET", "/no/such/route")]


def test_a_client_gets_health_alone_without_the_key_and_never_the_admin_api_or_metrics(guard):
    port, _ = guard
    table = {(method, path): (ask(port, method, path), ask(port, method, path, "not-the-key"), ask(port, method, path, KEY))
             for method, path in [("GET", "/health"), ("GET", "/metrics"), *ADMIN, *KEYED]}
    assert table.pop(("GET", "/health")) == (200, 200, 200)
    assert table.pop(("GET", "/metrics")) == (403, 403, 403)
    for route in ADMIN:
        assert table.pop(route) == (403, 403, 403), route
    assert table == dict.fromkeys(KEYED, (401, 401, 200))


@pytest.mark.parametrize("path", SPELT_OTHERWISE)
def test_an_admin_path_spelt_another_way_is_refused_even_with_the_key(guard, path):
    port, _ = guard
    assert ask(port, "POST", path, KEY) in (400, 403)


def test_a_key_that_only_starts_or_ends_like_the_key_is_refused(guard):
    port, _ = guard
    for key in (KEY[:-1], KEY + "x", KEY.split(",")[0], KEY.upper(), f" {KEY}"):
        assert ask(port, "GET", "/v1/models", key) == 401, key


def test_the_router_host_itself_reaches_everything(guard):
    port, _ = guard
    for method, path in [("GET", "/list_workers"), ("POST", "/remove_worker?url=x"), ("GET", "/metrics"),
                         ("GET", "/readiness")]:
        assert ask(port, method, path, source="127.0.0.1") == 200, path


@pytest.mark.parametrize("guard", [False], indirect=True)
def test_without_a_key_the_guard_still_fences_the_admin_api(guard):
    port, has_key = guard
    assert not has_key
    assert ask(port, "GET", "/v1/models") == 200
    assert ask(port, "GET", "/list_workers") == 403
    assert ask(port, "GET", "/metrics") == 403


def test_the_key_is_in_its_own_file_never_in_the_configuration(tmp_path):
    text = render(tmp_path)
    assert KEY not in text
    assert f"req.fhdr(authorization) -m str -f {tmp_path / 'guard-keys'}" in text
    assert f"server router 127.0.0.1:{DEFAULTS['vllm_router_guard_backend_port']}" in text
    assert "with_the_key" not in render(tmp_path, has_key=False)


def test_haproxy_refuses_the_configuration_when_the_key_file_is_missing(tmp_path):
    config = tmp_path / "guard.cfg"
    config.write_text(render(tmp_path))
    (tmp_path / "guard-keys").unlink()
    check = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True, timeout=30,
                           check=False)
    assert check.returncode != 0 and "guard-keys" in check.stdout + check.stderr


def test_the_role_verify_probes_expect_what_the_guard_answers_a_client(guard):
    """roles/vllm_router/tasks/verify.yml asks these from the host's cluster address (a client to the guard)."""
    port, _ = guard
    variables = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    probes = variables["__vllm_router_guard_probes"]
    env = template_env()

    def expect(value):
        return env.from_string(str(value)).render(__vllm_router_has_key=True)

    expected = {(p["method"], p["path"]): int(expect(p["expect"])) for p in probes}
    assert {route: ask(port, *route) for route in expected} == expected
    assert {("GET", "/health"), ("GET", "/list_workers"), ("GET", "/v1/models")} <= set(expected)


def test_systemds_own_parser_accepts_the_guards_unit(tmp_path):
    unit = tmp_path / "vllm-router-guard.service"
    unit.write_text(template_env().get_template("vllm-router-guard.service.j2").render(
        ansible_managed="Ansible managed", **DEFAULTS, __vllm_router_guard_config_path="/etc/vllm-router/guard.cfg"))
    text = unit.read_text()
    assert f"ExecStartPre={HAPROXY} -c -f /etc/vllm-router/guard.cfg" in text
    assert "ExecReload=/bin/kill -USR2 $MAINPID" in text and "Type=notify" in text
    verify = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert verify.returncode == 0 and verify.stdout + verify.stderr == "", verify.stdout + verify.stderr
