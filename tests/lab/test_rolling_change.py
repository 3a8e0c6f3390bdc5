"""Rolling changes behind the router on the lab (issue 18, item 3): one server at a time, no failed request.

The front of tests/lab/test_router.py (its fixture `front`): one deployment of the tiny Llama, three independent
TP=1 servers on node1, node2 and node3, vllm-router on node1 (round_robin). Under a bounded `vllm bench serve` load
through the router (rounds of a fixed number of prompts, each stops by itself, repeated while the play runs):

- a change of one vLLM flag (`vllm_cluster_serve_args: {max-num-seqs: 32}`) through `deploy.yml --tags vllm`
  rolls: each server leaves the router (the router's /list_workers, sampled every second, never lacks more than
  one server), drains (vLLM's --shutdown-timeout), restarts, is verified, smoked and put back before the next;
  0 failed requests; every node's running vLLM (`ps`) has the new flag; the new processes started in order;
- the same run again changes nothing; the same change in check mode with another value touches no service and
  no router;
- a change that passes the planner and vLLM's parser but makes vLLM exit at start (a tokenizer that does not
  exist) stops the roll at node1: node1 is rolled back (its previous argv runs again) and back in the router,
  node2 and node3 are untouched (same process, same plan.json), the play fails naming node1, what changed and
  what failed; 0 failed requests.

What could make it fail: a restart of every server at once (the router would lack all of them, requests fail), a
server taken back before it serves, a stop that aborts requests in flight (no --shutdown-timeout), a rollback
that leaves the server out of the router, a roll that goes on after a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench.profile import bench_argv
from test_router import (
    DEPLOYMENT,
    REPLICAS,
    REPO,
    assert_no_unit_active,
    assert_router_torn_down,
    changed,
    front_inventory,
    processed,
    router_url,
)
from test_router import workers_listed as listed  # the router's own worker list, sorted

pytestmark = [pytest.mark.lab_extended, pytest.mark.lab, pytest.mark.timeout(3600)]

GOOD = {"vllm_cluster_serve_args": {"max-num-seqs": 32}}
CHECK_ONLY = {"vllm_cluster_serve_args": {"max-num-seqs": 16}}
BAD = {"vllm_cluster_serve_args": {"max-num-seqs": 32, "tokenizer": "/srv/models/no-such-tokenizer"}}
# One round of the load: a fixed number of prompts at a fixed rate (about 30 s), it stops by itself.
ROUND = {"input_len": 16, "output_len": 8, "num_prompts": 120, "request_rate": 4, "max_concurrency": 4, "seed": 0,
         "num_warmups": 0}


def play(front, *args, check=True, timeout=2400):
    lab, inventory = front
    started = time.monotonic()
    result = lab.ansible_playbook("deploy.yml", *args, check=check, timeout=timeout, inventory=inventory)
    logs = inventory.parent / "logs"
    logs.mkdir(exist_ok=True)
    (logs / f"{len(list(logs.iterdir())):02d}-roll.log").write_text(result.stdout)
    print(f"deploy.yml {' '.join(args)}: exit {result.returncode} in {time.monotonic() - started:.0f} s")
    return result


def worker(lab, node: str) -> str:
    return f"http://{lab.fabric_address(node)}:8000"


def running_argv(lab, node: str) -> str:
    """The running vLLM API server's command line, from `ps` (the unit's main process)."""
    pid = lab.ssh(node, "systemctl show -p MainPID --value vllm.service").stdout.strip()
    return lab.ssh(node, f"ps -o args= -p {pid}").stdout.strip()


def main_pid(lab, node: str) -> str:
    return lab.ssh(node, "systemctl show -p MainPID --value vllm.service").stdout.strip()


class Load:
    """`vllm bench serve` rounds through the router while a play runs, and the router's list every second.

    Two loops of rounds, the second started half a round later: a round's client spends tens of seconds starting
    (it imports vLLM) before it sends anything, and the other loop's round covers that gap.
    """

    def __init__(self, lab, tmp_path: Path):
        self.lab, self.tmp_path = lab, tmp_path
        self.done = threading.Event()
        self.rounds: list[dict] = []
        self.samples: list[tuple[float, list[str]]] = []
        self.threads = [threading.Thread(target=self._bench, args=(loop,)) for loop in (0, 1)]
        self.threads.append(threading.Thread(target=self._sample))

    def _bench(self, loop: int):
        env = dict(os.environ, OPENAI_API_KEY=self.lab.api_key, HF_HUB_OFFLINE="1")
        if loop and self.done.wait(ROUND["num_prompts"] / ROUND["request_rate"] / 2):
            return
        while not self.done.is_set():
            name = f"round-{loop}-{sum(1 for r in self.rounds if r['loop'] == loop)}.json"
            argv = bench_argv(ROUND, router_url(self.lab), DEPLOYMENT, str(REPO / ".cache" / "models" / "tiny-llama"),
                              result_dir=str(self.tmp_path), result_filename=name,
                              vllm=str(REPO / ".venv-runtime" / "bin" / "vllm"))
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=False)
            result = json.loads((self.tmp_path / name).read_text()) if (self.tmp_path / name).exists() else {}
            self.rounds.append({"loop": loop, "end": time.monotonic(), "duration": result.get("duration", 0.0),
                                "rc": proc.returncode, "completed": result.get("completed", 0),
                                "failed": ROUND["num_prompts"] - result.get("completed", 0),
                                "errors": sorted({str(e)[:160] for e in result.get("errors") or [] if e}),
                                "tail": proc.stdout[-1500:] + proc.stderr[-1500:]})

    def _sample(self):
        while not self.done.is_set():
            self.samples.append((time.monotonic(), listed(self.lab)))
            time.sleep(1)

    def __enter__(self):
        base = sum(processed(self.lab).values())
        for thread in self.threads:
            thread.start()
        deadline = time.monotonic() + 300
        while sum(processed(self.lab).values()) < base + 4:  # the first round is flowing through the router
            assert time.monotonic() < deadline, "the load never reached the router"
            time.sleep(1)
        return self

    def __exit__(self, *exc):
        self.done.set()
        for thread in self.threads:
            thread.join(timeout=1200)

    def failed(self) -> int:
        return sum(r["failed"] for r in self.rounds)

    def covered(self, start: float, end: float) -> float:
        """The share of [start, end] during which some round was sending requests."""
        spans = sorted((max(r["end"] - r["duration"], start), min(r["end"], end)) for r in self.rounds)
        total, reached = 0.0, start
        for first, last in spans:
            first = max(first, reached)
            if last > first:
                total, reached = total + last - first, last
        return total / (end - start) if end > start else 0.0

    def report(self, what: str, start: float, end: float) -> str:
        requests = sum(r["completed"] for r in self.rounds)
        line = (f"{what}: {len(self.rounds)} bench rounds, {requests} requests completed, {self.failed()} failed; "
                f"load during {100 * self.covered(start, end):.0f} % of the play; "
                f"errors: {sorted({e for r in self.rounds for e in r['errors']})}")
        print(line)
        return line

    def absent_windows(self, urls: list[str]) -> dict[str, list[tuple[float, float]]]:
        """For each worker, the (first, last) sample times of each stretch the router did not list it."""
        windows: dict[str, list[tuple[float, float]]] = {url: [] for url in urls}
        for url in urls:
            start = last = None
            for at, shown in self.samples:
                if shown and url not in shown:
                    start, last = (at if start is None else start), at
                elif start is not None:
                    windows[url].append((start, last))
                    start = None
            if start is not None:
                windows[url].append((start, last))
        return windows


@pytest.fixture(scope="module")
def front(shared_lab, tiny_model, tmp_path_factory):
    """test_router.py's inventory: three TP=1 replicas (group replicas) and the router group on node1."""
    return front_inventory(shared_lab, tmp_path_factory)


