"""ansible-doc renders every module, filter, lookup and role of the tree, under its own name.

The plugins are found in the tree (each filter file's FilterModule().filters(), so a new filter in an
old file counts), not listed here: a new plugin without documentation fails this test. The text
rendering is what an operator reads and what breaks on a list item holding ": " (a dict where a
string belongs); the JSON rendering says which file the documentation came from.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DOC = str(Path(sys.executable).with_name("ansible-doc"))
PREFIX = "vllm_ops.cluster."
HEADERS = {"module": "> MODULE ", "filter": "> FILTER ", "lookup": "> LOOKUP ", "role": "> ROLE: "}
# Roles without an argument spec, and why (ansible-doc has nothing to render for them).
NO_SPEC = {"deploy_stage": "docs/roles/deploy_stage.md: a spec would add a validation task to every stage's play"}


def plugins_in(root: Path) -> dict[str, list[str]]:
    found = {"module": sorted(p.stem for p in (root / "plugins/modules").glob("*.py") if p.stem != "__init__"),
             "lookup": sorted(p.stem for p in (root / "plugins/lookup").glob("*.py") if p.stem != "__init__"),
             "role": sorted(p.name for p in (root / "roles").iterdir() if (p / "meta").is_dir())}
    filters = []
    for path in sorted((root / "plugins/filter").glob("*.py")):
        module = importlib.import_module(f"ansible_collections.vllm_ops.cluster.plugins.filter.{path.stem}")
        filters += module.FilterModule().filters()
    found["filter"] = sorted(filters)
    return found


def ansible_doc(kind: str, names: list[str], *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = env or dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    env["ANSIBLE_NOCOLOR"] = "1"
    return subprocess.run([ANSIBLE_DOC, "-t", kind, *extra, *(PREFIX + name for name in names)],
                          capture_output=True, text=True, timeout=300, check=False, cwd=REPO, env=env)


def rendering_problems(kind: str, names: list[str], env: dict | None = None) -> list[str]:
    """What is wrong with the documentation of `names`: one line per plugin (empty when all render)."""
    problems = []
    text = ansible_doc(kind, names, env=env)
    # ansible-doc stops at the first plugin it cannot render: then each one alone says which.
    for name in names if text.returncode != 0 else []:
        alone = ansible_doc(kind, [name], env=env)
        errors = [line for line in alone.stderr.splitlines() if "ERROR" in line]
        if alone.returncode != 0:
            problems.append(f"{kind} {PREFIX}{name}: ansible-doc exited {alone.returncode}: "
                            + (" ".join(errors) or alone.stderr[-1000:]))
    for name in names if text.returncode == 0 else []:
        if kind == "role" and name in NO_SPEC:
            continue
        header = HEADERS[kind] + (f"*{PREFIX}{name}*" if kind == "role" else f"{PREFIX}{name} ")
        if header not in text.stdout:
            problems.append(f"{kind} {PREFIX}{name}: not rendered (no {header.strip()!r} in ansible-doc's output)")
    if problems:
        return problems
    listed = ansible_doc(kind, names, "--json", env=env)
    docs = json.loads(listed.stdout or "{}")
    for name in names:
        entry = docs.get(PREFIX + name) or {}
        if kind == "role":
            if name not in NO_SPEC and not entry.get("entry_points"):
                problems.append(f"role {PREFIX}{name}: no entry point documented (meta/argument_specs.yml)")
            continue
        doc = entry.get("doc") or {}
        where = Path(doc.get("filename", "?")).name
        if doc.get(kind if kind == "module" else "name") != name:
            problems.append(f"{kind} {PREFIX}{name}: the documentation shown is {doc.get('name') or doc.get('module')!r}'s "
                            f"({where}): each filter of a file keeps its own in {name}.yml beside it, none in the .py")
        if not doc.get("short_description"):
            problems.append(f"{kind} {PREFIX}{name}: no short_description ({where})")
        if not entry.get("examples"):
            problems.append(f"{kind} {PREFIX}{name}: no EXAMPLES ({where})")
        if not entry.get("return"):
            problems.append(f"{kind} {PREFIX}{name}: no RETURN ({where})")
    return problems


FOUND = plugins_in(REPO)


def test_the_tree_has_the_plugins_we_expect_to_find():
    # The discovery itself: if it found nothing, every test below would pass on nothing.
    assert len(FOUND["module"]) >= 16 and "stage_stamp" in FOUND["module"]
    assert {"deploy_stage", "stages_to_run", "plan_table", "vllm_env_file"} <= set(FOUND["filter"])
    assert {"code_digest", "results_dir"} <= set(FOUND["lookup"])
    assert {"vllm_service", "deploy_stage", "doctor"} <= set(FOUND["role"])


@pytest.mark.parametrize("kind", ["module", "filter", "lookup", "role"])
def test_ansible_doc_renders_every_plugin_of_the_tree(kind):
    assert rendering_problems(kind, FOUND[kind]) == []


def test_a_role_without_a_spec_is_one_we_chose():
    for name, reason in NO_SPEC.items():
        assert not (REPO / "roles" / name / "meta" / "argument_specs.yml").exists(), f"{name} has a spec now: {reason}"
        assert "no argument spec on purpose" in (REPO / "docs" / "roles" / f"{name}.md").read_text()


def test_the_check_fails_on_a_broken_and_a_misnamed_documentation(tmp_path):
    """A copy of the collection with a module whose description item holds ': ', and a filter without its own doc."""
    copy = tmp_path / "ansible_collections" / "vllm_ops" / "cluster"
    for part in ("plugins", "meta"):
        shutil.copytree(REPO / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "galaxy.yml", copy / "galaxy.yml")
    module = copy / "plugins" / "modules" / "python_env_info.py"
    text = module.read_text()
    assert "  - A missing interpreter is not a failure (C(exists) is false).\n" in text
    module.write_text(text.replace("  - A missing interpreter is not a failure (C(exists) is false).\n",
                                   "  - A missing interpreter is not a failure: C(exists) is false.\n"))
    # The filter file's own DOCUMENTATION (another filter's) would be shown for a filter without its .yml.
    (copy / "plugins" / "filter" / "deploy_stages.yml").unlink()
    filters = copy / "plugins" / "filter" / "stage_stamp.py"
    documented = yaml.safe_load((copy / "plugins" / "filter" / "stage_inputs_digest.yml").read_text())
    filters.write_text(filters.read_text() + "".join(
        f'\n{part} = r"""\n{yaml.safe_dump(documented[part]) if part != "EXAMPLES" else documented[part]}"""\n'
        for part in ("DOCUMENTATION", "EXAMPLES", "RETURN")))
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")  # not the repository's collections_path
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(tmp_path), ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"))
    modules = rendering_problems("module", ["python_env_info", "gpu_facts"], env=env)
    assert modules and all(line.startswith("module vllm_ops.cluster.python_env_info:") for line in modules), modules
    assert "expected string" in modules[0]
    filters = rendering_problems("filter", ["deploy_stages", "deploy_stage", "stage_inputs_digest"], env=env)
    assert filters == [f"filter vllm_ops.cluster.{name}: the documentation shown is 'stage_inputs_digest''s "
                       f"(stage_stamp.py): each filter of a file keeps its own in {name}.yml beside it, none in the .py"
                       for name in ("deploy_stages", "deploy_stage")], filters
