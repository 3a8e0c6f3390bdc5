"""deploy.yml skips a stage only on a healthy deployment: units, stopped processes, a completion from the controller."""

import json
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ansible_collections.vllm_ops.cluster.plugins.lookup.api_completion import ask
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import health, host_state

SHOW = "LoadState=loaded\nActiveState={active}\nSubState={sub}\nNRestarts={restarts}\nControlGroup={cg}\nMainPID={pid}\n"


def fake_proc(tmp_path, states):
    """A /proc with {pid: state} and their /proc/<pid>/task/<pid>/children (every later pid a child of the first)."""
    proc = tmp_path / "proc"
    pids = list(states)
    for pid, state in states.items():
        task = proc / str(pid) / "task" / str(pid)
        task.mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (python3 (x) y) {state} 1 {pid} 0 0\n")
        (task / "children").write_text(" ".join(str(p) for p in pids[1:]) + " " if pid == pids[0] else "")
    return proc


def test_the_state_letter_follows_the_last_parenthesis():
    assert health.process_state("123 (vllm (worker) 1) T 1 2 3") == "T"
    assert health.process_state("7 (sleep) S 1") == "S"
    assert health.process_state("") == ""


def test_stopped_processes_are_read_from_the_unit_cgroup_or_else_from_its_main_process(tmp_path):
    proc = fake_proc(tmp_path, {100: "S", 101: "T", 102: "t", 103: "R"})
    cgroups = tmp_path / "cgroup"
    unit = cgroups / "system.slice" / "vllm.service"
    (unit / "child").mkdir(parents=True)
    (unit / "cgroup.procs").write_text("100\n101\n")
    (unit / "child" / "cgroup.procs").write_text("102\n")
    shown = SHOW.format(active="active", sub="running", restarts=0, cg="/system.slice/vllm.service", pid=100)
    found = health.unit_health(shown, str(cgroups), str(proc))
    assert found == {"load_state": "loaded", "active_state": "active", "sub_state": "running", "restarts": 0,
                     "stopped_pids": [101, 102]}
    assert health.node_problems({"vllm.service": found}) == ["vllm.service processes stopped (pids 101, 102 in state T)"]
    # No cgroup to read (another hierarchy, a container): the main process and its descendants.
    no_cgroup = SHOW.format(active="active", sub="running", restarts=0, cg="/elsewhere", pid=100)
    assert health.unit_health(no_cgroup, str(cgroups), str(proc))["stopped_pids"] == [101, 102]
    # cgroup v1: systemd's own hierarchy.
    v1 = tmp_path / "v1"
    (v1 / "systemd" / "ray.service").mkdir(parents=True)
    (v1 / "systemd" / "ray.service" / "cgroup.procs").write_text("103\n")
    assert health.cgroup_pids("/ray.service", str(v1)) == [103]
    # host_state's unit read gives the vllm role the same pids (a restart is wanted).
    state = host_state.unit_state(shown + "UnitFileState=enabled\n", str(cgroups), str(proc))
    assert state["stopped_pids"] == [101, 102] and state["unit_file_state"] == "enabled"


def test_a_real_stopped_process_is_found():
    child = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        for _ in range(50):
            if health.stopped_pids([child.pid]):
                break
            time.sleep(0.02)
        assert health.stopped_pids([child.pid, os.getpid()]) == [child.pid]
        assert child.pid in health.process_tree(os.getpid())
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.1)
        assert health.stopped_pids([child.pid]) == []
    finally:
        child.kill()
        child.wait()


def test_each_unit_finding_says_what_is_wrong():
    def problem(**values):
        return health.unit_problem("vllm.service", {"load_state": "loaded", "active_state": "active",
                                                    "sub_state": "running", "restarts": 0, "stopped_pids": [],
                                                    **values})
    assert problem() is None
    assert problem(active_state="failed", sub_state="failed") == "vllm.service failed (failed)"
    assert problem(active_state="activating", sub_state="auto-restart", restarts=4) == (
        "vllm.service restarting (activating/auto-restart, 4 restarts)")
    # A first start is not a restart loop; a unit not installed here is not this node's.
    assert problem(active_state="activating", sub_state="start", restarts=0) is None
    assert problem(load_state="not-found", active_state="failed") is None
    assert problem(stopped_pids=list(range(1, 11))) == (
        "vllm.service processes stopped (pids 1, 2, 3, 4, 5, 6, 7, 8 ... in state T)")
    assert health.problems({"node2": ["vllm.service failed (failed)"], "node1": []}, ["controller: x"]) == [
        "node2: vllm.service failed (failed)", "controller: x"]