@pytest.fixture(scope="module")
def deployed(front):
    """The three replicas and the router, converged (on a kept lab a first deploy.yml may roll the plan's change)."""
    lab, _ = front
    play(front)
    front_play = lab.ansible_playbook("playbooks/router.yml", timeout=1200, inventory=front[1])
    assert front_play.returncode == 0
    assert listed(lab) == sorted(worker(lab, n) for n in REPLICAS)
    return lab


def test_a_serve_arg_rolls_one_server_at_a_time_with_no_failed_request(front, deployed, tmp_path):
    lab = deployed
    urls = sorted(worker(lab, n) for n in REPLICAS)
    before = {node: main_pid(lab, node) for node in REPLICAS}
    with Load(lab, tmp_path) as load:
        started = time.monotonic()
        result = play(front, "--tags", "vllm", "-e", json.dumps(GOOD))
        ended = time.monotonic()
    load.report(f"rolling change in {ended - started:.0f} s", started, ended)
    assert result.returncode == 0, result.stdout[-6000:]
    assert all(r["rc"] == 0 for r in load.rounds), [r["tail"] for r in load.rounds if r["rc"]]
    assert load.failed() == 0
    # Every server left the router once, for its own restart, and never two at a time.
    windows = load.absent_windows(urls)
    print("out of the router (s after the first sample):", {
        url: [(round(a - load.samples[0][0]), round(b - load.samples[0][0])) for a, b in spans]
        for url, spans in windows.items()})
    assert all(len(spans) == 1 for spans in windows.values()), windows
    assert min(len(shown) for _, shown in load.samples if shown) == len(REPLICAS) - 1
    order = sorted(urls, key=lambda url: windows[url][0][0])
    assert order == [worker(lab, n) for n in REPLICAS], order  # node1, node2, node3
    spans = [windows[url][0] for url in order]
    assert all(earlier[1] < later[0] for earlier, later in zip(spans, spans[1:], strict=False)), spans
    # The play's own words: one server at a time, in order.
    assert [f"rolling change, server {i} of 3" in result.stdout for i in (1, 2, 3)] == [True] * 3
    for node in REPLICAS:
        assert main_pid(lab, node) != before[node], node
        args = running_argv(lab, node)
        assert "--max-num-seqs 32" in args and "--shutdown-timeout 30" in args, (node, args)
    assert listed(lab) == urls
    # The nodes share the lab host's kernel, so their monotonic clocks compare: the new processes started in order.
    starts = [int(lab.ssh(n, "systemctl show -p ExecMainStartTimestampMonotonic --value vllm.service").stdout)
              for n in REPLICAS]
    print("new processes started (s after node1's):", [round((at - starts[0]) / 1e6) for at in starts])
    assert starts == sorted(starts), starts


