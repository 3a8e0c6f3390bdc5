"""The house rules of the redesign: module_utils files stay small, and the docs name what the code reads."""

import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.request import INPUTS, VARIABLES
from test_facts_modules import REPO

LIMIT = 700


def test_no_module_utils_file_is_over_700_lines():
    long = {str(path.relative_to(REPO)): sum(1 for _ in path.open())
            for path in (REPO / "plugins" / "module_utils").rglob("*.py")}
    assert len(long) > 40  # the scan found the package's files
    over = {path: lines for path, lines in long.items() if lines > LIMIT}
    assert not over, f"split these (docs/architecture.md, 'Code layout'): {over}"


def test_the_architecture_page_names_every_planning_variable():
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text[text.index("## Inventory interface"): text.index("## Facts")]
    named = set(re.findall(r"`(vllm_(?:cluster|runtime)_\w+)`", table))
    # `vllm_cluster_tp`, `_pp`, ... name a family in one cell.
    for prefix, suffixes in re.findall(r"`(vllm_cluster_)\w+`((?:, `_\w+`)+)", table):
        named |= {prefix + suffix for suffix in re.findall(r"`_(\w+)`", suffixes)}
    missing = [variable for variable in VARIABLES if variable not in named]
    assert not missing, f"docs/architecture.md's inventory table lacks {missing}"
    assert len(VARIABLES) == len([spec for spec in INPUTS if spec.variable]) >= 20


def test_the_readme_layout_table_names_paths_that_exist():
    text = (REPO / "README.md").read_text()
    table = text[text.index("## Layout"):]
    paths = [path for cell in re.findall(r"^\| (`[^|]+`) \|", table, re.M) for path in re.findall(r"`([^`]+)`", cell)]
    assert len(paths) >= 15
    missing = [path for path in paths if not (REPO / path.rstrip("/")).exists()]
    assert not missing, f"README's layout table names paths that are not in the tree: {missing}"
    folders = sorted(p.name for p in (REPO / "plugins" / "module_utils").iterdir() if (p / "__init__.py").exists())
    unnamed = [name for name in folders if f"plugins/module_utils/{name}/" not in table]
    assert not unnamed, f"README's layout table lacks module_utils folders {unnamed}"
