#!/usr/bin/env python3
"""Fleet scale: plan.yml and a no-op deploy.yml at 3, 6 and 9 nodes (deployments of 3), side by side in one run.

    sudo .venv/bin/python bench/fleet_scale.py [--name tfscale] [--rounds 3] [--out results/bench/fleet_scale.json]
    sudo .venv/bin/python bench/fleet_scale.py --per-deployment 9 --plan-sizes 3 6 9   # each size ONE deployment
    .venv/bin/python bench/fleet_scale.py --no-lab        # the plan-only part, no root, no lab

Every play over the nodes runs one serial batch per deployment (docs/fleet.md), so a fleet pays per
deployment as well as per node. Measured, sizes interleaved and rotated round by round, medians reported:

1. plan: the checkout's `playbooks/plan.yml` on a generated inventory of N hosts in deployments of
   --per-deployment hosts (llama-3.1-8b from the catalog, one declared H200 per host, TP=1 and DP = the
   deployment's size, so every deployment plans a layout over all its hosts and no host is contacted);
   N = --plan-sizes (3 6 9 30 99).
2. skip plays: the same plan.yml followed by as many plays as deploy.yml has stage plays (counted from
   deploy.yml's imports), each with the fleet's exact hosts/serial expressions and only the skip task's
   `meta: end_batch` (roles/deploy_stage/tasks/skip.yml): what the skipped stage plays of a converged
   deploy.yml cost the controller, one batch per deployment, up to 99 hosts without a lab (a stand-in:
   the real plays also load their roles).
3. no-op: on a lab of --lab-nodes nodes (`lab up --name NAME`), for N = --lab-sizes (3 6 9), the
   checkout's unmodified `deploy.yml` on the lab's first N nodes in deployments of --per-deployment of
   the lab's tiny Llama (inventories/lab/group_vars, TP=1, DP = the deployment's size), with every stage
   converged: before the rounds each size is primed once by plan.yml, converged.yml and one play that
   records every stage's stamp with that run's input digest (module stage_stamp, state=record, no
   evidence: the stages themselves never ran). Sizes whose deployments differ on a shared node (e.g. one
   deployment per size) are primed again right before each of their no-ops (untimed), and all of them
   again when playbooks/, roles/ or plugins/ change during the run (converged.yml's code digest). A
   timed run must print "nothing to do" once per deployment and end changed=0 on every host; a run that
   decides to run a stage is killed at once and the bench stops. Each no-op is
   preceded by `ansible vllm_nodes -m ping` on the same hosts (timed too; it also opens SSH's
   ControlPersist connections, so every no-op runs over warm connections).

Each measure is taken twice: wall seconds, and the controller's CPU seconds (user + system of
ansible-playbook and every process it waited for: its workers and their ssh clients), which other jobs on
the host disturb far less. Prints a table of the medians (nodes, deployments, plan s, no-op s, seconds per
node, ratios to the smallest size) and a linear fit (over the deployments, or over the nodes when every
size is one deployment) with its 100-node extrapolation;
writes the same, with every sample, as JSON to --out (default results/bench/fleet_scale.json). The lab is
always brought down at the end (`lab down`, then `lab status` must show it gone). Every subprocess has
a timeout.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "lab" / "lab"
BIN = REPO / ".venv" / "bin"
RUNTIME_PYTHON = REPO / ".venv-runtime" / "bin" / "python"
MODEL = REPO / ".cache" / "models" / "tiny-llama"
OUT = REPO / "results" / "bench" / "fleet_scale.json"
LAB_GROUP_VARS = REPO / "inventories" / "lab" / "group_vars" / "vllm_nodes.yml"
sys.path.insert(0, str(REPO / "lab"))
sys.path.insert(0, str(REPO / "collections"))

FLEET_HOSTS = ("{{ groups | vllm_ops.cluster.fleet_hosts(hostvars | default(none), "
               "vllm_cluster_deployments | default('')) }}")
FLEET_BATCHES = ("{{ groups | vllm_ops.cluster.fleet_batches(hostvars | default(none), "
                 "vllm_cluster_deployments | default('')) }}")
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
NOTHING_TO_DO = "nothing to do: every stage holds on every node"
# converged.yml's summary when a stage would run (plugins/module_utils/deploy/stage_stamp.py, summary()).
RUNS_A_STAGE = re.compile(r'"(runs: |no stage skipped: )')
# The plan-only fleet: a catalog model, one declared GPU per host, so plan.yml contacts no host.
PLAN_GROUP_VARS = {
    "vllm_cluster_model": "llama-3.1-8b",
    "vllm_cluster_model_path": "/srv/models/llama-3.1-8b",
    "vllm_cluster_max_model_len": 8192,
    "vllm_cluster_tp": 1,
    "vllm_cluster_gpus": {"count": 1, "name": "NVIDIA H200", "memory_total_mib": 143771, "nvlink": False},
}
TIMEOUTS = {"lab_up": 900, "lab_down": 600, "lab_status": 120, "plan": 900, "prime": 1800, "noop": 1200,
            "ping": 300, "model": 300}


LAST_CPU_S = [0.0]  # run()'s last command: its CPU seconds and its children's


class NotANoop(RuntimeError):
    """deploy.yml decided to run a stage: the bench killed it."""


# --- pure helpers ---------------------------------------------------------------------------------------------
def deployments_of(hosts: list[str], per_deployment: int) -> list[list[str]]:
    """The hosts in deployments of per_deployment, in order (the last one takes what is left)."""
    if per_deployment < 1:
        raise ValueError("per_deployment must be >= 1")
    return [hosts[i:i + per_deployment] for i in range(0, len(hosts), per_deployment)]


def group_name(index: int) -> str:
    return f"fs_d{index + 1}"


def deployment_name(index: int) -> str:
    return f"fleet-d{index + 1}"


def test_address(index: int) -> str:
    """A distinct documentation address per generated host (198.18.0.0/15, never routed): fleet.py refuses
    two inventory hosts on one machine."""
    return f"198.18.{index // 250}.{index % 250 + 1}"


def plan_inventory(size: int, per_deployment: int) -> tuple[dict, dict[str, dict]]:
    """hosts.yml and group_vars of a generated fleet: `size` hosts h1..hN in deployments of per_deployment."""
    hosts = [f"h{k}" for k in range(1, size + 1)]
    children, group_vars = {}, {"vllm_nodes": dict(PLAN_GROUP_VARS)}
    for index, members in enumerate(deployments_of(hosts, per_deployment)):
        children[group_name(index)] = {"hosts": {host: {"ansible_host": test_address(hosts.index(host))}
                                                 for host in members}}
        group_vars[group_name(index)] = {"vllm_cluster_deployment": deployment_name(index),
                                         "vllm_cluster_dp": len(members)}
    return {"all": {"children": {"vllm_nodes": {"children": children}}}}, group_vars


def lab_inventory(lab_hosts: dict, size: int, per_deployment: int) -> tuple[dict, dict[str, dict]]:
    """The lab's hosts.yml (as `lab up` wrote it) cut to its first `size` nodes, in deployments of per_deployment.

    The lab's vars (user, key, SSH options, interpreter, lab_repository) stay on vllm_nodes; each deployment's
    group sets its name and TP=1, DP = its size over the lab's tiny Llama (inventories/lab/group_vars)."""
    nodes = lab_hosts["all"]["children"]["vllm_nodes"]
    members = nodes["hosts"]
    names = list(members)[:size]
    if len(names) < size:
        raise ValueError(f"the lab has {len(members)} nodes, {size} wanted")
    children, group_vars = {}, {}
    for index, group in enumerate(deployments_of(names, per_deployment)):
        children[group_name(index)] = {"hosts": {name: dict(members[name]) for name in group}}
        # No vLLM runs on these nodes (the stages never ran): the converged check's completion from the
        # controller is left out, so the no-op measures the stamps and the skipped plays.
        group_vars[group_name(index)] = {"vllm_cluster_deployment": deployment_name(index), "vllm_cluster_tp": 1,
                                         "vllm_cluster_dp": len(group), "vllm_cluster_converged_client_check": False}
    hosts = {"all": {"children": {"vllm_nodes": {"children": children, "vars": dict(nodes.get("vars") or {})}}}}
    return hosts, group_vars


