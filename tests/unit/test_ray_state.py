"""plugins/module_utils/verify/ray_state.py: Ray's own outputs parsed, and the verdict the ray_cluster role waits on.

`ray status` and `ray get nodes` are REAL public captures (tests/fixtures/ray/public,
each with its .source.txt). Node, actor and placement-group records for the
comparisons are built in the exact shape `ray list ... --format json` prints
(field names from those captures and Ray 2.60's output in
research/vllm-internals.md section 4); the live 2.60 outputs are parsed in
tests/lab/test_runtime_ray.py on the lab's real 3-node cluster.
"""

from __future__ import annotations

import json

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.ray_state import (
    RayStateError,
    compare_nodes,
    compare_status,
    parse_actors,
    parse_nodes,
    parse_placement_groups,
    parse_status,
    worker_layout,
)

GIB = 1024**3


@pytest.fixture(scope="module")
def ray_public(fixtures_dir):
    return fixtures_dir / "ray" / "public"


def read(ray_public, name: str) -> str:
    return (ray_public / name).read_text(encoding="utf-8")


def node_record(ip: str, *, gpus=None, head=False, state="ALIVE", message=None, node_id=None) -> dict:
    """One `ray list nodes --format json` entry, shaped as Ray 2.60 prints it (memory as text)."""
    resources = {f"node:{ip}": 1.0, "CPU": 2.0, "memory": "16.010 GiB", "object_store_memory": "476.837 MiB"}
    if gpus is not None:
        resources["GPU"] = float(gpus)
    if head:
        resources["node:__internal_head__"] = 1.0
    node_id = node_id or (ip.replace(".", "") * 8)[:56]
    return {"node_id": node_id, "node_ip": ip, "is_head_node": head, "state": state, "state_message": message,
            "node_name": ip, "resources_total": resources, "labels": {"ray.io/node-id": node_id},
            "start_time_ms": None, "end_time_ms": None}


LAB = [
    {"name": "node1", "address": "10.232.0.11", "gpus": 2},
    {"name": "node2", "address": "10.232.0.12", "gpus": 2},
    {"name": "node3", "address": "10.232.0.13", "gpus": 2},
]


def lab_nodes(*records: dict) -> list[dict]:
    return parse_nodes(json.dumps(list(records)))


# --------------------------------------------------------------------------- ray status (public captures)


def test_status_two_nodes_two_gpus(ray_public):
    status = parse_status(read(ray_public, "vllm15217-ray-status-2node-2gpu.txt"))
    assert status["timestamp"] == "2025-03-20 20:40:48.252496"
    assert status["node_count"] == 2
    assert [node["name"] for node in status["nodes"]] == [
        "node_5373538893976cc08e332acdf25b3f043ca49757d98d5f6ab048d1ed",
        "node_1689389e001b234e7d470b2da54b6c17b4441403358cf341f778e2ea",
    ]
    assert {node["status"] for node in status["nodes"]} == {"active"}
    assert status["usage"]["GPU"] == {"used": 0.0, "total": 2.0}
    assert status["usage"]["CPU"] == {"used": 0.0, "total": 256.0}
    assert status["usage"]["memory"]["total"] == pytest.approx(311.15 * GIB)
    assert status["pending"] == [] and status["failures"] == [] and status["demands"] == []


def test_status_without_its_header_and_with_tib(ray_public):
    status = parse_status(read(ray_public, "vllm11539-ray-status-2x8-h100.txt"))
    assert status["timestamp"] is None
    assert status["node_count"] == 2
    assert status["usage"]["GPU"]["total"] == 16.0
    assert status["usage"]["CPU"]["total"] == 384.0
    assert status["usage"]["memory"]["total"] == pytest.approx(3.88 * 1024**4)
    assert status["usage"]["object_store_memory"]["total"] == pytest.approx(19.46 * GIB)


def test_status_cut_after_memory(ray_public):
    status = parse_status(read(ray_public, "vllm5948-ray-status-2node-cpu.txt"))
    assert status["node_count"] == 2
    assert status["usage"]["GPU"] == {"used": 0.0, "total": 2.0}
    assert status["usage"]["CPU"]["total"] == 52.0


