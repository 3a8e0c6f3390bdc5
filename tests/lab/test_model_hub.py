"""A model deployed from a hub id through a real mirror: fetched once, fanned out over the fabric, checked shard by
shard, repaired, resumed, and refused before any download when a node has no room.

The mirror is olah (PyPI, .venv-mirror) on the controller, on the lab's management gateway, serving the lab's tiny
Llama published as a git repository with a 192 MiB `original/consolidated.00.pth` of random bytes beside it (as
many hub repositories carry the original checkpoint, which vLLM does not read). deploy.yml runs with
`vllm_runtime_model_source: hub:lab/tiny-llama@<commit>` and the model in a directory of its own revision on the
nodes; the module puts the lab's default deployment back at its end and removes that directory.

What would make these fail: a node that fetches from the mirror by itself (a second GET of a file in olah's log),
a fan-out that is not shown or not followed, nodes that end with different bytes, vLLM that does not serve the
staged path offline, a corrupt shard left in place, a stopped copy that starts again from zero, a download that
begins although a node has no room for the model.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.lab_extended, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab"))
from vlab.mirror import Mirror, publish  # noqa: E402

REPO_ID = "lab/tiny-llama"
MODELS = "/srv/models/hub"  # each revision in its own directory: tiny-llama-<commit>
SHARED = "/srv/shared/hub"  # on the lab's shared filesystem (docs/lab.md)
BIG = "original/consolidated.00.pth"
BIG_BYTES = 192 * 1024 * 1024
MIRROR_PORT = 18090
BWLIMIT_KIB = 16 * 1024  # each copy at 16 MiB/s: the big file takes about 12 s, long enough to stop one half-way
NODES = ("node1", "node2", "node3")
MODEL_DIR = ""  # set by the fixture hub


@pytest.fixture(scope="module")
def hub(shared_lab, tiny_model, tmp_path_factory):
    """(lab, commit, mirror, extra vars): the mirror serving the published model; the default deployment put back
    after the module."""
    source = tmp_path_factory.mktemp("hub-source") / "tiny-llama"
    subprocess.run(["cp", "-a", str(tiny_model), str(source)], check=True)
    (source / "original").mkdir()
    (source / BIG).write_bytes(os.urandom(BIG_BYTES))
    mirrors = tmp_path_factory.mktemp("mirrors")
    commit = publish(source, mirrors, REPO_ID)
    global MODEL_DIR
    MODEL_DIR = f"{MODELS}/tiny-llama-{commit}"
    with Mirror(mirrors, shared_lab.gateway, MIRROR_PORT, shared_lab.name) as mirror:
        extra = {"vllm_runtime_model_source": f"hub:{REPO_ID}@{commit}", "vllm_cluster_model_path": MODEL_DIR,
                 "vllm_runtime_model_hub_endpoint": mirror.endpoint, "vllm_runtime_model_progress_interval": 2,
                 "vllm_runtime_model_copy_bwlimit_kib": BWLIMIT_KIB}
        try:
            yield shared_lab, commit, mirror, extra, source
        finally:
            for node in NODES:
                shared_lab.ssh(node, f"umount {MODEL_DIR} 2>/dev/null; true", check=False)
            shared_lab.ansible_playbook("deploy.yml", timeout=2400)  # the lab's default deployment again
            for node in NODES:
                shared_lab.ssh(node, f"rm -rf {MODELS} /etc/vllm-cluster/model-sources", check=False)


def deploy(lab, extra, check=False, timeout=2400):
    return lab.ansible_playbook("deploy.yml", "-e", json.dumps(extra), check=check, timeout=timeout)


def gets(mirror, commit) -> dict[str, int]:
    """{file: GET requests for it} in olah's access log."""
    counts: dict[str, int] = {}
    marker = f'"GET /{REPO_ID}/resolve/{commit}/'
    for line in mirror.log().splitlines():
        if marker in line and '" 200' in line:
            name = line.split(marker, 1)[1].split(" HTTP/", 1)[0]
            counts[name] = counts.get(name, 0) + 1
    return counts


def sha256s(lab, node) -> dict[str, str]:
    out = lab.ssh(node, f"cd {MODEL_DIR} && find . -path ./.fetch -prune -o -type f -print0 | xargs -0 sha256sum").stdout
    return {line.split(None, 1)[1].removeprefix("./"): line.split(None, 1)[0] for line in out.splitlines()}


def answers(lab) -> dict:
    """One completion through the head's API from the controller: the reply's JSON."""
    url = f"http://{lab.management_address('node1')}:8000/v1/completions"
    body = json.dumps({"model": served_model(lab), "prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0,
                       "ignore_eos": True})
    out = subprocess.run(["curl", "-sS", "--max-time", "60", "-H", f"Authorization: Bearer {lab.api_key}",
                          "-H", "Content-Type: application/json", "-d", body, url],
                         capture_output=True, text=True, timeout=90, check=False)
    return json.loads(out.stdout or "{}")