def skip_plays_playbook(plan_playbook: Path, plays: int) -> list[dict]:
    """plan.yml, then `plays` fleet plays that only end their batch: a skipped stage play, once per deployment."""
    book: list[dict] = [{"name": "Plan every deployment (the checkout's plan.yml)",
                         "ansible.builtin.import_playbook": str(plan_playbook)}]
    for number in range(1, plays + 1):
        book.append({"name": f"Stand-in for skipped stage play {number}: one batch per deployment",
                     "hosts": FLEET_HOSTS, "serial": FLEET_BATCHES, "gather_facts": False,
                     "tasks": [{"name": "End this deployment's batch (a skipped stage)",
                                "ansible.builtin.meta": "end_batch"}]})
    return book


def prime_playbook(playbooks: Path) -> list[dict]:
    """plan.yml and converged.yml (which set each node's vllm_cluster_stage_digest), then a stamp for every stage
    of the plan with that digest: the next deploy.yml skips every stage, as on a converged fleet."""
    return [
        {"name": "Plan every deployment (the checkout's plan.yml)",
         "ansible.builtin.import_playbook": str(playbooks / "plan.yml")},
        {"name": "Compute each node's input digest (the checkout's converged.yml)",
         "ansible.builtin.import_playbook": str(playbooks / "converged.yml")},
        {"name": "Record every stage of the plan as converged (fleet_scale's priming, no evidence)",
         "hosts": FLEET_HOSTS, "serial": FLEET_BATCHES, "gather_facts": False,
         "tasks": [{"name": "Record the stage's stamp with this run's digest",
                    "vllm_ops.cluster.stage_stamp": {"state": "record", "stage": "{{ item }}",
                                                     "digest": "{{ vllm_cluster_stage_digest }}"},
                    "loop": "{{ vllm_cluster_plan | vllm_ops.cluster.deploy_stages | map(attribute='name') | list }}"}]},
    ]


