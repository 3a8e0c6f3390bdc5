"""Transport detection from real NCCL_DEBUG=INFO output: our H200 captures and public excerpts."""
import json

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts import (
    nvidia_smi,
    nvidia_smi_query,
    nvidia_smi_tables,
    nvidia_smi_topo,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.nccl_transport import (
    bottleneck,
    classify_path,
    parse_nccl_debug,
)


def read(fixtures_dir, relative):
    return (fixtures_dir / relative).read_text(encoding="utf-8")


def probe_log(fixtures_dir, name):
    return json.loads(read(fixtures_dir, f"gpu/h200x2-run/{name}.json"))["nccl_debug_log"]


def test_h200_pair_over_nvlink_despite_socket_network_plugin(fixtures_dir):
    """NCCL picks the Socket net plugin (no IB), but every channel between the two GPUs is P2P."""
    report = parse_nccl_debug(read(fixtures_dir, "gpu/h200x2/torch-allreduce-nccl-debug.log"))
    assert report["transport"] == "nvlink"
    assert report["networks"] == ["Socket"]
    assert report["ib_device_found"] is False
    assert report["path_counts"] == {"P2P/CUMEM": 48}
    assert report["nccl_version"] == "2.28.9"
    assert report["cuda_version"] == "13.0"
    assert (report["nranks"], report["nnodes"]) == (2, 1)
    assert report["ranks"]["0"]["cuda_dev"] == 0 and report["ranks"]["1"]["bus_id"] == "70"
    assert report["nvls"]["channels"] == 0 and report["nvls"]["active"] is False
    assert report["inter_node"] is None
    # That log was taken without the GRAPH subsystem: nothing proves the P2P path is NVLink.
    assert report["nvlink_evidence"] is None
    assert any("P2P links counted as NVLink" in note for note in report["notes"])
    assert any("via P2P/CUMEM" in line for line in report["evidence"])


def test_topology_from_gpu_facts_settles_the_p2p_path(fixtures_dir):
    facts = nvidia_smi.summarize_gpus(
        nvidia_smi_query.parse_query_xml(read(fixtures_dir, "gpu/h200x2/nvidia-smi-q.xml")),
        nvidia_smi_topo.parse_topo_matrix(read(fixtures_dir, "gpu/h200x2/topo.txt")),
    )
    log = read(fixtures_dir, "gpu/h200x2/torch-allreduce-nccl-debug.log")
    confirmed = parse_nccl_debug(log, p2p_over_nvlink=facts["nvlink"])
    assert facts["nvlink"] is True
    assert confirmed["transport"] == "nvlink" and confirmed["nvlink_evidence_source"] == "caller (topology)"
    assert not confirmed["notes"]
    # The same log on a host whose GPUs are not NVLink-connected is PCIe peer-to-peer.
    assert parse_nccl_debug(log, p2p_over_nvlink=False)["transport"] == "pcie"


def test_probe_capture_proves_nvlink_with_graph_lines(fixtures_dir):
    report = parse_nccl_debug(probe_log(fixtures_dir, "probe-main"))
    assert report["transport"] == report["intra_node"] == "nvlink"
    assert report["nvlink_evidence"] is True
    assert report["nvlink_evidence_source"] == "NCCL graph/topology lines"
    assert "NVL" in report["graph_path_types"]
    assert report["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert report["nvls"]["channels"] == 0
    assert report["nccl_version"] == "2.28.9"
    assert report["class_counts"] == {"nvlink": report["links"]} and report["links"] > 0


def test_nccl_tests_and_probe_used_the_same_nccl_and_link(fixtures_dir):
    ours = parse_nccl_debug(probe_log(fixtures_dir, "probe-main"))
    theirs = parse_nccl_debug(read(fixtures_dir, "gpu/h200x2-run/nccl-tests-nccl-debug.log"))
    assert theirs["nccl_version"] == ours["nccl_version"]
    assert theirs["transport"] == ours["transport"] == "nvlink"
    # One process per GPU (the probe) maps peer memory through cuMem handles; nccl-tests -g 2
    # drives both GPUs from one process and reads the peer through a direct pointer.
    assert set(ours["path_counts"]) == {"P2P/CUMEM"}
    assert set(theirs["path_counts"]) == {"P2P/direct pointer"}


def test_forced_shm_on_h200_is_detected(fixtures_dir):
    report = parse_nccl_debug(probe_log(fixtures_dir, "probe-shm"))
    assert report["transport"] == "shm"
    assert set(report["path_counts"]) == {"SHM/direct/direct"}
    assert report["env"]["NCCL_P2P_DISABLE"] == "1"
    # With P2P off NCCL's graph search reports a PCI path (PHB) between the GPUs.
    assert report["graph_path_types"] == ["PHB"]


def test_forced_socket_on_h200_is_detected(fixtures_dir):
    report = parse_nccl_debug(probe_log(fixtures_dir, "probe-socket"))
    assert report["transport"] == report["inter_node"] == "socket"
    assert report["intra_node"] is None
    assert set(report["path_counts"]) == {"NET/Socket/0"}
    assert report["env"]["NCCL_SHM_DISABLE"] == "1"


def test_two_node_run_on_one_host_reports_each_rank(fixtures_dir):
    for name, rank in (("probe-node0", "0"), ("probe-node1", "1")):
        report = parse_nccl_debug(probe_log(fixtures_dir, name))
        assert report["nranks"] == 2
        assert report["transport"] == "nvlink"
        assert rank in report["ranks"]


def test_public_two_node_socket_and_shm(fixtures_dir):
    report = parse_nccl_debug(read(fixtures_dir, "nccl/public/nccl1232-2node-socket-shm-excerpt.log"))
    assert report["transport"] == "socket"
    assert report["inter_node"] == "socket"
    assert report["intra_node"] == "shm"
    assert report["hosts"] == ["node0", "node2"]
    assert report["path_counts"]["SHM/direct/direct"] == 2
    assert report["class_counts"]["socket"] == report["links"] - 2


def test_public_pcie_box_over_shm(fixtures_dir):
    report = parse_nccl_debug(read(fixtures_dir, "nccl/public/nccl1817-8xl20-shm-excerpt.log"))
    assert report["transport"] == "shm"
    assert report["class_counts"] == {"shm": 11}
    assert report["hosts"] == ["sh9-machine-20250813085604-64df4c99dc-m27xf"]


def test_public_p2p_with_socket_between_nodes(fixtures_dir):
    report = parse_nccl_debug(read(fixtures_dir, "nccl/public/nccl952-2node-p2p-socket-excerpt.log"))
    assert report["transport"] == "socket"
    assert report["intra_node"] == "nvlink"
    assert report["inter_node"] == "socket"
    assert report["path_counts"]["NET/Socket/3"] == 2


def test_public_infiniband_with_gpudirect(fixtures_dir):
    report = parse_nccl_debug(read(fixtures_dir, "nccl/public/nccl707-a100-ib-gdrdma-excerpt.log"))
    assert report["transport"] == report["inter_node"] == "infiniband"
    assert report["gdrdma"] is True
    assert sorted(report["path_counts"]) == ["NET/IB/0/GDRDMA", "NET/IB/2/GDRDMA", "NET/IB/4/GDRDMA",
                                             "NET/IB/5/GDRDMA"]


def test_public_infiniband_without_gpudirect(fixtures_dir):
    report = parse_nccl_debug(read(fixtures_dir, "nccl/public/nccl1412-ib-without-gdrdma-p2p-excerpt.log"))
    assert report["inter_node"] == "infiniband"
    assert report["intra_node"] == "nvlink"
    assert report["transport"] == "infiniband"
    assert report["gdrdma"] is False
    assert any("GDRDMA" in note for note in report["notes"])
    assert report["path_counts"]["P2P/direct pointer/read"] == 10


def test_public_nvls_support_and_plugin_network_without_prefixes(fixtures_dir):
    report = parse_nccl_debug(read(fixtures_dir, "nccl/public/nccl1584-8xh100-nvls-ibext-excerpt.log"))
    assert report["nvls"]["multicast_available"] is True
    assert report["networks"] == ["IBext_v8"]
    assert report["nccl_version"] == "2.24.3"
    assert report["nranks"] == 8
    assert report["env"]["NCCL_IB_PCI_RELAXED_ORDERING"] == "1"
    # No channel line in the excerpt: nothing is proven.
    assert report["transport"] == "unknown" and report["links"] == 0
    assert any("no 'Channel" in note for note in report["notes"])


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("P2P/CUMEM", "nvlink"),
        ("P2P/IPC/read", "nvlink"),
        ("P2P/direct pointer/read", "nvlink"),
        ("SHM/direct/direct", "shm"),
        ("NET/Socket/0", "socket"),
        ("NET/IB/5/GDRDMA", "infiniband"),
        ("NET/IB/3", "infiniband"),
        ("NET/IBext_v8/3", "infiniband"),
    ],
)
def test_paths_printed_by_nccl_are_classified(path, expected):
    assert classify_path(path) == expected