def test_status_verbose_autoscaler_node_types_and_per_node_blocks(ray_public):
    status = parse_status(read(ray_public, "ray35411-ray-status-v-3node.txt"))
    assert status["timestamp"] == "2023-04-04 19:21:25.239417"
    assert status["nodes"] == [
        {"name": "ray.head.default", "count": 1, "status": "healthy"},
        {"name": "ray.worker.default", "count": 2, "status": "healthy"},
    ]
    assert status["node_count"] == 3
    assert status["usage"]["CPU"] == {"used": 0.0, "total": 6.0}
    assert "GPU" not in status["usage"]
    assert [(node["node"], node["type"]) for node in status["per_node"]] == [
        ("10.0.3.87", "ray.head.default"),
        ("10.0.2.228", "ray.worker.default"),
        ("10.0.2.207", "ray.worker.default"),
    ]
    head = status["per_node"][0]
    assert head["idle"] is False
    assert head["usage"]["object_store_memory"]["used"] == pytest.approx(1.25 * GIB)
    assert status["per_node"][2]["usage"]["memory"]["total"] == pytest.approx(5.60 * GIB)


def test_status_from_a_head_still_starting_is_an_error():
    with pytest.raises(RayStateError, match="No cluster status"):
        parse_status("No cluster status. It may take a few seconds for the Ray internal services to start up.")


@pytest.mark.parametrize("text", ["", "ray: command not found", "Error: something"])
def test_status_without_sections_is_an_error(text):
    with pytest.raises(RayStateError):
        parse_status(text)


def test_compare_status_counts_and_gpus(ray_public):
    status = parse_status(read(ray_public, "vllm15217-ray-status-2node-2gpu.txt"))
    two = [{"name": "a", "address": "10.0.0.1", "gpus": 1}, {"name": "b", "address": "10.0.0.2", "gpus": 1}]
    assert compare_status(two, status)["ok"] is True

    three = [*two, {"name": "c", "address": "10.0.0.3", "gpus": 1}]
    verdict = compare_status(three, status, cluster="Ray cluster 10.0.0.1:6379")
    assert verdict["ok"] is False
    assert verdict["message"].startswith(
        "Ray cluster 10.0.0.1:6379: expected 3 nodes with 3 GPUs; `ray status` reports 2 with 2 GPUs."
    )
    assert "1 of a (10.0.0.1), b (10.0.0.2), c (10.0.0.3) have not joined" in verdict["message"]


def test_compare_status_names_missing_nodes_when_verbose_lists_addresses(ray_public):
    status = parse_status(read(ray_public, "ray35411-ray-status-v-3node.txt"))
    expected = [{"name": "head", "address": "10.0.3.87"}, {"name": "w1", "address": "10.0.2.228"},
                {"name": "w2", "address": "10.0.2.207"}, {"name": "w3", "address": "10.0.2.99"}]
    verdict = compare_status(expected, status)
    assert verdict["missing"] == [{"name": "w3", "address": "10.0.2.99", "state": "absent", "state_message": None}]
    assert "Missing: w3 (10.0.2.99)." in verdict["message"]


# --------------------------------------------------------------------------- state API nodes


def test_ray_get_nodes_yaml_capture(ray_public):
    text = read(ray_public, "ray33553-ray-get-nodes-yaml.txt")
    record = yaml.safe_load(text.split("\n", 1)[1])  # first line is the prompt and command
    [node] = parse_nodes(record)
    assert node == {
        "node_id": "ecbe11d355cc23416ac42f530b854b6ab19671dafda928c281d29fd8",
        "address": "10.0.25.201",
        "name": "10.0.25.201",
        "is_head": False,
        "state": "ALIVE",
        "state_message": None,
        "gpus": 0.0,
        "cpus": 8.0,
        "resources": record["resources_total"],
    }


def test_list_nodes_json_with_text_memory_and_leading_noise():
    text = "2026-11-30 04:05:47,001 WARNING some log line\n" + json.dumps(
        [node_record("10.232.0.11", gpus=2, head=True), node_record("10.232.0.12", gpus=2)])
    nodes = parse_nodes(text)
    assert [(n["address"], n["is_head"], n["gpus"], n["cpus"]) for n in nodes] == [
        ("10.232.0.11", True, 2.0, 2.0), ("10.232.0.12", False, 2.0, 2.0)]
    assert nodes[0]["resources"]["memory"] == "16.010 GiB"