def deploy_plays(playbook: Path) -> list[dict]:
    """Every play deploy.yml runs, imports followed: [{file, name, fleet, serial}] (fleet: hosts are the nodes)."""
    plays = []
    for entry in yaml.safe_load(playbook.read_text()) or []:
        target = entry.get("ansible.builtin.import_playbook") or entry.get("import_playbook")
        if target:
            plays += deploy_plays((playbook.parent / target).resolve())
            continue
        hosts = str(entry.get("hosts", ""))
        plays.append({"file": playbook.name, "name": entry.get("name", ""),
                      "fleet": "fleet_hosts" in hosts, "serial": "serial" in entry})
    return plays


def recap(output: str) -> dict[str, dict[str, int]]:
    return {host: {"ok": int(ok), "changed": int(changed), "unreachable": int(unreachable), "failed": int(failed)}
            for host, ok, changed, unreachable, failed in RECAP.findall(output)}


def noop_problems(output: str, hosts: list[str], deployments: int) -> list[str]:
    """Why a deploy.yml run was not the no-op of a converged fleet ([] when it was)."""
    problems = []
    counts = recap(output)
    missing = sorted(set(hosts) - set(counts))
    if missing:
        problems.append(f"no recap for {', '.join(missing)}")
    for host, count in sorted(counts.items()):
        if count["changed"] or count["failed"] or count["unreachable"]:
            problems.append(f"{host}: changed={count['changed']} failed={count['failed']} "
                            f"unreachable={count['unreachable']}")
    found = output.count(NOTHING_TO_DO)
    if found != deployments:
        problems.append(f"'{NOTHING_TO_DO}' printed {found} times, not once per deployment ({deployments})")
    return problems


