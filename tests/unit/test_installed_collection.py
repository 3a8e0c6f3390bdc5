"""The collection as a user gets it: built, installed into a temporary path, used from another directory.

No checkout on any path: ANSIBLE_COLLECTIONS_PATH is the install directory, the working directory is
a scratch one, the configuration is empty. The commands run from the installed bin/ (as they are,
and through a link on PATH), the playbooks by FQCN; what they write lands in the working directory,
never in the installed collection. tests/lab/test_collection.py does the same against the lab's nodes.
The installed docs are read too: every path they name is in the collection (or said to be in the
repository, and there), and they hold no issue number and no dated run.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PLAN_ARGS = ["plan", "--model", "llama-3.1-70b", "--gpus-per-node", "4", "--gpu-memory-gib", "80",
             "--gpu-name", "NVIDIA A100-SXM4-80GB", "--json"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("installed")
    build = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path",
                            str(root / "dist"), str(REPO)], capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    (artifact,) = (root / "dist").glob("vllm_ops-cluster-*.tar.gz")
    config = root / "ansible.cfg"
    config.write_text("[defaults]\n")  # not the checkout's (its collections_path is the checkout)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "PYTHONPATH"))}
    env.update(ANSIBLE_CONFIG=str(config), ANSIBLE_COLLECTIONS_PATH=str(root / "collections"),
               ANSIBLE_NOCOLOR="1", PATH=f"{root / 'links'}:{BIN}:{os.environ.get('PATH', '')}")
    install = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", str(artifact), "-p",
                              str(root / "collections")], capture_output=True, text=True, timeout=300, check=False,
                             env=env, cwd=root)
    assert install.returncode == 0, install.stdout + install.stderr
    collection = root / "collections" / "ansible_collections" / "vllm_ops" / "cluster"
    (root / "links").mkdir()
    for cli in ("vllm-cluster", "vllm-cluster-report"):
        (root / "links" / cli).symlink_to(collection / "bin" / cli)
    work = root / "work"
    work.mkdir()
    return {"root": root, "collection": collection, "env": env, "work": work, "install": install.stdout}


def run(installed, argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, cwd=installed["work"],
                          env=installed["env"], **kwargs)


def test_the_commands_run_from_the_installed_collection_and_through_a_link(installed):
    for command in (str(installed["collection"] / "bin" / "vllm-cluster"), "vllm-cluster"):
        result = run(installed, [command, *PLAN_ARGS])
        assert result.returncode == 0, result.stderr
        plan = json.loads(result.stdout)
        assert (plan["strategy"], plan["tp"], plan["world_size"]) == ("tp", 4, 4)
    for command in (str(installed["collection"] / "bin" / "vllm-cluster-report"), "vllm-cluster-report"):
        result = run(installed, [command, "report", "--help"])
        assert result.returncode == 0 and "--results-dir" in result.stdout, result.stderr


def test_the_installed_command_knows_its_version_and_catalog(installed):
    """The artifact holds no galaxy.yml: --version reads MANIFEST.json's collection_info.version."""
    assert not (installed["collection"] / "galaxy.yml").exists()
    manifest = json.loads((installed["collection"] / "MANIFEST.json").read_text())
    result = run(installed, ["vllm-cluster", "--version"])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"vllm-cluster {manifest['collection_info']['version']} (collection vllm_ops.cluster)\n"
    result = run(installed, ["vllm-cluster", "models"])
    assert result.returncode == 0 and "llama-3.1-70b" in result.stdout, result.stderr


def test_a_command_outside_any_collection_says_where_it_belongs(installed, tmp_path):
    stray = tmp_path / "vllm-cluster"
    stray.write_text((installed["collection"] / "bin" / "vllm-cluster").read_text())
    result = run(installed, [sys.executable, str(stray), *PLAN_ARGS])
    assert result.returncode == 1
    assert "not in an installed collection (.../ansible_collections/vllm_ops/cluster/bin/)" in result.stderr