def test_the_same_change_again_changes_nothing_and_check_mode_touches_nothing(front, deployed):
    lab = deployed
    again = play(front, "--tags", "vllm", "-e", json.dumps(GOOD))
    counts = changed(again.stdout)
    assert counts and all(value == 0 for value in counts.values()), counts
    pids = {node: main_pid(lab, node) for node in REPLICAS}
    checked = play(front, "--tags", "vllm", "--check", "-e", json.dumps(CHECK_ONLY))
    assert checked.returncode == 0, checked.stdout[-6000:]
    assert {node: main_pid(lab, node) for node in REPLICAS} == pids
    assert listed(lab) == sorted(worker(lab, n) for n in REPLICAS)
    for node in REPLICAS:
        assert "--max-num-seqs 32" in running_argv(lab, node)


def test_a_change_that_makes_vllm_exit_stops_the_roll_at_the_first_server_and_rolls_it_back(front, deployed,
                                                                                            tmp_path):
    lab = deployed
    pids = {node: main_pid(lab, node) for node in REPLICAS}
    plans = {node: lab.ssh(node, "sha256sum /etc/vllm-cluster/plan.json").stdout.split()[0] for node in REPLICAS}
    old_argv = running_argv(lab, "node1")
    with Load(lab, tmp_path) as load:
        started = time.monotonic()
        result = play(front, "--tags", "vllm", "-e", json.dumps(BAD), check=False)
        ended = time.monotonic()
    load.report("failed change", started, ended)
    assert result.returncode != 0
    output = result.stdout
    assert "ROLLING CHANGE STOPPED at node1 (argv adds --tokenizer /srv/models/no-such-tokenizer)" in output, \
        output[-6000:]
    assert "not reached, unchanged: node2, node3" in output and "back in the router (node1)" in output
    assert "host node1: the new vLLM deployment did not come up on node1" in output
    assert "rolling change, server 2 of 3" not in output
    assert load.failed() == 0
    assert all(r["rc"] == 0 for r in load.rounds), [r["tail"] for r in load.rounds if r["rc"]]
    # node1 runs its previous argv again and is back in the router; node2 and node3 were not touched.
    assert running_argv(lab, "node1") == old_argv and "--tokenizer" not in old_argv
    assert main_pid(lab, "node1") != pids["node1"]
    assert {node: main_pid(lab, node) for node in ("node2", "node3")} == {n: pids[n] for n in ("node2", "node3")}
    assert {node: lab.ssh(node, "sha256sum /etc/vllm-cluster/plan.json").stdout.split()[0]
            for node in REPLICAS} == plans
    assert listed(lab) == sorted(worker(lab, n) for n in REPLICAS)


def test_the_lab_is_left_as_test_deploy_leaves_it(front):
    """No vLLM and no router anywhere (teardown.yml takes the router down), the lab inventory's firewall on every node."""
    lab, inventory = front
    lab.ansible_playbook("playbooks/teardown.yml", timeout=900, inventory=inventory)
    assert_router_torn_down(lab)
    lab.ansible_playbook("deploy.yml", "--tags", "firewall", timeout=900)
    assert_no_unit_active(lab, "vllm*.service")