def shared_nodes_differ(layouts: dict[int, list[list[str]]]) -> bool:
    """Whether a node belongs to different deployments at different sizes ({size: deployments' hosts}): its
    stamps then hold one size's digest at a time, so each no-op needs its size primed right before it."""
    seen: dict[str, set] = {}
    for deployments in layouts.values():
        for hosts in deployments:
            for host in hosts:
                seen.setdefault(host, set()).add(tuple(hosts))
    return any(len(shapes) > 1 for shapes in seen.values())


def interleaved(sizes: list[int], rounds: int) -> list[tuple[int, int]]:
    """(round, size) in run order: every round runs every size, the order rotated by one each round."""
    order = []
    for number in range(rounds):
        shift = number % len(sizes)
        order += [(number + 1, size) for size in sizes[shift:] + sizes[:shift]]
    return order


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x: (a, b)."""
    if len(xs) < 2 or len(set(xs)) < 2:
        raise ValueError("a fit needs two distinct x")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def summarize(samples: dict[str, dict[int, list[float]]], per_deployment: int) -> list[dict]:
    """One row per size: medians, seconds per node, ratios to the smallest size (the 3-node case)."""
    sizes = sorted({size for series in samples.values() for size in series})
    medians = {kind: {size: statistics.median(values) for size, values in series.items() if values}
               for kind, series in samples.items()}
    base = sizes[0] if sizes else None
    rows = []
    for size in sizes:
        row: dict = {"nodes": size, "deployments": -(-size // per_deployment)}
        for kind, by_size in medians.items():
            if size not in by_size:
                continue
            value = by_size[size]
            row[f"{kind}_s"] = round(value, 2)
            row[f"{kind}_s_per_node"] = round(value / size, 3)
            if base in by_size:
                row[f"{kind}_ratio"] = round(value / by_size[base], 2)
            row[f"{kind}_runs"] = [round(v, 2) for v in samples[kind][size]]
        rows.append(row)
    return rows


def fits(rows: list[dict], per_deployment: int, target_nodes: int = 100) -> dict:
    """Per measure, a least-squares line and its value at target_nodes: over the deployments when the rows differ
    in deployments (each one serial batch of per_deployment hosts), else over the nodes (one deployment)."""
    target_deployments = -(-target_nodes // per_deployment)
    by_deployments = len({row["deployments"] for row in rows}) > 1
    result = {"target_nodes": target_nodes, "target_deployments": target_deployments,
              "x": "deployments" if by_deployments else "nodes"}
    for kind in ("plan", "plan_cpu", "skip_plays", "skip_plays_cpu", "noop", "noop_cpu", "ping", "ping_cpu"):
        points = [(row["deployments"] if by_deployments else row["nodes"], row[f"{kind}_s"])
                  for row in rows if f"{kind}_s" in row]
        if len({x for x, _ in points}) < 2:
            continue
        a, b = linear_fit([p[0] for p in points], [p[1] for p in points])
        line = {"fixed_s": round(a, 2), "from": [p[0] for p in points]}
        if by_deployments:
            line.update(per_deployment_s=round(b, 3), per_node_s=round(b / per_deployment, 3))
            line[f"at_{target_nodes}_nodes_s"] = round(a + b * target_deployments, 1)
        else:
            line["per_node_s"] = round(b, 3)
            line[f"at_{target_nodes}_nodes_s"] = round(a + b * target_nodes, 1)
        result[kind] = line
    return result


def table(rows: list[dict]) -> str:
    """The medians: wall seconds, the controller's CPU seconds, seconds per node and the ratio to the first row."""
    def cell(row, key, spec):
        width = int(spec.split(".")[0])
        return format(row[key], spec) if key in row else "-".rjust(width)

    columns = [("plan s", "plan_s", "7.2f"), ("cpu", "plan_cpu_s", "6.2f"), ("/node", "plan_s_per_node", "6.3f"),
               ("ratio", "plan_ratio", "5.2f"), ("skip9 s", "skip_plays_s", "7.2f"), ("cpu", "skip_plays_cpu_s", "6.2f"),
               ("noop s", "noop_s", "7.2f"), ("cpu", "noop_cpu_s", "6.2f"), ("/node", "noop_s_per_node", "6.3f"),
               ("ratio", "noop_ratio", "5.2f"), ("cpu r", "noop_cpu_ratio", "5.2f"), ("ping s", "ping_s", "6.2f")]
    lines = [f"{'nodes':>5} {'depl':>4} " + " ".join(title.rjust(int(spec.split('.')[0])) for title, _, spec in columns)]
    for row in rows:
        lines.append(f"{row['nodes']:>5} {row['deployments']:>4} "
                     + " ".join(cell(row, key, spec) for _, key, spec in columns))
    return "\n".join(lines)


