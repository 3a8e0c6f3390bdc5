#!/usr/bin/env python3
"""What Ansible costs on top of vLLM: deploy.yml against the same `vllm serve` by hand, on the lab.

    sudo .venv/bin/python bench/deploy_overhead.py [--name bdeploy] [--rounds 2] [--keep]

On one 3-node lab with the lab's deployment (inventories/lab/group_vars: 2-node
mp, TP=2, tiny Llama on vLLM's CPU platform):

1. provision: `deploy.yml` once (runtime installed, model staged; timed but
   not part of the ratio);
2. one by-hand start to its first completion, not counted (a warm-up: the
   provisioning run warmed the unit's torch cache, not the one in /tmp);
   then per round, side by side on the same provisioned nodes, vLLM stopped
   before each start:
   - by hand: the plan's exact argv and environment of every node, started over
     SSH with systemd-run as the service user (a transient unit: no unit file,
     no Ansible; node 2 and node 1 at once), until the first completion
     answers on the head;
   - deploy.yml: from its start, with vLLM's unit and env files removed, until
     the first completion answers on the head (polled from the controller
     while deploy.yml runs); deploy.yml's own end is recorded too;
   the ratio deploy/hand (target <= 1.3);
3. a no-op re-run of deploy.yml on the converged 3 nodes against
   `ansible all -m ping` (target <= 3x: the converged check reads the stamps and the
   health of every node and asks the API for one completion), best of --rounds each.

Writes results/bench/deploy_overhead.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "lab" / "lab"
BIN = REPO / ".venv" / "bin"
RUNTIME_PYTHON = REPO / ".venv-runtime" / "bin" / "python"
MODEL = REPO / ".cache" / "models" / "tiny-llama"
OUT = REPO / "results" / "bench" / "deploy_overhead.json"
sys.path.insert(0, str(REPO / "lab"))

from vlab.inventory import api_key_path, fact_cache  # noqa: E402  (each lab's own Ansible fact cache)
from vlab.machines import SSH_OPTIONS  # noqa: E402  (the options lab/lab itself uses)

VENV = "/opt/vllm-cluster/venv"
HOME = "/var/lib/vllm-cluster"
USER = "vllm"
HAND_UNIT = "vllm-by-hand"
GUARD_DIR = "/usr/local/lib/vllm-cluster/python"  # roles/vllm_service: vllm_service_api_guard_dir
START_TIMEOUT_S = 600
POLL_S = 0.25
RECAP = re.compile(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", re.M)


class Bench:
    def __init__(self, name: str) -> None:
        self.name = name
        self.status: dict = {}

    # --- lab ----------------------------------------------------------------------
    def lab(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(LAB), *args, "--name", self.name], capture_output=True, text=True,
                              timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"lab {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def up(self) -> None:
        self.lab("up", "--nodes", "3")
        self.status = json.loads(self.lab("status", "--json").stdout)

    @property
    def inventory(self) -> Path:
        return Path(self.status["spec"]["inventory_dir"])

    def address(self, node: str) -> str:
        return next(n["management_address"] for n in self.status["nodes"] if n["node"] == node)

    def ssh(self, node: str, command: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        argv = ["ssh", "-i", str(self.inventory / "ssh" / "id_ed25519"), *SSH_OPTIONS,
                f"root@{self.address(node)}", command]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{node}: `{command}` exited {proc.returncode}: {proc.stderr[-1000:]}")
        return proc

    # --- ansible ------------------------------------------------------------------
    def env(self) -> dict:
        return dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INVENTORY_IGNORE_REGEX="^(ssh|secrets)$",
                    ANSIBLE_CACHE_PLUGIN_CONNECTION=str(fact_cache(self.name)),
                    PATH=f"{BIN}:{os.environ.get('PATH', '')}")

    def playbook(self, *args: str, timeout: float = 2400) -> subprocess.Popen:
        return subprocess.Popen([str(BIN / "ansible-playbook"), "-i", str(self.inventory), *args], cwd=REPO,
                                env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def run_playbook(self, *args: str, timeout: float = 2400) -> tuple[float, str]:
        started = time.monotonic()
        proc = self.playbook(*args)
        out, _ = proc.communicate(timeout=timeout)
        elapsed = time.monotonic() - started
        if proc.returncode != 0:
            raise RuntimeError(f"ansible-playbook {' '.join(args)} failed ({proc.returncode}):\n{out[-6000:]}")
        return elapsed, out

    def ping(self) -> float:
        started = time.monotonic()
        proc = subprocess.run([str(BIN / "ansible"), "-i", str(self.inventory), "all", "-m", "ansible.builtin.ping"],
                              cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"ansible all -m ping failed:\n{proc.stdout[-3000:]}")
        return time.monotonic() - started

    # --- vLLM ---------------------------------------------------------------------
    def plan(self) -> dict:
        self.run_playbook("playbooks/plan.yml", "-e", "vllm_cluster_plan_output=true",
                          "-e", f"vllm_cluster_deployment=bench-{self.name}")
        return json.loads((REPO / "results" / f"bench-{self.name}" / "plan.json").read_text())

    def completion_ok(self, node: str) -> bool:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key()}"}
        base = f"http://{self.address(node)}:8000/v1"
        try:
            # The API's model id is the plan's served_model_name (the deployment's name by default): ask for it.
            with urllib.request.urlopen(urllib.request.Request(f"{base}/models", headers=headers),
                                        timeout=10) as response:
                served = json.loads(response.read())["data"][0]["id"]
            body = json.dumps({"model": served, "prompt": "The quick brown fox", "max_tokens": 4,
                               "temperature": 0, "ignore_eos": True}).encode()
            request = urllib.request.Request(f"{base}/completions", data=body, headers=headers)
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())["usage"]["completion_tokens"] == 4
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError, KeyError, IndexError):
            return False

    def api_key(self) -> str:
        return api_key_path(self.inventory).read_text().strip()

    def wait_first_completion(self, node: str, started: float, process: subprocess.Popen | None = None,
                              by_hand: list[str] = ()) -> float:
        checked = time.monotonic()
        while time.monotonic() - started < START_TIMEOUT_S:
            if self.completion_ok(node):
                return time.monotonic() - started
            if process is not None and process.poll() is not None and process.returncode != 0:
                raise RuntimeError(f"deploy.yml exited {process.returncode} before a completion answered")
            if by_hand and time.monotonic() - checked > 5:  # a by-hand start that died is not waited for
                checked = time.monotonic()
                for host in by_hand:
                    if self.ssh(host, f"systemctl is-failed --quiet {HAND_UNIT}", check=False).returncode == 0:
                        tail = self.ssh(host, f"journalctl -u {HAND_UNIT} -n 15 --no-pager", check=False).stdout
                        raise RuntimeError(f"{host}: the by-hand start failed:\n{tail}")
            time.sleep(POLL_S)
        raise RuntimeError(f"no completion from {node} within {START_TIMEOUT_S}s")

    def stop_all(self, nodes: list[str], remove_units: bool) -> None:
        for node in nodes:
            command = ("systemctl stop vllm.service 2>/dev/null; systemctl disable vllm.service 2>/dev/null; "
                       f"systemctl stop {HAND_UNIT} 2>/dev/null; systemctl reset-failed {HAND_UNIT} 2>/dev/null; true")
            if remove_units:
                command += ("; rm -f /etc/systemd/system/vllm.service /etc/vllm-cluster/vllm.env; "
                            "systemctl daemon-reload")
            self.ssh(node, command)

    def start_by_hand(self, plan: dict) -> float:
        """The plan's argv and env on every node, as the service user, started at once; seconds to a completion."""
        procs = []
        started = time.monotonic()
        for node in reversed(plan["nodes"]):  # workers first, as an operator would
            # A transient unit: the same command an operator would type, detached from the SSH session.
            env = " ".join(shlex.quote(f"--setenv={k}={v}") for k, v in sorted(node["env"].items()))
            if "vllm_cluster_api_guard.ApiGuard" in node["argv"]:
                # The plan's API guard (--middleware): its module and the key file, as the unit reads them.
                key_env = f"{plan['service']['config_dir']}/api-key.env"
                env += f" --setenv=PYTHONPATH={GUARD_DIR} {shlex.quote(f'--property=EnvironmentFile=-{key_env}')}"
            argv = " ".join(shlex.quote(word) for word in [f"{VENV}/bin/vllm", *node["argv"][1:]])
            command = (f"systemd-run --quiet --unit={HAND_UNIT} --uid={USER} --working-directory={HOME} "
                       f"--setenv=HOME={HOME} {env} -- {argv}")
            argv_ssh = ["ssh", "-i", str(self.inventory / "ssh" / "id_ed25519"), *SSH_OPTIONS,
                        f"root@{self.address(node['host'])}", command]
            procs.append(subprocess.Popen(argv_ssh, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        for proc in procs:
            proc.wait(timeout=60)
        return self.wait_first_completion(plan["nodes"][0]["host"], started, by_hand=[n["host"] for n in plan["nodes"]])

    def start_with_deploy(self, plan: dict) -> tuple[float, float]:
        started = time.monotonic()
        proc = self.playbook("deploy.yml")
        first = self.wait_first_completion(plan["nodes"][0]["host"], started, proc)
        out, _ = proc.communicate(timeout=1800)
        total = time.monotonic() - started
        if proc.returncode != 0:
            raise RuntimeError(f"deploy.yml failed ({proc.returncode}):\n{out[-6000:]}")
        return first, total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="bdeploy", help="lab name (1-8 of [a-z0-9])")
    parser.add_argument("--rounds", type=int, default=2, help="side-by-side rounds (and no-op re-runs)")
    parser.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("deploy_overhead: needs root (the lab)", file=sys.stderr)
        return 2
    if not (MODEL / "model.safetensors").exists():
        subprocess.run([str(RUNTIME_PYTHON), str(REPO / "lab" / "make_tiny_model.py"), "llama", str(MODEL),
                        "--weights"], check=True, timeout=300, capture_output=True)

    bench = Bench(args.name)
    result: dict = {"host": {"machine": platform.machine(), "cpus": os.cpu_count(), "kernel": platform.release()},
                    "lab_nodes": 3, "rounds": []}
    try:
        bench.up()
        provision_s, _ = bench.run_playbook("deploy.yml")
        result["provision_deploy_s"] = round(provision_s, 1)
        plan = bench.plan()
        used = [n["host"] for n in plan["nodes"]]
        result["layout"] = f"{plan['strategy']} ({plan['backend']}) TP={plan['tp']} PP={plan['pp']} on {', '.join(used)}"
        # Warm-up, not counted: the provisioning run started the unit and sent a completion (its
        # torch cache under the service home is warm); the by-hand start's cache in /tmp is not yet.
        bench.stop_all(used, remove_units=True)
        result["hand_warmup_s"] = round(bench.start_by_hand(plan), 1)
        print(f"warm-up by hand (not counted): {result['hand_warmup_s']:.1f}s", flush=True)
        for number in range(args.rounds):
            bench.stop_all(used, remove_units=True)
            hand = bench.start_by_hand(plan)
            bench.stop_all(used, remove_units=True)
            first, total = bench.start_with_deploy(plan)
            result["rounds"].append({"round": number + 1, "hand_first_completion_s": round(hand, 1),
                                     "deploy_first_completion_s": round(first, 1),
                                     "deploy_total_s": round(total, 1), "ratio": round(first / hand, 2)})
            print(f"round {number + 1}: by hand {hand:.1f}s, deploy.yml {first:.1f}s to the first completion "
                  f"({total:.1f}s to its end): ratio {first / hand:.2f}", flush=True)
        noop, pings = [], []
        for _ in range(args.rounds):
            pings.append(bench.ping())
            elapsed, out = bench.run_playbook("deploy.yml")
            changed = {host: int(n) for host, n in RECAP.findall(out)}
            if not changed or any(changed.values()):
                raise RuntimeError(f"the re-run of deploy.yml changed something ({changed}):\n{out[-4000:]}")
            noop.append(elapsed)
        result["noop_deploy_s"] = [round(x, 1) for x in noop]
        result["ping_s"] = [round(x, 2) for x in pings]
        hand_best = min(r["hand_first_completion_s"] for r in result["rounds"])
        deploy_best = min(r["deploy_first_completion_s"] for r in result["rounds"])
        result["summary"] = {
            "hand_first_completion_s": hand_best,
            "deploy_first_completion_s": deploy_best,
            "ratio_best": round(deploy_best / hand_best, 2),
            "ratio_median": round(statistics.median(r["ratio"] for r in result["rounds"]), 2),
            "ratio_target": 1.3,
            "noop_deploy_s": round(min(noop), 2),
            "ping_s": round(min(pings), 2),
            "noop_over_ping": round(min(noop) / min(pings), 1),
            "noop_over_ping_target": 3.0,
        }
    finally:
        if not args.keep:
            bench.lab("down", timeout=300)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    summary = result.get("summary", {})
    print(json.dumps(summary, indent=2))
    print(f"wrote {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
