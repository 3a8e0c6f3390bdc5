"""lab/vlab/inventory.py: what `lab up` and `lab down` do to a lab's inventory and fact cache."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lab"))

from vlab import inventory  # noqa: E402
from vlab.spec import LabSpec  # noqa: E402


@pytest.fixture
def lab(tmp_path, monkeypatch):
    monkeypatch.setattr(inventory, "REPO", tmp_path)
    spec = LabSpec(name="tunit", index=7, nodes=2, inventory_dir=tmp_path / ".cache/labs/tunit/inventory")
    spec.inventory.mkdir(parents=True)
    return spec


def test_up_on_a_running_lab_keeps_the_fact_cache_directory(lab):
    # Molecule's create runs `lab up` as a task: its ansible-playbook opened this directory
    # at start and writes localhost's facts into it after the task (CI failed on a removed one).
    cache = inventory.fact_cache(lab.name)
    cache.mkdir(parents=True)
    (cache / "node1").write_text("{}")
    inventory.write(lab)
    assert cache.is_dir()
    assert not (cache / "node1").exists(), "stale facts of a node survived lab up"
    inventory.write(lab)
    assert cache.is_dir()


def test_up_writes_hosts_and_an_owner_only_api_key_and_ray_token(lab):
    inventory.write(lab)
    hosts = (lab.inventory / "hosts.yml").read_text()
    assert "node1:" in hosts and "node2:" in hosts and "node3:" not in hosts
    # inventories/lab/group_vars finds the lab's model through it, wherever the playbooks are installed.
    assert f"        lab_repository: {inventory.REPO}\n" in hosts
    key, token = inventory.api_key_path(lab.inventory), inventory.ray_auth_token_path(lab.inventory)
    assert key.stat().st_mode & 0o777 == 0o600 and token.stat().st_mode & 0o777 == 0o600
    assert key.parent.stat().st_mode & 0o777 == 0o700
    first_key, first_token = key.read_text(), token.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}\n", first_token), first_token  # Ray's own token format
    assert first_key != first_token
    inventory.write(lab)
    assert (key.read_text(), token.read_text()) == (first_key, first_token), "a second lab up replaced a secret"


def test_down_removes_what_up_wrote_and_keeps_foreign_files(lab):
    inventory.write(lab)
    cache = inventory.fact_cache(lab.name)
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "node2").write_text("{}")
    foreign = lab.inventory / "notes.txt"
    foreign.write_text("mine")
    inventory.remove(lab)
    assert not cache.exists()
    assert not (lab.inventory / "hosts.yml").exists()
    assert not inventory.api_key_path(lab.inventory).exists()
    assert not inventory.ray_auth_token_path(lab.inventory).exists()
    assert foreign.read_text() == "mine"
