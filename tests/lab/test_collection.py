"""The collection as a user installs it, against the lab: playbooks by FQCN, the command line outside the repository.

Issue 22's acceptance on the shared lab: the collection built from this tree and installed into a
temporary path; `ansible-playbook vllm_ops.cluster.plan vllm_ops.cluster.preflight` from a scratch
directory, with ANSIBLE_COLLECTIONS_PATH the install and an empty configuration (not the checkout's
ansible.cfg, whose collections_path is the checkout); then the installed bin/vllm-cluster, through a
link on PATH, plans the same layout. Quick and read-only on the nodes: no vLLM restart, no stage
stamp (those are written only inside deploy.yml). tests/unit/test_installed_collection.py covers the
same install offline (the plan of an example inventory, every playbook's syntax by FQCN).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
CONTROLLER_BIN = REPO / ".venv" / "bin"

DEPLOYMENT = "lab-tiny-llama"  # inventories/lab/group_vars
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@pytest.fixture(scope="module")
def lab(shared_lab):
    """The run's shared lab (tests/lab/conftest.py: shared_lab); nothing here changes its nodes."""
    return shared_lab


@pytest.fixture(scope="module")
def installed(tmp_path_factory, tiny_model) -> dict:
    """Built from this tree, installed into a temporary path; a scratch working directory beside it."""
    root = tmp_path_factory.mktemp("collection")
    galaxy = str(CONTROLLER_BIN / "ansible-galaxy")
    build = subprocess.run([galaxy, "collection", "build", "--force", "--output-path", str(root / "dist"), str(REPO)],
                           capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    (artifact,) = (root / "dist").glob("vllm_ops-cluster-*.tar.gz")
    # A user's configuration, not the checkout's: scripts/test exports ANSIBLE_CONFIG, whose collections_path
    # holds this very collection, and ansible-galaxy then finds it installed and installs nothing.
    (root / "ansible.cfg").write_text("[defaults]\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "PYTHONPATH"))}
    env.update(ANSIBLE_CONFIG=str(root / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(root / "collections"))
    install = subprocess.run([galaxy, "collection", "install", str(artifact), "-p", str(root / "collections")],
                             capture_output=True, text=True, timeout=300, check=False, cwd=root, env=env)
    assert install.returncode == 0, install.stdout + install.stderr
    collection = root / "collections" / "ansible_collections" / "vllm_ops" / "cluster"
    assert (collection / "MANIFEST.json").is_file(), f"nothing installed into {collection}:\n{install.stdout}"
    (root / "links").mkdir()
    (root / "links" / "vllm-cluster").symlink_to(collection / "bin" / "vllm-cluster")
    (root / "work").mkdir()
    return {"root": root, "collection": collection, "work": root / "work", "model": tiny_model}


def user_env(lab, installed) -> dict[str, str]:
    """The lab's Ansible environment (fact cache, inventory ignore patterns) without the checkout's configuration."""
    env = lab.ansible_env()
    env.update(ANSIBLE_CONFIG=str(installed["root"] / "ansible.cfg"),
               ANSIBLE_COLLECTIONS_PATH=str(installed["root"] / "collections"),
               PATH=f"{installed['root'] / 'links'}:{env['PATH']}")
    env.pop("PYTHONPATH", None)
    return env


def run(lab, installed, argv: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=installed["work"], env=user_env(lab, installed))
    assert proc.returncode == 0, (f"`{shlex.join(argv)}` in {installed['work']} exited {proc.returncode}:\n"
                                  f"{proc.stdout[-8000:]}\n{proc.stderr[-4000:]}")
    return proc


def node_state(lab) -> dict[str, tuple[str, str]]:
    """Per node: vllm.service's invocation and the stage stamps there (what a write on the node would change)."""
    state = {}
    for node in lab.nodes:
        invocation = lab.ssh(node, "systemctl show -p InvocationID --value vllm.service", check=False).stdout.strip()
        stamps = lab.ssh(node, "ls /etc/vllm-cluster/stages 2>/dev/null || true", check=False).stdout.split()
        state[node] = (invocation, " ".join(sorted(stamps)))
    return state


@pytest.fixture(scope="module")
def fqcn_run(lab, installed):
    """plan + preflight by FQCN from the installed collection, in one ansible-playbook run; the nodes before and after."""
    playbook = str(CONTROLLER_BIN / "ansible-playbook")
    checked = run(lab, installed, [playbook, "--syntax-check", "-i", str(lab.inventory),
                                   "vllm_ops.cluster.plan", "vllm_ops.cluster.preflight"])
    before = node_state(lab)
    result = run(lab, installed, [playbook, "-i", str(lab.inventory), "vllm_ops.cluster.plan",
                                  "vllm_ops.cluster.preflight", "-e", "vllm_cluster_plan_output=true"])
    return {"syntax": checked, "result": result, "before": before, "after": node_state(lab)}


def test_the_playbooks_are_the_installed_collections(installed, fqcn_run):
    for name in ("plan", "preflight"):
        assert f"playbook: {installed['collection'] / 'playbooks' / f'{name}.yml'}\n" in fqcn_run["syntax"].stdout
    assert str(REPO / "playbooks") not in fqcn_run["syntax"].stdout + fqcn_run["result"].stdout


def test_plan_and_preflight_run_by_fqcn_and_change_nothing_on_the_nodes(lab, fqcn_run):
    out = fqcn_run["result"].stdout
    assert "Layout: tp (mp) TP=2 PP=1 DP=1 EP=1 world_size=2" in out
    counts = {host: tuple(map(int, rest)) for host, *rest in RECAP.findall(out)}
    assert set(counts) >= set(lab.nodes) | {"localhost"}, out[-3000:]
    for node in lab.nodes:  # ok, changed, unreachable, failed
        assert counts[node][1:] == (0, 0, 0), (node, counts[node], out[-3000:])
    assert "TASK [vllm_ops.cluster.gpu_preflight" in out
    assert fqcn_run["after"] == fqcn_run["before"], "a read-only run restarted vLLM or wrote a stage stamp"


def test_plan_json_is_in_the_working_directory_not_in_the_collection(installed, fqcn_run):
    written = installed["work"] / "results" / DEPLOYMENT / "plan.json"
    plan = json.loads(written.read_text())
    assert (plan["deployment"], plan["tp"], plan["world_size"]) == (DEPLOYMENT, 2, 2)
    inside = [str(path) for path in installed["collection"].rglob("*") if path.name in ("plan.json", "results")]
    assert inside == [], "the playbook wrote into the installed collection"


def test_the_installed_cli_plans_what_the_playbook_planned(lab, installed, fqcn_run):
    """bin/vllm-cluster through a link on PATH, from the scratch directory, with the lab's inventory as flags."""
    plan = json.loads((installed["work"] / "results" / DEPLOYMENT / "plan.json").read_text())
    addresses = ",".join(lab.fabric_address(node) for node in lab.nodes)
    result = run(lab, installed, [
        "vllm-cluster", "plan", "--model", str(installed["model"]), "--model-path", "/srv/models/tiny-llama",
        "--deployment", DEPLOYMENT, "--device", "cpu", "--max-model-len", "512", "--tp", "2",
        "--allow-tp-across-nodes", "--cpu-kvcache-space-gib", "1", "--nodes", str(len(lab.nodes)),
        "--gpus-per-node", "1", "--gpu-memory-gib", "4", "--gpu-name", "cpu", "--no-nvlink",
        "--addresses", addresses, "--fabric-interface", "eth1", "--json"], timeout=120)
    cli = json.loads(result.stdout)
    for key in ("strategy", "tp", "pp", "dp", "ep", "world_size", "nodes_used", "memory"):
        assert cli[key] == plan[key], key
    assert [node["argv"] for node in cli["nodes"]] == [node["argv"] for node in plan["nodes"]]
    assert not os.path.exists(installed["collection"] / "results")