# --- processes ------------------------------------------------------------------------------------------------
def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(argv: list[str], timeout: float, env: dict | None = None, guard: re.Pattern | None = None
        ) -> tuple[int, str, float]:
    """(rc, output, seconds). Its own process group, killed on timeout, on an exception, or when a line matches
    guard (NotANoop). Raises TimeoutError on timeout. LAST_CPU_S[0]: the CPU seconds (user + system) of the
    command and every process it waited for (ansible's workers, their ssh clients): the controller's cost."""
    started = time.monotonic()
    cpu_before = children_cpu_s()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    tripped = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if guard is not None and guard.search(line):
                tripped.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            if tripped.is_set():
                raise NotANoop(f"{' '.join(argv[:4])}: a stage would run; killed")
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{' '.join(argv[:4])}: no end within {timeout:.0f}s; killed")
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        LAST_CPU_S[0] = children_cpu_s() - cpu_before
    except BaseException:
        kill(proc)
        reader.join(timeout=10)
        print("".join(lines)[-4000:], file=sys.stderr)
        raise
    reader.join(timeout=30)
    if tripped.is_set():
        raise NotANoop(f"{' '.join(argv[:4])}: a stage would have run:\n{''.join(lines)[-4000:]}")
    return proc.returncode, "".join(lines), elapsed


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def ansible_env(fact_cache: Path) -> dict:
    return dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INVENTORY_IGNORE_REGEX="^(ssh|secrets)$",
                ANSIBLE_CACHE_PLUGIN_CONNECTION=str(fact_cache), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
                PATH=f"{BIN}:{os.environ.get('PATH', '')}")