PLAN = {
    "backend": "ray", "ports": {"api": 8000}, "service": {"unit": "vllm.service"},
    "nodes": [
        {"host": "node1", "node_rank": 0, "runs_vllm": True, "headless": False,
         "argv": ["vllm", "serve", "/srv/models/tiny", "--host", "0.0.0.0"]},
        {"host": "node2", "node_rank": 1, "runs_vllm": True, "headless": True, "argv": ["vllm", "serve", "/srv/models/tiny"]},
    ],
}


def test_the_units_and_the_api_servers_come_from_the_plan():
    assert health.units_to_check(PLAN, "node1") == ["vllm.service", "ray-head.service"]
    assert health.units_to_check(PLAN, "node2") == ["vllm.service", "ray-worker.service"]
    assert health.units_to_check(dict(PLAN, backend="mp"), "node2") == ["vllm.service"]
    assert health.units_to_check(PLAN, "node9") == []
    assert health.api_targets(PLAN, {"node1": "10.0.0.1"}) == [
        {"host": "node1", "url": "http://10.0.0.1:8000/v1/completions", "model": "/srv/models/tiny"}]
    # Independent replicas: every node serves; a bound address wins; IPv6 in brackets; the served name wins.
    replicas = dict(PLAN, served_model_name="tiny", nodes=[
        dict(PLAN["nodes"][0], argv=["vllm", "serve", "m", "--host", "fd00::1"]),
        dict(PLAN["nodes"][1], headless=False)])
    assert [(t["url"], t["model"]) for t in health.api_targets(replicas, {})] == [
        ("http://[fd00::1]:8000/v1/completions", "tiny"), ("http://node2:8000/v1/completions", "tiny")]
    url, body, headers = health.completion_request(health.api_targets(PLAN)[0], "sk-1")
    assert headers["Authorization"] == "Bearer sk-1" and json.loads(body)["max_tokens"] == 1
    assert "Authorization" not in health.completion_request(health.api_targets(PLAN)[0], "")[2]


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        length = int(self.headers.get("Content-Length", 0))
        request = json.loads(self.rfile.read(length))
        if self.path == "/slow/v1/completions":
            time.sleep(1.5)
        if self.headers.get("Authorization") != "Bearer sk-1":
            code, answer = 401, {"error": "Unauthorized"}
        elif self.path == "/empty/v1/completions":
            code, answer = 200, {"choices": []}
        else:
            code, answer = 200, {"choices": [{"text": "!"}], "model": request["model"]}
        data = json.dumps(answer).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout under test)

    def log_message(self, *args):
        pass


def test_the_controller_asks_for_a_completion_and_names_what_failed():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    closed = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    closed_port = closed.server_port
    closed.server_close()
    try:
        def target(path):
            return {"host": "node1", "url": f"{base}{path}/v1/completions", "model": "m"}
        assert ask(target(""), "sk-1", 5) is None
        assert ask(target(""), "wrong", 5) == (
            f"controller: POST {base}/v1/completions answered HTTP 401: {{\"error\": \"Unauthorized\"}}")
        assert ask(target("/empty"), "sk-1", 5) == (
            f"controller: POST {base}/empty/v1/completions answered HTTP 200 without a completion")
        assert ask(target("/slow"), "sk-1", 0.5) == (
            f"controller: POST {base}/slow/v1/completions timed out after 0.5 s")
        refused = ask({"host": "node1", "url": f"http://127.0.0.1:{closed_port}/v1/completions", "model": "m"},
                      "sk-1", 5)
        assert refused.startswith(f"controller: POST http://127.0.0.1:{closed_port}/v1/completions failed: ")
        assert "refused" in refused.lower()
    finally:
        server.shutdown()
        server.server_close()


