"""The router health check of the runbooks and docs/router.md, run on a real router's answers.

vllm-router 0.1.17's `/list_workers` keeps a worker whose vLLM died (tests/fixtures/router/doctor/killed/): it is
membership, not health. The runbooks read `/workers` instead: every worker's `is_healthy`, and their count. The
check below is the docs' line, word for word; it runs here with curl against a local server that answers the
captured `/workers` of each state (healthy, one worker removed, one worker's vLLM killed).
"""

from __future__ import annotations

import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "fixtures" / "router" / "doctor"
ROUTER_URL = "http://127.0.0.1:8080"
# The check as the docs print it, before its one placeholder, <servers> (how many workers the router must have).
CHECK = r"""curl -sf --max-time 5 http://127.0.0.1:8080/workers | python3 -c 'import json,sys; w=json.load(sys.stdin)["workers"]; n=int(sys.argv[1]); [print(x["url"], "healthy" if x["is_healthy"] else "UNHEALTHY") for x in w]; ok=sum(bool(x["is_healthy"]) for x in w); print(f"{ok} of {len(w)} workers healthy, {n} expected"); sys.exit(not len(w) == ok == n)'"""


class _Router(BaseHTTPRequestHandler):
    state = "healthy"

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = (CAPTURES / self.state / "workers.json").read_bytes() if self.path == "/workers" else b"{}"
        self.send_response(200 if self.path == "/workers" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def router():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Router)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def run_check(url, servers):
    command = CHECK.replace(ROUTER_URL, url) + f" {servers}"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False)
    return result.returncode, result.stdout


def test_every_doc_prints_the_same_check():
    found = [(path.relative_to(REPO), line.strip()) for path in sorted((REPO / "docs").rglob("*.md"))
             for line in path.read_text().splitlines() if "/workers | python3" in line]
    assert {str(path) for path, _ in found} == {"docs/router.md", "docs/runbooks/rolling-upgrade.md",
                                                "docs/runbooks/add-replica.md", "docs/runbooks/drain-node.md"}
    assert all(line == f"{CHECK} <servers>" for _, line in found), found


@pytest.mark.parametrize(("state", "servers", "code", "last"), [
    ("healthy", 2, 0, "2 of 2 workers healthy, 2 expected"),
    ("healthy", 3, 1, "2 of 2 workers healthy, 3 expected"),  # one server missing from the router
    ("killed", 2, 1, "1 of 2 workers healthy, 2 expected"),  # /list_workers still lists both
    ("removed", 1, 0, "1 of 1 workers healthy, 1 expected"),  # drained: one left, healthy
    ("removed", 2, 1, "1 of 1 workers healthy, 2 expected"),
])
def test_the_check_passes_only_with_every_worker_there_and_healthy(router, state, servers, code, last):
    _Router.state = state
    returncode, output = run_check(f"http://127.0.0.1:{router.server_address[1]}", servers)
    assert (returncode, output.splitlines()[-1]) == (code, last), output
    if state == "killed":
        assert "http://127.0.0.1:18102 UNHEALTHY" in output.splitlines()
        listed = (CAPTURES / state / "list_workers.json").read_text()
        assert "18101" in listed and "18102" in listed  # membership: the dead worker is still listed


def test_a_router_that_does_not_answer_fails_the_check():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert run_check(f"http://127.0.0.1:{port}", 2)[0] != 0
