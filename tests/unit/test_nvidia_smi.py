"""nvidia-smi parsers, on real captures only (tests/fixtures/gpu, each with its source note)."""

from __future__ import annotations

import json
from fnmatch import fnmatch
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts import nvidia_smi
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi import (
    NvidiaSmiParseError,
    summarize_gpus,
    topology_links,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi_query import (
    compute_capability_for,
    parse_query_text,
    parse_query_xml,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi_tables import (
    QUERY_GPU_FIELDS,
    parse_default_table,
    parse_dmon,
    parse_pmon,
    parse_query_gpu_csv,
    parse_version,
    split_capture_sections,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi_topo import (
    parse_nvlink_status,
    parse_topo_matrix,
)

GPU = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
H200 = GPU / "h200x2"
LOAD = GPU / "h200x2-load"
PUBLIC = GPU / "public"
CAPTURES = sorted(PUBLIC.glob("nvgpuexp-capture-*-drv*.txt"))
CAPTURES = [path for path in CAPTURES if not path.name.endswith(".source.txt")]


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def sections(path: Path) -> dict:
    """Capture sections keyed by '<state> :: <what>' title."""
    return {section["title"]: section for section in split_capture_sections(read(path))}


# ------------------------------------------------------------------ -q -x

XML_EXPECTED = {
    # file: (schema, driver, cuda, attached, described, name, memory MiB, capability, persistence, mig, processes)
    "h200x2/nvidia-smi-q.xml": ("nvsmi_device_v13.dtd", "580.159.04", "13.0", 2, 2, "NVIDIA H200", 143771, "9.0",
                                True, False, 0),
    "h200x2-plan-fit/nvidia-smi-q-x.xml": ("nvsmi_device_v13.dtd", "580.159.04", "13.0", 2, 2, "NVIDIA H200",
                                           143771, "9.0", True, False, 0),
    "h200x2-load/nvidia-smi-q-idle.xml": ("nvsmi_device_v13.dtd", "580.159.04", "13.0", 2, 2, "NVIDIA H200", 143771,
                                          "9.0", True, False, 0),
    "h200x2-load/nvidia-smi-q-load.xml": ("nvsmi_device_v13.dtd", "580.159.04", "13.0", 2, 2, "NVIDIA H200", 143771,
                                          "9.0", True, False, 2),
    "public/telegraf-a100-sxm4-80gb-mig.xml": ("nvsmi_device_v12.dtd", "535.54.03", "12.2", 4, 1,
                                               "NVIDIA A100-SXM4-80GB", 81920, "8.0", False, True, 0),
    "public/telegraf-a10g.xml": ("nvsmi_device_v11.dtd", "515.105.01", "11.7", 1, 1, "NVIDIA A10G", 23028, "8.6",
                                 False, False, 1),
    "public/telegraf-tesla-t4.xml": ("nvsmi_device_v11.dtd", "515.105.01", "11.7", 1, 1, "Tesla T4", 15360, "7.5",
                                     False, False, 2),
    "public/telegraf-rtx4000-sff-ada-schema-v13.xml": ("nvsmi_device_v13.dtd", "595.84", "13.2", 1, 1,
                                                       "NVIDIA RTX 4000 SFF Ada Generation", 20475, "8.9", True,
                                                       False, 4),
    "public/datakit-8x-v100s-pcie-32gb-driver460.xml": ("nvsmi_device_v11.dtd", "460.73.01", "11.2", 8, 8,
                                                        "Tesla V100S-PCIE-32GB", 32510, "7.0", False, False, 8),
    "public/openpai-2x-rtx2080ti-driver410.xml": ("nvsmi_device_v10.dtd", "410.73", "10.0", 2, 2,
                                                  "GeForce RTX 2080 Ti", 10989, "7.5", False, False, 0),
    "public/openpai-4x-tesla-k80-driver430.xml": ("nvsmi_device_v10.dtd", "430.26", None, 4, 4, "Tesla K80", 11441,
                                                  "3.7", False, False, 2),
    "public/openpai-gtx1070-driver384.xml": ("nvsmi_device_v9.dtd", "384.66", None, 6, 2, "GeForce GTX 1070", 8112,
                                             "6.1", False, False, 4),
}


def test_every_xml_fixture_has_an_expectation():
    on_disk = {str(path.relative_to(GPU)) for path in GPU.glob("*/*.xml")}
    assert on_disk == set(XML_EXPECTED)


@pytest.mark.parametrize("relative", sorted(XML_EXPECTED))
def test_query_xml_summary_matches_the_capture(relative):
    schema, driver, cuda, attached, described, name, memory, capability, persistence, mig, processes = (
        XML_EXPECTED[relative]
    )
    parsed = parse_query_xml(read(GPU / relative))
    summary = summarize_gpus(parsed)
    assert parsed["schema"] == schema
    assert (summary["driver_version"], summary["cuda_version"]) == (driver, cuda)
    assert (summary["attached_gpus"], summary["count"]) == (attached, described)
    assert summary["name"] == name and summary["homogeneous"]
    assert summary["memory_total_mib"] == memory
    assert summary["compute_capability"] == capability
    assert summary["persistence_mode"] is persistence
    assert summary["mig_mode"] is mig
    assert len(summary["processes"]) == processes
    assert summary["present"] is True
    assert [gpu["index"] for gpu in summary["gpus"]] == list(range(described))


def test_h200_pair_from_the_real_2x_h200_machine():
    parsed = parse_query_xml(read(H200 / "nvidia-smi-q.xml"))
    first, second = parsed["gpus"]
    assert (first["pci_bus_id"], second["pci_bus_id"]) == ("00000000:00:06.0", "00000000:00:07.0")
    assert first["uuid"] == "GPU-868df17e-8f33-8d92-8b9e-66e635b10324"
    assert second["uuid"] == "GPU-ae3fc5b7-eed7-58e8-f870-fe989cf15306"
    for gpu in parsed["gpus"]:
        assert gpu["architecture"] == "Hopper"
        assert gpu["compute_capability_source"] == "product_name"
        assert gpu["memory_total_mib"] == 143771
        assert gpu["ecc_mode"] == "Enabled"
        assert gpu["ecc_errors"] == {
            "volatile": {"correctable": 0, "uncorrectable": 0},
            "aggregate": {"correctable": 0, "uncorrectable": 0},
        }
        assert gpu["fabric"]["state"] == "Completed" and gpu["fabric"]["status"] == "Success"
        assert gpu["virtualization_mode"] == "Pass-Through"
        assert (gpu["pcie_link_gen_max"], gpu["pcie_link_width_max"]) == (5, 16)
        assert gpu["power_limit_w"] == 700.0
        assert gpu["mig_mode_current"] == "Disabled" and gpu["mig_devices"] == []


def test_h200_summary_with_topology_and_nvlink():
    parsed = parse_query_xml(read(H200 / "nvidia-smi-q.xml"))
    topo = parse_topo_matrix(read(H200 / "topo.txt"))
    nvlink = parse_nvlink_status(read(H200 / "nvlink-s.txt"))
    summary = summarize_gpus(parsed, topo=topo, nvlink_status=nvlink)
    assert summary["links"]["GPU0"]["GPU1"] == "NV18"
    assert summary["nvlink"] is True
    assert summary["nvlink_links_per_pair"] == 18
    # Two GPUs with 18 links each need no switch; the fabric registration says there is one.
    assert summary["nvswitch"] is True
    assert summary["fabric_state"] == "Completed"
    assert summary["memory_total_gib"] == round(143771 / 1024, 2)
    for gpu in summary["gpus"]:
        assert gpu["cpu_affinity"] == "0-31"
        assert gpu["numa_affinity"] == "0"
        assert gpu["gpu_numa_id"] is None
        assert gpu["nvlink_active_links"] == 18
        assert gpu["nvlink_total_gb_s"] == pytest.approx(18 * 26.562)
        assert gpu["closest_nics"] == []
    assert summary["warnings"] == []


def test_processes_under_load_carry_gpu_and_memory():
    summary = summarize_gpus(parse_query_xml(read(LOAD / "nvidia-smi-q-load.xml")))
    assert [(p["gpu"], p["pid"], p["name"], p["type"], p["used_memory_mib"]) for p in summary["processes"]] == [
        (0, 583, "python3", "C", 6754),
        (1, 583, "python3", "C", 6754),
    ]
    assert summary["processes"][0]["gpu_uuid"] == "GPU-5ca8532c-9041-29ce-72cc-27ab52815263"
    assert [gpu["memory_used_mib"] for gpu in summary["gpus"]] == [6763, 6763]


def test_k80_index_follows_document_order_not_minor_number():
    parsed = parse_query_xml(read(PUBLIC / "openpai-4x-tesla-k80-driver430.xml"))
    assert [gpu["pci_bus_id"] for gpu in parsed["gpus"]] == [
        "00001580:00:00.0", "00002DF7:00:00.0", "00004968:00:00.0", "0000F8D6:00:00.0",
    ]
    assert [gpu["minor_number"] for gpu in parsed["gpus"]] == [1, 2, 3, 0]
    assert parsed["cuda_version"] is None  # the capture says 'Not Found'


def test_k80_old_ecc_layout_and_retired_pages():
    summary = summarize_gpus(parse_query_xml(read(PUBLIC / "openpai-4x-tesla-k80-driver430.xml")))
    aggregate = [gpu["ecc_errors"]["aggregate"] for gpu in summary["gpus"]]
    assert aggregate[0] == {"correctable": 7, "uncorrectable": 7}
    assert aggregate[1]["uncorrectable"] == 4
    assert summary["ecc_uncorrectable_aggregate"] == 11
    assert summary["ecc_uncorrectable_volatile"] == 0
    assert [gpu["retired_pages"]["double_bit"] for gpu in summary["gpus"]] == [1, 1, 0, 0]
    assert [(p["gpu"], p["pid"], p["used_memory_mib"]) for p in summary["processes"]] == [(0, 58813, 576), (1, 58642, 576)]


def test_ecc_not_supported_reads_as_unknown():
    summary = summarize_gpus(parse_query_xml(read(PUBLIC / "openpai-2x-rtx2080ti-driver410.xml")))
    assert summary["ecc_uncorrectable_volatile"] is None
    assert all(gpu["ecc_mode"] is None for gpu in summary["gpus"])


def test_a100_mig_devices_and_partial_capture_warning():
    summary = summarize_gpus(parse_query_xml(read(PUBLIC / "telegraf-a100-sxm4-80gb-mig.xml")))
    (gpu,) = summary["gpus"]
    assert gpu["mig_enabled"] is True
    assert [device["memory_total_mib"] for device in gpu["mig_devices"]] == [19968] * 4
    assert [device["multiprocessor_count"] for device in gpu["mig_devices"]] == [14] * 4
    assert gpu["fabric"] == {"state": None, "status": None, "clique_id": None, "cluster_uuid": None}
    assert summary["nvswitch"] is False
    assert "nvidia-smi reports 4 attached GPUs but describes 1" in summary["warnings"]


def test_v100_eight_gpus_processes_and_persistence_warnings():
    summary = summarize_gpus(parse_query_xml(read(PUBLIC / "datakit-8x-v100s-pcie-32gb-driver460.xml")))
    assert [gpu["pci_bus_id"][-7:] for gpu in summary["gpus"]] == [
        "00:0D.0", "00:0E.0", "00:0F.0", "00:10.0", "00:11.0", "00:12.0", "00:13.0", "00:14.0",
    ]
    assert summary["processes"][0]["pid"] == 37305 and summary["processes"][0]["used_memory_mib"] == 31683
    assert {process["name"] for process in summary["processes"]} == {"python"}
    assert sum("persistence mode is off" in warning for warning in summary["warnings"]) == 8
    assert summary["nvlink"] is None  # eight GPUs but no topology given


def test_rtx4000_schema_v13_process_types():
    summary = summarize_gpus(parse_query_xml(read(PUBLIC / "telegraf-rtx4000-sff-ada-schema-v13.xml")))
    assert [(p["pid"], p["type"]) for p in summary["processes"]] == [
        (1842, "G"), (3190, "G"), (4937, "C"), (34626, "C+G"),
    ]
    assert summary["gpus"][0]["virtualization_mode"] == "None"


def test_query_xml_rejects_other_outputs():
    with pytest.raises(NvidiaSmiParseError, match="not XML"):
        parse_query_xml(read(LOAD / "error-bad-index.txt"))
    with pytest.raises(NvidiaSmiParseError, match="not XML"):
        parse_query_xml(read(H200 / "topo.txt"))
    with pytest.raises(NvidiaSmiParseError, match="printed nothing"):
        parse_query_xml("")


@pytest.mark.parametrize(
    ("name", "architecture", "expected"),
    [
        ("NVIDIA H200", "Hopper", "9.0"),
        ("NVIDIA H100 80GB HBM3", None, "9.0"),
        ("NVIDIA A100-SXM4-80GB", "Ampere", "8.0"),
        ("NVIDIA A10G", "Ampere", "8.6"),
        ("NVIDIA L40S", None, "8.9"),
        ("Quadro RTX 4000", None, "7.5"),
        ("Tesla K80", None, "3.7"),
        ("Some Future GPU", "Ampere", None),
        ("Some Future GPU", "Hopper", "9.0"),
    ],
)
def test_compute_capability_table(name, architecture, expected):
    assert compute_capability_for(name, architecture)[0] == expected


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda path: path.name)
def test_name_table_agrees_with_compute_cap_reported_by_nvidia_smi(capture):
    by_title = sections(capture)
    for state in ("idle", "load"):
        rows = parse_query_gpu_csv(by_title[f"{state} :: query-gpu (csv, what the exporter parses)"]["body"])
        text = parse_query_text(by_title[f"{state} :: query (-q)"]["body"])
        assert [gpu["compute_capability"] for gpu in text["gpus"]] == [row["compute_cap"] for row in rows]


# ------------------------------------------------------------------ -q (text)


def test_query_text_and_xml_agree_on_the_same_machine():
    xml = parse_query_xml(read(LOAD / "nvidia-smi-q-load.xml"))
    text = parse_query_text(read(LOAD / "nvidia-smi-q-load.txt"))
    assert text["driver_version"] == xml["driver_version"] == "580.159.04"
    assert text["attached_gpus"] == 2
    keys = ("pci_bus_id", "uuid", "name", "memory_total_mib", "persistence_mode", "mig_mode_current",
            "ecc_mode", "ecc_errors", "fabric", "pcie_link_width_max", "power_limit_w", "processes")
    for from_text, from_xml in zip(text["gpus"], xml["gpus"], strict=True):
        assert {key: from_text[key] for key in keys} == {key: from_xml[key] for key in keys}


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda path: path.name)
def test_query_text_matches_the_csv_of_the_same_capture(capture):
    by_title = sections(capture)
    for state in ("idle", "load"):
        (row,) = parse_query_gpu_csv(by_title[f"{state} :: query-gpu (csv, what the exporter parses)"]["body"])
        parsed = parse_query_text(by_title[f"{state} :: query (-q)"]["body"])
        (gpu,) = parsed["gpus"]
        assert gpu["name"] == row["name"]
        assert gpu["pci_bus_id"] == row["pci.bus_id"]
        assert gpu["memory_total_mib"] == row["memory.total"]
        assert gpu["persistence_mode"] == (row["persistence_mode"] == "Enabled")
        assert gpu["mig_mode_current"] == row["mig.mode.current"]
        assert parsed["driver_version"] == row["driver_version"]
        apps = parse_query_gpu_csv(by_title[f"{state} :: query-compute-apps (per-process)"]["body"])
        assert [(p["pid"], p["used_memory_mib"]) for p in gpu["processes"]] == [
            (app["pid"], app["used_gpu_memory"]) for app in apps
        ]


@pytest.mark.parametrize(
    ("capture", "mig_memory"),
    [
        ("nvgpuexp-capture-h100-mig-drv590.txt", [40448, 20096, 9984, 9984]),
        ("nvgpuexp-capture-h200-mig-drv590.txt", [71424, 71424, 33280, 16384, 16384]),
    ],
)
def test_query_text_mig_devices(capture, mig_memory):
    parsed = parse_query_text(sections(PUBLIC / capture)["load :: query (-q)"]["body"])
    (gpu,) = parsed["gpus"]
    assert gpu["mig_enabled"] is True
    assert [device["memory_total_mib"] for device in gpu["mig_devices"]] == mig_memory
    assert all(process["gpu_instance_id"] is not None for process in gpu["processes"])


def test_query_text_rejects_other_outputs():
    with pytest.raises(NvidiaSmiParseError, match="NVSMI LOG"):
        parse_query_text(read(LOAD / "error-bad-index.txt"))


# ------------------------------------------------------------------ topo -m

TOPO_EXPECTED = {
    # file: (gpus, nics, GPU0-GPU1 link, incomplete rows, GPU0 cpu affinity, GPU0 numa affinity)
    "h200x2/topo.txt": (2, 0, "NV18", [], "0-31", "0"),
    "h200x2-load/topo.txt": (2, 0, "NV18", [], "0-31", "0"),
    "public/topo-2x-nv12-8nic.txt": (2, 8, "NV12", [], None, None),
    "public/topo-4x-h100-nv6-4nic.txt": (4, 4, "NV6", [], "6,14,22,30", "3"),
    "public/topo-8x-dgx-nv18-12nic.txt": (8, 12, "NV18", ["NIC0"], "0-55,112-167", "0"),
    "public/topo-8x-h100-sxm-nv18-10nic.txt": (8, 10, "NV18", ["NIC3"], "0-55,112-167", "0"),
    "public/topo-8x-rtx4090-pcie-allsys.txt": (8, 2, "SYS", [], "0-55,112-167", "0"),
}


def test_every_topo_fixture_has_an_expectation():
    on_disk = {str(path.relative_to(GPU)) for path in GPU.glob("*/topo*.txt") if ".source." not in path.name}
    assert on_disk == set(TOPO_EXPECTED)


@pytest.mark.parametrize("relative", sorted(TOPO_EXPECTED))
def test_topo_matrix(relative):
    gpus, nics, link, incomplete, cpu_affinity, numa_affinity = TOPO_EXPECTED[relative]
    topo = parse_topo_matrix(read(GPU / relative))
    assert topo["gpus"] == [f"GPU{index}" for index in range(gpus)]
    assert topo["nics"] == [f"NIC{index}" for index in range(nics)]
    assert topo["matrix"]["GPU0"]["GPU1"] == link
    assert topo["matrix"]["GPU1"]["GPU0"] == link
    assert topo["incomplete_rows"] == incomplete
    assert topo["affinity"]["GPU0"]["cpu_affinity"] == cpu_affinity
    assert topo["affinity"]["GPU0"]["numa_affinity"] == numa_affinity
    for label in topo["gpus"]:
        assert topo["matrix"][label][label] == "X"
        assert len(topo["matrix"][label]) == gpus + nics
        assert topo["affinity"][label]["gpu_numa_id"] is None  # every capture prints N/A


def test_topo_dgx_row_glitches_are_split():
    topo = parse_topo_matrix(read(PUBLIC / "topo-8x-dgx-nv18-12nic.txt"))
    # 'NODENODE' and 'NODEPXB' lost a tab when pasted; the PXB NIC of GPU5 is NIC9.
    assert [topo["matrix"]["GPU5"][f"NIC{index}"] for index in range(6, 12)] == [
        "NODE", "NODE", "NODE", "PXB", "NODE", "NODE",
    ]
    assert topo["affinity"]["GPU4"]["cpu_affinity"] == "56-111,168-223"
    assert topo["affinity"]["GPU4"]["numa_affinity"] == "1"
    assert len(topo["affinity"]["GPU4"]["cpus"]) == 112


def test_topo_4x_h100_numa_per_gpu_and_pix_nic():
    topo = parse_topo_matrix(read(PUBLIC / "topo-4x-h100-nv6-4nic.txt"))
    assert [topo["affinity"][f"GPU{index}"]["numa_affinity"] for index in range(4)] == ["3", "1", "7", "5"]
    assert [topo["matrix"][f"GPU{index}"][f"NIC{index}"] for index in range(4)] == ["PIX"] * 4
    assert topo["affinity"]["GPU2"]["cpus"] == [7, 15, 23, 31]


def test_topo_rtx4090_nic_behind_gpu6_host_bridge():
    topo = parse_topo_matrix(read(PUBLIC / "topo-8x-rtx4090-pcie-allsys.txt"))
    assert topo["matrix"]["GPU6"]["NIC0"] == "PHB"
    assert topo["matrix"]["NIC0"]["NIC1"] == "PIX"
    assert topo["affinity"]["GPU7"]["numa_affinity"] == "1"


@pytest.mark.parametrize(
    ("relative", "nvlink", "per_pair", "through_switch"),
    [
        ("h200x2/topo.txt", True, 18, False),  # two GPUs: 18 links fit without a switch
        ("public/topo-2x-nv12-8nic.txt", True, 12, False),
        ("public/topo-4x-h100-nv6-4nic.txt", True, 6, False),  # 3 peers x 6 = 18 links: direct
        ("public/topo-8x-h100-sxm-nv18-10nic.txt", True, 18, True),  # 7 peers x 18 links: NVSwitch
        ("public/topo-8x-dgx-nv18-12nic.txt", True, 18, True),
        ("public/topo-8x-rtx4090-pcie-allsys.txt", False, None, False),
    ],
)
def test_topology_links(relative, nvlink, per_pair, through_switch):
    topo = parse_topo_matrix(read(GPU / relative))
    assert topology_links(topo, topo["gpus"]) == (nvlink, per_pair, through_switch)


def test_topology_links_without_pairs_or_topology():
    topo = parse_topo_matrix(read(H200 / "topo.txt"))
    assert topology_links(topo, ["GPU0"]) == (False, None, False)
    assert topology_links(None, ["GPU0", "GPU1"]) == (None, None, False)


def test_closest_nics_from_topology():
    topo = parse_topo_matrix(read(PUBLIC / "topo-4x-h100-nv6-4nic.txt"))
    assert nvidia_smi.link_rank("PIX") < nvidia_smi.link_rank("SYS") < nvidia_smi.link_rank(None)
    for index in range(4):
        row = topo["matrix"][f"GPU{index}"]
        nearest = min(row, key=lambda device: nvidia_smi.link_rank(row[device]) if device.startswith("NIC") else 99)
        assert nearest == f"NIC{index}"


def test_topo_rejects_other_outputs():
    with pytest.raises(NvidiaSmiParseError, match="no topology matrix"):
        parse_topo_matrix(read(LOAD / "error-bad-topo-arg.txt"))
    with pytest.raises(NvidiaSmiParseError, match="no topology matrix"):
        parse_topo_matrix(read(H200 / "nvlink-s.txt"))


# ------------------------------------------------------------------ nvlink -s


@pytest.mark.parametrize("relative", ["h200x2/nvlink-s.txt", "h200x2-load/nvlink-s.txt"])
def test_nvlink_status_h200(relative):
    status = parse_nvlink_status(read(GPU / relative))
    assert [gpu["index"] for gpu in status["gpus"]] == [0, 1]
    assert {gpu["name"] for gpu in status["gpus"]} == {"NVIDIA H200"}
    for gpu in status["gpus"]:
        assert gpu["supported"] is True
        assert gpu["active_links"] == 18 and gpu["inactive_links"] == 0
        assert {link["speed_gb_s"] for link in gpu["links"]} == {26.562}
        assert gpu["total_gb_s"] == pytest.approx(478.116)


@pytest.mark.parametrize(
    ("capture", "supported", "links"),
    [
        ("nvgpuexp-capture-h100-80gb-hbm3-drv590.txt", True, 18),
        ("nvgpuexp-capture-h200-drv590.txt", True, 18),
        ("nvgpuexp-capture-h100-mig-drv590.txt", False, 0),  # 'not supported for Devices in MIG mode'
        ("nvgpuexp-capture-h200-mig-drv590.txt", False, 0),
        ("nvgpuexp-capture-l40s-drv595.txt", True, 0),  # PCIe card: no links listed
    ],
)
def test_nvlink_status_captures(capture, supported, links):
    (gpu,) = parse_nvlink_status(sections(PUBLIC / capture)["capabilities :: nvlink -s"]["body"])["gpus"]
    assert gpu["supported"] is supported
    assert gpu["active_links"] == links


def test_nvlink_status_rejects_other_outputs():
    with pytest.raises(NvidiaSmiParseError):
        parse_nvlink_status(read(LOAD / "error-bad-index.txt"))


# ------------------------------------------------------------------ CSV


def test_query_gpu_csv_noheader_nounits_from_the_h200_machine():
    rows = parse_query_gpu_csv(read(H200 / "query-gpu.csv"), fields=QUERY_GPU_FIELDS)
    assert [(row["index"], row["name"], row["memory.total"], row["memory.free"]) for row in rows] == [
        (0, "NVIDIA H200", 143771, 143156),
        (1, "NVIDIA H200", 143771, 143156),
    ]
    assert {row["driver_version"] for row in rows} == {"580.159.04"}
    assert {row["compute_cap"] for row in rows} == {"9.0"}
    assert rows[0]["uuid"] == "GPU-868df17e-8f33-8d92-8b9e-66e635b10324"
    assert rows[1]["pci.bus_id"] == "00000000:00:07.0"
    assert (rows[0]["persistence_mode"], rows[0]["mig.mode.current"]) == ("Enabled", "Disabled")


def test_query_gpu_csv_header_and_noheader_give_the_same_rows():
    with_header = parse_query_gpu_csv(read(LOAD / "query-gpu-load.csv"))
    without = parse_query_gpu_csv(read(LOAD / "query-gpu-load-noheader-nounits.csv"), fields=QUERY_GPU_FIELDS)
    assert with_header == without
    assert list(with_header[0]) == list(QUERY_GPU_FIELDS)
    assert [row["memory.used"] for row in with_header] == [6763, 6763]
    idle = parse_query_gpu_csv(read(LOAD / "query-gpu-idle.csv"))
    assert [row["memory.used"] for row in idle] == [0, 0]
    # A header line passed together with explicit fields is recognised and skipped.
    assert parse_query_gpu_csv(read(LOAD / "query-gpu-load.csv"), fields=QUERY_GPU_FIELDS) == with_header


def test_compute_apps_csv_header_and_noheader():
    fields = ("pid", "process_name", "used_gpu_memory", "gpu_uuid", "gpu_bus_id")
    with_header = parse_query_gpu_csv(read(LOAD / "compute-apps-load.csv"))
    without = parse_query_gpu_csv(read(LOAD / "compute-apps-load-noheader-nounits.csv"), fields=fields)
    assert with_header == without
    assert [(row["pid"], row["process_name"], row["used_gpu_memory"], row["gpu_bus_id"]) for row in without] == [
        (583, "python3", 6754, "00000000:00:06.0"),
        (583, "python3", 6754, "00000000:00:07.0"),
    ]


@pytest.mark.parametrize(
    ("name", "gpu", "memory", "capability", "mig", "kmd"),
    [
        ("csv-query-gpu-h100-80gb-hbm3-load.txt", "NVIDIA H100 80GB HBM3", 81559, "9.0", "Disabled", False),
        ("csv-query-gpu-h100-mig-load.txt", "NVIDIA H100 80GB HBM3", 81559, "9.0", "Enabled", False),
        ("csv-query-gpu-h200-mig-load.txt", "NVIDIA H200", 143771, "9.0", "Enabled", False),
        ("csv-query-gpu-l40s-load.txt", "NVIDIA L40S", 46068, "8.9", None, True),
    ],
)
def test_public_query_gpu_csv(name, gpu, memory, capability, mig, kmd):
    (row,) = parse_query_gpu_csv(read(PUBLIC / name))
    assert row["name"] == gpu
    assert row["memory.total"] == memory
    assert row["compute_cap"] == capability
    assert row["mig.mode.current"] == mig
    assert ("kmd_version" in row) is kmd
    assert row["serial"] == "0000000000000"  # digits, but an identifier: stays text
    assert row["pci.domain"] == "0x0000"
    assert row["display_mode"] is None  # '[Requested functionality has been deprecated]'
    assert row["vgpu_driver_capability.heterogenous_multivGPU"] is None  # '[N/A]'
    assert row["pcie.link.width.max"] == 16
    assert isinstance(row["power.limit"], float) and row["power.limit"] > 0
    assert row["count"] == 1


def test_query_gpu_csv_rejects_a_headerless_text_without_fields():
    with pytest.raises(NvidiaSmiParseError, match="CSV header"):
        parse_query_gpu_csv(read(H200 / "query-gpu.csv"))
    with pytest.raises(NvidiaSmiParseError, match="12 fields"):
        parse_query_gpu_csv(read(LOAD / "compute-apps-load-noheader-nounits.csv"), fields=QUERY_GPU_FIELDS)
    assert parse_query_gpu_csv("") == []


# ------------------------------------------------------------------ dmon / pmon


def test_dmon_h200_default_selection():
    rows = parse_dmon(read(H200 / "dmon.txt"))
    assert len(rows) == 4
    assert [row["gpu"] for row in rows] == [0, 1, 0, 1]
    assert list(rows[0]) == ["gpu", "sm", "mem", "enc", "dec", "jpg", "ofa", "fb", "bar1", "ccpm"]
    assert {row["bar1"] for row in rows} == {1}
    assert {row["sm"] for row in rows} == {0}


def test_dmon_pucm_under_load():
    rows = parse_dmon(read(LOAD / "dmon-pucm-load.txt"))
    assert len(rows) == 6
    assert list(rows[0])[:4] == ["gpu", "pwr", "gtemp", "mtemp"]
    assert {row["fb"] for row in rows} == {6763}
    assert {row["mclk"] for row in rows} == {3201}
    assert all(row["pwr"] > 100 for row in rows)


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda path: path.name)
def test_dmon_and_pmon_sections(capture):
    by_title = sections(capture)
    for state in ("idle", "load"):
        rows = parse_dmon(by_title[f"{state} :: dmon (per-device monitor, incl. PCIe rx/tx)"]["body"])
        assert len(rows) == 5 and {row["gpu"] for row in rows} == {0}
        assert all(isinstance(row["pwr"], int) for row in rows)
        processes = parse_pmon(by_title[f"{state} :: pmon (per-process monitor)"]["body"])
        assert processes and {row["gpu"] for row in processes} == {0}
    idle = parse_pmon(by_title["idle :: pmon (per-process monitor)"]["body"])
    assert {(row["pid"], row["command"]) for row in idle} == {(None, None)}
    load = parse_pmon(by_title["load :: pmon (per-process monitor)"]["body"])
    assert all(isinstance(row["pid"], int) and row["command"] for row in load)