def test_converged_yml_skips_only_when_the_controller_gets_a_completion_and_prints_why_not(tmp_path):
    """playbooks/converged.yml through ansible-playbook: every stamp recorded, then checked twice (API up, API frozen)."""
    import yaml
    from test_facts_modules import ANSIBLE, MODULE_PYTHON, REPO

    frozen = threading.Event()

    class Api(Handler):
        def do_POST(self):  # noqa: N802
            if frozen.is_set():
                time.sleep(3)
            super().do_POST()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # systemctl as a node without the unit installed: units are read, none is ours to judge.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "systemctl").write_text("#!/bin/sh\nprintf 'LoadState=not-found\\nActiveState=inactive\\n"
                                    "SubState=dead\\nNRestarts=0\\nControlGroup=\\nMainPID=0\\nInvocationID=\\n'\n")
    (fake / "systemctl").chmod(0o755)
    plan = {"deployment": "vllm", "backend": "mp", "ports": {"api": server.server_port},
            "service": {"unit": "vllm.service", "stage_dir": str(tmp_path / "stages")},
            "nodes": [{"host": "node1", "node_rank": 0, "runs_vllm": True, "headless": False,
                       "argv": ["vllm", "serve", "m", "--host", "127.0.0.1"]}]}
    record = {"hosts": "node1", "gather_facts": False, "tasks": [{
        "name": "Record every stage", "vllm_ops.cluster.stage_stamp": {
            "state": "record", "dir": str(tmp_path / "stages"), "stage": "{{ item }}",
            "digest": "{{ vllm_cluster_stage_digest }}"},
        "loop": ["preflight", "network", "firewall", "runtime", "vllm", "verify"]}]}
    converged = {"ansible.builtin.import_playbook": str(REPO / "playbooks" / "converged.yml")}
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([converged, record, converged]))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"vllm_nodes": {"hosts": {"node1": {
        "ansible_connection": "local", "ansible_python_interpreter": MODULE_PYTHON}}}}}}))
    extra = {"vllm_cluster_plan": plan, "vllm_cluster_deployment_hosts": ["node1"], "vllm_cluster_api_key": "sk-1",
             "vllm_cluster_converged_probe_timeout_s": 1}

    def summaries():
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
                   PATH=f"{fake}:{os.environ['PATH']}")
        proc = subprocess.run([str(ANSIBLE.with_name("ansible-playbook")), "-i", str(inventory), str(playbook),
                               "-e", json.dumps(extra)], cwd=REPO, capture_output=True, text=True, timeout=300,
                              check=False, env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        return [task["hosts"]["node1"]["msg"] for play in json.loads(proc.stdout)["plays"] for task in play["tasks"]
                if task["task"]["name"] == "Print what runs and why"]

    url = f"http://127.0.0.1:{server.server_port}/v1/completions"
    try:
        first, second = summaries()
        assert first[0] == "runs: preflight, network, firewall, runtime, vllm, verify"
        assert second[:2] == ["converged on every node, skipped: preflight, network, firewall, runtime, vllm, verify",
                              "nothing to do: every stage holds on every node"]
        frozen.set()
        _, frozen_run = summaries()
        assert frozen_run == ["no stage skipped: the deployment is not healthy",
                              f"  controller: POST {url} timed out after 1 s",
                              "runs: preflight, network, firewall, runtime, vllm, verify"]
    finally:
        server.shutdown()
        server.server_close()


def test_free_space_is_read_where_the_path_is_or_will_be_created(tmp_path):
    """The vllm preflight's floor reads this: a cache directory vLLM has not created yet counts on its parent's
    filesystem. A wrong ancestor or the root's statvfs instead of the path's would fail the equality below."""
    (tmp_path / "home").mkdir()
    expected = os.statvfs(tmp_path / "home")
    found = host_state.free_space(str(tmp_path / "home" / ".cache" / "vllm"))
    assert found["checked"] == str(tmp_path / "home")
    assert found["total_bytes"] == expected.f_blocks * expected.f_frsize > 0
    assert 0 <= found["free_bytes"] <= found["total_bytes"]
    assert host_state.free_space(str(tmp_path / "home"))["checked"] == str(tmp_path / "home")
