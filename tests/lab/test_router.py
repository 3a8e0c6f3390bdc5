"""The front door on the lab (issue 18): three independent replicas of one deployment behind vllm-router.

One deployment of the lab's tiny Llama, `vllm_cluster_tp: 1` and `vllm_cluster_dp: 3` on node1, node2 and node3: a
dense model, so the planner makes its DP replicas independent servers (plan `data_parallel.mode: independent`):
each node runs its own `vllm serve` with its own API server, without --data-parallel-*, --nnodes, --master-addr or
--headless. The router (role vllm_router, playbooks/router.yml) runs on node1, the inventory's group vllm_router,
with `round_robin` so that every replica is asked in turn; its workers come from the plan.

Proved: deploy.yml and playbooks/router.yml converge and a second run of each changes nothing; the `openai` client
on the controller gets completions through the router; a request without the key gets 401; every replica's vLLM
counted requests that came through the router (vLLM's own `vllm:request_success_total` on each node, and the
router's `vllm_router_processed_requests_total` per worker); from a client's network namespace, every route the
running vLLM registers and the router's own, with no key and a wrong key, are dropped on the replicas' API ports
and answer nothing but /health through the router's guard; the key is in no `ps` line, nowhere in node1's journal
and nowhere in Ansible's output (the second router run at -vv). Failover: under a bounded `vllm bench serve` through
the router (a fixed number of prompts, it stops by itself), SIGKILL of node2's vLLM: the failed requests are
counted (at most the ones in flight), the router marks node2 unhealthy within its health checks and sends it
nothing more, systemd restarts it, and it is back in the router and serving requests. The last test hands the
front on to the run's next front module (conftest FRONT_MODULES: test_scale_replicas in CI) or leaves the lab as
test_deploy leaves it (no vLLM, no router, the lab inventory's firewall).

What could make it fail: a planner that keeps vLLM's internal DP (one API server, node2 and node3 headless: the
router would list one worker), a verify or smoke test that only asks node rank 0, router workers that miss a
replica, a launcher that puts the key in argv or a log line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench.profile import bench_argv
from lab_order import FRONT_MODULES, next_lab_module
from test_hardening import API_PORT, routes_of_the_running_vllm

pytestmark = [pytest.mark.lab, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
RUNTIME_PYTHON = REPO / ".venv-runtime" / "bin" / "python"  # has the openai client (requirements/runtime.lock)
DEPLOYMENT = "lab-tiny-llama"
REPLICAS = ("node1", "node2", "node3")
ROUTER_HOST = "node1"
ROUTER_PORT = 8080
# The runbooks' command word for word (test_doctor_runbooks checks they only run what the project runs).
LIST_WORKERS = "curl -sf --max-time 5 http://127.0.0.1:8080/list_workers"
ROUTER_METRICS_PORT = 29000
HEALTH_INTERVAL_S, HEALTH_TIMEOUT_S, FAILURE_THRESHOLD = 5, 3, 2  # the role's defaults
VICTIM = "node2"
METRICS_READER = "node3"  # stands for the Prometheus host: the replicas' vllm_service_api_metrics_from
# The bounded load of the failover test: a fixed number of prompts at a fixed rate, it stops by itself.
LOAD = {"input_len": 16, "output_len": 8, "num_prompts": 240, "request_rate": 4, "max_concurrency": 4, "seed": 0,
        "num_warmups": 0}
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
SUCCESS = re.compile(r'^vllm:request_success_total\{[^}]*\}\s+([0-9.e+]+)$', re.M)


@pytest.fixture(scope="module")
def front(shared_lab, tiny_model, tmp_path_factory):
    """The lab's hosts as one deployment of three TP=1 replicas (group replicas) and the router group on node1."""
    return front_inventory(shared_lab, tmp_path_factory)


# A front family's first deploy.yml: whatever layout the lab serves becomes the front's at once (a rolling change
# refuses a layout switch without it).
LAYOUT_SWITCH = ("-e", "vllm_cluster_allow_layout_switch=true")


