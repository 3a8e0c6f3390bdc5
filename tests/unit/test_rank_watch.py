"""roles/vllm_service/files/vllm-rank-watch, run for real on loopback: real TCP connections, real `ss`, real signals.

The head is a stand-in process that holds a listening socket on MASTER_PORT (what vLLM's TCPStore does on the head);
a worker is a connection to it from its own loopback address, 127.0.0.2 or 127.0.0.3 (the worker's rendezvous
connection; the head's own address, 127.0.0.1, is the local end and must not count). The head listens on a
dual-stack socket like torch's TCPStore, so the peers show as IPv4-mapped addresses (the lab found that). The watch must end the
head (SIGTERM) once a worker that was connected is gone, and must not end it while the worker stays, nor for a
worker that never connected. What could make these fail: a watch that reads the wrong column of `ss`, matches
ports as addresses, judges a worker that never linked, or never signals.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

WATCH = (Path(__file__).resolve().parents[2] / "roles" / "vllm_service" / "files" / "vllm-rank-watch")

HEAD = """
import signal, socket, sys, time
# Dual stack, as torch's TCPStore listens: an IPv4 peer shows in ss as [::ffff:127.0.0.2]:port.
server = socket.socket(socket.AF_INET6); server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
server.bind(("::", 0)); server.listen(8)
print(server.getsockname()[1], flush=True)
held = []
signal.signal(signal.SIGTERM, lambda *_: (print("TERM", flush=True), sys.exit(0)))
server.settimeout(0.2)
while True:
    try:
        held.append(server.accept()[0])
    except socket.timeout:
        pass
"""


def start_head():
    head = subprocess.Popen([sys.executable, "-c", HEAD], stdout=subprocess.PIPE, text=True)
    port = int(head.stdout.readline())
    return head, port


def start_watch(head, port, *workers):
    env = dict(os.environ, VLLM_RANK_WATCH_INTERVAL="0.2")
    return subprocess.Popen(["bash", str(WATCH), str(head.pid), str(port), *workers],
                            stderr=subprocess.PIPE, text=True, env=env)


def wait_linked(port):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        shown = subprocess.run(["ss", "-H", "-t", "-n", "state", "established", f"( sport = :{port} )"],
                               capture_output=True, text=True, check=True).stdout
        if shown.strip():
            return
        time.sleep(0.1)
    raise AssertionError(f"no established connection to port {port}")


def test_the_head_ends_once_a_connected_worker_is_gone():
    head, port = start_head()
    worker = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
    other = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.3", 0))
    try:
        wait_linked(port)
        watch = start_watch(head, port, "127.0.0.3", "127.0.0.2")
        time.sleep(1.0)  # several rounds with both workers connected: the head must live
        assert head.poll() is None, "the watch ended the head while its workers were connected"
        worker.close()  # the worker's process ended: the kernel closes its connection
        assert head.wait(timeout=15) == 0
        assert head.stdout.readline().strip() == "TERM"  # SIGTERM first, not SIGKILL
        assert watch.wait(timeout=10) == 0
        said = watch.stderr.read()
        assert f"the rendezvous connection from worker 127.0.0.2 to port {port} closed" in said
        assert f"ending this head (pid {head.pid})" in said
    finally:
        worker.close()
        other.close()
        head.kill()


def test_a_worker_that_never_connected_is_not_judged_and_the_watch_ends_with_its_head():
    head, port = start_head()
    try:
        watch = start_watch(head, port, "10.255.255.1")  # planned, never connected
        time.sleep(1.0)
        assert head.poll() is None, "the watch ended the head for a worker that never connected"
        head.send_signal(signal.SIGKILL)  # the head ends on its own: the watch leaves quietly
        head.wait(timeout=10)
        assert watch.wait(timeout=10) == 0
        assert watch.stderr.read() == ""
    finally:
        head.kill()


def test_a_worker_that_reconnects_within_a_round_keeps_its_head():
    head, port = start_head()
    worker = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
    try:
        wait_linked(port)
        watch = start_watch(head, port, "127.0.0.2")
        time.sleep(0.6)
        worker.close()
        worker = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
        time.sleep(1.5)  # several rounds after the reconnect
        assert head.poll() is None, "the watch ended the head for a worker that reconnected at once"
        assert watch.poll() is None
    finally:
        worker.close()
        head.kill()
        head.wait(timeout=10)
