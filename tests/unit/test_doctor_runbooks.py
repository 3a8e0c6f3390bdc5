"""The runbooks only use commands the project runs: its playbooks, or commands its tests and modules run."""

import json
import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = sorted((REPO / "docs" / "runbooks").glob("*.md"))
SEED_STAGES = ("stage-0-baseline", "stage-1-single-node-tp", "stage-2-scaling-check", "stage-3-multi-node-tp-pp",
               "stage-4-moe-ep-dp")
FAILURE_FAMILIES = ("failure-startup", "failure-communication", "failure-performance")


def corpus():
    """What the project itself runs: its tests, modules, roles, playbooks and the lab."""
    texts = []
    for pattern in ("tests/**/*.py", "plugins/**/*.py", "roles/**/*.yml", "roles/**/*.py", "playbooks/*.yml",
                    "lab/vlab/*.py", "*.yml"):
        for path in REPO.glob(pattern):
            if "fixtures" not in path.parts and path.name != Path(__file__).name:
                texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(texts)


CORPUS = corpus()


def commands(path):
    text = path.read_text(encoding="utf-8")
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                yield line


def prefix_is_run_by_the_project(command):
    """The command up to its first <placeholder> appears in the project, tokens separated as code writes them."""
    head = command.split("<", 1)[0].strip()
    tokens = head.split()
    pattern = r"[\s\"',\[\]]+".join(re.escape(token) for token in tokens)
    return re.search(pattern, CORPUS) is not None


def test_one_runbook_per_seed_stage_and_failure_family():
    names = {path.stem for path in RUNBOOKS}
    assert set(SEED_STAGES) | set(FAILURE_FAMILIES) | {"README"} <= names


def test_every_runbook_command_is_a_project_playbook_or_a_command_the_project_runs():
    checked = 0
    for path in RUNBOOKS:
        for command in commands(path):
            checked += 1
            if command.startswith("ansible-playbook "):
                argv = shlex.split(command.split("<", 1)[0])
                playbook = argv[1]
                assert (REPO / playbook).is_file(), f"{path.name}: {playbook} is not a playbook of the project"
                assert "-i" in argv, f"{path.name}: {command} names no inventory"
                for index, arg in enumerate(argv):
                    if arg == "-e":
                        value = argv[index + 1]
                        # JSON keeps a number a number; key=value passes strings (the planner refuses "4").
                        names = list(json.loads(value)) if value.startswith("{") else [value.split("=", 1)[0]]
                        for name in names:
                            assert name in CORPUS, f"{path.name}: {name} is not a variable the project reads"
                        if not value.startswith("{"):
                            assert not re.match(r"^vllm_cluster_(tp|pp|dp|ep)=", value), (
                                f"{path.name}: {value} passes a string; use -e '{{\"{value.split('=')[0]}\": N}}'")
                    if arg == "--tags":
                        assert f"tags: [{argv[index + 1]}" in CORPUS or argv[index + 1] in CORPUS
            else:
                assert prefix_is_run_by_the_project(command), f"{path.name}: `{command}` is not run by the project"
    assert checked > 40


def test_runbooks_link_to_existing_runbooks():
    for path in RUNBOOKS:
        for target in re.findall(r"\]\(([\w.-]+\.md)\)", path.read_text(encoding="utf-8")):
            assert (path.parent / target).exists(), f"{path.name} links to a missing {target}"
