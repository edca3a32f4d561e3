"""Benchmark: lease + fenced write latency, and publishes per second with 8 writers,
on SQLite and on PostgreSQL (a throwaway cluster with fsync on).

The anchor, measured in the same run on the same database, is a plain upsert of
the same row with no lease, no fence and no effect records; figures are printed
as ratios to it. Run: ``.venv/bin/python bench/bench_publish.py [--n 300]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from stockade.publish import PublishRequest, publish
from stockade.publish.sink import Write
from stockade.publish.sql import PostgresSink, SQLiteSink
from stockade.store import open_store

WRITERS = 8


def plain_upsert(sink_url: str) -> Callable[[int], None]:
    """The anchor: one durable upsert of a row, nothing else."""
    sql = ("INSERT INTO plain (key, payload) VALUES ({p}, {p}) ON CONFLICT (key)"
           " DO UPDATE SET payload = excluded.payload")
    if sink_url.startswith("sqlite:"):
        db = sqlite3.connect(sink_url[7:], isolation_level=None, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE IF NOT EXISTS plain (key TEXT PRIMARY KEY, payload TEXT)")

        def go(i: int) -> None:
            db.execute("BEGIN IMMEDIATE")
            db.execute(sql.format(p="?"), (f"k{i % 50}", f'{{"i": {i}}}'))
            db.execute("COMMIT")
        return go
    conn = psycopg.connect(sink_url, autocommit=True)
    conn.execute("CREATE TABLE IF NOT EXISTS plain (key TEXT PRIMARY KEY, payload TEXT)")

    def go_pg(i: int) -> None:
        conn.execute(sql.format(p="%s"), (f"k{i % 50}", f'{{"i": {i}}}'))
    return go_pg


def fenced_write(store_url: str, sink_url: str, tag: str) -> Callable[[int], None]:
    """Take the lease, write through the fenced sink, release: the core of a publish."""
    store = open_store(store_url, Path("."))
    sink: SQLiteSink | PostgresSink = (
        SQLiteSink(Path(sink_url[7:]), "daily") if sink_url.startswith("sqlite:")
        else PostgresSink(sink_url, "daily")
    )

    def go(i: int) -> None:
        lease = store.acquire_lease("bench", tag, 30.0, user=str(i))
        assert lease is not None
        r = sink.write(Write(f"{tag}/pub/{i}", f"k{i % 50}", {"i": i}, tag, lease.token, "bench"))
        assert r.status == "applied", r
        store.release_lease("bench", tag, user=str(i))
    return go


def latency(fn: Callable[[int], None], n: int, offset: int = 0) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(offset + i)
        out.append(time.perf_counter() - t)
    return out


def _publish_worker(args: tuple[str, str, str, int, int, float]) -> int:
    store_url, sink_to, run_id, first, count, started = args
    store = open_store(store_url, Path("."))
    for i in range(first, first + count):
        out = publish(PublishRequest(
            run_id=run_id, step="publish", item=i, attempt=1, to=sink_to, base_dir=Path("."),
            key=f"k{i}", payload={"i": i}, lease="bench.publish", lease_ttl=60, max_age=86400,
            run_started_at=started, allow_stale=False, input_fingerprint="fp",
        ), store)
        assert out.status == "succeeded", out
    store.close()
    return count


def _plain_worker(args: tuple[str, int, int]) -> int:
    sink_url, first, count = args
    go = plain_upsert(sink_url)
    for i in range(first, first + count):
        go(i)
    return count


def throughput(pool: Any, worker: Callable[[Any], int], jobs: list[Any]) -> float:
    t = time.perf_counter()
    total = sum(pool.map(worker, jobs))
    return total / (time.perf_counter() - t)


def ms(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] * 1000 if q < 100 else max(xs) * 1000


def bench(name: str, store_url: str, sink_url: str, sink_to: str, n: int, pool: Any) -> None:
    plain = plain_upsert(sink_url)
    fenced = fenced_write(store_url, sink_url, f"{name}-lat")
    latency(plain, 20)
    latency(fenced, 20, offset=10_000)
    a = latency(plain, n)
    b = latency(fenced, n, offset=20_000)
    pa, pb = statistics.median(a) * 1000, statistics.median(b) * 1000
    print(f"{name}: lease + fenced write  p50 {pb:7.2f} ms  p99 {ms(b, 99):7.2f} ms"
          f"   anchor (plain upsert) p50 {pa:6.2f} ms   ratio {pb / pa:5.1f}x")
    per = max(n // WRITERS, 10)
    started = time.time()
    pub = throughput(pool, _publish_worker,
                     [(store_url, sink_to, f"{name}-run", w * per, per, started) for w in range(WRITERS)])
    base = throughput(pool, _plain_worker, [(sink_url, 100_000 + w * per, per) for w in range(WRITERS)])
    print(f"{name}: {WRITERS} writers: {pub:8.1f} publishes/s   anchor {base:8.1f} upserts/s"
          f"   ratio {base / pub:5.1f}x slower")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300, help="sequential operations per latency figure")
    ap.add_argument("--skip-postgres", action="store_true")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as d, ctx.Pool(WRITERS) as pool:
        print(f"SQLite {sqlite3.sqlite_version}, synchronous=FULL for leases, fences and sink rows")
        bench("sqlite", f"sqlite:///{d}/store.db", f"sqlite:{d}/sink.db",
              f"sqlite:///{d}/pubsink.db?table=daily", args.n, pool)
        if args.skip_postgres:
            return
        import pgcluster

        with pgcluster.cluster(durable=True) as c:
            url = c.new_database()
            print(f"PostgreSQL {c.bindir.parent.name} on a unix socket, fsync on")
            bench("postgresql", url, url, url + "&table=pubdaily", args.n, pool)


if __name__ == "__main__":
    main()