@pytest.mark.parametrize("text, match", [
    ("Error: Failed to make request to http://10.232.0.11:8265/api/v0/nodes.", "printed no JSON"),
    ("[{\"node_id\": ", "invalid JSON"),
    (json.dumps([{"node_ip": "10.0.0.1", "state": "ALIVE"}]), "lacks node_id"),
    (json.dumps([{"node_id": "x", "node_ip": "10.0.0.1", "state": "ALIVE", "resources_total": {"GPU": "two"}}]),
     "GPU is not a number"),
    (json.dumps({"nodes": 3}), "lacks node_id"),
])
def test_unreadable_node_lists_are_errors(text, match):
    with pytest.raises(RayStateError, match=match):
        parse_nodes(text)


# --------------------------------------------------------------------------- the verdict the role waits on


def test_every_node_alive_with_its_gpus_is_ok():
    nodes = lab_nodes(node_record("10.232.0.11", gpus=2, head=True), node_record("10.232.0.13", gpus=2),
                      node_record("10.232.0.12", gpus=2))
    verdict = compare_nodes(LAB, nodes)
    assert verdict == {"ok": True, "alive": 3, "gpus": 6.0, "expected_nodes": 3, "expected_gpus": 6.0,
                       "missing": [], "unexpected": [], "gpu_mismatch": [], "message": ""}


def test_a_missing_worker_is_named_with_its_address_and_what_was_found():
    nodes = lab_nodes(node_record("10.232.0.11", gpus=2, head=True), node_record("10.232.0.12", gpus=2))
    verdict = compare_nodes(LAB, nodes, cluster="Ray cluster 10.232.0.11:6379")
    assert verdict["ok"] is False
    assert verdict["missing"] == [{"name": "node3", "address": "10.232.0.13", "state": "absent",
                                   "state_message": None}]
    assert verdict["message"] == (
        "Ray cluster 10.232.0.11:6379: expected 3 ALIVE nodes with 6 GPUs; Ray reports 2 ALIVE with 4 GPUs. "
        "Missing: node3 (10.232.0.13). "
        "Found: node1 (10.232.0.11, head, 2 GPUs), node2 (10.232.0.12, 2 GPUs)."
    )


def test_a_dead_node_says_so_with_rays_reason():
    nodes = lab_nodes(node_record("10.232.0.11", gpus=2, head=True), node_record("10.232.0.12", gpus=2),
                      node_record("10.232.0.13", gpus=2, state="DEAD",
                                  message="Health check failed due to missing too many heartbeats"))
    verdict = compare_nodes(LAB, nodes)
    assert verdict["missing"][0]["state"] == "DEAD"
    assert ("Missing: node3 (10.232.0.13) is DEAD: Health check failed due to missing too many heartbeats."
            in verdict["message"])


def test_a_node_on_the_management_address_is_flagged_as_the_wrong_nic():
    nodes = lab_nodes(node_record("10.232.0.11", gpus=2, head=True), node_record("10.232.0.12", gpus=2),
                      node_record("10.231.0.13", gpus=2))
    verdict = compare_nodes(LAB, nodes)
    assert [m["name"] for m in verdict["missing"]] == ["node3"]
    assert [u["address"] for u in verdict["unexpected"]] == ["10.231.0.13"]
    assert "ALIVE at an address no node should use: 10.231.0.13 (2 GPUs)" in verdict["message"]
    assert "check --node-ip-address and the fabric interface" in verdict["message"]


def test_a_node_with_fewer_gpus_fails_even_when_all_nodes_are_there():
    nodes = lab_nodes(node_record("10.232.0.11", gpus=2, head=True), node_record("10.232.0.12", gpus=1),
                      node_record("10.232.0.13", gpus=2))
    verdict = compare_nodes(LAB, nodes)
    assert verdict["ok"] is False and verdict["missing"] == []
    assert verdict["gpu_mismatch"] == [{"name": "node2", "address": "10.232.0.12", "gpus": 1.0, "expected": 2.0}]
    assert "node2 (10.232.0.12) registered 1 GPUs, expected 2." in verdict["message"]
    assert "Ray reports 3 ALIVE with 5 GPUs" in verdict["message"]


