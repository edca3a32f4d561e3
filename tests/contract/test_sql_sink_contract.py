"""One contract for the SQL table sinks: the same tests on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from stockade.errors import InfraError
from stockade.publish.sink import SinkUrlError, Write, open_sink, split_table
from stockade.publish.sql import PostgresSink, SQLiteSink
from stockade.store import SQLiteStore

SinkFactory = Callable[[], SQLiteSink | PostgresSink]


@pytest.fixture(params=["sqlite", "postgresql"])
def make_sink(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SinkFactory]:
    made: list[SQLiteSink | PostgresSink] = []

    if request.param == "sqlite":
        def factory() -> SQLiteSink | PostgresSink:
            made.append(SQLiteSink(tmp_path / "sink.db", "daily"))
            return made[-1]
    else:
        url = request.getfixturevalue("pg_url")

        def factory() -> SQLiteSink | PostgresSink:
            made.append(PostgresSink(url, "daily"))
            return made[-1]

    yield factory
    for s in made:
        s.close()


def rows(sink: SQLiteSink | PostgresSink, table: str = "daily") -> list[tuple[Any, ...]]:
    sql = f'SELECT key, payload, fencing_token, run_id FROM "{table}" ORDER BY key'
    if isinstance(sink, SQLiteSink):
        with sqlite3.connect(sink.path) as db:
            return list(db.execute(sql))
    with psycopg.connect(sink.conninfo) as conn:
        return list(conn.execute(sql))


def applied(sink: SQLiteSink | PostgresSink) -> list[tuple[str, int]]:
    sql = "SELECT idempotency_key, fencing_token FROM stockade_sink_effects ORDER BY seq"
    if isinstance(sink, SQLiteSink):
        with sqlite3.connect(sink.path) as db:
            return list(db.execute(sql))
    with psycopg.connect(sink.conninfo) as conn:
        return list(conn.execute(sql))


def w(run: str, token: int, key: str = "k", item: int = 0, payload: Any = None,
      lease: str = "L") -> Write:
    return Write(idempotency_key=f"{run}/pub/{item}", key=key,
                 payload={"from": run} if payload is None else payload,
                 run_id=run, token=token, lease=lease)


def test_a_table_of_the_users_without_the_columns_is_named_with_them(
        make_sink: SinkFactory) -> None:
    # CREATE TABLE IF NOT EXISTS leaves such a table as it was; the first
    # write then failed with the database's "no such column: fencing_token".
    sink = make_sink()
    ddl = "CREATE TABLE daily (key TEXT PRIMARY KEY, payload TEXT)"
    if isinstance(sink, SQLiteSink):
        with sqlite3.connect(sink.path) as db:
            db.execute(ddl)
    else:
        with psycopg.connect(sink.conninfo) as conn:
            conn.execute(ddl)
    with pytest.raises(InfraError) as refused:
        sink.write(w("A", 1))
    assert str(refused.value).startswith("table daily in ")
    assert str(refused.value).endswith(
        " has no column fencing_token, run_id, published_at; a publish writes key, payload, "
        "fencing_token, run_id, published_at: publish to a table of its own (?table=...), "
        "or add them")


def test_table_has_the_design_columns(make_sink: SinkFactory) -> None:
    sink = make_sink()
    assert sink.write(w("A", 1, payload={"x": [1, "ü"]})).status == "applied"
    if isinstance(sink, SQLiteSink):
        with sqlite3.connect(sink.path) as db:
            cols = [r[1] for r in db.execute('PRAGMA table_info("daily")')]
            stamp = db.execute("SELECT published_at FROM daily").fetchone()[0]
    else:
        with psycopg.connect(sink.conninfo) as conn:
            cols = [r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'daily'"
                " ORDER BY ordinal_position")]
            stamp = conn.execute("SELECT published_at FROM daily").fetchone()[0]  # type: ignore[index]
    assert cols == ["key", "payload", "fencing_token", "run_id", "published_at"]
    assert stamp
    assert rows(sink) == [("k", '{"x": [1, "ü"]}', 1, "A")]


@pytest.mark.parametrize(
    ("writes", "statuses", "final"),
    [
        # Newer token overwrites, older one is fenced by the row.
        ([("A", 1, "k"), ("B", 2, "k"), ("A2", 1, "k")], ["applied", "applied", "fenced"], {"k": "B"}),
        # The gap a per-row check leaves: B (token 2) wrote k1 only; stale A (token 1)
        # tries k2, which B has not written yet. The lease's high-water mark refuses it.
        ([("B", 2, "k1"), ("A", 1, "k2")], ["applied", "fenced"], {"k1": "B"}),
        # One run's items share a token and write different keys.
        ([("A", 3, "k1"), ("A", 3, "k2")], ["applied", "applied"], {"k1": "A", "k2": "A"}),
        # Tokens climbing one by one, each run writing its own key.
        ([("A", 1, "a"), ("B", 2, "b"), ("C", 3, "c")], ["applied"] * 3, {"a": "A", "b": "B", "c": "C"}),
    ],
)
def test_fencing(make_sink: SinkFactory, writes: list[tuple[str, int, str]], statuses: list[str],
                 final: dict[str, str]) -> None:
    sink = make_sink()
    got = []
    for i, (run, token, key) in enumerate(writes):
        got.append(sink.write(w(run, token, key, item=i)).status)
    assert got == statuses
    assert {r[0]: r[3] for r in rows(sink)} == final


def test_fenced_result_names_the_newer_token(make_sink: SinkFactory) -> None:
    sink = make_sink()
    sink.write(w("B", 9, "k1"))
    r = sink.write(w("A", 7, "k2"))
    assert (r.status, r.token, r.winner_token, r.winner_run) == ("fenced", 7, 9, "B")
    assert "token 7 < newer token 9" in r.message and "run B" in r.message


def test_leases_are_fenced_separately(make_sink: SinkFactory) -> None:
    sink = make_sink()
    assert sink.write(w("B", 9, "k1", lease="L1")).status == "applied"
    assert sink.write(w("A", 2, "k2", lease="L2")).status == "applied"
    assert sink.write(w("C", 1, "k1", lease="L2", item=1)).status == "fenced"  # the row's own token


@pytest.mark.parametrize("times", [2, 3, 5])
def test_duplicate_delivery_is_one_application(make_sink: SinkFactory, times: int) -> None:
    sink = make_sink()
    results = [sink.write(w("A", 4, "k", payload={"n": 1})) for _ in range(times)]
    assert [r.status for r in results] == ["applied"] + ["already"] * (times - 1)
    assert applied(sink) == [("A/pub/0", 4)]
    assert rows(sink) == [("k", '{"n": 1}', 4, "A")]


def test_retry_with_same_token_after_newer_write_is_already_applied(make_sink: SinkFactory) -> None:
    sink = make_sink()
    assert sink.write(w("A", 1, "k")).status == "applied"
    assert sink.write(w("B", 2, "k")).status == "applied"
    again = sink.write(w("A", 1, "k"))       # A's answer was lost; it retries
    assert (again.status, again.token) == ("already", 1)
    assert rows(sink) == [("k", '{"from": "B"}', 2, "B")]


def test_lookup_reconciles(make_sink: SinkFactory) -> None:
    sink = make_sink()
    assert sink.lookup("A/pub/0", "k") is None
    sink.write(w("A", 3, "k"))
    found = make_sink().lookup("A/pub/0", "k")
    assert found is not None and (found.status, found.token) == ("already", 3)


def test_concurrent_writers_keep_tokens_monotonic(make_sink: SinkFactory) -> None:
    """8 threads, each its own connection, write with shuffled tokens: the applied
    tokens, in commit order, never go down."""
    make_sink().write(w("seed", 0, "seed"))
    tokens = [5, 1, 8, 3, 7, 2, 6, 4]
    barrier = threading.Barrier(len(tokens))

    def go(t: int) -> None:
        s = make_sink()
        barrier.wait()
        for j in range(5):
            s.write(w(f"r{t}", t, f"k{j}", item=j))

    threads = [threading.Thread(target=go, args=(t,)) for t in tokens]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    seq = [tok for _, tok in applied(make_sink())]
    assert seq == sorted(seq)
    assert {r[2] for r in rows(make_sink()) if r[0] != "seed"} == {max(seq)}


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("sqlite:///r.db?table=daily_report", True),
        ("sqlite:///r.db", False),
        ("sqlite:///r.db?table=bad-name", False),
        ("sqlite:///r.db?table=a&table=b", False),
        ('sqlite:///r.db?table=x";drop', False),
        ("mysql://h/db?table=t", False),
        ("file:///abs/dir", True),
        ("https://example.invalid/hook", True),
    ],
)
def test_sink_urls(tmp_path: Path, url: str, ok: bool) -> None:
    store = SQLiteStore(":memory:")
    if ok:
        open_sink(url, tmp_path, store).close()
    else:
        with pytest.raises(SinkUrlError):
            open_sink(url, tmp_path, store)


@pytest.mark.parametrize(
    ("url", "path"),
    [("sqlite:///rel/r.db?table=t", "BASE/rel/r.db"), ("sqlite:////abs/r.db?table=t", "/abs/r.db")],
)
def test_sqlite_sink_paths(tmp_path: Path, url: str, path: str) -> None:
    sink = open_sink(url, tmp_path, SQLiteStore(":memory:"))
    assert isinstance(sink, SQLiteSink)
    assert str(sink.path) == path.replace("BASE", str(tmp_path))


def test_postgres_url_keeps_other_parameters() -> None:
    rest, table = split_table("postgresql://u@/db?host=/tmp/s&port=5433&table=t")
    assert (rest, table) == ("postgresql://u@/db?host=/tmp/s&port=5433", "t")
