"""Re-running deploy.yml repairs a drifted or broken deployment, or stops in bounded time naming host and cause.

The lab's 2-node mp deployment (TP=2, head node1, headless worker node2), healthy
and converged (the module before leaves it so). Each case breaks one thing by
hand, as an operator or another tool would, then runs `deploy.yml` once, as an
operator's first reflex; CI makes the eight repairable kinds at once (one
`deploy.yml`, about a third of their eight runs), `--extended` each alone:

- a repair case passes when deploy.yml exits 0, the broken thing is back as
  declared on the node, and the API answers a completion from the controller;
- a failure case (what Ansible must not touch: another team's nftables table, a
  full disk) passes when deploy.yml fails within the case's bound and its output
  names the host and the cause; then the operator's own fix, and a second
  deploy.yml must go green with no other step.

Each case's time to repair (or to the clear failure) is printed and written to
results/drift-repair.json, each deploy.yml's output to results/drift-repair/<case>.log
(with Ansible's per-task times: where a slow repair spent them). What would make a case fail: a stage skipped as
converged while the thing is broken (its stamp misses it, or the health check
does not see it), a foreign file kept, a rule left live, a restart that does
not happen, a wait that does not stop, a message that names another host.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.timeout(3600)]

HEAD, WORKER = "node1", "node2"
HOME = "/var/lib/vllm-cluster"
ENV_FILE = "/etc/vllm-cluster/vllm.env"
DROPIN_DIR = "/etc/systemd/system/vllm.service.d"
MODEL_DIR = "/srv/models/tiny-llama"
REPAIR_BOUND_S = 900  # one deploy.yml that restarts vLLM on the lab (vLLM's own start is 60-90 s of it)
FAIL_BOUND_S = 300  # a clear failure: no vLLM start is waited for
RESULTS = Path(__file__).resolve().parents[2] / "results" / "drift-repair.json"
TIMINGS: dict[str, dict] = {}
OUTPUTS = RESULTS.parent / "drift-repair"


@pytest.fixture(scope="module")
def deployed(shared_lab, tiny_model):
    """The lab's own deployment, verified and converged (deploy.yml; stages that hold are skipped)."""
    shared_lab.ansible_playbook("deploy.yml", timeout=2400)
    yield shared_lab
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(TIMINGS, indent=2, sort_keys=True) + "\n")
    print("\ncase                         outcome     seconds")
    for case, row in TIMINGS.items():
        print(f"{case:<28} {row['outcome']:<11} {row['seconds']:7.1f}")


def api(lab, path, body=None, timeout=60):
    request = urllib.request.Request(
        f"http://{lab.management_address(HEAD)}:8000{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {lab.api_key}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def answers(lab, timeout=60) -> bool:
    """One completion from the controller, as a client sends it."""
    try:
        model = api(lab, "/v1/models", timeout=timeout)["data"][0]["id"]
        reply = api(lab, "/v1/completions", {"model": model, "prompt": "The quick brown fox", "max_tokens": 4,
                                             "temperature": 0, "ignore_eos": True}, timeout)
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError):
        return False
    return reply["usage"]["completion_tokens"] == 4


def unit(lab, node, *props):
    shown = lab.ssh(node, f"systemctl show -p {','.join(props)} vllm.service").stdout
    return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)


def deploy(lab, case):
    """deploy.yml once, its output kept under results/drift-repair/ with each task's time (profile_tasks)."""
    started = time.monotonic()
    proc = lab.ansible_playbook("deploy.yml", check=False, timeout=2400,
                                env={"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks"})
    seconds = time.monotonic() - started
    OUTPUTS.mkdir(parents=True, exist_ok=True)
    (OUTPUTS / (case.replace(" ", "-").replace("(", "").replace(")", "") + ".log")).write_text(
        f"# deploy.yml: exit {proc.returncode} in {seconds:.1f} s\n{proc.stdout}{proc.stderr}")
    return proc, seconds


def output_of(proc) -> str:
    return proc.stdout + proc.stderr


