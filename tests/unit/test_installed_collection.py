"""The collection as a user gets it: built, installed into a temporary path, used from another directory.

No checkout on any path: ANSIBLE_COLLECTIONS_PATH is the install directory, the working directory is
a scratch one, the configuration is empty. The commands run from the installed bin/ (as they are,
and through a link on PATH), the playbooks by FQCN; what they write lands in the working directory,
never in the installed collection. tests/lab/test_collection.py does the same against the lab's nodes.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PLAN_ARGS = ["plan", "--model", "llama-3.1-70b", "--gpus-per-node", "4", "--gpu-memory-gib", "80",
             "--gpu-name", "NVIDIA A100-SXM4-80GB", "--json"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("installed")
    build = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path",
                            str(root / "dist"), str(REPO)], capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    (artifact,) = (root / "dist").glob("vllm_ops-cluster-*.tar.gz")
    config = root / "ansible.cfg"
    config.write_text("[defaults]\n")  # not the checkout's (its collections_path is the checkout)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "PYTHONPATH"))}
    env.update(ANSIBLE_CONFIG=str(config), ANSIBLE_COLLECTIONS_PATH=str(root / "collections"),
               ANSIBLE_NOCOLOR="1", PATH=f"{root / 'links'}:{BIN}:{os.environ.get('PATH', '')}")
    install = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", str(artifact), "-p",
                              str(root / "collections")], capture_output=True, text=True, timeout=300, check=False,
                             env=env, cwd=root)
    assert install.returncode == 0, install.stdout + install.stderr
    collection = root / "collections" / "ansible_collections" / "vllm_ops" / "cluster"
    (root / "links").mkdir()
    for cli in ("vllm-cluster", "vllm-cluster-report"):
        (root / "links" / cli).symlink_to(collection / "bin" / cli)
    work = root / "work"
    work.mkdir()
    return {"root": root, "collection": collection, "env": env, "work": work}


def run(installed, argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, cwd=installed["work"],
                          env=installed["env"], **kwargs)


def test_the_commands_run_from_the_installed_collection_and_through_a_link(installed):
    for command in (str(installed["collection"] / "bin" / "vllm-cluster"), "vllm-cluster"):
        result = run(installed, [command, *PLAN_ARGS])
        assert result.returncode == 0, result.stderr
        plan = json.loads(result.stdout)
        assert (plan["strategy"], plan["tp"], plan["world_size"]) == ("tp", 4, 4)
    for command in (str(installed["collection"] / "bin" / "vllm-cluster-report"), "vllm-cluster-report"):
        result = run(installed, [command, "report", "--help"])
        assert result.returncode == 0 and "--results-dir" in result.stdout, result.stderr


def test_the_installed_command_knows_its_version_and_catalog(installed):
    """The artifact holds no galaxy.yml: --version reads MANIFEST.json's collection_info.version."""
    assert not (installed["collection"] / "galaxy.yml").exists()
    manifest = json.loads((installed["collection"] / "MANIFEST.json").read_text())
    result = run(installed, ["vllm-cluster", "--version"])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"vllm-cluster {manifest['collection_info']['version']} (collection vllm_ops.cluster)\n"
    result = run(installed, ["vllm-cluster", "models"])
    assert result.returncode == 0 and "llama-3.1-70b" in result.stdout, result.stderr


def test_a_command_outside_any_collection_says_where_it_belongs(installed, tmp_path):
    stray = tmp_path / "vllm-cluster"
    stray.write_text((installed["collection"] / "bin" / "vllm-cluster").read_text())
    result = run(installed, [sys.executable, str(stray), *PLAN_ARGS])
    assert result.returncode == 1
    assert "not in an installed collection (.../ansible_collections/vllm_ops/cluster/bin/)" in result.stderr


def test_the_plan_playbook_runs_by_fqcn_and_writes_into_the_working_directory(installed):
    inventory = installed["collection"] / "inventories" / "examples" / "tp-70b-4xa100"
    result = run(installed, [str(BIN / "ansible-playbook"), "vllm_ops.cluster.plan", "-i", str(inventory),
                             "-e", "vllm_cluster_plan_output=true"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    (written,) = (installed["work"] / "results").glob("*/plan.json")
    assert json.loads(written.read_text())["tp"] == 4
    inside = [str(path) for path in installed["collection"].rglob("*") if path.name in ("plan.json", "results")]
    assert inside == [], "the playbook wrote into the installed collection"


def test_every_playbook_is_reachable_by_fqcn(installed):
    playbooks = sorted((REPO / "playbooks").glob("*.yml"))
    assert len(playbooks) >= 16
    result = run(installed, [str(BIN / "ansible-playbook"), "--syntax-check", "-i", "localhost,",
                             *(f"vllm_ops.cluster.{playbook.stem}" for playbook in playbooks)])
    assert result.returncode == 0, result.stdout[-1500:] + result.stderr[-1500:]
    for playbook in playbooks:
        assert f"playbook: {installed['collection'] / 'playbooks' / playbook.name}\n" in result.stdout, playbook.name


def test_the_installed_files_are_no_wider_than_they_should_be(installed):
    for path in installed["collection"].rglob("*"):
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert not mode & 0o022, f"{path}: mode {mode:o} is writable by others than its owner"
        if path.is_file() and mode & 0o111:
            assert path.read_bytes().startswith(b"#!"), f"{path}: executable without a #! line"
    for cli in ("vllm-cluster", "vllm-cluster-report"):
        assert os.access(installed["collection"] / "bin" / cli, os.X_OK), cli
