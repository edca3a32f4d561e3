"""PostgreSQL store: every lease operation locks the lease row before its users.

``acquire_lease`` updates the lease row, then deletes from
``stockade_lease_users``; a ``release_lease`` that deleted its user row first
and updated the lease row second deadlocked against it (seen in the chaos
test). Here a third connection holds the lease row; the release must then be
waiting without having locked any user row.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from stockade.store import open_store

pytestmark = pytest.mark.postgres


def test_release_locks_the_lease_row_before_the_users(pg_url: str, tmp_path: Path) -> None:
    store = open_store(pg_url, tmp_path)
    assert store.acquire_lease("L", "run1", 100.0, user="i0") is not None
    with psycopg.connect(pg_url) as holder, psycopg.connect(pg_url, autocommit=True) as probe:
        holder.execute("SELECT 1 FROM stockade_leases WHERE name = 'L' FOR UPDATE")
        releasing = threading.Thread(
            target=store.release_lease, args=("L", "run1"), kwargs={"user": "i0"}
        )
        releasing.start()
        deadline = time.monotonic() + 10
        while not probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE '%stockade_leases%' AND pid <> pg_backend_pid()"
        ).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "release_lease never waited for the lease row"
            time.sleep(0.01)
        # The release is blocked on the lease row: it must hold no user row.
        with probe.transaction():
            rows = probe.execute(
                "SELECT holder FROM stockade_lease_users WHERE name = 'L' FOR UPDATE NOWAIT"
            ).fetchall()
        assert rows == [("run1",)]
        holder.rollback()
        releasing.join(10)
        assert not releasing.is_alive()
    assert store.acquire_lease("L", "run2", 100.0) is not None
    store.close()
