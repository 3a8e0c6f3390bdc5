"""A real nspawn lab for a test module: up before its first test, down after its last one, always.

Use it from any test module under tests/lab/:

    import pytest

    pytestmark = pytest.mark.lab
    LAB_NODES = 2            # optional, default 3
    LAB_NAME = "tdeploy"     # optional, 1-8 of [a-z0-9]; default: "t" + a hash of the module's path

    def test_something(lab):
        result = lab.ssh("node1", "systemctl is-active ray-head")
        assert result.stdout.strip() == "active"
        lab.ansible_playbook("playbooks/deploy.yml")          # -i the lab's own inventory

API of the `lab` fixture (module scope; one lab per module, so modules can run in parallel):
    lab.name, lab.nodes (["node1", ...]), lab.inventory (Path of the generated inventory
        directory: hosts.yml, host_vars/, ssh/, secrets/), lab.key (the SSH private key),
        lab.api_key (the vLLM API key of this lab)
    lab.management_address(node), lab.fabric_address(node), lab.gateway (host end of management)
    lab.ssh(node, command, check=True, timeout=120) -> CompletedProcess   command: one shell string
    lab.run(*args, check=True, timeout=...) -> CompletedProcess         lab/lab ARGS --name <lab>
    lab.hw_set(node, key=value, ...), lab.hw_show(node) -> dict, lab.hw_reset(node)   node may be "all"
    lab.node(node, "poweroff" | "start" | "reboot")
    lab.status() -> dict                                                 `lab status --json`
    lab.down() -> CompletedProcess                                       idempotent; teardown calls it
    lab.ansible_env() -> dict, lab.ansible_playbook(playbook, *args, check=True, timeout=1800, inventory=None, env=None)
    lab.playbook_outputs (every playbook run on the lab this session), lab.first_output_of(playbook)
For a second lab or another scope: the `make_lab` fixture, `with make_lab("t2", nodes=1) as other:`.

The `shared_lab` fixture (session scope, 3 nodes) is one lab for every module that
deploys vLLM (deploy, benchmark, doctor, hardening): the runtime is installed once
per run, which is most of CI's time. Its name is $VLLM_CLUSTER_SHARED_LAB, by default
the README's lab (`vlab`, inventory inventories/lab/): test_demo runs scripts/demo
first, whose lab and deployment the others then use. Another name lets two engineers
develop such modules side by side. A module
that uses it starts with the deployment it needs (deploy.yml is idempotent) and puts
back anything it breaks (hardware, units, firewall) before it ends.

The lab is brought down even when tests fail (VLLM_CLUSTER_KEEP_LAB=1 keeps it, for iteration), and teardown fails the module when
`lab down` reports leftovers. Needs root and the host packages of scripts/bootstrap;
without them the tests FAIL with the reason (they are never skipped).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB_CLI = REPO / "lab" / "lab"
CONTROLLER_BIN = REPO / ".venv" / "bin"
UP_TIMEOUT_S = 900  # a fresh machine first builds the node image (about 2 minutes here)
DOWN_TIMEOUT_S = 300
sys.path.insert(0, str(REPO / "lab"))
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.ray_auth import ray_auth_section  # noqa: E402
from lab_order import LAST, MODULE_ORDER  # noqa: E402  (the modules' order in a run: tests/lab/lab_order.py)
from vlab.inventory import api_key_path, fact_cache  # noqa: E402  (each lab's own Ansible fact cache)

# The roles' Ray authentication (token by default): a `ray` command run as root on a node reads its token file.
RAY_CLI_ENV = " ".join(f"{name}={value}" for name, value in ray_auth_section("token")["environment"].items())
from vlab.machines import SSH_OPTIONS  # noqa: E402  (the options lab/lab itself uses)
from vlab.spec import DEFAULT_NAME as DEFAULT_LAB_NAME  # noqa: E402  (the README's lab: scripts/demo)


class Lab:
    """Handle on one running lab (see the module docstring)."""

    def __init__(self, name: str, nodes: int) -> None:
        self.name = name
        self.node_count = nodes
        self.record: dict = {}
        # (arguments, stdout + stderr) of every playbook run on this lab in this pytest session, first to last:
        # test_hardening reads them all for the API key, the first deploy.yml (which writes the key) included.
        self.playbook_outputs: list[tuple[str, str]] = []

    # --- lifecycle ------------------------------------------------------------
    def run(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        argv = [str(LAB_CLI), *args, "--name", self.name]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"`{' '.join(argv)}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def up(self) -> subprocess.CompletedProcess:
        proc = self.run("up", "--nodes", str(self.node_count), timeout=UP_TIMEOUT_S)
        self.record = self.status()
        return proc

    def down(self) -> subprocess.CompletedProcess:
        return self.run("down", timeout=DOWN_TIMEOUT_S)

    def status(self) -> dict:
        proc = self.run("status", "--json", check=False, timeout=120)
        return json.loads(proc.stdout)

    # --- shape -----------------------------------------------------------------
    @property
    def nodes(self) -> list[str]:
        return [f"node{k}" for k in range(1, self.node_count + 1)]

    @property
    def inventory(self) -> Path:
        return Path(self.record["spec"]["inventory_dir"])

    @property
    def api_key(self) -> str:
        """The vLLM API key `lab up` wrote for this lab (inventories/lab/group_vars reads the same file)."""
        return api_key_path(self.inventory).read_text().strip()

    @property
    def key(self) -> Path:
        return self.inventory / "ssh" / "id_ed25519"

    def _node(self, node: str) -> dict:
        return next(n for n in self.record["nodes"] if n["node"] == node)

    def management_address(self, node: str) -> str:
        return self._node(node)["management_address"]

    def fabric_address(self, node: str) -> str:
        return self._node(node)["fabric_address"]

    @property
    def gateway(self) -> str:
        return self.record["management_gateway"]

    # --- nodes -----------------------------------------------------------------
    def ssh(self, node: str, command: str, *, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        argv = ["ssh", "-i", str(self.key), *SSH_OPTIONS, f"root@{self.management_address(node)}", command]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"{node}: `{command}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def hw_set(self, node: str, **keys: object) -> subprocess.CompletedProcess:
        assignments = [f"{k.replace('__', '.')}={'' if v is None else v}" for k, v in keys.items()]
        return self.run("hw", "set", node, *assignments)

    def hw_show(self, node: str) -> dict:
        return json.loads(self.run("hw", "show", node).stdout)

    def hw_reset(self, node: str) -> subprocess.CompletedProcess:
        return self.run("hw", "reset", node)

    def node(self, node: str, action: str) -> subprocess.CompletedProcess:
        return self.run("node", node, action, timeout=300)

    # --- ansible -------------------------------------------------------------
    def ansible_env(self) -> dict[str, str]:
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
                   PATH=f"{CONTROLLER_BIN}:{os.environ.get('PATH', '')}")
        env.setdefault("ANSIBLE_INVENTORY_IGNORE_REGEX", "^(ssh|secrets)$")  # key directories are not inventory
        # Every lab names its nodes node1..N: each lab gets its own fact cache.
        env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = str(fact_cache(self.name))
        return env

    def first_output_of(self, playbook: str) -> str | None:
        """The output of the first run of `playbook` (any arguments) on this lab in this session, or None."""
        return next((output for arguments, output in self.playbook_outputs if shlex.split(arguments)[0] == playbook),
                    None)

    def ansible_playbook(self, playbook: str, *args: str, check: bool = True, timeout: float = 1800,
                         inventory: Path | None = None, env: dict[str, str] | None = None,
                         ) -> subprocess.CompletedProcess:
        argv = [str(CONTROLLER_BIN / "ansible-playbook"), "-i", str(inventory or self.inventory), playbook, *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              cwd=REPO, env={**self.ansible_env(), **(env or {})})
        self.playbook_outputs.append((shlex.join([playbook, *args]), proc.stdout + proc.stderr))
        if check and proc.returncode != 0:
            raise AssertionError(f"`{shlex.join(argv)}` exited {proc.returncode}:\n{failure_excerpt(proc.stdout)}\n"
                                 f"{proc.stderr[-4000:]}")
        return proc


def failure_excerpt(output: str, tail: int = 8000) -> str:
    """The first fatal/failed task lines (a long run can push them out of the tail), then the tail."""
    lines = output.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(("fatal:", "failed:"))), None)
    head = ""
    if first is not None and len("\n".join(lines[first:])) > tail:
        task = next((i for i in range(first, -1, -1) if lines[i].startswith("TASK [")), first)
        head = "\n".join(lines[task:first + 1])[:4000] + "\n[...]\n"
    return head + output[-tail:]


def _check_host() -> None:
    if os.geteuid() != 0:
        pytest.fail("the lab tests need root (namespaces, mounts, systemd-nspawn)")
    missing = [t for t in ("systemd-nspawn", "debootstrap", "ip", "nsenter", "ssh") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"the lab tests need {', '.join(missing)}: run scripts/bootstrap")


def claim_from_another_checkout(lab: Lab) -> None:
    """A lab of this name recorded by another checkout (its inventory outside this repository) is not ours.

    The lab registry (/var/lib/vllm-cluster-lab) is per machine and the test labs' names are
    the same in every checkout, so a run in a fresh clone finds the record that an earlier run
    elsewhere left (a killed run, or a kept lab) and `lab up` would boot that lab with the other
    checkout's inventory, keys and model path. Stale (no node running) or in CI: take it down and
    start clean. Live outside CI: another engineer's lab, so fail and say how to run side by side.
    """
    status = lab.status()
    if not status.get("up"):
        return
    inventory = Path(status["spec"]["inventory_dir"])
    if inventory.resolve().is_relative_to(REPO):
        return
    running = [n["node"] for n in status["nodes"] if n.get("supervisor_pid")]
    if running and not os.environ.get("CI"):
        pytest.fail(f"lab {lab.name} is up from another checkout (inventory {inventory}; running: "
                    f"{', '.join(running)}): bring it down there (`lab/lab down --name {lab.name}`) or give this "
                    "run other lab names (VLLM_CLUSTER_SHARED_LAB, LAB_NAME)")
    print(f"lab {lab.name}: recorded by another checkout (inventory {inventory}, nodes running: "
          f"{', '.join(running) or 'none'}); taking it down to start clean", file=sys.stderr)
    lab.down()


@contextlib.contextmanager
def lab_session(name: str, nodes: int = 3) -> Iterator[Lab]:
    """Bring lab `name` up with `nodes` nodes; always bring it down; fail on leftovers."""
    _check_host()
    lab = Lab(name, nodes)
    claim_from_another_checkout(lab)
    try:
        lab.up()
        yield lab
    finally:
        if os.environ.get("VLLM_CLUSTER_KEEP_LAB") != "1":  # a developer's iteration keeps the installed lab
            lab.down()


def default_lab_name(module_path: str) -> str:
    return "t" + hashlib.sha256(module_path.encode()).hexdigest()[:6]


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    module = request.module
    name = getattr(module, "LAB_NAME", None) or default_lab_name(str(Path(module.__file__).relative_to(REPO)))
    with lab_session(name, getattr(module, "LAB_NODES", 3)) as handle:
        yield handle


# The modules run in MODULE_ORDER (lab_order.py: the shared lab's users, the front family back to back).
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> tuple[int, int]:
        path = Path(str(item.fspath))
        if path.parent != Path(__file__).parent:
            return (0, 0)
        name = path.name
        return (1, MODULE_ORDER.index(name) if name in MODULE_ORDER else LAST - 0.5)  # a new module: before it
    items.sort(key=rank)  # stable: the order inside a module stays


def shared_lab_name() -> str:
    """$VLLM_CLUSTER_SHARED_LAB, else the README's lab (lab/lab's default name), which scripts/demo brings up."""
    return os.environ.get("VLLM_CLUSTER_SHARED_LAB") or DEFAULT_LAB_NAME


@pytest.fixture(scope="session")
def shared_lab() -> Iterator[Lab]:
    with lab_session(shared_lab_name(), 3) as handle:
        yield handle


TINY_MODEL = REPO / ".cache" / "models" / "tiny-llama"  # where inventories/lab/group_vars points


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The lab inventory's model, built offline on the controller once per run (real bf16 safetensors)."""
    if not (TINY_MODEL / "model.safetensors").exists():
        proc = subprocess.run(
            [str(REPO / ".venv-runtime" / "bin" / "python"), str(REPO / "lab" / "make_tiny_model.py"), "llama",
             str(TINY_MODEL), "--weights"], capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
    return TINY_MODEL


@pytest.fixture(scope="session")
def lab_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One results/ directory for the shared lab's run: the doctor's checklist reads the benchmark's stages."""
    return tmp_path_factory.mktemp("lab-results")


@pytest.fixture(scope="session")
def make_lab():
    """`lab_session` as a fixture: `with make_lab(name, nodes) as other:` for a lab of the test's own."""
    return lab_session