def test_dmon_mig_prints_dashes_for_utilisation():
    rows = parse_dmon(sections(PUBLIC / "nvgpuexp-capture-h100-mig-drv590.txt")[
        "load :: dmon (per-device monitor, incl. PCIe rx/tx)"]["body"])
    assert {row["sm"] for row in rows} == {None}
    assert rows[0]["pwr"] == 438


def test_pmon_h200_load():
    rows = parse_pmon(read(LOAD / "pmon-load.txt"))
    assert [(row["gpu"], row["pid"], row["type"], row["command"]) for row in rows] == [
        (0, 583, "C", "python3"), (1, 583, "C", "python3"), (0, 583, "C", "python3"), (1, 583, "C", "python3"),
    ]
    assert {row["enc"] for row in rows} == {None}


def test_dmon_rejects_rows_without_header():
    with pytest.raises(NvidiaSmiParseError, match="header"):
        parse_dmon(read(H200 / "query-gpu.csv"))


# ------------------------------------------------------------------ default table and --version


def test_default_table_h200_idle():
    table = parse_default_table(read(H200 / "nvidia-smi.txt"))
    assert (table["driver_version"], table["cuda_version"]) == ("580.159.04", "13.0")
    assert [(gpu["index"], gpu["name"], gpu["pci_bus_id"], gpu["memory_total_mib"]) for gpu in table["gpus"]] == [
        (0, "NVIDIA H200", "00000000:00:06.0", 143771),
        (1, "NVIDIA H200", "00000000:00:07.0", 143771),
    ]
    assert all(gpu["persistence_mode"] and gpu["mig_mode"] == "Disabled" for gpu in table["gpus"])
    assert table["processes"] == []


