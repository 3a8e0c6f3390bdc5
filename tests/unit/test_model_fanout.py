"""The fan-out plan: every node reached once, from a node that already holds the model, no link carrying
every copy, in about log(nodes) rounds."""

import math
import re

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.model import fanout as fo


def nodes(count):
    return [(f"node-{i:02d}", f"10.20.0.{i}") for i in range(1, count + 1)]


def check_tree(plan, pairs, source, degree, source_degree):
    """Every node but the source receives exactly once, from the source or a node that received in an
    earlier round; no sender over its degree; the rounds are the tree's depths."""
    names = [name for name, _ in pairs]
    receivers = [edge["to"] for edge in plan["edges"]]
    assert sorted(receivers) == sorted(name for name in names if name != source)
    assert len(set(receivers)) == len(receivers)
    received_in = {source: 0}
    for edge in plan["edges"]:
        assert edge["from"] in received_in, f"{edge['from']} sends before it holds the model"
        assert edge["round"] == received_in[edge["from"]] + 1
        received_in[edge["to"]] = edge["round"]
        assert edge["to_address"] == dict(pairs)[edge["to"]]
    for sender, count in fo.out_degrees(plan).items():
        assert count <= (source_degree if sender == source else degree), (sender, count)
    assert plan["rounds"] == max(received_in.values())
    assert [edge["round"] for edge in plan["edges"]] == sorted(edge["round"] for edge in plan["edges"])


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 8, 15, 16, 64, 100, 1000])
@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_every_node_is_reached_once_within_the_degree_in_log_rounds(count, degree):
    pairs = nodes(count)
    for source, source_degree in (("node-01", degree), ("controller", 1)):
        plan = fo.plan_fanout(pairs, source, degree=degree)
        assert plan["source_degree"] == source_degree
        check_tree(plan, pairs, source, degree, source_degree)
        # A full tree: the fewest rounds a tree of this degree can have.
        receivers = count - 1 if source != "controller" else count
        if degree == 1:
            assert plan["rounds"] == receivers  # a chain
        elif receivers:
            roots = 1 if source == "controller" else 0  # the controller's one copy is a round of its own
            below = receivers - roots
            assert plan["rounds"] == roots + (math.ceil(math.log(below * (degree - 1) / degree + 1, degree))
                                              if below else 0)
            assert plan["rounds"] <= roots + math.ceil(math.log(count, degree)) + 1


def test_no_link_carries_every_copy_and_the_source_sends_first():
    pairs = nodes(7)
    plan = fo.plan_fanout(pairs, "node-04")
    assert max(fo.out_degrees(plan).values()) == 2 < len(plan["edges"]) == 6
    assert [(e["round"], e["from"], e["to"]) for e in plan["edges"]] == [
        (1, "node-04", "node-01"), (1, "node-04", "node-02"),
        (2, "node-01", "node-03"), (2, "node-01", "node-05"),
        (2, "node-02", "node-06"), (2, "node-02", "node-07")]
    assert {e["network"] for e in plan["edges"]} == {"fabric"}
    assert fo.sender_of(plan)["node-06"]["from_address"] == "10.20.0.2"
    assert "node-04" not in fo.sender_of(plan)


def test_the_controller_sends_one_copy_over_management_unless_told():
    pairs = nodes(3)
    plan = fo.plan_fanout(pairs, "controller")
    assert [(e["round"], e["from"], e["to"], e["network"]) for e in plan["edges"]] == [
        (1, "controller", "node-01", "management"), (2, "node-01", "node-02", "fabric"),
        (2, "node-01", "node-03", "fabric")]
    assert plan["edges"][0]["from_address"] is None
    wide = fo.plan_fanout(pairs, "controller", source_degree=3)
    assert [e["from"] for e in wide["edges"]] == ["controller"] * 3 and wide["rounds"] == 1


def test_the_plan_is_deterministic_and_follows_the_nodes_order():
    pairs = nodes(9)
    assert fo.plan_fanout(pairs, "node-05") == fo.plan_fanout(list(pairs), "node-05")
    reordered = fo.plan_fanout(list(reversed(pairs)), "node-05")
    assert [e["to"] for e in reordered["edges"]][:2] == ["node-09", "node-08"]
    as_dicts = [{"name": name, "address": address} for name, address in pairs]
    assert fo.plan_fanout(as_dicts, "node-05") == fo.plan_fanout(pairs, "node-05")


def test_one_node_holding_the_source_copies_nothing():
    plan = fo.plan_fanout(nodes(1), "node-01")
    assert plan["edges"] == [] and plan["rounds"] == 0
    assert fo.fanout_table(plan) == ["Fan-out: from node-01, 0 copies in 0 rounds; each node sends at most 2"]