def repaired(lab, case, check) -> str:
    """deploy.yml once: exit 0, `check()` holds on the node, a completion answers. Returns its output."""
    proc, seconds = deploy(lab, case)
    out = output_of(proc)
    TIMINGS[case] = {"outcome": "repaired" if proc.returncode == 0 else "not repaired", "seconds": round(seconds, 1)}
    assert proc.returncode == 0, f"deploy.yml did not repair {case} (exit {proc.returncode}):\n{out[-6000:]}"
    assert seconds < REPAIR_BOUND_S, f"{case}: deploy.yml took {seconds:.0f} s (bound {REPAIR_BOUND_S} s)"
    problem = check()
    assert not problem, f"{case}: deploy.yml exited 0 but {problem}:\n{out[-4000:]}"
    assert answers(lab), f"{case}: deploy.yml exited 0 but the API does not answer a completion:\n{out[-4000:]}"
    return out


def failed_clearly(lab, case, host, words) -> str:
    """deploy.yml once: fails within FAIL_BOUND_S, its failure names `host` and every one of `words`."""
    proc, seconds = deploy(lab, case)
    out = output_of(proc)
    TIMINGS[case] = {"outcome": "failed" if proc.returncode else "exit 0", "seconds": round(seconds, 1)}
    assert proc.returncode != 0, f"{case}: deploy.yml exited 0 on a deployment it cannot repair:\n{out[-4000:]}"
    assert seconds < FAIL_BOUND_S, f"{case}: deploy.yml took {seconds:.0f} s to fail (bound {FAIL_BOUND_S} s)"
    failures = "\n".join(line for line in out.splitlines() if line.startswith(("fatal:", "failed:")) or "msg" in line)
    for word in [host, *words]:
        assert word in failures, f"{case}: the failure does not name {word!r}:\n{failures[-4000:]}"
    return out


def green_after_fix(lab, case):
    proc, seconds = deploy(lab, case + " (after the fix)")
    TIMINGS[case + " (after the fix)"] = {"outcome": "repaired" if proc.returncode == 0 else "not repaired",
                                         "seconds": round(seconds, 1)}
    assert proc.returncode == 0, (f"{case}: after the operator's fix deploy.yml still fails:\n"
                                  f"{output_of(proc)[-6000:]}")
    assert answers(lab), f"{case}: after the operator's fix deploy.yml exited 0 but no completion answers"


@pytest.fixture
def lab(deployed):
    """A healthy deployment before each case (a case that failed leaves one put right by a full run)."""
    if not answers(deployed):
        deployed.ssh(HEAD, "nft delete table inet ops_block; systemctl restart vllm-cluster-firewall.service", check=False)
        deployed.ansible_playbook("deploy.yml", "-e", "vllm_cluster_full_run=true", timeout=2400)
    return deployed


def stopped_processes(lab, node) -> int:
    """How many processes of vllm.service are stopped (state T/t) on node."""
    return int(lab.ssh(node, "cg=$(systemctl show -P ControlGroup vllm.service); "
                             "for p in $(for d in /sys/fs/cgroup$cg /sys/fs/cgroup/unified$cg /sys/fs/cgroup/systemd$cg; "
                             "do [ -d $d ] && find $d -name cgroup.procs -exec cat {} +; done | sort -u); do "
                             "sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f1; done "
                             "| grep -c '^[Tt]$' || true").stdout.strip())


SHARD = f"{MODEL_DIR}/model.safetensors"
NODE_MANIFEST = "/etc/vllm-cluster/model-manifest.json"


def flip_one_byte(lab, node, path):
    """A corrupt shard of the same size (a bad disk, a copy cut and patched): only its sha256 tells."""
    lab.ssh(node, f"printf X | dd of={path} bs=1 seek=100000 conv=notrunc status=none")


def manifest_sha256(lab, node, name):
    manifest = json.loads(lab.ssh(node, f"cat {NODE_MANIFEST}").stdout)
    return next(entry["sha256"] for entry in manifest["files"] if entry["path"] == name)


