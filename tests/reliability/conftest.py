"""Reliability suite: real CLI subprocesses, real run folders, a real fault-injecting HTTP
server on 127.0.0.1 (``memsearch.testing.agent_server``). ``report.py`` holds the ledger each
test records into; the table is printed at the end of the session."""

from __future__ import annotations

import sys

import pytest

# Loaded by the root conftest (tests/conftest.py), which also holds the session hooks that print
# the table: the xdist controller never loads this file.
report = sys.modules["memsearch_reliability_report"]


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


@pytest.fixture(scope="session")
def bm25_index(hotpot_dev_dir, tmp_path_factory, rel):
    """A BM25 index of the shipped dev sample built by the real CLI, for the service tests."""
    out = tmp_path_factory.mktemp("bm25") / "ix"
    built = rel.run_cli([str(rel.EXE), "retrieval", "build", "--data", str(hotpot_dev_dir), "--method", "bm25",
                         "--out", str(out)])
    assert built.returncode == 0, built.stderr
    return out
