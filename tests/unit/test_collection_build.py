"""The built collection holds only what a user runs: no inventory of ours, no key, no test, no cache.

`ansible-galaxy collection build` of this tree (galaxy.yml's `manifest`, an allow-list) into a temporary
directory; the artifact fails on any file outside ALLOWED, on any name or content that looks like a
private key or an API key, and on a file mode wider than it should be. The same check runs on a copy of
the tree with keys, inventories and caches planted where a lab run or a user leaves them, so that it is
seen to fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_GALAXY = str(Path(sys.executable).with_name("ansible-galaxy"))

# Everything the artifact may hold (full-path regular expressions).
ALLOWED = [re.compile(pattern) for pattern in (
    r"MANIFEST\.json", r"FILES\.json", r"README\.md", r"CHANGELOG\.md", r"LICENSE", r"deploy\.yml",
    r"meta/runtime\.yml", r"meta/variables\.yml",
    r"bin/vllm-cluster", r"bin/vllm-cluster-report",
    r"plugins/(modules|filter|lookup|action)/[a-z_]+\.(py|yml)", r"plugins/module_utils/([a-z_]+/)*[a-z_]+\.py",
    r"roles/[a-z_]+/(defaults|vars|meta|tasks|handlers|templates|files)/[^/]+",
    r"roles/vllm_monitoring/files/(rules|dashboards)/[^/]+", r"roles/[a-z_]+/README\.md",
    r"playbooks/(tasks/)?[a-z_]+\.yml",
    r"docs/([a-z_-]+/)*[a-zA-Z0-9_.-]+\.md",
    r"inventories/examples/.+", r"inventories/prod\.example/.+",
)]
# Never shipped, whatever the allow-list says: what a lab, a test run or an operator leaves in the tree.
FORBIDDEN_TOP = {"tests", "lab", "molecule", "bench", "results", "collections", "scripts", "requirements", ".ci"}
FORBIDDEN_PARTS = {"secrets", "ssh", "__pycache__", ".hypothesis", ".cache", ".venv", ".venv-runtime", ".venv-mirror",
                   ".git"}
FORBIDDEN_NAMES = re.compile(r"^(id_(rsa|dsa|ecdsa|ed25519)(\.pub)?|.*\.(pem|key|p12|pfx|kdbx)|.*api[-_]?key.*"
                             r"|vault[-_]?pass.*|\.vault_pass.*|known_hosts|authorized_keys)$", re.I)
# Content that is a key: a private key block, a vault, a token with a known prefix, a literal secret value.
KEY_CONTENT = [
    (re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"), "a private key"),
    (re.compile(r"PuTTY-User-Key-File-"), "a PuTTY private key"),
    (re.compile(r"\$ANSIBLE_VAULT;[^\n]*\n[ \t#]*[0-9a-f]{20,}"), "an Ansible Vault (encrypted secrets of an inventory)"),
    (re.compile(r"\b(sk-[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"
                r"|glpat-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})\b"), "an API token"),
    # A name like a secret's, then a value of 20+ key characters with a digit (not a variable or a lookup).
    (re.compile(r"(?i)\b[a-z_]*(api[_-]?key|token|secret|password)[a-z_]*[\"']?[ \t]*[:=][ \t]*[\"']?"
                r"(?=[A-Za-z_+/=-]*[0-9])[A-Za-z0-9_+/=-]{20,}"), "a literal secret value"),
]
ONE_TOKEN = re.compile(r"[A-Za-z0-9_+/=-]{20,}")  # a whole file that is one such word is a key file
SHEBANG = b"#!"
COMMANDS = ("bin/vllm-cluster", "bin/vllm-cluster-report")


def build(source: Path, output: Path) -> Path:
    proc = subprocess.run([ANSIBLE_GALAXY, "collection", "build", "--force", "--output-path", str(output), str(source)],
                          capture_output=True, text=True, timeout=300, check=False, cwd=source)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (artifact,) = output.glob("vllm_ops-cluster-*.tar.gz")
    return artifact


def artifact_problems(artifact: Path) -> list[str]:
    """Every way the artifact is wrong, one line each: a name outside the allow-list, a key, a wide mode."""
    problems = []
    with tarfile.open(artifact) as tar:
        for member in tar.getmembers():
            name = member.name.rstrip("/")
            parts = name.split("/")
            mode = stat.S_IMODE(member.mode)
            if member.isdir():
                if mode != 0o755:
                    problems.append(f"{name}/: directory mode {mode:o}, expected 755")
                continue
            if not member.isfile():
                problems.append(f"{name}: a {'link' if member.issym() or member.islnk() else 'special file'}, "
                                "expected regular files only")
                continue
            if not any(pattern.fullmatch(name) for pattern in ALLOWED):
                problems.append(f"{name}: outside the files a user runs (tests/unit/test_collection_build.py ALLOWED)")
            if parts[0] in FORBIDDEN_TOP or set(parts) & FORBIDDEN_PARTS:
                under = parts[0] if parts[0] in FORBIDDEN_TOP else sorted(set(parts) & FORBIDDEN_PARTS)[0]
                problems.append(f"{name}: under {under}/, which never ships")
            if name.startswith("inventories/") and parts[1] not in ("examples", "prod.example"):
                problems.append(f"{name}: an inventory of a deployment (only the examples ship)")
            if FORBIDDEN_NAMES.match(parts[-1]):
                problems.append(f"{name}: named like a key or a secret")
            data = tar.extractfile(member).read()
            text = data.decode("utf-8", errors="replace")
            for pattern, what in KEY_CONTENT:
                found = pattern.search(text)
                if found:
                    line = text.count("\n", 0, found.start()) + 1
                    problems.append(f"{name}:{line}: looks like {what}")
            if ONE_TOKEN.fullmatch(text.strip()):
                problems.append(f"{name}: the whole file is one {len(text.strip())}-character word, like a key file")
            if mode & ~0o755 or mode & 0o644 != 0o644:
                problems.append(f"{name}: mode {mode:o}, expected 644 or 755")
            executable = bool(mode & 0o111)
            if executable and not data.startswith(SHEBANG):
                problems.append(f"{name}: mode {mode:o} is executable without a #! line")
            if name in COMMANDS and not executable:
                problems.append(f"{name}: mode {mode:o}, a command must be executable (755)")
            if member.uid != 0 or member.gid != 0:
                problems.append(f"{name}: owned by {member.uid}:{member.gid}, expected 0:0")
    return problems


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    return build(REPO, tmp_path_factory.mktemp("build"))


def test_the_artifact_holds_only_what_a_user_runs(artifact):
    assert artifact_problems(artifact) == []


def test_the_artifact_holds_everything_a_user_runs(artifact):
    with tarfile.open(artifact) as tar:
        names = set(tar.getnames())
    for required in ("README.md", "LICENSE", "deploy.yml", "meta/runtime.yml", "meta/variables.yml", "bin/vllm-cluster", "bin/vllm-cluster-report",
                     "playbooks/deploy.yml", "playbooks/plan.yml", "plugins/modules/stage_stamp.py",
                     "plugins/filter/deploy_stage.yml", "plugins/module_utils/plan/build.py",
                     "roles/vllm_service/files/vllm-head-watch", "roles/vllm_service/templates/vllm.service.j2",
                     "docs/architecture.md", "inventories/prod.example/hosts.yml",
                     "inventories/examples/tp-70b-4xa100/hosts.yml"):
        assert required in names, required
    for role in (REPO / "roles").iterdir():
        assert f"roles/{role.name}/meta/main.yml" in names, role.name
    for playbook in (REPO / "playbooks").glob("*.yml"):
        assert f"playbooks/{playbook.name}" in names, playbook.name


def test_the_metadata_is_true_and_names_every_collection_the_roles_use(artifact):
    """MANIFEST.json as ansible-galaxy wrote it: Apache-2.0 with its text, no placeholder URL, and every
    collection that a role or playbook calls by FQCN (other than ansible.builtin and this one) a dependency."""
    with tarfile.open(artifact) as tar:
        info = json.load(tar.extractfile("MANIFEST.json"))["collection_info"]
        license_text = tar.extractfile("LICENSE").read().decode()
    assert info["license"] == ["Apache-2.0"]
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    for field in ("repository", "documentation", "homepage", "issues"):
        assert not info.get(field) or ".invalid" not in info[field], (field, info[field])
    used = set()
    for path in [*(REPO / "roles").rglob("*.yml"), *(REPO / "playbooks").rglob("*.yml"), REPO / "deploy.yml"]:
        used |= set(re.findall(r"^\s*-?\s*([a-z_]+\.[a-z_]+)\.[a-z_]+:", path.read_text(), re.M))
    used -= {"ansible.builtin", "vllm_ops.cluster"}
    assert "community.grafana" in used  # the check reads what it should
    assert used <= set(info["dependencies"]), (used, info["dependencies"])


def _copy_of_the_tree(target: Path) -> Path:
    """The tree without its venvs and caches (git-tracked or not: what a working tree holds)."""
    skip = {".git", ".venv", ".venv-runtime", ".cache", "collections", "results", "output", "__pycache__"}
    shutil.copytree(REPO, target, symlinks=True, ignore=lambda _dir, names: [n for n in names if n in skip])
    return target


def _private_key(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # the README's lab, when it is up, left its own key in the copied tree
    path.with_name(path.name + ".pub").unlink(missing_ok=True)
    if shutil.which("ssh-keygen"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "planted", "-f", str(path)],
                       check=True, capture_output=True, timeout=60)
    else:  # the marker is what the check reads
        path.write_text("-----BEGIN " + "OPENSSH PRIVATE KEY-----\nAAAA\n-----END " + "OPENSSH PRIVATE KEY-----\n")


def test_what_a_lab_or_an_operator_leaves_in_the_tree_never_ships(tmp_path):
    tree = _copy_of_the_tree(tmp_path / "tree")
    _private_key(tree / "inventories/lab/ssh/id_ed25519")
    (tree / "inventories/lab/secrets").mkdir(exist_ok=True)
    (tree / "inventories/lab/secrets/vllm-api-key").write_text("Zk3q9VJm2x8sY_0a7bQwErTyUiOpLkJh-GfDsA1z2X3\n")
    (tree / "inventories/lab/hosts.yml").write_text("---\nall: {}\n")
    for inventory in ("prod", "prod-eu", "staging"):
        (tree / "inventories" / inventory / "group_vars").mkdir(parents=True)
        (tree / "inventories" / inventory / "group_vars/vllm_nodes.yml").write_text(
            "---\nvllm_cluster_api_key: Zk3q9VJm2x8sY0a7bQwErTyUiOpLkJh\n")
    for cache in (".hypothesis/examples/x", ".cache/facts/node1", "results/lab/plan.json",
                  "roles/vllm_service/files/__pycache__/x.cpython-313.pyc", "plugins/filter/.x.py.swp",
                  "tests/output/junit.xml", "playbooks/.~lock.yml"):
        (tree / cache).parent.mkdir(parents=True, exist_ok=True)
        (tree / cache).write_text("planted\n")
    artifact = build(tree, tmp_path / "out")
    assert artifact_problems(artifact) == []
    with tarfile.open(artifact) as tar:
        names = tar.getnames()
    assert not [name for name in names if name.startswith(("inventories/lab", "inventories/prod/", "inventories/st",
                                                            "inventories/prod-eu", "tests", "lab/", ".", "results"))]


def test_the_check_fails_on_a_key_or_a_mode_inside_what_ships(tmp_path):
    """Planted where the allow-list lets them through: only the content and mode checks can see them."""
    tree = _copy_of_the_tree(tmp_path / "tree")
    _private_key(tree / "roles/vllm_runtime/files/deploy_key")
    (tree / "roles/vllm_runtime/files/token").write_text("Zk3q9VJm2x8sY_0a7bQwErTyUiOpLkJh-GfDsA1z2X3\n")
    defaults = tree / "inventories/prod.example/group_vars/vllm_nodes.yml"
    defaults.write_text(defaults.read_text() + 'vllm_cluster_hf_token: "hf_' + "a1B2" * 9 + '"\n')
    (tree / "docs/notes.md").write_text("the key: vllm_cluster_api_key=" + "Q9x" * 10 + "\n")
    os.chmod(tree / "docs/planner.md", 0o775)
    (tree / "roles/vllm_runtime/files/id_ed25519.pub").write_text("ssh-ed25519 AAAA planted\n")
    problems = artifact_problems(build(tree, tmp_path / "out"))
    expected = {
        "roles/vllm_runtime/files/deploy_key": "looks like a private key",
        "roles/vllm_runtime/files/token": "the whole file is one 43-character word",
        "inventories/prod.example/group_vars/vllm_nodes.yml": "looks like an API token",
        "docs/notes.md": "looks like a literal secret value",
        "docs/planner.md": "is executable without a #! line",
        "roles/vllm_runtime/files/id_ed25519.pub": "named like a key",
    }
    for name, what in expected.items():
        assert any(line.startswith(name) and what in line for line in problems), (name, what, problems)
    assert {line.split(":", 1)[0] for line in problems} == set(expected), problems
