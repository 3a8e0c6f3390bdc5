"""A model fetched from a real Hugging Face-compatible mirror: olah serving the lab's model, fetched by
roles/vllm_runtime/files/model_fetch.py (the hub's HTTP API, standard library only), checked by the manifest.

The mirror is olah from PyPI (.venv-mirror, requirements/mirror.lock), started by the module on 127.0.0.1,
offline, over a git repository holding a tiny Llama and a 64 MiB shard of random bytes (lab/vlab/mirror.py).
What would make these fail: a fetch that follows a branch instead of the pinned commit, complete files
fetched again after a kill, a part left behind or taken for the file, files that differ from the published
ones, a branch name accepted where a commit is required.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.model import manifest as mf

pytestmark = pytest.mark.runtime

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab"))
from vlab.mirror import Mirror, publish  # noqa: E402

RUNTIME_PYTHON = REPO / ".venv-runtime" / "bin" / "python"
FETCH = REPO / "roles" / "vllm_runtime" / "files" / "model_fetch.py"
BUILDER = REPO / "lab" / "make_tiny_model.py"
REPO_ID = "lab/tiny-llama-big"
SHARD_BYTES = 64 * 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def published(tmp_path_factory, runtime_python):
    """(source directory, commit, mirror) with the mirror serving; stopped after the module."""
    source = tmp_path_factory.mktemp("source") / "model"
    built = subprocess.run([str(runtime_python), str(BUILDER), "llama", str(source), "--weights"],
                           capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr[-2000:]
    (source / "extra-shard.bin").write_bytes(os.urandom(SHARD_BYTES))
    mirrors = tmp_path_factory.mktemp("mirrors")
    commit = publish(source, mirrors, REPO_ID)
    with Mirror(mirrors, "127.0.0.1", free_port(), f"t{os.getpid()}") as mirror:
        yield source, commit, mirror


def fetch(mirror, revision, dest, *extra, popen=False):
    """model_fetch.py with a node's Python (the runtime's 3.11 interpreter, standard library only)."""
    argv = [str(RUNTIME_PYTHON), "-I", str(FETCH), REPO_ID, revision, str(dest), *extra]
    env = {"PATH": "/usr/bin:/bin", "HF_ENDPOINT": mirror.endpoint}
    if popen:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)


def lines(stdout: str, kind: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines() if line.startswith(kind + " ")]


def test_a_pinned_commit_is_fetched_byte_for_byte_with_progress(published, tmp_path):
    source, commit, mirror = published
    status = tmp_path / "status.json"
    proc = fetch(mirror, commit, tmp_path / "dest", "--interval", "0.01", "--status-file", str(status))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = lines(proc.stdout, "result")[-1]
    assert json.loads(status.read_text()) == {"kind": "result", **result}
    assert result["commit"] == commit
    assert {name: entry["size"] for name, entry in result["files"].items()} == mf.list_files(str(source))
    assert mf.build_manifest(str(tmp_path / "dest"), "node1") == mf.build_manifest(str(source), "controller")
    assert not (tmp_path / "dest" / ".fetch").exists()
    progress = lines(proc.stdout, "progress")
    assert progress and all(entry["total"] == result["bytes"] for entry in progress), proc.stdout[-2000:]


@pytest.mark.parametrize("revision", ["main", "v1.0", "addf48c"])
def test_a_revision_that_is_not_a_commit_is_refused_before_any_request(published, tmp_path, revision):
    _, _, mirror = published
    proc = fetch(mirror, revision, tmp_path / "dest")
    assert proc.returncode == 2
    assert "is not a commit id (40 hex digits)" in lines(proc.stdout, "error")[0]["msg"]
    assert not (tmp_path / "dest").exists()


def test_a_commit_the_mirror_does_not_hold_fails_naming_it_and_fetches_nothing(published, tmp_path):
    _, _, mirror = published
    proc = fetch(mirror, "0" * 40, tmp_path / "dest")
    assert proc.returncode == 1
    message = lines(proc.stdout, "error")[0]["msg"]
    assert message.startswith(f"{REPO_ID}@{'0' * 40} from {mirror.endpoint}: ") and "HTTP" in message, message
    assert not (tmp_path / "dest").exists()


def resolve_gets(mirror, commit, name) -> int:
    """How many GET requests for the file olah's access log shows."""
    return mirror.log().count(f'"GET /{REPO_ID}/resolve/{commit}/{name} HTTP/1.1" 200')