def front_inventory(lab, tmp_path_factory):
    """(lab, inventory): the inventory of `front` (tests/lab/test_rolling_change.py uses it too)."""
    inventory = tmp_path_factory.mktemp("router-inventory")
    hosts = yaml.safe_load((lab.inventory / "hosts.yml").read_text())
    nodes = hosts["all"]["children"]["vllm_nodes"]
    members = nodes.pop("hosts")
    nodes["children"] = {"replicas": {"hosts": {n: members[n] for n in REPLICAS}}}
    hosts["all"]["children"]["vllm_router"] = {"hosts": {ROUTER_HOST: None}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    for shared in ("host_vars", "secrets"):
        (inventory / shared).symlink_to(lab.inventory / shared)
    group_vars = inventory / "group_vars"
    group_vars.mkdir()
    (group_vars / "vllm_nodes.yml").symlink_to(REPO / "inventories" / "lab" / "group_vars" / "vllm_nodes.yml")
    (group_vars / "replicas.yml").write_text(yaml.safe_dump(
        {"vllm_cluster_tp": 1, "vllm_cluster_dp": 3, "vllm_cluster_allow_tp_across_nodes": False,
         "vllm_service_api_metrics_from": [lab.fabric_address(METRICS_READER)]}))
    (group_vars / "vllm_router.yml").write_text(yaml.safe_dump(
        {"vllm_router_wheelhouse": "/srv/wheelhouse", "vllm_router_policy": "round_robin",
         "vllm_router_port": ROUTER_PORT, "vllm_router_prometheus_port": ROUTER_METRICS_PORT}))
    return lab, inventory


def play(front, playbook, *args, timeout=2400):
    """Run a playbook on the lab with this inventory; its output kept under logs/, its time printed."""
    lab, inventory = front
    began = time.monotonic()
    result = lab.ansible_playbook(playbook, *args, timeout=timeout, inventory=inventory)
    logs = inventory.parent / "logs"
    logs.mkdir(exist_ok=True)
    (logs / f"{len(list(logs.iterdir())):02d}-{Path(playbook).stem}.log").write_text(result.stdout)
    print(f"{playbook} {' '.join(args)}: {time.monotonic() - began:.0f} s")
    return result


def changed(output: str) -> dict[str, int]:
    return {host: int(count) for host, _, count, _, _ in RECAP.findall(output)}


@pytest.fixture(scope="module")
def runs(front):
    """deploy.yml then playbooks/router.yml, then both again (the router's second run at -vv).

    The first deploy.yml may meet the lab's default deployment still serving (the module before left it, as
    test_doctor does): it switches the layout on purpose (every server stopped, the new layout started)."""
    return {
        "deploy": play(front, "deploy.yml", *LAYOUT_SWITCH).stdout,
        "router": play(front, "playbooks/router.yml").stdout,
        "deploy_again": play(front, "deploy.yml").stdout,
        "router_again": play(front, "playbooks/router.yml", "-vv").stdout,
    }


def argv_of(lab, node: str) -> list[str]:
    shown = lab.ssh(node, "systemctl show -p ExecStart --value vllm.service").stdout
    return shown.split("argv[]=", 1)[1].split(" ;", 1)[0].split()


def router_url(lab) -> str:
    return f"http://{lab.management_address(ROUTER_HOST)}:{ROUTER_PORT}"


def openai_through_router(lab, count: int) -> list[dict]:
    """`count` completions one after another and the model list through the router, by the openai client on the
    controller; each with its wall time (``seconds``)."""
    script = (
        "import json, sys, time, openai\n"
        "client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], timeout=120, max_retries=0)\n"
        "models = [m.id for m in client.models.list().data]\n"
        "for i in range(int(sys.argv[4])):\n"
        "    started = time.monotonic()\n"
        "    done = client.completions.create(model=sys.argv[3], prompt=f'Request {i}: the quick brown fox',\n"
        "                                     max_tokens=4, temperature=0, extra_body={'ignore_eos': True})\n"
        "    print(json.dumps({'models': models, 'model': done.model, 'tokens': done.usage.completion_tokens,\n"
        "                      'seconds': time.monotonic() - started}))\n")
    proc = subprocess.run([str(RUNTIME_PYTHON), "-c", script, f"{router_url(lab)}/v1", lab.api_key, DEPLOYMENT,
                           str(count)], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def replica_successes(lab, node: str) -> float:
    """vLLM's own count of finished requests on one replica, read on the node itself (the API guard serves
    /metrics to the node's loopback and the monitoring hosts only)."""
    shown = lab.ssh(node, "curl -sf http://127.0.0.1:8000/metrics").stdout
    return sum(float(value) for value in SUCCESS.findall(shown))


def router_health(lab) -> dict[str, float]:
    """vllm_router_worker_health per worker URL, from the router's metrics port (cluster address)."""
    metrics = lab.ssh(ROUTER_HOST, f"curl -sf http://{lab.fabric_address(ROUTER_HOST)}:{ROUTER_METRICS_PORT}/metrics")
    return {worker: float(value) for worker, value in re.findall(
        r'^vllm_router_worker_health\{[^}]*worker="([^"]+)"[^}]*\}\s+([0-9.]+)$', metrics.stdout, re.M)}


def processed(lab) -> dict[str, float]:
    metrics = lab.ssh(ROUTER_HOST, f"curl -sf http://{lab.fabric_address(ROUTER_HOST)}:{ROUTER_METRICS_PORT}/metrics")
    return {worker: float(value) for worker, value in re.findall(
        r'^vllm_router_processed_requests_total\{[^}]*worker="([^"]+)"[^}]*\}\s+([0-9.]+)$', metrics.stdout, re.M)}


def test_dense_replicas_are_planned_as_independent_servers(front, runs):
    lab, _ = front
    for node in REPLICAS:
        argv = argv_of(lab, node)
        assert argv[argv.index("--tensor-parallel-size") + 1] == "1", (node, argv)
        shared = [word for word in argv if word.startswith("--data-parallel") or word in
                  ("--nnodes", "--node-rank", "--master-addr", "--headless")]
        assert shared == [], (node, argv)
    plan = json.loads(lab.ssh(ROUTER_HOST, "cat /etc/vllm-cluster/plan.json").stdout)
    assert plan["data_parallel"]["mode"] == "independent", plan["data_parallel"]
    assert [(n["host"], n["headless"], n["dp_ranks"]) for n in plan["nodes"]] == [
        ("node1", False, [0]), ("node2", False, [1]), ("node3", False, [2])]
    assert any("independent" in line for line in plan["decision"]), plan["decision"]


def test_deploy_and_router_converge_and_a_second_run_changes_nothing(front, runs):
    lab, _ = front
    assert lab.ssh(ROUTER_HOST, "systemctl is-active vllm-router.service").stdout.strip() == "active"
    assert "vllm::router" in lab.ssh(ROUTER_HOST, "ps -eo args").stdout  # the launcher's process title
    for name in ("deploy_again", "router_again"):
        counts = changed(runs[name])
        assert counts and all(value == 0 for value in counts.values()), (name, counts)
    assert ROUTER_HOST in changed(runs["router_again"])


def test_the_openai_client_gets_completions_through_the_router_and_every_replica_serves(front, runs):
    lab, _ = front
    before = {node: replica_successes(lab, node) for node in REPLICAS}
    answers = openai_through_router(lab, 9)
    assert len(answers) == 9
    assert all(a["model"] == DEPLOYMENT and a["tokens"] == 4 and DEPLOYMENT in a["models"] for a in answers)
    after = {node: replica_successes(lab, node) for node in REPLICAS}
    served = {node: after[node] - before[node] for node in REPLICAS}
    assert all(count >= 1 for count in served.values()), served
    assert sum(served.values()) == 9, served
    by_worker = processed(lab)
    assert {f"http://{lab.fabric_address(n)}:8000" for n in REPLICAS} <= set(by_worker), by_worker
    assert all(count >= 1 for count in by_worker.values()), by_worker


def openai_check(base_url: str, api_key_file: Path) -> list[dict]:
    """lab/openai_check.py (scripts/demo's client): the model list, a completion, a chat and a streamed chat."""
    proc = subprocess.run([str(RUNTIME_PYTHON), str(REPO / "lab" / "openai_check.py"), "--base-url", base_url,
                           "--model", DEPLOYMENT, "--api-key-file", str(api_key_file), "--json"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_chat_and_streamed_chat_answer_through_the_router_and_on_a_replica(front, runs):
    """What most clients send: the chat template ships in the model's tokenizer config, so vLLM answers chat."""
    lab, _ = front
    key_file = lab.inventory / "secrets" / "vllm-api-key"
    for base_url in (f"{router_url(lab)}/v1", f"http://{lab.management_address('node2')}:8000/v1"):
        models, completion, chat, stream = openai_check(base_url, key_file)
        assert DEPLOYMENT in models["models"], (base_url, models)
        assert completion["model"] == chat["model"] == stream["model"] == DEPLOYMENT, base_url
        assert completion["tokens"] == chat["tokens"] == stream["tokens"] == 8, (base_url, completion, chat, stream)
        assert chat["role"] == "assistant", (base_url, chat)
        # A stream, not one answer: the role, content deltas, the usage chunk. Not one delta per token: vLLM merges
        # the deltas its API server has not sent yet when it falls behind the engine (RequestOutputCollector).
        assert stream["chunks"] >= 3, (base_url, stream)


def test_a_request_without_the_key_is_refused_with_401(front, runs):
    lab, _ = front
    for path, body in (("/v1/models", None),
                       ("/v1/completions", json.dumps({"model": DEPLOYMENT, "prompt": "x", "max_tokens": 1}))):
        request = urllib.request.Request(f"{router_url(lab)}{path}", data=body.encode() if body else None,
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 401, (path, refused.value.code)


# The router's own routes (vllm-router 0.1.17, read from its binary) beside vLLM's: its admin API and its views.
ROUTER_ROUTES = [("GET", "/list_workers"), ("GET", "/workers"), ("POST", "/workers"), ("POST", "/add_worker"),
                 ("POST", "/remove_worker"), ("POST", "/flush_cache"), ("GET", "/get_loads"),
                 ("GET", "/scheduling/diagnostics"), ("POST", "/start_profile"), ("POST", "/stop_profile"),
                 ("GET", "/readiness"), ("GET", "/liveness"), ("GET", "/get_server_info"), ("GET", "/get_model_info"),
                 ("GET", "/health_generate")]
CLIENT_ADDRESS_OCTET = 250  # on the management network: no node's address, not the controller's (the gateway)

# Run inside the client's network namespace: every (method, url) with no key and with a wrong key; a target whose
# port does not take a connection within 3 s counts as dropped for all its routes.
WALK = r"""
import json, socket, sys, urllib.error, urllib.parse, urllib.request
def status(method, url, key):
    request = urllib.request.Request(url, data=b"{}" if method in ("POST", "PUT", "PATCH") else None, method=method)
    request.add_header("Content-Type", "application/json")
    if key is not None:
        request.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return "refused"
table = {}
for base, routes in json.load(sys.stdin).items():
    where = urllib.parse.urlsplit(base)
    try:
        socket.create_connection((where.hostname, where.port), timeout=3).close()
        reachable = True
    except OSError:
        reachable = False
    for method, path in routes:
        table[f"{base} {method} {path}"] = ([status(method, base + path, key) for key in (None, "not-the-key")]
                                             if reachable else ["dropped", "dropped"])
print(json.dumps(table))
"""


def client_namespace(lab) -> tuple[str, str]:
    """(netns, address): a network namespace on the lab's management bridge, as a client's host on the clients'
    network (inside node_firewall_api_allowed_cidrs, neither the controller nor a node of the deployment)."""
    netns, host_end = f"{lab.name}-client", f"{lab.name}-cm"
    network = lab.gateway.rsplit(".", 1)[0]
    address = f"{network}.{CLIENT_ADDRESS_OCTET}"
    remove_client_namespace(lab)
    for argv in (["ip", "netns", "add", netns],
                 ["ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", netns],
                 ["ip", "link", "set", host_end, "master", f"{lab.name}-mgmt", "up"],
                 ["ip", "-n", netns, "addr", "add", f"{address}/24", "dev", "eth0"],
                 ["ip", "-n", netns, "link", "set", "eth0", "up"],
                 ["ip", "-n", netns, "link", "set", "lo", "up"]):
        subprocess.run(argv, check=True, capture_output=True, timeout=30)
    return netns, address


def remove_client_namespace(lab) -> None:
    subprocess.run(["ip", "netns", "del", f"{lab.name}-client"], capture_output=True, timeout=30, check=False)
    subprocess.run(["ip", "link", "del", f"{lab.name}-cm"], capture_output=True, timeout=30, check=False)


def test_a_client_gets_only_health_without_the_key_on_every_route_directly_and_through_the_router(front, runs):
    """From a client's network namespace, every route the running vLLM registers (read from vLLM's own app in a
    replica's runtime) and the router's own routes, with no key and with a wrong key: on each replica's API port
    directly (one door: the firewall drops a client there) and through the router's guard. Only /health answers.
    /metrics answers the host the replicas allow it to (metrics_from, as the monitoring group's hosts are by
    default), not a client. Fails when a replica's port takes a client, when the guard forwards an admin route or a
    route without the key, or when the walk finds none of vLLM's admin routes to try."""
    lab, _ = front
    routes = routes_of_the_running_vllm(lab, "node2")
    assert ("POST", "/tokenize") in routes and ("POST", "/is_scaling_elastic_ep") in routes, routes
    targets = {f"http://{lab.management_address(node)}:{API_PORT}": routes for node in REPLICAS}
    targets[router_url(lab)] = routes + ROUTER_ROUTES
    netns, address = client_namespace(lab)
    try:
        walked = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", WALK], input=json.dumps(targets),
                                capture_output=True, text=True, timeout=1800, check=True)
    finally:
        remove_client_namespace(lab)
    table = json.loads(walked.stdout)
    print(f"\nfrom a client at {address}: {len(routes)} routes of the running vLLM, {len(ROUTER_ROUTES)} of the "
          "router; no key / wrong key")
    for where, statuses in table.items():
        print(f"{where:88} {statuses[0]!s:>8} {statuses[1]!s:>8}")
    answered = sorted(where for where, statuses in table.items()
                      if any(status not in (400, 401, 403, "refused", "dropped") for status in statuses))
    assert answered == [f"{router_url(lab)} GET /health"], answered
    direct = {where: statuses for where, statuses in table.items() if not where.startswith(router_url(lab))}
    assert set(map(tuple, direct.values())) == {("dropped", "dropped")}, "a replica's API port took a client"
    for method, path in ROUTER_ROUTES[:10]:  # the admin API: 403 whatever the key
        assert table[f"{router_url(lab)} {method} {path}"] == [403, 403], path
    # /metrics: the host the replicas allow (node3 here, in metrics_from) reads every replica's; the client read none.
    for node in REPLICAS:
        read = lab.ssh(METRICS_READER, f"curl -s -o /dev/null -w '%{{http_code}}' "
                                       f"http://{lab.fabric_address(node)}:{API_PORT}/metrics", check=False)
        assert read.stdout.strip() == "200", (node, read.stdout, read.stderr)
    assert table[f"{router_url(lab)} GET /metrics"] == [403, 403]


def test_the_key_is_absent_from_ps_the_journal_and_ansibles_output(front, runs):
    lab, _ = front
    key = lab.api_key
    assert len(key) >= 16
    ps = lab.ssh(ROUTER_HOST, "ps -eo pid,args").stdout
    assert "vllm::router" in ps or "vllm-router" in ps, ps[-2000:]
    assert key not in ps
    journal = lab.ssh(ROUTER_HOST, "journalctl --no-pager -o cat", timeout=300).stdout
    assert "vllm-router" in journal or "vllm_router" in journal
    assert key not in journal
    for name, output in runs.items():
        assert key not in output, name


def test_a_killed_replica_is_taken_out_within_the_health_checks_and_comes_back_to_traffic(front, runs, tmp_path):
    """Under `vllm bench serve` through the router, SIGKILL of node2's vLLM (its API server, the unit's main PID)."""
    lab, _ = front
    victim_url = f"http://{lab.fabric_address(VICTIM)}:8000"
    assert router_health(lab).get(victim_url) == 1.0
    argv = bench_argv(LOAD, router_url(lab), DEPLOYMENT, str(REPO / ".cache" / "models" / "tiny-llama"),
                      result_dir=str(tmp_path), result_filename="bench.json",
                      vllm=str(REPO / ".venv-runtime" / "bin" / "vllm"))
    env = dict(os.environ, OPENAI_API_KEY=lab.api_key, HF_HUB_OFFLINE="1")
    bench = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline, base = time.monotonic() + 300, sum(processed(lab).values())
        while sum(processed(lab).values()) < base + 12 and time.monotonic() < deadline:  # the load is flowing
            time.sleep(1)
        assert bench.poll() is None, "the load ended before the kill"
        pid = lab.ssh(VICTIM, "systemctl show -p MainPID --value vllm.service").stdout.strip()
        killed = time.monotonic()
        lab.ssh(VICTIM, f"kill -KILL {pid}")
        while router_health(lab).get(victim_url) != 0.0:
            assert time.monotonic() - killed < 120, "the router never marked the killed replica unhealthy"
            time.sleep(0.5)
        taken_out_s = time.monotonic() - killed
        # The runbooks' health check names the dead replica and fails; /list_workers still lists it (membership).
        code, shown = runbook_health_check(lab, len(REPLICAS))
        assert code != 0 and f"{victim_url} UNHEALTHY" in shown, shown
        assert victim_url in lab.ssh(ROUTER_HOST, LIST_WORKERS).stdout
        sent_to_victim = processed(lab).get(victim_url, 0.0)
        time.sleep(2 * HEALTH_INTERVAL_S)
        assert processed(lab).get(victim_url, 0.0) == sent_to_victim, "requests went to the dead replica"
        output, _ = bench.communicate(timeout=900)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 0, output[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    failed = LOAD["num_prompts"] - result["completed"]
    errors = sorted({str(error)[:160] for error in result.get("errors") or [] if error})
    print(f"failover: taken out after {taken_out_s:.1f} s; {failed} of {LOAD['num_prompts']} requests failed; "
          f"errors: {errors}")
    # The router's checks: FAILURE_THRESHOLD failed checks, each at most interval + timeout apart.
    assert taken_out_s <= FAILURE_THRESHOLD * (HEALTH_INTERVAL_S + HEALTH_TIMEOUT_S) + HEALTH_INTERVAL_S
    assert failed <= LOAD["max_concurrency"], (failed, errors)  # at most the requests in flight at the kill

    # systemd restarts the unit (Restart=always); the router takes the replica back and sends it requests again.
    deadline = time.monotonic() + 900
    while router_health(lab).get(victim_url) != 1.0:
        assert time.monotonic() < deadline, "the killed replica never came back into the router"
        time.sleep(2)
    print(f"failover: {VICTIM} back in the router {time.monotonic() - killed:.0f} s after the kill")
    code, shown = runbook_health_check(lab, len(REPLICAS))
    assert code == 0 and f"{len(REPLICAS)} of {len(REPLICAS)} workers healthy" in shown, shown
    assert lab.ssh(VICTIM, "systemctl show -p MainPID --value vllm.service").stdout.strip() != pid
    before = replica_successes(lab, VICTIM)
    openai_through_router(lab, 6)
    assert replica_successes(lab, VICTIM) - before >= 1


def runbook_health_check(lab, servers: int) -> tuple[int, str]:
    """The runbooks' router health check (docs/runbooks/rolling-upgrade.md, word for word) on the router host."""
    line = next(line.strip() for line in (REPO / "docs" / "runbooks" / "rolling-upgrade.md").read_text().splitlines()
                if "/workers | python3" in line)
    line = line.replace("http://127.0.0.1:8080/", f"http://127.0.0.1:{ROUTER_PORT}/").replace("<servers>", str(servers))
    done = lab.ssh(ROUTER_HOST, line, check=False)
    return done.returncode, done.stdout


def assert_router_torn_down(lab) -> None:
    """After teardown.yml: role vllm_router's teardown left no unit, key directory or process on the router host."""
    gone = lab.ssh(ROUTER_HOST, "test ! -e /etc/systemd/system/vllm-router.service && test ! -e /etc/vllm-router"
                                " && ! systemctl is-active vllm-router.service", check=False)
    assert gone.returncode == 0, "teardown.yml left vllm-router's unit, key directory or process on " + ROUTER_HOST


def workers_listed(lab) -> list[str]:
    """The router's own worker list, asked on the router host (its guard passes the host itself, without a key)."""
    shown = lab.ssh(ROUTER_HOST, LIST_WORKERS, check=False).stdout
    try:
        return sorted(json.loads(shown)["urls"])
    except (ValueError, KeyError):
        return []


def leave_front(front, request) -> None:
    """The end of a front module (conftest FRONT_MODULES): hand the front on, or leave the lab as test_deploy does.

    When the run's next module is of the front family, the three replicas and the router stay for it, checked:
    every replica's vllm.service and the router active, and the router listing the three workers. Otherwise:
    no vLLM and no router anywhere, the lab inventory's firewall on every node; teardown.yml takes the router
    down first (role vllm_router's teardown: its unit and key directory gone).
    """
    lab, _ = front
    following = next_lab_module(request)
    if following in FRONT_MODULES:
        for node in REPLICAS:
            assert lab.ssh(node, "systemctl is-active vllm.service", check=False).stdout.strip() == "active", node
        assert lab.ssh(ROUTER_HOST, "systemctl is-active vllm-router.service", check=False).stdout.strip() == "active"
        urls = sorted(f"http://{lab.fabric_address(node)}:8000" for node in REPLICAS)
        assert workers_listed(lab) == urls, f"the router does not list the three replicas: {workers_listed(lab)}"
        print(f"the front (three replicas and the router) handed on to {following}")
        return
    play(front, "playbooks/teardown.yml", timeout=900)
    assert_router_torn_down(lab)
    lab.ansible_playbook("deploy.yml", "--tags", "firewall", timeout=900)
    assert_no_unit_active(lab, "vllm*.service")


def assert_no_unit_active(lab, *patterns: str) -> None:
    """No unit matching the patterns active on any replica node; the lab firewall's own unit is meant to run."""
    quoted = " ".join(f"'{pattern}'" for pattern in patterns)
    for node in REPLICAS:
        shown = lab.ssh(node, f"systemctl list-units --state=active --no-legend --plain {quoted}", check=False)
        active = [line.split()[0] for line in shown.stdout.splitlines()
                  if line.strip() and line.split()[0] != "vllm-cluster-firewall.service"]
        assert active == [], f"{node}: {shown.stdout}"


def test_the_front_is_handed_on_or_the_lab_is_left_as_test_deploy_leaves_it(front, request):
    """For the modules after this one (leave_front)."""
    leave_front(front, request)
