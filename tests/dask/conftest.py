"""Fixtures for the Dask executor: real ``dask scheduler``/``dask worker`` processes.

The workers' HOME, TMPDIR and scratch are their own folders, none of them
the engine's; the engine is a ``stockade run`` the test starts (as root,
like the rest of the suite).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import daskcluster  # tests/daskcluster.py

# A hard import: the test extra installs distributed, and a skip raised while
# this file is imported would never reach the strict-skips hook.
import distributed  # noqa: F401

from tests.integration.conftest import Project


@contextlib.contextmanager
def _machine_folder() -> Iterator[Path]:
    """Where the workers live: outside the engine's (private) test folder, as on another
    machine, and reachable by jail uids as a worker's TMPDIR is (bwrap binds from there)."""
    top = Path(tempfile.mkdtemp(prefix="stockade-dask-"))
    top.chmod(0o755)
    try:
        base = top / "worker machines"
        base.mkdir()
        yield base
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="session")
def dask_cluster() -> Iterator[daskcluster.Cluster]:
    """Two workers of two threads, shared by the tests that kill nothing."""
    with _machine_folder() as base, daskcluster.cluster(base) as c:
        yield c


@pytest.fixture
def private_cluster() -> Iterator[daskcluster.Cluster]:
    """A cluster of its own (started by the test: workers to kill, restart or refuse)."""
    with _machine_folder() as base:
        c = daskcluster.Cluster(base)
        try:
            c.start_scheduler()
            yield c
        finally:
            c.stop()


@pytest.fixture
def project(tmp_path: Path) -> Project:
    p = Project(tmp_path / "engine dir")
    p.path.mkdir()
    p.root = p.path / ".stockade"
    p.env["STOCKADE_HOME"] = str(p.root)
    p.env.pop("STOCKADE_SANDBOX", None)
    return p


def item_provenance(project: Project, run_id: str, target: str) -> dict[str, Any]:
    r = project.run("show", run_id, target, "--json")
    assert r.code == 0, r.err
    return dict(r.json()["provenance"])


def all_attempts(project: Project, run_id: str) -> list[dict[str, Any]]:
    """Every attempt the run store (SQLite) records for the run, provenance parsed."""
    import sqlite3

    db = project.root / "stockade.db"
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
        rows = c.execute("SELECT step, item, attempt, outcome, message, provenance FROM attempts "
                         "WHERE run_id=? ORDER BY step, item, attempt", (run_id,)).fetchall()
    return [{"step": r[0], "item": r[1], "attempt": r[2], "outcome": r[3], "message": r[4],
             "provenance": json.loads(r[5]) if r[5] else None} for r in rows]


def run_json(project: Project, *args: str, timeout: float = 300) -> tuple[int, dict[str, Any],
                                                                          str]:
    r = project.run(*args, "--json", timeout=timeout)
    try:
        data = json.loads(r.out)
    except ValueError:
        data = {}
    return r.code, data, r.err