def test_the_table_shows_who_copies_from_whom():
    table = fo.fanout_table(fo.plan_fanout(nodes(3), "controller"))
    assert table == [
        "Fan-out: from controller, 3 copies in 2 rounds; each node sends at most 2, controller 1",
        "  round  from                         to",
        "  1      controller                   node-01 (10.20.0.1)",
        "  2      node-01 (10.20.0.1)          node-02 (10.20.0.2)",
        "  2      node-01 (10.20.0.1)          node-03 (10.20.0.3)",
    ]


@pytest.mark.parametrize("given, source, degree, message", [
    ([], "controller", 2, "no node needs the model"),
    ([("a", "10.0.0.1"), ("b", "10.0.0.2"), ("a", "10.0.0.3")], "a", 2, "node names given twice: a"),
    ([("a", "10.0.0.1"), ("b", "10.0.0.1")], "a", 2, "fabric addresses given twice: 10.0.0.1"),
    ([("a", "10.0.0.1"), ("b", "")], "a", 2, "node b: no fabric address"),
    ([("", "10.0.0.1")], "controller", 2, "a node without a name"),
    ([("controller", "10.0.0.1")], "controller", 2, "a node is named 'controller'"),
    (nodes(2), "node-01", 0, "the fan-out degree must be an integer of at least 1, not 0"),
    (nodes(2), "node-01", True, "the fan-out degree must be an integer of at least 1, not True"),
    (nodes(2), "node-01", 1.5, "the fan-out degree must be an integer of at least 1, not 1.5"),
    (nodes(2), "node-09", 2, "the source 'node-09' is neither 'controller' nor one of the nodes (node-01, node-02)"),
])
def test_nonsense_is_refused_with_a_clear_error(given, source, degree, message):
    with pytest.raises(fo.FanoutError, match="^" + re.escape(message)):
        fo.plan_fanout(given, source, degree=degree)
    with pytest.raises(fo.FanoutError, match="source's fan-out degree"):
        fo.plan_fanout(nodes(2), "controller", source_degree=0)


def test_the_filter_gives_the_plan_each_receivers_edge_and_the_table_and_names_the_filter_on_refusal():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.vllm_ops.cluster.plugins.filter.model_fanout import model_fanout

    given = [{"name": name, "address": address} for name, address in nodes(3)]
    plan = model_fanout(given, "node-01")
    assert plan["rounds"] == 1 and sorted(plan["sender_of"]) == ["node-02", "node-03"]
    assert plan["sender_of"]["node-03"]["from_address"] == "10.20.0.1"
    assert plan["table"][0] == "Fan-out: from node-01, 2 copies in 1 round; each node sends at most 2"
    with pytest.raises(AnsibleFilterError, match="^model_fanout: the source 'node-09' is neither"):
        model_fanout(given, "node-09")
    with pytest.raises(AnsibleFilterError, match="^model_fanout: the nodes must be a list, got dict"):
        model_fanout({}, "node-01")


def test_nodes_that_share_the_sources_directory_get_no_copy_and_send_none():
    pairs = nodes(5)
    plan = fo.plan_fanout(pairs, "node-01", shared=["node-04", "node-02"])
    assert plan["shared"] == ["node-02", "node-04"]  # in the nodes' order
    assert [(edge["from"], edge["to"]) for edge in plan["edges"]] == [("node-01", "node-03"), ("node-01", "node-05")]
    check_tree(plan, [p for p in pairs if p[0] not in plan["shared"]], "node-01", 2, 2)
    assert fo.fanout_table(plan)[1] == "  node-02, node-04 read node-01's copy (the same filesystem): no copy, only the check"
    every = fo.plan_fanout(nodes(3), "node-01", shared=["node-02", "node-03"])
    assert every["edges"] == [] and every["rounds"] == 0
    assert fo.fanout_table(every) == [
        "Fan-out: from node-01, 0 copies in 0 rounds; each node sends at most 2",
        "  node-02, node-03 read node-01's copy (the same filesystem): no copy, only the check"]
    with pytest.raises(fo.FanoutError, match="^shared names nodes that are not among the nodes: node-09$"):
        fo.plan_fanout(nodes(3), "node-01", shared=["node-09"])
    with pytest.raises(fo.FanoutError, match="^the source 'node-01' cannot share its own directory$"):
        fo.plan_fanout(nodes(3), "node-01", shared=["node-01"])


def test_the_filter_passes_the_shared_nodes():
    from ansible_collections.vllm_ops.cluster.plugins.filter.model_fanout import model_fanout

    given = [{"name": name, "address": address} for name, address in nodes(3)]
    plan = model_fanout(given, "node-01", 2, ["node-03"])
    assert sorted(plan["sender_of"]) == ["node-02"] and plan["shared"] == ["node-03"]