def write_inventory(directory: Path, hosts: dict, group_vars: dict[str, dict],
                    links: dict[str, Path] | None = None) -> Path:
    (directory / "group_vars").mkdir(parents=True)
    (directory / "hosts.yml").write_text("---\n" + yaml.safe_dump(hosts, sort_keys=False))
    for name, variables in group_vars.items():
        (directory / "group_vars" / f"{name}.yml").write_text("---\n" + yaml.safe_dump(variables, sort_keys=False))
    for name, target in (links or {}).items():
        (directory / name).symlink_to(target)
    return directory


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.plan_env = ansible_env(work / "facts")
        self.lab_env: dict = {}
        self.lab_inventories: dict[int, Path] = {}
        self.lab_hosts: dict[int, list[str]] = {}
        self.lab_is_up = False
        self.code_digest = ""
        self.reprimed: list[str] = []
        self.prime_each = False

    # --- lab --------------------------------------------------------------------------------------------------
    def lab(self, *words: str, timeout: float, check: bool = True) -> tuple[int, str]:
        rc, out, _ = run([str(LAB), *words, "--name", self.args.name], timeout)
        if check and rc != 0:
            raise RuntimeError(f"lab {' '.join(words)} --name {self.args.name} exited {rc}:\n{out[-3000:]}")
        return rc, out

    def lab_up(self) -> float:
        from vlab.inventory import fact_cache  # the lab's own Ansible fact cache

        started = time.monotonic()
        self.lab_is_up = True  # from here on, down is due whatever happens
        self.lab("up", "--nodes", str(self.args.lab_nodes), timeout=TIMEOUTS["lab_up"])
        up_s = time.monotonic() - started
        status = json.loads(self.lab("status", "--json", timeout=TIMEOUTS["lab_status"])[1])
        inventory = Path(status["spec"]["inventory_dir"])
        lab_hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
        self.lab_env = ansible_env(fact_cache(self.args.name))
        for size in self.args.lab_sizes:
            hosts, group_vars = lab_inventory(lab_hosts, size, self.args.per_deployment)
            directory = write_inventory(self.work / f"lab-{size}", hosts, group_vars,
                                        {"host_vars": inventory / "host_vars", "secrets": inventory / "secrets"})
            (directory / "group_vars" / "vllm_nodes.yml").symlink_to(LAB_GROUP_VARS)
            self.lab_inventories[size] = directory
            self.lab_hosts[size] = [h for g in hosts["all"]["children"]["vllm_nodes"]["children"].values()
                                    for h in g["hosts"]]
        self.prime_each = shared_nodes_differ(
            {size: deployments_of(hosts, self.args.per_deployment) for size, hosts in self.lab_hosts.items()})
        return up_s

    def lab_down(self) -> dict:
        """`lab down`, then `lab status` must say the lab is not up and nothing remains."""
        result = {}
        try:
            rc, out = self.lab("down", timeout=TIMEOUTS["lab_down"], check=False)
            result["down_rc"] = rc
            result["down_leftovers_check"] = "nothing remains" in out
        except BaseException as error:  # the status below still runs
            result["down_error"] = str(error)
        rc, out = self.lab("status", timeout=TIMEOUTS["lab_status"], check=False)
        result["status_rc"] = rc
        result["status"] = out.strip().splitlines()[-1] if out.strip() else ""
        result["gone"] = rc == 0 and "not up" in out and "nothing remains" in out
        self.lab_is_up = not result["gone"]
        return result

    # --- measures ---------------------------------------------------------------------------------------------
    def playbook(self, inventory: Path, playbook: Path, env: dict, timeout: float, guard=None) -> tuple[float, str]:
        rc, out, elapsed = run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook)], timeout, env,
                               guard)
        if rc != 0:
            raise RuntimeError(f"ansible-playbook {playbook.name} -i {inventory} exited {rc}:\n{out[-5000:]}")
        return elapsed, out

    def plan(self, size: int) -> float:
        elapsed, _ = self.playbook(self.work / f"plan-{size}", REPO / "playbooks" / "plan.yml", self.plan_env,
                                   TIMEOUTS["plan"])
        return elapsed

    def skip_plays(self, size: int) -> float:
        elapsed, _ = self.playbook(self.work / f"plan-{size}", self.work / "skip_plays.yml", self.plan_env,
                                   TIMEOUTS["plan"])
        return elapsed

    def ping(self, size: int) -> float:
        rc, out, elapsed = run([str(BIN / "ansible"), "-i", str(self.lab_inventories[size]), "vllm_nodes", "-m",
                                "ansible.builtin.ping"], TIMEOUTS["ping"], self.lab_env)
        if rc != 0:
            raise RuntimeError(f"ansible vllm_nodes -m ping ({size} nodes) exited {rc}:\n{out[-3000:]}")
        return elapsed

    def prime(self, size: int) -> float:
        elapsed, _ = self.playbook(self.lab_inventories[size], self.work / "prime.yml", self.lab_env,
                                   TIMEOUTS["prime"])
        return elapsed

    def noop(self, size: int) -> float:
        digest = current_code_digest()
        if digest != self.code_digest:  # someone changed playbooks/roles/plugins: every stamp is stale
            print(f"the code digest changed ({self.code_digest[:12]} -> {digest[:12]}): priming again", flush=True)
            self.reprimed.append(f"{time.strftime('%H:%M:%S')} {git_head()}")
            if not self.prime_each:
                self.prime_all()
        if self.prime_each:  # this size's deployments are not the last primed ones on these nodes
            self.code_digest = digest
            self.prime(size)
        elapsed, out = self.playbook(self.lab_inventories[size], REPO / "deploy.yml", self.lab_env,
                                     TIMEOUTS["noop"], guard=RUNS_A_STAGE)
        problems = noop_problems(out, self.lab_hosts[size], -(-size // self.args.per_deployment))
        if problems:
            raise NotANoop(f"deploy.yml on {size} nodes was not a no-op: {problems}\n{out[-4000:]}")
        return elapsed

    def prime_all(self) -> dict[int, float]:
        self.code_digest = current_code_digest()
        return {size: round(self.prime(size), 2) for size in self.args.lab_sizes}


def current_code_digest() -> str:
    """converged.yml's lookup code_digest, as the controller computes it now."""
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.stage_stamp import code_digest

    return code_digest(REPO)


def git_head() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30, check=False).stdout.strip()
    except subprocess.TimeoutExpired:
        return "?"


def terminate(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds into the finally blocks: the lab still goes down


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--name", default="tfscale", help="lab name (1-8 of [a-z0-9]; default tfscale)")
    parser.add_argument("--lab-nodes", type=int, default=9, help="nodes of the lab (default 9)")
    parser.add_argument("--lab-sizes", type=int, nargs="+", default=[3, 6, 9], help="no-op sizes (default 3 6 9)")
    parser.add_argument("--plan-sizes", type=int, nargs="+", default=[3, 6, 9, 30, 99],
                        help="plan.yml sizes on generated inventories (default 3 6 9 30 99)")
    parser.add_argument("--per-deployment", type=int, default=3, help="hosts per deployment (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each over every size (default 3)")
    parser.add_argument("--no-lab", action="store_true", help="the plan-only part: no lab, no root")
    parser.add_argument("--no-skip-plays", action="store_true", help="leave out the skipped-stage-plays stand-in")
    parser.add_argument("--out", default=str(OUT), help=f"JSON output (default {OUT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    if args.no_lab:
        args.lab_sizes = []
    if args.lab_sizes and os.geteuid() != 0:
        parser.error("the no-op part needs root (the lab); run with --no-lab for the plan-only part")
    if args.lab_sizes and max(args.lab_sizes) > args.lab_nodes:
        parser.error(f"--lab-sizes up to {max(args.lab_sizes)} need --lab-nodes >= that")
    if args.lab_sizes and not (MODEL / "config.json").exists():
        run([str(RUNTIME_PYTHON), str(REPO / "lab" / "make_tiny_model.py"), "llama", str(MODEL), "--weights"],
            TIMEOUTS["model"])
    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)

    plays = deploy_plays(REPO / "deploy.yml")
    stage_plays = [p for p in plays if p["fleet"] and p["file"] not in ("plan.yml", "converged.yml")]
    sizes = sorted(set(args.plan_sizes) | set(args.lab_sizes))
    result: dict = {
        "benchmark": "fleet_scale",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "host": {"cpus": os.cpu_count(), "kernel": platform.release(),
                 "mem_total_mib": round(int(Path("/proc/meminfo").read_text().split()[1]) / 1024),
                 "loadavg_at_start": os.getloadavg()},
        "commit_at_start": git_head(),
        "per_deployment": args.per_deployment, "rounds": args.rounds,
        "deploy_yml": {"plays": len(plays), "fleet_plays": sum(p["fleet"] for p in plays),
                       "fleet_plays_with_serial": sum(p["fleet"] and p["serial"] for p in plays),
                       "stage_plays": len(stage_plays), "list": plays},
        "order": [],
    }
    measures = {"plan": args.plan_sizes, "skip_plays": [] if args.no_skip_plays else args.plan_sizes,
                "ping": args.lab_sizes, "noop": args.lab_sizes}
    # Wall seconds, and the controller's CPU seconds (<kind>_cpu): the figure the other labs' load disturbs least.
    samples: dict[str, dict[int, list[float]]] = {
        f"{kind}{suffix}": {size: [] for size in kinds} for kind, kinds in measures.items() if kinds
        for suffix in ("", "_cpu")}

    work = Path(tempfile.mkdtemp(prefix="fleet_scale-"))
    bench = Bench(args, work)
    failure = None
    try:
        for size in args.plan_sizes:
            write_inventory(work / f"plan-{size}", *plan_inventory(size, args.per_deployment))
        (work / "skip_plays.yml").write_text(
            "---\n" + yaml.safe_dump(skip_plays_playbook(REPO / "playbooks" / "plan.yml", len(stage_plays)),
                                     sort_keys=False))
        (work / "prime.yml").write_text("---\n" + yaml.safe_dump(prime_playbook(REPO / "playbooks"),
                                                                 sort_keys=False))
        if args.lab_sizes:
            result["lab_up_s"] = round(bench.lab_up(), 1)
            print(f"lab {args.name} up with {args.lab_nodes} nodes in {result['lab_up_s']}s", flush=True)
            result["prime_s"] = bench.prime_all()
            result["primed_before_each_noop"] = bench.prime_each
            print(f"primed (plan + converged + stamps): {result['prime_s']}", flush=True)
            # One untimed no-op per size: the first deploy.yml after the priming loads what the later ones reuse.
            result["warmup_noop_s"] = {size: round(bench.noop(size), 2) for size in args.lab_sizes}
            print(f"warm-up no-ops (not counted): {result['warmup_noop_s']}", flush=True)
        for number, size in interleaved(sizes, args.rounds):
            done = {"round": number, "nodes": size}
            for kind, kinds in measures.items():  # ping right before the no-op: it warms SSH's connections
                if size in kinds:
                    done[f"{kind}_s"] = round(getattr(bench, kind)(size), 2)
                    done[f"{kind}_cpu_s"] = round(LAST_CPU_S[0], 2)
                    samples[kind][size].append(done[f"{kind}_s"])
                    samples[f"{kind}_cpu"][size].append(done[f"{kind}_cpu_s"])
            done["loadavg"] = round(os.getloadavg()[0], 2)
            result["order"].append(done)
            print(json.dumps(done), flush=True)
    except BaseException as error:  # the lab goes down; what was measured is written
        failure = error
        result["error"] = f"{type(error).__name__}: {error}"[:4000]
    finally:
        if bench.lab_is_up:
            result["lab_down"] = bench.lab_down()
            print(f"lab {args.name} down: {result['lab_down']}", flush=True)
        shutil.rmtree(work, ignore_errors=True)

    result["commit_at_end"] = git_head()
    result["reprimed_after_code_changes"] = bench.reprimed
    result["loadavg_at_end"] = os.getloadavg()
    rows = summarize({k: {s: v for s, v in series.items() if v} for k, series in samples.items()},
                     args.per_deployment)
    result["rows"] = rows
    if rows:
        result["fit"] = fits(rows, args.per_deployment)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows))
    if "fit" in result:
        print(json.dumps(result["fit"], indent=2))
    print(f"wrote {out}")
    if failure is not None:
        print(f"fleet_scale: stopped: {result['error']}", file=sys.stderr)
        return 1
    if result.get("lab_down", {}).get("gone") is False:
        print(f"fleet_scale: lab {args.name} is not gone: {result['lab_down']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