def served_model(lab) -> str:
    url = f"http://{lab.management_address('node1')}:8000/v1/models"
    out = subprocess.run(["curl", "-sS", "--max-time", "30", "-H", f"Authorization: Bearer {lab.api_key}", url],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return json.loads(out)["data"][0]["id"]


@pytest.fixture(scope="module")
def deployed(hub):
    lab, commit, mirror, extra, source = hub
    lab.ansible_playbook("deploy.yml", timeout=2400)  # the default deployment, whose served name is kept
    name = served_model(lab)
    started = time.monotonic()
    proc = deploy(lab, extra)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    print(f"\ndeploy.yml from the mirror with the fan-out: {time.monotonic() - started:.1f} s")
    return hub + (out, name)


def test_a_hub_id_is_fetched_once_fanned_out_and_served_offline_from_the_staged_path(deployed):
    lab, commit, mirror, extra, source, out, name = deployed
    # The plan of the copies is shown, and followed: the bytes left the mirror once.
    assert "Fan-out: from node1, 2 copies in 1 round; each node sends at most 2" in out
    assert "node2: copy from node1" in out or "copy from node1" in out
    published = {path.relative_to(source).as_posix() for path in source.rglob("*") if path.is_file()}
    assert gets(mirror, commit) == {name: 1 for name in published}, gets(mirror, commit)
    # Every node holds the published bytes, and the same manifest.
    expected = sha256s(lab, "node1")
    assert set(expected) == published
    for node in NODES[1:]:
        assert sha256s(lab, node) == expected, node
    manifests = {lab.ssh(node, "sha256sum /etc/vllm-cluster/model-manifest.json").stdout.split()[0] for node in NODES}
    assert len(manifests) == 1
    # vLLM serves the staged path offline, under the deployment's name.
    environ = lab.ssh("node1", "tr '\\0' '\\n' < /proc/$(systemctl show -p MainPID --value vllm.service)/environ").stdout
    assert "HF_HUB_OFFLINE=1" in environ.splitlines()
    argv = lab.ssh("node1", "tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value vllm.service)/cmdline").stdout
    assert MODEL_DIR in argv, argv
    assert served_model(lab) == name
    assert answers(lab)["usage"]["completion_tokens"] == 4


def test_a_corrupt_shard_on_one_node_is_named_removed_and_copied_again_by_the_next_run(deployed):
    lab, commit, mirror, extra, source, _, _ = deployed
    before = gets(mirror, commit)
    good = sha256s(lab, "node1")["model.safetensors"]
    lab.ssh("node3", f"printf 'ZZZZ' | dd of={MODEL_DIR}/model.safetensors bs=1 seek=200000 conv=notrunc status=none")
    bad = sha256s(lab, "node3")["model.safetensors"]
    assert bad != good
    proc = deploy(lab, extra)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    named = [line for line in out.splitlines() if "host node3: model.safetensors: corrupt" in line]
    assert named and good in named[0] and bad in named[0], out[-6000:]
    assert sha256s(lab, "node3")["model.safetensors"] == good
    assert gets(mirror, commit) == before  # repaired from a peer, not from the mirror
    assert answers(lab)["usage"]["completion_tokens"] == 4


def test_a_copy_stopped_half_way_resumes_from_its_part(deployed):
    lab, commit, mirror, extra, source, _, _ = deployed
    lab.ssh("node2", f"rm -f {MODEL_DIR}/{BIG}")
    argv = [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(lab.inventory), "deploy.yml",
            "-e", json.dumps(extra)]
    run = subprocess.Popen(argv, cwd=REPO, env=lab.ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        deadline, arrived = time.monotonic() + 900, 0
        while time.monotonic() < deadline and run.poll() is None:
            arrived = int(lab.ssh("node2", f"du -sb {MODEL_DIR}/original | cut -f1").stdout.strip() or 0)
            if arrived > BIG_BYTES // 3:
                break
            time.sleep(0.5)
        assert BIG_BYTES // 3 < arrived < BIG_BYTES, f"the copy was not caught half-way ({arrived} bytes)"
        lab.ssh("node2", "systemctl stop vllm-model-copy.service")
        out, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode != 0, out[-6000:]
    stopped = [line for line in out.splitlines() if "host node2: copy from node1: vllm-model-copy.service" in line]
    assert stopped and "run again to resume" in stopped[0], out[-6000:]
    for node in ("node1", "node2", "node3"):  # the share stopped with the round, though its receiver failed
        assert lab.ssh(node, "systemctl is-active vllm-model-share.service", check=False).stdout.strip() != "active"
    kept = int(lab.ssh("node2", f"stat -c %s {MODEL_DIR}/original/.fetch/consolidated.00.pth").stdout)
    assert 0 < kept < BIG_BYTES
    proc = deploy(lab, extra)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-8000:]
    stats = lab.ssh("node2", "journalctl -u vllm-model-copy.service -o cat | grep -E '^(Matched|Literal) data' "
                             "| tail -2").stdout
    matched = int(stats.split("Matched data: ")[1].split(" bytes")[0].replace(",", ""))
    literal = int(stats.split("Literal data: ")[1].split(" bytes")[0].replace(",", ""))
    print(f"\nstopped at {arrived} bytes, {kept} kept; the resumed copy matched {matched} and sent {literal}")
    assert matched >= kept * 0.9 and literal <= BIG_BYTES - kept * 0.9, stats
    assert sha256s(lab, "node2") == sha256s(lab, "node1")


def test_a_node_without_room_is_refused_before_any_download(deployed):
    lab, commit, mirror, extra, source, _, _ = deployed
    before = gets(mirror, commit)
    lab.ssh("node3", f"mount -t tmpfs -o size=4m tmpfs {MODEL_DIR}")
    try:
        proc = deploy(lab, extra)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-6000:]
        refusal = [line for line in out.splitlines() if f"host node3: {MODEL_DIR} needs" in line]
        assert refusal and "before any download" in refusal[0] and "4.0 MiB free" in refusal[0], out[-6000:]
        assert "vllm-model-fetch" not in out and "copy from node1" not in out
        assert lab.ssh("node3", f"ls -A {MODEL_DIR}").stdout.strip() == ""
        assert gets(mirror, commit) == before
    finally:
        lab.ssh("node3", f"umount {MODEL_DIR}", check=False)
    proc = deploy(lab, extra)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-8000:]
    assert answers(lab)["usage"]["completion_tokens"] == 4