def test_a_killed_fetch_keeps_its_complete_files_and_the_next_run_completes_the_rest(published, tmp_path):
    """The fetch is stopped (SIGSTOP, then SIGKILL) once the shard's part holds some bytes. The next run does
    not fetch the files that were complete again (each still the same inode and mtime, one GET each in the
    mirror's log), completes the shard (olah ignores Range, so the part is replaced by the whole file), and
    the result is byte for byte the published model, with no part left."""
    source, commit, mirror = published
    dest = tmp_path / "dest"
    part = dest / ".fetch" / "extra-shard.bin.part"
    proc = fetch(mirror, commit, dest, popen=True)
    deadline, cut = time.monotonic() + 120, 0
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            # Cut inside the shard once a smaller file is complete (four files are fetched at once, largest first).
            if part.exists() and part.stat().st_size > 0 and (dest / "config.json").exists():
                os.killpg(proc.pid, signal.SIGSTOP)
                cut = part.stat().st_size
                break
            time.sleep(0.002)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
    assert 0 < cut < SHARD_BYTES, f"the fetch was not cut inside the shard ({cut} bytes): nothing to resume"
    assert not (dest / "extra-shard.bin").exists()
    complete = {path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in dest.iterdir() if path.is_file()}
    assert "config.json" in complete, complete
    print(f"cut at {cut} of {SHARD_BYTES} bytes; complete before the kill: {sorted(complete)}")
    gets_before = {name: resolve_gets(mirror, commit, name) for name in complete}

    again = fetch(mirror, commit, dest)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for name, stamp in complete.items():
        now = dest / name
        assert (now.stat().st_ino, now.stat().st_mtime_ns) == stamp, f"{name} was written again"
        assert resolve_gets(mirror, commit, name) == gets_before[name], f"{name} was fetched again"
    assert not (dest / ".fetch").exists()
    assert mf.build_manifest(str(dest), "node1") == mf.build_manifest(str(source), "controller")


def test_the_list_gives_the_sizes_and_what_the_directory_holds_before_any_download(published, tmp_path):
    """What the room check reads before a byte moves: the total and the bytes already complete in DEST."""
    source, commit, mirror = published
    dest = tmp_path / "dest"
    listed = fetch(mirror, commit, dest, "--list")
    assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-3000:]
    result = lines(listed.stdout, "result")[-1]
    assert result["bytes"] == sum(mf.list_files(str(source)).values()) and result["complete_bytes"] == 0
    assert not dest.exists()
    dest.mkdir()
    (dest / "config.json").write_bytes((source / "config.json").read_bytes())
    (dest / "extra-shard.bin").write_bytes(b"cut short")
    again = lines(fetch(mirror, commit, dest, "--list").stdout, "result")[-1]
    assert again["complete_bytes"] == (source / "config.json").stat().st_size


def plan_from_hub(tmp_path, mirror, commit):
    """plan.yml on a one-host inventory whose model is only the hub source (no vllm_cluster_model); the host
    declares its GPU, so no node is contacted."""
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "hosts.yml").write_text(json.dumps({"all": {"children": {"vllm_nodes": {
        "hosts": {"gpu-a": {"ansible_host": "192.0.2.20", "vllm_cluster_gpus": {
            "count": 1, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": False}}},
        "vars": {"vllm_cluster_deployment": "tiny", "vllm_cluster_model_path": "/srv/models/tiny",
                 "vllm_cluster_max_model_len": 512, "vllm_runtime_model_source": f"hub:{REPO_ID}@{commit}",
                 "vllm_runtime_model_hub_endpoint": mirror.endpoint}}}}}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": f"{REPO / '.venv' / 'bin'}:/usr/bin:/bin"}
    return subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "playbooks/plan.yml", "-i", str(inventory),
                           "-e", f"vllm_cluster_results_dir={tmp_path / 'results'}", "-e", "vllm_cluster_plan_output=true"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_plan_reads_the_config_of_the_pinned_commit_from_the_mirror_before_any_weight_moves(published, tmp_path):
    source, commit, mirror = published
    weights_before = resolve_gets(mirror, commit, "model.safetensors")
    proc = plan_from_hub(tmp_path, mirror, commit)
    assert proc.returncode == 0, proc.stdout[-4000:]
    config = json.loads((source / "config.json").read_text())
    plan = json.loads((tmp_path / "results" / "tiny" / "plan.json").read_text())
    assert plan["model"]["layers"] == config["num_hidden_layers"] and plan["model"]["path"] == "/srv/models/tiny"
    assert (tmp_path / "results" / "tiny" / "hub" / commit / "config.json").read_bytes() == \
        (source / "config.json").read_bytes()
    assert resolve_gets(mirror, commit, "config.json") >= 1
    assert resolve_gets(mirror, commit, "model.safetensors") == weights_before  # only config.json: no weight moved


def test_plan_names_the_url_when_the_mirror_does_not_hold_the_commit(published, tmp_path):
    _, _, mirror = published
    proc = plan_from_hub(tmp_path, mirror, "b" * 40)
    assert proc.returncode != 0
    assert f"{mirror.endpoint}/{REPO_ID}/resolve/{'b' * 40}/config.json" in proc.stdout, proc.stdout[-3000:]
