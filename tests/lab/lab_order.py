"""The lab modules' order in a run, and which module comes next (tests/lab/conftest.py sorts by it).

The own-lab modules run first, then the shared lab's users, from the README's demo (test_demo: scripts/demo
brings the lab up and deploys, test_deploy reads that first deploy.yml) to Molecule, whose destroy ends the shared
lab.

The front family (FRONT_MODULES) runs back to back: each hands the deployed three replicas and the
router on to the next module of the family in the run (test_router.leave_front), and the last of the
family in the run tears them down (test_monitoring, the family's last, always does, Prometheus too).
A run then deploys the front once instead of once per module.
"""

from __future__ import annotations

from pathlib import Path

FRONT_MODULES = ("test_router.py", "test_scale_replicas.py", "test_monitoring.py")
# test_benchmark and test_doctor follow test_hardening: each starts on the default deployment the one before leaves
# (CI runs the doctor's faults that leave vLLM running there without a start of its own), and the doctor's checklist
# reads the benchmark's stages when both run.
MODULE_ORDER = ("test_lab.py", "test_faults_preflight_network.py", "test_demo.py", "test_deploy.py", "test_collection.py",
                "test_self_healing.py", "test_drift_repair.py", "test_hardening.py", "test_benchmark.py",
                "test_doctor.py", "test_fleet.py", "test_model_hub.py", "test_teardown.py",
                *FRONT_MODULES, "test_rolling_change.py",
                "test_runtime_ray.py", "test_ray_backend.py", "test_doctor_ray.py", "test_molecule.py")
LAST = MODULE_ORDER.index("test_molecule.py")  # Molecule's destroy ends the shared lab: nothing may follow it


def next_lab_module(request) -> str | None:
    """The file name of the module this run runs next after the requesting test's module (None: none follows).

    Read from the session's items, which are the tests selected to run (after `-m`, `-k` and the conftest's sort):
    a module that `-m "not lab_extended"` deselected is not next.
    """
    items = request.session.items
    here = Path(str(request.node.fspath))
    position = next(i for i, item in enumerate(items) if item.nodeid == request.node.nodeid)
    return next((Path(str(item.fspath)).name for item in items[position + 1:] if Path(str(item.fspath)) != here),
                None)
