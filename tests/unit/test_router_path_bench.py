"""bench/router_path.py reads the front from a lab inventory: the replicas, the router host, their addresses."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def bench():
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("router_path", REPO / "bench" / "router_path.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inventory(tmp_path, routers):
    hosts = {"all": {"children": {
        "vllm_nodes": {"children": {"replicas": {"hosts": {f"node{k}": {"ansible_host": f"10.0.1.{k}"}
                                                           for k in (1, 2, 3)}}}},
        "vllm_router": {"hosts": {name: {"ansible_host": "10.0.1.4"} for name in routers}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (tmp_path / "host_vars").mkdir()
    for k in (1, 2, 3, 4):
        (tmp_path / "host_vars" / f"node{k}.yml").write_text(yaml.safe_dump(
            {"lab_management_address": f"10.0.1.{k}", "lab_fabric_address": f"10.0.2.{k}"}))
    return tmp_path


def test_the_front_is_read_from_the_inventory(tmp_path):
    replicas, router = bench().hosts_of(inventory(tmp_path, ["node4"]))
    assert [r["name"] for r in replicas] == ["node1", "node2", "node3"]
    assert replicas[1] == {"name": "node2", "management": "10.0.1.2", "fabric": "10.0.2.2"}
    assert router == {"name": "node4", "management": "10.0.1.4", "fabric": "10.0.2.4"}


def test_a_front_without_one_router_host_is_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"group vllm_router holds \[\]; expected one router host"):
        bench().hosts_of(inventory(tmp_path, []))