# Each kind of drift deploy.yml repairs: break(lab, node) makes it by hand and returns check(), which returns ""
# once the node is back as declared (else what is still wrong); `says` is what deploy.yml's output must name.


def chown_home(lab, node):
    lab.ssh(node, f"chown root:root {HOME} && chmod 0700 {HOME}")

    def check():
        owner = lab.ssh(node, f"stat -c '%U %a' {HOME}").stdout.split()
        return "" if owner[0] == "vllm" else f"{HOME} on {node} is owned by {owner[0]} (mode {owner[1]})"
    return check


def add_foreign_dropin(lab, node):
    lab.ssh(node, f"mkdir -p {DROPIN_DIR} && printf '[Service]\\nCPUQuota=3%%\\n' > {DROPIN_DIR}/50-quota.conf"
                  " && systemctl daemon-reload")

    def check():
        paths = lab.ssh(node, "systemctl show -p DropInPaths vllm.service").stdout.strip()
        quota = lab.ssh(node, "systemctl show -p CPUQuotaPerSecUSec vllm.service").stdout.strip()
        return "" if "50-quota.conf" not in paths and quota.endswith("infinity") else f"{node}: {paths}; {quota}"
    return check


def edit_environment_file(lab, node):
    before = lab.ssh(node, f"sha256sum {ENV_FILE}").stdout.split()[0]
    invocation = unit(lab, node, "InvocationID")["InvocationID"]
    lab.ssh(node, f"echo VLLM_LOGGING_LEVEL=DEBUG >> {ENV_FILE}")

    def check():
        if lab.ssh(node, f"sha256sum {ENV_FILE}").stdout.split()[0] != before:
            return f"{ENV_FILE} on {node} still differs from what the deployment wrote"
        if unit(lab, node, "InvocationID")["InvocationID"] == invocation:
            return f"vLLM on {node} was not restarted onto the restored file"
        return ""
    return check


def stop_and_mask_unit(lab, node):
    lab.ssh(node, "systemctl mask --runtime vllm.service && systemctl stop vllm.service")

    def check():
        states = [unit(lab, each, "ActiveState")["ActiveState"] for each in (HEAD, WORKER)]
        masked = unit(lab, node, "UnitFileState")["UnitFileState"]
        return "" if states == ["active", "active"] and masked == "enabled" else (
            f"vllm.service is {states} on {HEAD}, {WORKER}; {node}'s unit file state {masked}")
    return check


def freeze_rank_processes(lab, node):
    lab.ssh(node, "systemctl kill --signal=SIGSTOP vllm.service")
    assert stopped_processes(lab, node) > 0, f"SIGSTOP froze no process of {node}'s vllm.service"

    def check():
        stopped = stopped_processes(lab, node)
        return "" if stopped == 0 else f"{stopped} of vLLM's processes on {node} are still stopped"
    return check


def change_model_file(lab, node):
    before = lab.ssh(node, f"sha256sum {MODEL_DIR}/config.json").stdout.split()[0]
    lab.ssh(node, f"echo ' ' >> {MODEL_DIR}/config.json")

    def check():
        now = lab.ssh(node, f"sha256sum {MODEL_DIR}/config.json").stdout.split()[0]
        return "" if now == before else f"{MODEL_DIR}/config.json on {node} still differs from the staged model"
    return check


def corrupt_weight_shard(lab, node):
    """Same size, one byte changed: the runtime stamp sees the shard changed, the copy from the controller puts
    it back, and the node's copy is checked against the manifest before vLLM starts again."""
    expected = manifest_sha256(lab, node, "model.safetensors")
    flip_one_byte(lab, node, SHARD)
    assert lab.ssh(node, f"sha256sum {SHARD}").stdout.split()[0] != expected

    def check():
        now = lab.ssh(node, f"sha256sum {SHARD}").stdout.split()[0]
        return "" if now == expected else f"{SHARD} on {node} has sha256 {now}, the manifest says {expected}"
    return check


