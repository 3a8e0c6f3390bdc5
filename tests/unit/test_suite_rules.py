"""The suite's own rules (tests/suite_rules.py) on a planted test run: a skip or an xfail fails it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def run_pytest(tmp_path, body, *extra):
    (tmp_path / "test_planted.py").write_text("import pytest\n\n" + body)
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_rules", "-q", "-p", "no:cacheprovider",
                           *extra, str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=env, check=False)


# scripts/test runs the unit layer on every core (pytest-xdist): the rule must hold there too.
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_a_skipped_test_fails_the_run_and_is_named(tmp_path, workers):
    result = run_pytest(tmp_path, "def test_ok():\n    assert 1\n\n"
                                  "def test_owed():\n    pytest.skip('needs a GPU')\n", *workers)
    assert result.returncode == 1, result.stdout
    assert "skipped or xfailed tests fail this suite" in result.stdout
    assert "test_planted.py::test_owed" in result.stdout and "needs a GPU" in result.stdout


def test_an_xfail_fails_the_run_too(tmp_path):
    result = run_pytest(tmp_path, "@pytest.mark.xfail(reason='known bug')\ndef test_bug():\n    assert 0\n")
    assert result.returncode == 1 and "known bug" in result.stdout, result.stdout


def test_a_clean_run_passes(tmp_path):
    result = run_pytest(tmp_path, "def test_ok():\n    assert 1\n")
    assert result.returncode == 0, result.stdout
    assert "skipped or xfailed" not in result.stdout


def test_every_test_module_name_is_unique_across_the_layers():
    # The layers are folders without __init__.py, so pytest imports each module by its bare name: a second
    # tests/*/test_x.py stops the whole run at collection ("import file mismatch"), as
    # tests/unit/test_doctor_unseen.py did beside tests/lab/test_doctor_unseen.py in a CI run.
    seen = {}
    for path in sorted(TESTS.glob("*/test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_the_next_lab_module_is_the_next_one_selected_to_run(tmp_path):
    # tests/lab/lab_order.next_lab_module decides whether a front module hands its deployment on
    # (test_router.leave_front): a module left out by -m must not count as next, or the front would be left
    # deployed for a module that never runs.
    (tmp_path / "conftest.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(TESTS / 'lab')!r})\n"
        "from lab_order import next_lab_module\n\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'extended: left out with -m')\n")
    probe = ("import pytest\nfrom lab_order import next_lab_module\n\n"
             "def test_first():\n    pass\n\n"
             "def test_last(request):\n    print('NEXT', __name__, next_lab_module(request))\n")
    (tmp_path / "test_a.py").write_text(probe)
    (tmp_path / "test_b.py").write_text("import pytest\npytestmark = pytest.mark.extended\n\n" + probe)
    (tmp_path / "test_c.py").write_text(probe)

    def nexts(*args):
        result = subprocess.run([sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", *args,
                                 str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                                check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        return [list(found) for found in re.findall(r"NEXT (\S+) (\S+)", result.stdout)]

    assert nexts() == [["test_a", "test_b.py"], ["test_b", "test_c.py"], ["test_c", "None"]]
    assert nexts("-m", "not extended") == [["test_a", "test_c.py"], ["test_c", "None"]]
