"""PostgreSQL fixtures for the publish tests (see ``tests/pgcluster.py``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pgcluster


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
