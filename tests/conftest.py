"""Shared test configuration and fixtures.

``--strict-skips`` (CI passes it) turns every skip into a failure: a sandbox
test that skipped because bubblewrap or PostgreSQL is missing is a broken CI
machine, not a pass. That holds for a whole module that skips itself while
it is imported, too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pgcluster  # tests/pgcluster.py, found through the line above


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--strict-skips",
        action="store_true",
        default=os.environ.get("STOCKADE_STRICT_SKIPS") == "1",
        help="fail any test that would be skipped (missing bwrap, PostgreSQL, ...)",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    _fail_a_skip(outcome.get_result(), item.config)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    # A module that skips itself while imported (``pytest.importorskip`` at
    # the top) is skipped at collection, before any test report: the same rule.
    outcome = yield
    _fail_a_skip(outcome.get_result(), collector.config)


def _fail_a_skip(report: pytest.TestReport | pytest.CollectReport, config: pytest.Config) -> None:
    if report.skipped and config.getoption("--strict-skips"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under --strict-skips: {reason}"


# -- a throwaway PostgreSQL cluster, shared by the store, sink and publish tests --



@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[pgcluster.Cluster]:
    if pgcluster.find_bin() is None:
        pytest.skip(f"PostgreSQL server binaries missing: apt-get install {pgcluster.APT_PACKAGE}")
    with pgcluster.cluster() as c:
        yield c


@pytest.fixture
def pg_url(pg_cluster: pgcluster.Cluster) -> str:
    """A fresh, empty database in the session's cluster."""
    return pg_cluster.new_database()