def test_total_gpus_alone_when_nodes_carry_no_count():
    expected = [{"name": n["name"], "address": n["address"]} for n in LAB]
    nodes = lab_nodes(node_record("10.232.0.11", head=True), node_record("10.232.0.12"),
                      node_record("10.232.0.13"))
    assert compare_nodes(expected, nodes)["ok"] is True  # nothing said about GPUs
    verdict = compare_nodes(expected, nodes, expected_gpus=6)
    assert verdict["ok"] is False
    assert verdict["message"].endswith("Found: node1 (10.232.0.11, head, 0 GPUs), node2 (10.232.0.12, 0 GPUs), "
                                       "node3 (10.232.0.13, 0 GPUs).")


def test_expected_nodes_need_an_address():
    with pytest.raises(RayStateError, match="has no address"):
        compare_nodes([{"name": "node1"}], [])


# --------------------------------------------------------------------------- actors and placement groups


def actor_record(index: int, node_id: str, *, tp: int, pp: int = 0, state="ALIVE", cls="RayWorkerProc") -> dict:
    return {"actor_id": f"{index:032x}", "class_name": cls, "state": state, "job_id": "02000000",
            "name": f"vllm_Worker_demo_TP{tp}_PP{pp}", "node_id": node_id, "pid": 21700 + index,
            "ray_namespace": "ns", "placement_group_id": "0b76" + "0" * 32}


def test_worker_layout_joins_actors_to_node_addresses():
    nodes = lab_nodes(node_record("10.232.0.11", gpus=2, head=True, node_id="a" * 56),
                      node_record("10.232.0.12", gpus=2, node_id="b" * 56))
    actors = parse_actors(json.dumps([
        actor_record(1, "a" * 56, tp=1), actor_record(0, "a" * 56, tp=0),
        actor_record(2, "b" * 56, tp=0, pp=1), actor_record(3, "b" * 56, tp=1, pp=1),
        actor_record(4, "b" * 56, tp=1, pp=1, state="DEAD"),
        actor_record(5, "b" * 56, tp=0, cls="EngineCoreActor"),
    ]))
    layout = worker_layout(actors, nodes)
    assert {address: [(w["tp"], w["pp"]) for w in workers] for address, workers in layout.items()} == {
        "10.232.0.11": [(0, 0), (1, 0)],
        "10.232.0.12": [(0, 1), (1, 1)],
    }
    assert layout["10.232.0.11"][0]["pid"] == 21700


def test_placement_groups_with_and_without_detail():
    detailed = parse_placement_groups(json.dumps([{
        "placement_group_id": "26da" + "0" * 32, "name": "dp_rank_0", "creator_job_id": "01000000",
        "state": "CREATED", "is_detached": True,
        "bundles": [{"bundle_id": {"placement_group_id": "26da" + "0" * 32, "bundle_index": i},
                     "unit_resources": {"GPU": 1.0}, "node_id": "a" * 56, "label_selector": {}} for i in range(2)],
    }]))
    assert detailed[0]["name"] == "dp_rank_0" and detailed[0]["state"] == "CREATED"
    assert [(b["index"], b["resources"], b["node_id"]) for b in detailed[0]["bundles"]] == [
        (0, {"GPU": 1.0}, "a" * 56), (1, {"GPU": 1.0}, "a" * 56)]
    plain = parse_placement_groups(json.dumps([{"placement_group_id": "26da", "name": "", "state": "CREATED",
                                                "bundles": None}]))
    assert plain[0]["bundles"] == []


def test_actor_and_group_records_need_their_ids():
    with pytest.raises(RayStateError, match="lacks actor_id"):
        parse_actors(json.dumps([{"class_name": "RayWorkerProc"}]))
    with pytest.raises(RayStateError, match="lacks placement_group_id"):
        parse_placement_groups(json.dumps([{"name": "x"}]))