def drop_the_controller_in_our_table(lab, node):
    """A rule that drops only the controller's traffic: the nodes still reach each other (the network stage's
    probe passes); the firewall stamp sees the live table differ, and the stage loads it again."""
    lab.ssh(node, f"nft insert rule inet vllm_cluster input ip saddr {lab.gateway} tcp dport 8000 drop")

    def check():
        rules = lab.ssh(node, "nft list table inet vllm_cluster").stdout
        return "" if f"ip saddr {lab.gateway} tcp dport 8000 drop" not in rules else (
            f"the hand-added rule is still live on {node}")
    return check


# kind -> (how it is made, the node of its own case, what deploy.yml's output must name; {node} is filled in)
DRIFTS = {
    "home owner and mode": (chown_home, HEAD, ()),
    "foreign drop-in": (add_foreign_dropin, WORKER, ("50-quota.conf",)),
    "environment file edited": (edit_environment_file, HEAD, ()),
    "unit stopped and masked": (stop_and_mask_unit, WORKER, ()),
    "rank processes frozen": (freeze_rank_processes, WORKER, ("{node}: vllm.service processes stopped",)),
    "model file changed": (change_model_file, WORKER, ()),
    "weight shard corrupted": (corrupt_weight_shard, WORKER,
                               ("Check the node's copy of the model file by file against the manifest",)),
    "rule added to our nftables table": (drop_the_controller_in_our_table, HEAD, ("firewall because {node}:",)),
}
# The one run in CI: every kind at once, spread over both nodes so that none hides another (node2's unit is
# stopped, so its ranks cannot be the frozen ones; the shard and the model file are on different nodes).
AT_ONCE = {"home owner and mode": HEAD, "foreign drop-in": WORKER, "environment file edited": HEAD,
           "unit stopped and masked": WORKER, "rank processes frozen": HEAD, "model file changed": HEAD,
           "weight shard corrupted": WORKER, "rule added to our nftables table": HEAD}


def assert_named(out, kind, node):
    for words in DRIFTS[kind][2]:
        said = words.format(node=node)
        assert said in out, f"{kind} on {node}: deploy.yml's output does not name {said!r}:\n{out[-3000:]}"


def test_eight_kinds_of_drift_at_once_are_repaired_by_one_run(lab):
    """The operator's worst morning: eight kinds of drift on both nodes at once, one deploy.yml. Each is checked
    on its node afterwards, as in its own case below, and the API answers. What would make it fail: one repair
    undoing or hiding another (a stage skipped because an earlier one restarted vLLM, a check read before the
    restart), as well as any single kind's failure."""
    assert set(AT_ONCE) == set(DRIFTS)
    checks = {kind: DRIFTS[kind][0](lab, node) for kind, node in AT_ONCE.items()}
    assert not answers(lab, timeout=5)

    def check():
        return "; ".join(problem for problem in (each() for each in checks.values()) if problem)
    out = repaired(lab, "eight kinds at once", check)
    # An unhealthy deployment runs every stage, so no stage's own reason (the firewall's) is printed; the removed
    # drop-in and the first unhealthy node are.
    assert "no stage skipped: the deployment is not healthy" in out, out[-3000:]
    for kind in ("foreign drop-in", "rank processes frozen"):
        assert_named(out, kind, AT_ONCE[kind])


@pytest.mark.lab_extended  # each kind alone, with its own time: CI runs them all at once above (docs/lab.md)
@pytest.mark.parametrize("kind", DRIFTS)
def test_each_kind_of_drift_alone_is_repaired(lab, kind):
    make, node, _ = DRIFTS[kind]
    check = make(lab, node)
    out = repaired(lab, kind, check)
    assert "nothing to do" not in out
    assert_named(out, kind, node)


