"""The suite's own rules, as pytest hooks (tests/conftest.py imports them).

- A skipped or xfailed test fails the run: a skip is a failure we owe, not a pass.
- The run ends with the time each lab module took (setup, calls and teardown of its
  tests, the shared lab's bring-up counted where it happened), so CI's budget is
  visible in every run.
"""

from __future__ import annotations

from collections import defaultdict

LAB_PREFIX = "tests/lab/"
_module_seconds: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    if path.startswith(LAB_PREFIX):
        _module_seconds[path] += report.duration


def _owed(terminalreporter):
    return [report for kind in ("skipped", "xfailed", "xpassed") for report in terminalreporter.stats.get(kind, [])]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _module_seconds:
        terminalreporter.section("lab module times")
        for path, seconds in sorted(_module_seconds.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{seconds:8.0f} s  {path}")
        terminalreporter.write_line(f"{sum(_module_seconds.values()):8.0f} s  all lab modules")
    owed = _owed(terminalreporter)
    if owed:
        terminalreporter.section("skipped or xfailed tests fail this suite")
        for report in owed:
            reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
            terminalreporter.write_line(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and _owed(reporter) and exitstatus == 0:
        session.exitstatus = 1