def test_default_table_h200_load_processes():
    table = parse_default_table(read(LOAD / "nvidia-smi-load.txt"))
    assert [(p["gpu"], p["pid"], p["name"], p["used_memory_mib"]) for p in table["processes"]] == [
        (0, 583, "python3", 6754), (1, 583, "python3", 6754),
    ]
    assert [gpu["memory_used_mib"] for gpu in table["gpus"]] == [6763, 6763]


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda path: path.name)
def test_default_table_matches_the_query_of_the_same_capture(capture):
    by_title = sections(capture)
    for state in ("idle", "load"):
        table = parse_default_table(by_title[f"{state} :: nvidia-smi (default table)"]["body"])
        text = parse_query_text(by_title[f"{state} :: query (-q)"]["body"])
        assert table["driver_version"] == text["driver_version"]
        assert [gpu["memory_total_mib"] for gpu in table["gpus"]] == [gpu["memory_total_mib"] for gpu in text["gpus"]]
        assert [p["pid"] for p in table["processes"]] == [p["pid"] for gpu in text["gpus"] for p in gpu["processes"]]


def test_version_output():
    assert parse_version(read(LOAD / "version.txt")) == {
        "nvidia_smi": "580.159.04", "nvml": "580.159", "driver": "580.159.04", "cuda": "13.0",
    }
    for capture in CAPTURES:
        version = parse_version(sections(capture)["capabilities :: version"]["body"])
        # The capture file names carry the driver branch: ...-drv590.txt, ...-drv595.txt.
        assert f"drv{version['driver'].split('.')[0]}" in capture.name
        assert version["cuda"] in ("13.1", "13.2")
    with pytest.raises(NvidiaSmiParseError):
        parse_version(read(LOAD / "error-bad-field.txt"))


