"""InfiniBand / RoCE parsers, on real captures only (tests/fixtures/ib/public, each with its source note)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.ibstat import (
    IbParseError,
    absent_summary,
    parse_ibdev2netdev,
    parse_ibstat,
    parse_ibstatus,
    parse_ibv_devinfo,
    summarize_ib,
)

IB = Path(__file__).resolve().parents[1] / "fixtures" / "ib" / "public"


def read(name: str) -> str:
    return (IB / name).read_text(encoding="utf-8")


IBSTAT_EXPECTED = {
    # file: (CAs, ports, active, down ports, active rates, link layers, CA types)
    "gpud-ibstat-a100-8hca-ibpanic.txt": (8, 8, 8, [], [200], {"InfiniBand": 8}, {"MT4124"}),
    "gpud-ibstat-a100-9hca-all-active.txt": (9, 9, 9, [], [200], {"Ethernet": 1, "InfiniBand": 8}, {"MT4126"}),
    "gpud-ibstat-h100-12hca-3-down-disabled.txt": (
        12, 12, 9, ["mlx5_2/1", "mlx5_7/1", "mlx5_8/1"], [100, 400], {"InfiniBand": 8, "Ethernet": 4},
        {"MT4129", "MT4125"},
    ),
    "gpud-ibstat-h100-12hca-all-active.txt": (12, 12, 12, [], [100, 400], {"Ethernet": 12}, {"MT4129", "MT4125"}),
    "gpud-ibstat-h100-12hca-down-polling.txt": (
        12, 12, 10, ["mlx5_5/1", "mlx5_11/1"], [100, 400], {"Ethernet": 12}, {"MT4129", "MT4125"},
    ),
    "gpud-ibstat-h100-9hca-all-active.txt": (
        9, 9, 9, [], [200, 400], {"InfiniBand": 8, "Ethernet": 1}, {"MT4129", "MT41692"},
    ),
    "issue-mooncake1999-ibstat-mixed-excerpt.txt": (
        3, 3, 2, ["mlx5_10/1"], [200], {"Ethernet": 2, "unknown": 1}, {"MT4129", "MT4125"},
    ),
    "mail-linux-rdma-ibstat-mlx4-2port-polling.txt": (
        1, 2, 0, ["mlx4_0/1", "mlx4_0/2"], [], {"InfiniBand": 1, "Ethernet": 1}, {"MT4099"},
    ),
}


def test_every_ibstat_fixture_has_an_expectation():
    on_disk = {path.name for path in IB.glob("*ibstat-*.txt") if ".source." not in path.name}
    assert on_disk == set(IBSTAT_EXPECTED)


@pytest.mark.parametrize("name", sorted(IBSTAT_EXPECTED))
def test_ibstat_summary(name):
    cas, ports, active, down, rates, layers, types = IBSTAT_EXPECTED[name]
    summary = summarize_ib(parse_ibstat(read(name)))
    assert summary["present"] is True
    assert (summary["ca_count"], summary["port_count"], summary["active_count"]) == (cas, ports, active)
    assert summary["down_ports"] == down
    assert summary["down_count"] == len(down)
    assert summary["rates_gbps"] == rates
    assert summary["link_layers"] == layers
    assert {port["ca_type"] for port in summary["ports"]} == types
    assert len(summary["warnings"]) == len(down)


def test_ibstat_h100_mixed_fabric_ports():
    summary = summarize_ib(parse_ibstat(read("gpud-ibstat-h100-12hca-3-down-disabled.txt")))
    assert summary["infiniband_active"] == [
        "mlx5_0/1", "mlx5_3/1", "mlx5_4/1", "mlx5_5/1", "mlx5_6/1", "mlx5_9/1", "mlx5_10/1", "mlx5_11/1",
    ]
    assert summary["ethernet_active"] == ["mlx5_1/1"]
    assert summary["active_cas"][:3] == ["mlx5_0", "mlx5_1", "mlx5_3"]  # natural order: mlx5_2 is down
    first = summary["ports"][0]
    assert (first["base_lid"], first["sm_lid"], first["rate_gbps"]) == (75, 334, 400)
    assert first["port_guid"] == "0x946dae0300cde72c"
    assert first["firmware"] == "28.39.1002"
    assert summary["warnings"][0] == (
        "mlx5_2/1 is Down (Disabled): port disabled (administratively down or not cabled by design)"
    )


def test_ibstat_polling_port_points_at_the_cable():
    summary = summarize_ib(parse_ibstat(read("gpud-ibstat-h100-12hca-down-polling.txt")))
    polling = [warning for warning in summary["warnings"] if "Polling" in warning]
    assert polling == ["mlx5_11/1 is Down (Polling): no link: check the cable, the transceiver and the switch port"]


def test_ibstat_roce_ports_have_no_lid():
    summary = summarize_ib(parse_ibstat(read("gpud-ibstat-h100-12hca-all-active.txt")))
    assert {port["base_lid"] for port in summary["ports"]} == {0}
    assert summary["infiniband_active"] == []
    assert len(summary["ethernet_active"]) == 12
    parsed = parse_ibstat(read("gpud-ibstat-h100-12hca-all-active.txt"))
    assert list(parsed["cas"])[:3] == ["mlx5_0", "mlx5_1", "mlx5_10"]  # as printed (lexical)
    assert parsed["cas"]["mlx5_0"]["node_guid"] == "0xa088c20300e3142a"


def test_ibstat_bond_device_and_bluefield():
    summary = summarize_ib(parse_ibstat(read("gpud-ibstat-h100-9hca-all-active.txt")))
    bond = [port for port in summary["ports"] if port["ca"] == "mlx5_bond_0"]
    assert [(port["ca_type"], port["link_layer"], port["rate_gbps"]) for port in bond] == [("MT41692", "Ethernet", 200)]
    assert summary["ports"][-1]["ca"] == "mlx5_bond_0"


def test_ibstat_ibpanic_is_kept_as_an_error():
    parsed = parse_ibstat(read("gpud-ibstat-a100-8hca-ibpanic.txt"))
    assert parsed["errors"] == ["ibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: No such file or directory"]
    summary = summarize_ib(parsed)
    assert summary["errors"] == parsed["errors"]
    assert {port["sm_lid"] for port in summary["ports"]} == {1}
    assert summary["ports"][0]["base_lid"] == 13247
    assert parsed["cas"]["mlx5_0"]["system_guid"] == "0xb83fd203006e2704"


def test_ibstat_two_port_connectx3():
    parsed = parse_ibstat(read("mail-linux-rdma-ibstat-mlx4-2port-polling.txt"))
    ca = parsed["cas"]["mlx4_0"]
    assert (ca["type"], ca["port_count"], ca["firmware"], ca["hardware_version"]) == ("MT4099", 2, "2.42.5000", "1")
    assert [(p["port"], p["state"], p["physical_state"], p["rate_gbps"], p["link_layer"]) for p in ca["ports"]] == [
        (1, "Down", "Polling", 10, "InfiniBand"),
        (2, "Down", "Disabled", 40, "Ethernet"),
    ]


def test_ibstat_truncated_excerpt_keeps_what_it_has():
    parsed = parse_ibstat(read("issue-mooncake1999-ibstat-mixed-excerpt.txt"))
    cut = parsed["cas"]["mlx5_10"]["ports"][0]
    assert (cut["state"], cut["physical_state"], cut["rate_gbps"], cut["link_layer"]) == (
        "Down", "Disabled", None, None,
    )
    assert parsed["cas"]["mlx5_10"]["firmware"] == "22.31.1014"


def test_ibstat_rejects_other_outputs():
    with pytest.raises(IbParseError, match="CA"):
        parse_ibstat(read("gpud-ibstatus-a100-all-active.txt"))
    assert parse_ibstat("") == {"cas": {}, "errors": []}


def test_ibstatus_blocks():
    parsed = parse_ibstatus(read("gpud-ibstatus-a100-all-active.txt"))
    summary = summarize_ib(parsed)
    assert summary["ca_count"] == 9 and summary["active_count"] == 9
    assert summary["link_layers"] == {"InfiniBand": 8, "Ethernet": 1}
    assert summary["rates_gbps"] == [40, 200]
    first = parsed["cas"]["mlx5_0"]["ports"][0]
    assert (first["state"], first["physical_state"], first["rate_gbps"], first["width_speed"]) == (
        "Active", "LinkUp", 200, "4X HDR",
    )
    assert (first["base_lid"], first["sm_lid"]) == (0x33BF, 1)
    # ibstatus and ibstat of the same kind of A100 VM agree on the LID numbering.
    ibstat = parse_ibstat(read("gpud-ibstat-a100-8hca-ibpanic.txt"))
    assert ibstat["cas"]["mlx5_0"]["ports"][0]["base_lid"] == first["base_lid"] == 13247
    with pytest.raises(IbParseError):
        parse_ibstatus(read("mail-linux-rdma-ibstat-mlx4-2port-polling.txt"))


def test_ibv_devinfo_h100_port_down():
    parsed = parse_ibv_devinfo(read("issue-deepep38-ibv_devinfo-h100-excerpt.txt"))
    ca = parsed["cas"]["mlx5_0"]
    assert (ca["firmware"], ca["vendor_part_id"], ca["board_id"], ca["port_count"]) == (
        "28.39.2048", 4129, "MT_0000000838", 1,
    )
    assert ca["node_guid"] == "0x58a2e103002a09b8"
    (port,) = ca["ports"]
    assert (port["state"], port["base_lid"], port["sm_lid"], port["link_layer"]) == ("Down", 65535, 0, "InfiniBand")
    assert parsed["cas"]["mlx5_1"]["ports"] == []  # the excerpt stops inside mlx5_1
    summary = summarize_ib(parsed)
    assert summary["down_ports"] == ["mlx5_0/1"]
    assert summary["warnings"] == ["mlx5_0/1 is Down"]


def test_ibv_devinfo_roce_port_and_high_indices():
    parsed = parse_ibv_devinfo(read("issue-deepep60-ibv_devinfo-mixed-excerpt.txt"))
    assert list(parsed["cas"]) == ["mlx5_12", "mlx5_13"]
    (port,) = parsed["cas"]["mlx5_12"]["ports"]
    assert (port["state"], port["link_layer"]) == ("Down", "Ethernet")
    assert parsed["cas"]["mlx5_12"]["vendor_part_id"] == 4125
    assert parsed["cas"]["mlx5_13"]["vendor_part_id"] == 4129
    with pytest.raises(IbParseError):
        parse_ibv_devinfo(read("issue-imbue-ibdev2netdev-12hca.txt"))


def test_ibdev2netdev_with_poster_comments():
    mappings = parse_ibdev2netdev(read("issue-imbue-ibdev2netdev-12hca.txt"))
    assert len(mappings) == 12
    assert mappings[0] == {"ca": "mlx5_0", "port": 1, "netdev": "ibp26s0", "up": False}
    assert [entry["netdev"] for entry in mappings if entry["up"]] == ["enp27s0f0np0", "enp157s0f0np0"]
    with pytest.raises(IbParseError):
        parse_ibdev2netdev(read("gpud-ibstatus-a100-all-active.txt"))


def test_summary_attaches_netdevs_by_ca_and_port():
    # Two captures of 12-adapter H100 nodes with the same mlx5_0..mlx5_11 naming;
    # what is tested is the join on (CA, port), not that they come from one host.
    netdevs = parse_ibdev2netdev(read("issue-imbue-ibdev2netdev-12hca.txt"))
    summary = summarize_ib(parse_ibstat(read("gpud-ibstat-h100-12hca-all-active.txt")), netdevs)
    by_name = {port["name"]: port for port in summary["ports"]}
    assert (by_name["mlx5_0/1"]["netdev"], by_name["mlx5_0/1"]["netdev_up"]) == ("ibp26s0", False)
    assert by_name["mlx5_7/1"]["netdev"] == "enp157s0f0np0"
    assert all(port["netdev"] for port in summary["ports"])


def test_absent_summary():
    summary = absent_summary()
    assert summary["present"] is False
    assert summary["ports"] == [] and summary["active_cas"] == []