def task_results(out: str, task: str) -> dict[str, str]:
    """{host: ok|changed|skipping|failed} of the task's first run in a playbook's output."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    body = plain.split(f"{task}] ***", 1)[1].split("\nTASK [", 1)[0]
    return {host: status for status, host in re.findall(r"^(ok|changed|skipping|failed): \[(\w+)", body, re.M)}


def test_a_model_on_a_filesystem_every_node_mounts_is_fetched_once_copied_to_none_and_checked_on_each(deployed):
    """The lab's /srv/shared is one host directory every node mounts (docs/lab.md): the nodes find that they see
    node1's directory, node1 fetches, nobody copies, every node checks the bytes it reads. What could make it fail:
    a node that copies onto the shared directory (rsync onto the files it reads), a node that skips its check,
    a second GET of a file at the mirror, a copy left on a node's own disk."""
    lab, commit, mirror, extra, source, _, name = deployed
    for node in NODES:
        mounted = lab.ssh(node, "findmnt -n -o TARGET /srv/shared", check=False).stdout.strip()
        assert mounted == "/srv/shared", f"{node} has no /srv/shared: a lab started before it existed (down, then up)"
    path = f"{SHARED}/tiny-llama-{commit}"
    before = gets(mirror, commit)
    try:
        proc = deploy(lab, {**extra, "vllm_cluster_model_path": path})
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-8000:]
        assert f"node2, node3 see node1's {path} itself" in out, out[-6000:]
        assert "node2, node3 read node1's copy (the same filesystem): no copy, only the check" in out
        assert "copy from node1" not in out
        published = {p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file()}
        after = gets(mirror, commit)
        assert {f: after.get(f, 0) - before.get(f, 0) for f in published} == {f: 1 for f in published}, after
        checked = task_results(out, "Check the node's copy of the model file by file against the manifest")
        assert checked == {"node1": "ok", "node2": "ok", "node3": "ok"}, checked
        held = lab.ssh("node2", f"cd {path} && find . -path ./.fetch -prune -o -type f -print | sort").stdout.split()
        assert sorted(f.removeprefix("./") for f in held) == sorted(published)
        argv = lab.ssh("node2", "tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value vllm.service)/cmdline").stdout
        assert path in argv, argv
        assert served_model(lab) == name
        assert answers(lab)["usage"]["completion_tokens"] == 4
        again = deploy(lab, {**extra, "vllm_cluster_model_path": path})
        assert again.returncode == 0 and "nothing to do: every stage holds on every node" in again.stdout, \
            again.stdout[-6000:]
        # A directory on the controller: copied to node1 alone (three nodes writing one file would race).
        by_copy = f"{SHARED}/by-copy"
        staged = lab.ansible_playbook("deploy.yml", "--tags", "runtime", "-e", json.dumps(
            {"vllm_runtime_model_source": str(source), "vllm_cluster_model_path": by_copy}), timeout=1800)
        out = staged.stdout + staged.stderr
        assert staged.returncode == 0, out[-8000:]
        assert f"node2, node3 see node1's {by_copy} itself" in out, out[-6000:]
        copied = task_results(out, "Copy the model from the controller")
        assert copied == {"node1": "changed", "node2": "skipping", "node3": "skipping"}, copied
        checked = task_results(out, "Check the node's copy of the model file by file against the manifest")
        assert checked == {"node1": "ok", "node2": "ok", "node3": "ok"}, checked
    finally:
        lab.ssh("node1", f"rm -rf {SHARED}", check=False)