def test_p2p_without_nvlink_is_pcie():
    assert classify_path("P2P/IPC/read", p2p_over_nvlink=False) == "pcie"


def test_bottleneck_is_the_slowest_link():
    assert bottleneck(["nvlink", "infiniband"]) == "infiniband"
    assert bottleneck(["nvlink", "socket", "shm"]) == "socket"
    assert bottleneck(["nvlink", "unknown"]) == "unknown"
    assert bottleneck(["unknown", "shm"]) == "shm"
    assert bottleneck([]) == "unknown"


def test_live_facts_of_the_proof_run_agree_with_the_nccl_log(fixtures_dir):
    """The facts parsers on that machine's nvidia-smi outputs, next to what NCCL logged there."""
    facts_dir = "gpu/h200x2-run/facts"
    facts = nvidia_smi.summarize_gpus(
        nvidia_smi_query.parse_query_xml(read(fixtures_dir, f"{facts_dir}/nvidia-smi-q.xml")),
        nvidia_smi_topo.parse_topo_matrix(read(fixtures_dir, f"{facts_dir}/topo.txt")),
        nvidia_smi_topo.parse_nvlink_status(read(fixtures_dir, f"{facts_dir}/nvlink-s.txt")),
    )
    assert (facts["count"], facts["name"], facts["nvlink"], facts["nvlink_links_per_pair"]) == (
        2, "NVIDIA H200", True, 18)
    from_log = parse_nccl_debug(probe_log(fixtures_dir, "probe-main"))
    from_facts = parse_nccl_debug(probe_log(fixtures_dir, "probe-main"), p2p_over_nvlink=facts["nvlink"])
    assert from_log["nvlink_evidence"] is from_facts["nvlink_evidence"] is True
    assert from_log["transport"] == from_facts["transport"] == "nvlink"


def test_proof_run_changed_no_gpu_setting(fixtures_dir):
    before = nvidia_smi_tables.parse_query_gpu_csv(read(fixtures_dir, "gpu/h200x2-run/facts/settings-before.csv"))
    after = nvidia_smi_tables.parse_query_gpu_csv(read(fixtures_dir, "gpu/h200x2-run/facts/settings-after.csv"))
    assert len(before) == 2 and before == after
    assert {row["persistence_mode"] for row in after} == {"Enabled"}
