"""Reliability suite: real CLI subprocesses, real run folders, a real fault-injecting HTTP
server on 127.0.0.1 (``memsearch.testing.agent_server``). ``report.py`` holds the ledger each
test records into; the table is printed at the end of the session."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("memsearch_reliability_report", Path(__file__).with_name("report.py"))
report = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
if not hasattr(report, "LEDGER"):
    _spec.loader.exec_module(report)


@pytest.fixture(scope="session")
def rel():
    """The report module: ``rel.LEDGER.record(...)`` and the run-folder checks."""
    return report


@pytest.fixture(autouse=True)
def _ledger_test(request):
    report.LEDGER.current = request.node.nodeid
    yield
    report.LEDGER.current = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and rep.when == "call":
        report.LEDGER.test_failed(item.nodeid)


def pytest_sessionfinish(session):
    # Under pytest-xdist each worker holds the rows of its own tests: hand them to the controller.
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["reliability_ledger"] = report.LEDGER.dump()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent with -p no:xdist
def pytest_testnodedown(node, error):
    report.LEDGER.merge(getattr(node, "workeroutput", {}).get("reliability_ledger", {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not report.LEDGER.rows:
        return
    terminalreporter.section("reliability")
    terminalreporter.write_line(report.LEDGER.table())
    terminalreporter.write_line(report.LEDGER.result_line())
