"""The deployment heals itself (issue 23): a worker that goes away and comes back needs no deploy.yml.

The lab's 2-node mp deployment (TP=2, the head on node1, a headless worker on
node2). With the worker stopped, the head's API server answers one request with
an error and then exits with status 0 (measured); under `Restart=on-failure` the
head then stayed down until someone ran deploy.yml, also after the worker was
back. The unit now has `Restart=always`: the head starts again, waits at the
rendezvous, and the worker joins when it starts (a reboot starts it: the unit is
enabled). This test fails if systemd does not restart the head (its restart
count stays), or if the two do not meet again within the bound.

Rank-aware health (issue 18): before any request, the head's rank watch
(vllm-rank-watch) sees the worker's rendezvous connection close and ends the
head, so that its /health fails within seconds and a router takes the replica
out before a client meets the missing rank. Without the watch /health answered
200 until the next request failed; the test fails if /health still answers
after RANK_WATCH_BOUND_S with no request sent, or if the head's journal lacks
the watch's line.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.timeout(2400)]

HEAD, WORKER = "node1", "node2"
HEAD_EXIT_BOUND_S = 300  # the head's engine notices the lost worker on the next request
HEALED_BOUND_S = 900  # head back at the rendezvous (its restart back-off included) + worker start + load
RANK_WATCH_BOUND_S = 50  # two 5 s rounds of the watch + the head's shutdown on SIGTERM (30 s, then SIGKILL)


@pytest.fixture(scope="module")
def deployed(shared_lab, tiny_model):
    """The lab's own deployment, verified (deploy.yml; stages still converged are skipped)."""
    shared_lab.ansible_playbook("deploy.yml", timeout=2400)
    return shared_lab


def api(lab, path, body=None, timeout=60):
    request = urllib.request.Request(
        f"http://{lab.management_address(HEAD)}:8000{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {lab.api_key}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def healthy(lab):
    """The head's /health answers 200 (no key, no request to the engine)."""
    try:
        with urllib.request.urlopen(f"http://{lab.management_address(HEAD)}:8000/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.HTTPError, urllib.error.URLError, TimeoutError, ConnectionError):
        return False


def completion(lab, model, timeout=60):
    return api(lab, "/v1/completions", {"model": model, "prompt": "The quick brown fox", "max_tokens": 4,
                                        "temperature": 0, "ignore_eos": True}, timeout)


def unit(lab, node, *props):
    shown = lab.ssh(node, f"systemctl show -p {','.join(props)} vllm.service").stdout
    return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)


def test_the_head_restarts_after_its_worker_left_and_serves_once_the_worker_is_back(deployed):
    lab = deployed
    model = api(lab, "/v1/models")["data"][0]["id"]
    assert completion(lab, model)["usage"]["completion_tokens"] == 4
    before = int(unit(lab, HEAD, "NRestarts")["NRestarts"])

    since = lab.ssh(HEAD, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    assert healthy(lab)
    lab.ssh(WORKER, "systemctl stop vllm.service")
    try:
        # No request yet: the rank watch alone must take the head's /health down.
        stopped = time.monotonic()
        while healthy(lab):
            assert time.monotonic() - stopped < RANK_WATCH_BOUND_S, (
                f"the head still answered /health {RANK_WATCH_BOUND_S} s after its worker stopped, with no request "
                f"sent: the rank watch did not end it; {unit(lab, HEAD, 'ActiveState', 'SubState', 'NRestarts')}")
            time.sleep(1)
        print(f"the head's /health failed {time.monotonic() - stopped:.1f} s after its worker stopped")
        journal = lab.ssh(HEAD, f"journalctl -u vllm.service --since '{since}' --no-pager -o cat").stdout
        worker_address = lab.ssh(HEAD, "python3 -c \"import json; print([n['address'] for n in json.load("
                                       "open('/etc/vllm-cluster/plan.json'))['nodes'] if n['headless']][0])\"").stdout
        assert f"vllm-rank-watch: the rendezvous connection from worker {worker_address.strip()}" in journal, (
            journal[-3000:])

        failed = None
        try:
            completion(lab, model, timeout=120)
        except (urllib.error.HTTPError, urllib.error.URLError, TimeoutError, ConnectionError) as error:
            failed = error
        assert failed is not None, "the head answered a completion with its worker stopped"

        deadline = time.monotonic() + HEAD_EXIT_BOUND_S
        while int(unit(lab, HEAD, "NRestarts")["NRestarts"]) == before:
            assert time.monotonic() < deadline, (
                f"systemd did not restart the head within {HEAD_EXIT_BOUND_S} s of its worker leaving: "
                f"{unit(lab, HEAD, 'ActiveState', 'SubState', 'ExecMainStatus', 'Result')}")
            time.sleep(5)
    finally:
        lab.ssh(WORKER, "systemctl start --no-block vllm.service")

    deadline, last = time.monotonic() + HEALED_BOUND_S, None
    while time.monotonic() < deadline:
        try:
            answer = completion(lab, model, timeout=60)
            break
        except (urllib.error.HTTPError, urllib.error.URLError, TimeoutError, ConnectionError) as error:
            last = error
            time.sleep(10)
    else:
        raise AssertionError(f"no completion within {HEALED_BOUND_S} s of the worker's start, no deploy.yml run: "
                             f"{last}; head {unit(lab, HEAD, 'ActiveState', 'SubState', 'NRestarts')}, "
                             f"worker {unit(lab, WORKER, 'ActiveState', 'SubState', 'NRestarts')}")
    assert answer["usage"]["completion_tokens"] == 4
    assert unit(lab, HEAD, "ActiveState")["ActiveState"] == unit(lab, WORKER, "ActiveState")["ActiveState"] == "active"
