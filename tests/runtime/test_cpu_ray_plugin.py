"""lab/vllm_cpu_ray_plugin: built offline, and real vLLM (vllm-cpu 0.32 in .venv-runtime) picks it.

The wheel comes from the two ways the repository builds it: scripts/build-lab-wheels
(the stdlib backend, what bootstrap runs) and pip's PEP 517 path; both give the same
bytes. Unpacked on PYTHONPATH, its entry point is found by vLLM's own plugin loader.
"""
from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.runtime

REPO = Path(__file__).resolve().parents[2]
RUNTIME_PYTHON = REPO / ".venv-runtime" / "bin" / "python"
PACKAGE = REPO / "lab" / "vllm_cpu_ray_plugin"
WHEEL = "vllm_cpu_ray_plugin-0.2.0-py3-none-any.whl"


def test_the_wheel_is_reproducible_and_vllm_activates_the_platform(tmp_path):
    pip_dir, unpacked = tmp_path / "pip", tmp_path / "site"
    subprocess.run([str(RUNTIME_PYTHON), "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(pip_dir), str(PACKAGE)], check=True, timeout=120)
    built = (REPO / ".cache" / "wheelhouse" / WHEEL)
    subprocess.run([str(REPO / "scripts" / "build-lab-wheels"), str(RUNTIME_PYTHON)], check=True, timeout=120)
    assert (pip_dir / WHEEL).read_bytes() == built.read_bytes()
    with zipfile.ZipFile(built) as wheel:
        wheel.extractall(unpacked)
        entry_points = wheel.read("vllm_cpu_ray_plugin-0.2.0.dist-info/entry_points.txt").decode()
    assert entry_points.splitlines()[:2] == ["[vllm.platform_plugins]", "cpu_ray = vllm_cpu_ray_plugin:detect"]
    probe = ("from vllm.platforms import current_platform as p, cpu; "
             "from vllm.utils.import_utils import resolve_obj_by_qualname as resolve; "
             "from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator; "
             "c = resolve(p.get_device_communicator_cls()); "
             "print(type(p).__name__, p.ray_device_key, p.device_type, isinstance(p, cpu.CpuPlatform), "
             "c.__name__, issubclass(c, CpuCommunicator))")
    proc = subprocess.run([str(RUNTIME_PYTHON), "-c", probe], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(unpacked), "PATH": "/usr/bin:/bin"}, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["CpuRayPlatform", "GPU", "cpu", "True", "CpuRayCommunicator", "True"]
