"""docs/planner.md's catalog table is what the planner plans now (tests/unit/planner_table.py writes it)."""

from planner_table import BEGIN, DOC, END, render, rows


def test_the_catalog_table_in_the_docs_is_the_planners():
    text = DOC.read_text()
    assert BEGIN in text and END in text
    assert render(text) == text, "docs/planner.md's catalog table is stale: run tests/unit/planner_table.py --write"


def test_the_table_has_every_catalog_model_on_three_clusters():
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_catalog

    body = rows()[2:]
    assert len(body) == 3 * len(model_catalog.catalog_names())
    strategies = {line.split(" | ")[2] for line in body}
    # the table shows every branch the tree takes for these models, and the honest "does not fit"
    assert {"single", "tp", "ep_dp", "does not fit"} <= strategies, strategies