def test_the_plan_playbook_runs_by_fqcn_and_writes_into_the_working_directory(installed):
    inventory = installed["collection"] / "inventories" / "examples" / "tp-70b-4xa100"
    result = run(installed, [str(BIN / "ansible-playbook"), "vllm_ops.cluster.plan", "-i", str(inventory),
                             "-e", "vllm_cluster_plan_output=true"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    (written,) = (installed["work"] / "results").glob("*/plan.json")
    assert json.loads(written.read_text())["tp"] == 4
    inside = [str(path) for path in installed["collection"].rglob("*") if path.name in ("plan.json", "results")]
    assert inside == [], "the playbook wrote into the installed collection"


def test_every_playbook_is_reachable_by_fqcn(installed):
    playbooks = sorted((REPO / "playbooks").glob("*.yml"))
    assert len(playbooks) >= 16
    result = run(installed, [str(BIN / "ansible-playbook"), "--syntax-check", "-i", "localhost,",
                             *(f"vllm_ops.cluster.{playbook.stem}" for playbook in playbooks)])
    assert result.returncode == 0, result.stdout[-1500:] + result.stderr[-1500:]
    for playbook in playbooks:
        assert f"playbook: {installed['collection'] / 'playbooks' / playbook.name}\n" in result.stdout, playbook.name


def test_the_declared_dependency_is_met_by_the_ansible_package_without_galaxy(installed):
    """galaxy.yml declares community.grafana; the controller's `ansible` package holds it, so the install (without
    --no-deps) finds it installed and fetches nothing: no Galaxy is needed where the `ansible` package is."""
    (line,) = [line for line in installed["install"].splitlines() if "community.grafana" in line]
    assert "is already installed, skipping" in line, installed["install"]


def test_the_installed_files_are_no_wider_than_they_should_be(installed):
    for path in installed["collection"].rglob("*"):
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert not mode & 0o022, f"{path}: mode {mode:o} is writable by others than its owner"
        if path.is_file() and mode & 0o111:
            assert path.read_bytes().startswith(b"#!"), f"{path}: executable without a #! line"
    for cli in ("vllm-cluster", "vllm-cluster-report"):
        assert os.access(installed["collection"] / "bin" / cli, os.X_OK), cli


# --- The installed docs send a user only to files the collection holds -------------------------------------
# A reference is a markdown link to a relative target, or a word (in prose, in backticks or in a fenced code
# block) whose first part is one of the repository's (REPO_PARTS). It must exist in the installed collection,
# unless the text says it lives in the repository: "the repository" or "a checkout" in its own paragraph (a list
# item, a table row), in the paragraph or heading that introduces its list or table, in the paragraph before
# its code block, or in the page's first paragraph. Then it must exist in the repository (a stale reference
# fails either way).
REPO_PARTS = ("tests", "scripts", "lab", "bench", "molecule", ".ci", "requirements", "collections", "docs", "roles",
              "plugins", "playbooks", "meta", "inventories/examples", "inventories/prod.example", "inventories/lab")
REPO_FILES = ("deploy.yml", "galaxy.yml", "ansible.cfg", "pyproject.toml", "LICENSE", "CHANGELOG.md",
              "bin/vllm-cluster", "bin/vllm-cluster-report")  # not bin/vllm: a venv's
IN_THE_REPOSITORY = re.compile(r"\b(the repository|a checkout)\b", re.I)
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^\s*(```|~~~)")
NEW_BLOCK = re.compile(r"^\s*(#{1,6}\s|[-*+]\s|\d+\.\s|\|)")


def _blocks(text: str):
    """(first line, kind, text) of each paragraph, list item, table row, heading and fenced block."""
    blocks, current, start, fence = [], [], 0, None
    for number, line in enumerate(text.splitlines(), 1):
        if fence is not None:
            if FENCE.match(line):
                blocks.append((fence[0], "code", "\n".join(fence[1])))
                fence = None
            else:
                fence[1].append(line)
            continue
        if FENCE.match(line) or not line.strip() or NEW_BLOCK.match(line):
            if current:
                blocks.append((start, "text", " ".join(current)))
            current = []
            if FENCE.match(line):
                fence = (number, [])
                continue
            if not line.strip():
                continue
        if not current:
            start = number
        current.append(line.strip())
    if current:
        blocks.append((start, "text", " ".join(current)))
    return blocks


def _path_like(token: str) -> str | None:
    """The repository path a word names (`lab/lab`, `tests/unit/x.py::test`, `./scripts/demo`), or None."""
    token = token.strip().strip("\"'()[],;:").removeprefix("./").split("::", 1)[0]
    if "..." in token or "$" in token or "{{" in token:
        return None
    token = token.rstrip(".,:;)]\"'")
    if token in REPO_FILES or token.startswith(tuple(part + "/" for part in REPO_PARTS)):
        return token.rstrip("/")
    if re.fullmatch(r"[\w.-]+/[\w./-]+\.md", token) and not token.startswith(("results/", "../")):
        return token  # any other page by its path (a run's report under results/ is written, not shipped)
    return None


def _exists(root: Path, relative: str) -> bool:
    """At the root, or inside a role (`meta/argument_specs.yml`); `<name>` stands for any name."""
    pattern = re.sub(r"<[^>]+>", "*", relative)
    return any(root.glob(pattern)) or any(root.glob(f"roles/*/{pattern}"))


def reference_problems(collection: Path, repository: Path) -> list[str]:
    """Every reference of every installed .md to a file the collection does not hold, one line each."""
    problems = []
    for doc in sorted(collection.rglob("*.md")):
        name = doc.relative_to(collection).as_posix()
        blocks = _blocks(doc.read_text())
        first = next((text for _, kind, text in blocks if kind == "text" and not text.startswith("#")), "")
        page_marked = bool(IN_THE_REPOSITORY.search(first))
        previous = lead = ""  # the last text block; the last paragraph or heading (what introduces a list)
        for line, kind, text in blocks:
            item = kind == "text" and bool(NEW_BLOCK.match(text)) and not text.startswith("#")
            marked = page_marked or bool(IN_THE_REPOSITORY.search(text)) or (
                kind == "code" and bool(IN_THE_REPOSITORY.search(previous))) or (
                item and bool(IN_THE_REPOSITORY.search(lead)))
            references = []  # (path relative to the collection's root, as written)
            for target in LINK.findall(text) if kind == "text" else ():
                if re.match(r"^[a-z][a-z0-9+.-]*:|^#", target, re.I):
                    continue
                path = (doc.parent / target.split("#", 1)[0]).resolve()
                try:
                    references.append((path.relative_to(collection.resolve()).as_posix(), target))
                except ValueError:
                    problems.append(f"{name}:{line}: ({target}) points outside the collection")
            words = text.split() if kind == "code" else [
                *(word for span in CODE_SPAN.findall(text) for word in span.split()),
                *LINK.sub(" ", CODE_SPAN.sub(" ", text)).split()]  # the spans' words, then the prose's
            for word in words:
                path = _path_like(word)
                if path:
                    references.append((path, word))
            for path, written in references:
                if _exists(collection, path):
                    continue
                if not marked:
                    problems.append(f"{name}:{line}: {written} is not in the collection "
                                    "(ship it, or say it is in the repository)")
                elif not _exists(repository, path):
                    problems.append(f"{name}:{line}: {written} is in neither the collection nor the repository")
            if kind == "text":
                previous = text
            lead = "" if kind == "code" else lead if item else text
    return problems


def test_the_installed_docs_refer_only_to_files_they_can_reach(installed):
    docs = sorted(installed["collection"].rglob("*.md"))
    assert len(docs) >= 30 and installed["collection"] / "docs" / "lab.md" in docs
    assert reference_problems(installed["collection"], REPO) == []


def test_the_reference_walker_fails_on_a_planted_bad_reference(tmp_path):
    collection, repository = tmp_path / "collection", tmp_path / "repository"
    for root in (collection, repository):
        (root / "docs" / "runbooks").mkdir(parents=True)
        (root / "playbooks").mkdir()
        (root / "playbooks" / "deploy.yml").write_text("---\n")
    (repository / "lab").mkdir()
    (repository / "lab" / "lab").write_text("#!/bin/sh\n")
    (repository / "tests" / "unit").mkdir(parents=True)
    (repository / "tests" / "unit" / "test_ok.py").write_text("")
    (collection / "docs" / "runbooks" / "README.md").write_text(
        "# Runbooks\n\nStart at [the architecture](../architecture.md) and `playbooks/deploy.yml`.\n\n"
        "- a good link: [deploy](../../playbooks/deploy.yml), an anchor [here](#runbooks), "
        "[a site](https://docs.vllm.ai/)\n"
        "- the lab: `lab/lab up` and `tests/lab/test_x.py::test_y` (as bench/x.py says).\n\n"
        "The lab is in the repository: `lab/lab status`, not `lab/gone`.\n\n"
        "From a checkout:\n\n```bash\n./lab/lab down\n./scripts/demo\n```\n\n"
        "| `roles/<role>/README.md` | a row |\n\n"
        "## Tests (in the repository)\n\n- `tests/unit/test_ok.py` and `tests/unit/test_gone.py`\n\n"
        "After them: `tests/unit/test_ok.py`.\n")
    (collection / "docs" / "lab.md").write_text(
        "# Lab\n\nThis page is about the repository's lab: `lab/lab`.\n\nLater: `lab/lab`, `bench/x.py`.\n")
    problems = reference_problems(collection, repository)
    expected = [
        "docs/lab.md:5: bench/x.py is in neither the collection nor the repository",
        "docs/runbooks/README.md:3: ../architecture.md is not in the collection",
        "docs/runbooks/README.md:6: lab/lab is not in the collection",
        "docs/runbooks/README.md:6: tests/lab/test_x.py::test_y is not in the collection",
        "docs/runbooks/README.md:6: bench/x.py is not in the collection",
        "docs/runbooks/README.md:8: lab/gone is in neither the collection nor the repository",
        "docs/runbooks/README.md:12: ./scripts/demo is in neither the collection nor the repository",
        "docs/runbooks/README.md:17: roles/<role>/README.md is not in the collection",
        "docs/runbooks/README.md:21: tests/unit/test_gone.py is in neither the collection nor the repository",
        "docs/runbooks/README.md:23: tests/unit/test_ok.py is not in the collection",
    ]
    assert [problem.split(" (")[0] for problem in problems] == expected, problems


# --- The installed docs speak to users: no issue numbers, no dated run diaries ------------------------------
# An issue number of this project ("issue 18", "Issue 23, item 3", "(#21)") means nothing to a user. A date or a
# clock time in prose or a table is a run diary: a figure lives in a table of docs/performance.md or
# docs/benchmarks.md beside the command that reproduces it and the commit it measured. Fenced code blocks may hold
# dates and times (a report's output, a timestamp in an example). Another project's issue, written with its name
# (`vllm#6042`, `vllm PR#43095`, `owner/repo#7`), is a source and stays.
OUR_ISSUE = re.compile(r"\b(issues?|PRs?|pull requests?)\s+#?\d+\b", re.I)
BARE_NUMBER = re.compile(r"(?<![\w/#-])#\d+\b")  # "(#21)"; in a code block, a report's "#1" is a rank
DIARY = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b[0-2]?\d:[0-5]\d(-[0-2]?\d:[0-5]\d)? UTC\b")


def diary_problems(collection: Path) -> list[str]:
    """Every issue number, and every date or clock time outside a code block, in the installed .md files."""
    problems = []
    for doc in sorted(collection.rglob("*.md")):
        name = doc.relative_to(collection).as_posix()
        for line, kind, text in _blocks(doc.read_text()):
            numbers = [*OUR_ISSUE.finditer(text), *(BARE_NUMBER.finditer(text) if kind == "text" else ())]
            for found in sorted(numbers, key=lambda match: match.start()):
                problems.append(f"{name}:{line}: an issue number ({found.group(0)})")
            for found in DIARY.finditer(text) if kind == "text" else ():
                problems.append(f"{name}:{line}: a dated run ({found.group(0)})")
    return problems


def test_the_installed_docs_hold_no_issue_numbers_and_no_dated_runs(installed):
    assert diary_problems(installed["collection"]) == []


def test_the_diary_check_fails_on_planted_issue_numbers_and_dates(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text(
        "# X\n\nSince issue 18 the router (Issue 23, item 3) and #21 do this.\n\n"
        "| run | figure |\n| --- | --- |\n| 2026-12-03, 00:35 UTC | 1.32 |\n\n"
        "Seen upstream: vllm#6042, vllm PR#43095, owner/repo#7; a report:\n\n"
        "```\nplan.json (2026-11-30 10:00:00 UTC)\n#1 vllm.service fails\n```\n")
    assert [problem.split(": ", 1)[1] for problem in diary_problems(tmp_path)] == [
        "an issue number (issue 18)", "an issue number (Issue 23)", "an issue number (#21)",
        "a dated run (2026-12-03)", "a dated run (00:35 UTC)"]