# ------------------------------------------------------------------ capture bundles


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda path: path.name)
def test_capture_sections(capture):
    found = split_capture_sections(read(capture))
    commands = [section["command"] for section in found if section["command"]]
    assert "nvidia-smi -q" in commands and "nvidia-smi topo -m" in commands
    assert sum(command.startswith("nvidia-smi --query-gpu=") for command in commands) == 2
    by_title = {section["title"]: section for section in found}
    topo = parse_topo_matrix(by_title["capabilities :: topo -m"]["body"])
    assert topo["gpus"] == ["GPU0"] and topo["affinity"]["GPU0"]["cpus"]


def test_h200_capture_environment_lists_the_device_nodes_gpu_facts_looks_for():
    default_globs = ["/dev/nvidia[0-9]*", "/proc/driver/nvidia/gpus/*"]
    for relative in ("h200x2-load/env.txt",):
        lines = read(GPU / relative).splitlines()
        matched = [line for line in lines if any(fnmatch(line, pattern) for pattern in default_globs)]
        assert matched == ["/dev/nvidia0", "/dev/nvidia1", "/proc/driver/nvidia/gpus/0000:00:06.0",
                           "/proc/driver/nvidia/gpus/0000:00:07.0"]
        assert "/dev/nvidiactl" in lines and "/dev/nvidiactl" not in matched
    env = read(H200 / "env.txt")
    assert "nvidia-smi: /usr/local/nvidia/bin/nvidia-smi" in env
    assert "ibstat: \n" in env


# --- the total CUDA sees (measured on 2x H200 by bench/gpu/plan_fit.py) ------------------------------------------


def test_cuda_total_is_fb_total_minus_the_driver_reserve_as_measured_on_h200():
    fit = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200x2-plan-fit"
    facts = summarize_gpus(parse_query_xml((fit / "nvidia-smi-q-x.xml").read_text()))
    measured = json.loads((fit / "plan_fit-after.json").read_text())
    assert facts["memory_total_mib"] == 143771
    assert facts["memory_cuda_total_mib"] == 143771 - 616
    # cudaMemGetInfo's total on that machine (GiB, 3 decimals): the same within 2 MiB
    assert abs(facts["memory_cuda_total_mib"] / 1024 - measured["per_gpu"][0]["total_gib"]) < 2 / 1024
