"""Shared test configuration.

``--strict-skips`` (CI passes it) turns every skip into a failure: a sandbox
test that skipped because bubblewrap or PostgreSQL is missing is a broken CI
machine, not a pass.
"""

from __future__ import annotations

import os

import pytest


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
    report = outcome.get_result()
    if report.skipped and item.config.getoption("--strict-skips"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under --strict-skips: {reason}"