@pytest.mark.lab_extended  # a refusal, the fix, then green: two runs, outside CI's budget
def test_node_staged_shard_corrupted_is_refused_naming_node_file_and_digests(lab):
    """A model the operator staged on the nodes (no controller source): the manifest is built from the first
    node's copy and every other copy is checked against it; a corrupt shard on the worker stops deploy.yml
    before vLLM starts, naming the node, the file and both digests. The operator's fix (staging from the
    controller again) and the next deploy.yml is green."""
    expected = manifest_sha256(lab, WORKER, "model.safetensors")
    flip_one_byte(lab, WORKER, SHARD)
    found = lab.ssh(WORKER, f"sha256sum {SHARD}").stdout.split()[0]
    started = time.monotonic()
    proc = lab.ansible_playbook("deploy.yml", "-e", "vllm_runtime_model_source=", check=False, timeout=2400)
    seconds = time.monotonic() - started
    TIMINGS["node-staged shard corrupted"] = {"outcome": "failed" if proc.returncode else "exit 0",
                                              "seconds": round(seconds, 1)}
    out = output_of(proc)
    assert proc.returncode != 0, f"deploy.yml accepted a corrupt shard on {WORKER}:\n{out[-4000:]}"
    assert seconds < FAIL_BOUND_S, f"deploy.yml took {seconds:.0f} s to refuse the shard (bound {FAIL_BOUND_S} s)"
    failures = [line for line in out.splitlines() if line.startswith("fatal:")]
    assert failures, out[-4000:]
    first = failures[0]  # the head's own verify then misses the worker: a consequence, printed after
    assert first.startswith(f"fatal: [{WORKER}]"), "\n".join(failures)[-4000:]
    for word in (f"host {WORKER}: model.safetensors: corrupt", expected, found):
        assert word in first, f"the refusal does not name {word!r}:\n{first[-4000:]}"
    green_after_fix(lab, "node-staged shard corrupted")
    assert lab.ssh(WORKER, f"sha256sum {SHARD}").stdout.split()[0] == expected


@pytest.mark.lab_extended  # a refusal, the fix, then green: two runs, outside CI's budget
def test_node_without_room_for_the_model_is_refused_before_any_copy_then_green_after_it_is_freed(lab):
    """The worker's model directory on a filesystem of 1 MiB (the shard alone is 1.4 MB): the room check,
    against the manifest built on the controller, refuses before anything is copied, naming the node, the path
    and the need; the operator frees the disk, and the next deploy.yml is green."""
    lab.ssh(WORKER, f"mount -t tmpfs -o size=1m tmpfs {MODEL_DIR}")
    try:
        failed_clearly(lab, "no room for the model", WORKER, [f"{MODEL_DIR} needs", "before any download"])
        assert lab.ssh(WORKER, f"ls -A {MODEL_DIR}").stdout.strip() == "", "something was copied to the full disk"
    finally:
        lab.ssh(WORKER, f"umount --lazy {MODEL_DIR}", check=False)  # the operator's fix
    green_after_fix(lab, "no room for the model")


def test_rule_in_another_table_is_named_then_green_after_its_removal(lab):
    """Another team's table drops the controller's network on the API port: named, never deleted by deploy.yml."""
    lab.ssh(HEAD, "nft add table inet ops_block && "
                  "nft add chain inet ops_block input '{ type filter hook input priority -10; }' && "
                  f"nft add rule inet ops_block input ip saddr {lab.gateway} tcp dport 8000 drop")
    try:
        failed_clearly(lab, "rule in another nftables table", HEAD, ["ops_block", "8000"])
    finally:
        lab.ssh(HEAD, "nft delete table inet ops_block", check=False)  # the operator's own fix
    green_after_fix(lab, "rule in another nftables table")


@pytest.mark.lab_extended
def test_full_cache_filesystem_is_named_then_green_after_it_is_freed(lab):
    cache = f"{HOME}/.cache"
    lab.ssh(HEAD, f"mkdir -p {cache} && mount -t tmpfs -o size=1m,uid=$(id -u vllm) tmpfs {cache} && "
                  f"(dd if=/dev/zero of={cache}/filler bs=64k 2>/dev/null || true) && systemctl stop vllm.service")
    try:
        failed_clearly(lab, "cache filesystem full", HEAD, ["space"])
    finally:
        lab.ssh(HEAD, f"umount --lazy {cache}", check=False)  # the operator frees the disk (vLLM may hold it open)
    green_after_fix(lab, "cache filesystem full")
