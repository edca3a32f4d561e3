"""Chaos: writer processes share one lease with a short TTL while the test pauses
them at random (SIGSTOP/SIGCONT, longer than the TTL). A paused holder wakes up
still believing in its old token. With fencing, the tokens that land never go
back; the unfenced control run of the same test shows that they otherwise do.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from stockade.store import open_store

WRITER = Path(__file__).with_name("chaos_writer.py")
WRITERS = 4
SECONDS = 4.0
TTL = 0.15


def landed(sink: str) -> list[tuple[str, int]]:
    sql = "SELECT key, fencing_token FROM stockade_sink_effects ORDER BY seq"
    if sink.startswith("sqlite:"):
        with sqlite3.connect(sink[7:]) as db:
            return list(db.execute(sql))
    with psycopg.connect(sink) as conn:
        return list(conn.execute(sql))


def final_rows(sink: str) -> dict[str, int]:
    sql = "SELECT key, fencing_token FROM chaos"
    if sink.startswith("sqlite:"):
        with sqlite3.connect(sink[7:]) as db:
            return dict(db.execute(sql).fetchall())
    with psycopg.connect(sink) as conn:
        return dict(conn.execute(sql).fetchall())  # type: ignore[arg-type]


def regressions(seq: list[tuple[str, int]]) -> int:
    """Writes that landed with a token below one that had already landed."""
    top, bad = -1, 0
    for _, token in seq:
        if token < top:
            bad += 1
        top = max(top, token)
    return bad


@pytest.mark.parametrize(
    ("db", "fenced"),
    [("sqlite", True), ("sqlite", False), ("postgresql", True)],
    ids=["sqlite-fenced", "sqlite-unfenced-control", "postgresql-fenced"],
)
def test_paused_holders_never_move_the_sink_back(
    request: pytest.FixtureRequest, tmp_path: Path, db: str, fenced: bool
) -> None:
    if db == "sqlite":
        store_url, sink = f"sqlite:///{tmp_path}/store.db", f"sqlite:{tmp_path}/sink.db"
    else:
        store_url = sink = request.getfixturevalue("pg_url")
    store = open_store(store_url, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    procs = {
        f"w{i}": subprocess.Popen(
            [sys.executable, str(WRITER), store_url, sink, f"w{i}", str(SECONDS), str(TTL),
             *([] if fenced else ["--unfenced"])],
            stdout=subprocess.PIPE, env=env,
        )
        for i in range(WRITERS)
    }
    rng = random.Random(1234)
    stops = 0
    try:
        end = time.monotonic() + SECONDS - 0.5
        while time.monotonic() < end:
            lease = store.get_lease("chaos")
            live = lease is not None and lease.holder in procs and lease.expires_at > store.db_now()
            # Mostly pause whoever holds the lease right now, mid-write: the dangerous moment.
            name = lease.holder if lease and live and rng.random() < 0.8 \
                else rng.choice(list(procs))
            procs[name].send_signal(signal.SIGSTOP)
            time.sleep(rng.uniform(2 * TTL, 4 * TTL))
            procs[name].send_signal(signal.SIGCONT)
            stops += 1
            time.sleep(rng.uniform(0.0, TTL))
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGCONT)
    counts: list[dict[str, Any]] = []
    for p in procs.values():
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        counts.append(json.loads(out))
    store.close()

    seq = landed(sink)
    total = {k: sum(c[k] for c in counts) for k in counts[0]}
    print(f"chaos {db} fenced={fenced}: {total} stops={stops} regressions={regressions(seq)}")
    assert stops >= 5 and total["rounds"] >= 10 and len(seq) >= 40, (stops, total)
    assert total["failed"] == 0
    if fenced:
        assert regressions(seq) == 0
        # Paused holders did wake up and try: the fence, not luck, kept them out.
        assert total["fenced"] > 0, total
        # Every key holds the highest token that ever landed on it.
        top: dict[str, int] = {}
        for key, token in seq:
            top[key] = max(top.get(key, -1), token)
        assert final_rows(sink) == top
    else:
        assert regressions(seq) > 0, "the control run should show stale writes landing"
