"""SQL table sinks on SQLite and PostgreSQL.

The user's table has the columns of DESIGN.md: ``key`` (primary key),
``payload`` (JSON text), ``fencing_token``, ``run_id``, ``published_at``. Two
bookkeeping tables live next to it in the same database, so the checks and the
write commit together:

- ``stockade_sink_fences``: the high-water token per lease. Checking only the
  row's own token would let a stale holder write a key the new holder has not
  written yet; the per-lease mark closes that gap.
- ``stockade_sink_effects``: every applied idempotency key, so a retry or a
  replay is recognised as already applied (not fenced, not applied twice), and
  ``resume`` can ask whether an ambiguous write landed.

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Protocol

import psycopg

from stockade.errors import InfraError
from stockade.publish.sink import Sink, Write, WriteResult, fenced_message, redact

_SQLITE_NOW = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"


def _payload_text(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True, ensure_ascii=False)


def _schema(table: str, *, pg: bool) -> list[str]:
    token = "BIGINT" if pg else "INTEGER"
    stamp = "TIMESTAMPTZ" if pg else "TEXT"
    seq = "BIGSERIAL PRIMARY KEY" if pg else "INTEGER PRIMARY KEY AUTOINCREMENT"
    return [
        f'CREATE TABLE IF NOT EXISTS "{table}" (key TEXT PRIMARY KEY, payload TEXT NOT NULL,'
        f" fencing_token {token} NOT NULL, run_id TEXT NOT NULL, published_at {stamp} NOT NULL)",
        "CREATE TABLE IF NOT EXISTS stockade_sink_fences (lease TEXT PRIMARY KEY,"
        f" high_water {token} NOT NULL, run_id TEXT NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS stockade_sink_effects (seq {seq},"
        " idempotency_key TEXT NOT NULL UNIQUE, tbl TEXT NOT NULL, key TEXT NOT NULL,"
        f" lease TEXT NOT NULL, fencing_token {token} NOT NULL, run_id TEXT NOT NULL,"
        f" applied_at {stamp} NOT NULL)",
    ]


#: The columns of the table a SQL sink writes (DESIGN: Sinks).
COLUMNS = ("key", "payload", "fencing_token", "run_id", "published_at")


def missing_columns(table: str, where: str, have: set[str]) -> None:
    """Refuse a table that existed before without the columns the sink writes
    (``CREATE TABLE IF NOT EXISTS`` left it as it was): one message naming them,
    not a database's "no such column" at the first write."""
    missing = [c for c in COLUMNS if c not in have]
    if missing:
        raise InfraError(
            f"table {table} in {where} has no column {', '.join(missing)}; a publish writes "
            f"{', '.join(COLUMNS)}: publish to a table of its own (?table=...), or add them")


class _Cursor(Protocol):
    def execute(self, sql: str, args: Any = ...) -> Any: ...
    def fetchone(self) -> Any: ...


class _SqlSink(Sink):
    """The fenced write, shared by both databases; subclasses give the dialect."""

    table: str
    fenced: bool
    now_sql: str
    lock_suffix: str  # row lock for PostgreSQL, nothing for SQLite (the whole db is locked)

    def _q(self, sql: str) -> str:
        return sql

    def _one(self, cur: _Cursor, sql: str, args: tuple[Any, ...]) -> Any:
        cur.execute(self._q(sql), args)
        return cur.fetchone()

    def _apply(self, cur: _Cursor, w: Write) -> WriteResult:
        """Run inside one write transaction; the caller commits unless ``failed``/``fenced``."""
        if self.fenced:
            # Lock the lease's fence first so concurrent writers of one lease take turns.
            cur.execute(
                self._q("INSERT INTO stockade_sink_fences VALUES (?, 0, '') ON CONFLICT DO NOTHING"),
                (w.lease,),
            )
            hw, hw_run = self._one(
                cur,
                "SELECT high_water, run_id FROM stockade_sink_fences WHERE lease = ?"
                + self.lock_suffix,
                (w.lease,),
            )
        done = self._one(
            cur,
            "SELECT fencing_token FROM stockade_sink_effects WHERE idempotency_key = ?",
            (w.idempotency_key,),
        )
        if done is not None:
            return WriteResult("already", int(done[0]), message="already applied")
        if self.fenced:
            if w.token < hw:
                return WriteResult("fenced", w.token, int(hw), hw_run,
                                   fenced_message(w.token, int(hw), hw_run, self.name))
            row = self._one(
                cur,
                f'SELECT fencing_token, run_id FROM "{self.table}" WHERE key = ?' + self.lock_suffix,
                (w.key,),
            )
            if row is not None and w.token < row[0]:
                return WriteResult("fenced", w.token, int(row[0]), row[1],
                                   fenced_message(w.token, int(row[0]), row[1], self.name))
            cur.execute(
                self._q("UPDATE stockade_sink_fences SET high_water = ?, run_id = ? WHERE lease = ?"),
                (w.token, w.run_id, w.lease),
            )
        cur.execute(
            self._q(
                f'INSERT INTO "{self.table}" (key, payload, fencing_token, run_id, published_at)'
                f" VALUES (?, ?, ?, ?, {self.now_sql}) ON CONFLICT (key) DO UPDATE SET"
                " payload = excluded.payload, fencing_token = excluded.fencing_token,"
                " run_id = excluded.run_id, published_at = excluded.published_at"
            ),
            (w.key, _payload_text(w.payload), w.token, w.run_id),
        )
        cur.execute(
            self._q(
                "INSERT INTO stockade_sink_effects"
                " (idempotency_key, tbl, key, lease, fencing_token, run_id, applied_at)"
                f" VALUES (?, ?, ?, ?, ?, ?, {self.now_sql})"
            ),
            (w.idempotency_key, self.table, w.key, w.lease, w.token, w.run_id),
        )
        return WriteResult("applied", w.token, message="applied")


class SQLiteSink(_SqlSink):
    """A table in a SQLite file. ``fenced=False`` exists only for the chaos test's control."""

    now_sql = _SQLITE_NOW
    lock_suffix = ""

    def __init__(self, path: Path, table: str, *, fenced: bool = True) -> None:
        self.path = Path(path)
        self.table = table
        self.fenced = fenced
        self.name = f"sqlite:///{self.path}?table={table}"
        self._db: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not self.path.exists()
            db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0,
                                 check_same_thread=False)
            if fresh:
                db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA busy_timeout=30000")
            # The fence and the row must be on disk when we report success.
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN IMMEDIATE")
            for stmt in _schema(self.table, pg=False):
                db.execute(stmt)
            db.execute("COMMIT")
            have = {row[1] for row in db.execute(f'PRAGMA table_info("{self.table}")')}
        except (sqlite3.Error, OSError) as exc:
            raise InfraError(f"cannot open SQLite sink {self.path}: {exc}") from exc
        missing_columns(self.table, str(self.path), have)
        self._db = db
        return db

    def write(self, w: Write) -> WriteResult:
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                result = self._apply(db.cursor(), w)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT" if result.status == "applied" else "ROLLBACK")
        except sqlite3.Error as exc:
            return WriteResult("failed", w.token, message=f"SQLite sink {self.path}: {exc}")
        return result

    def lookup(self, idempotency_key: str, key: str) -> WriteResult | None:
        if not self.path.exists():
            return None
        row = self._connect().execute(
            "SELECT fencing_token FROM stockade_sink_effects WHERE idempotency_key = ?",
            (idempotency_key,),
        ).fetchone()
        return None if row is None else WriteResult("already", int(row[0]), message="already applied")

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


#: Arbitrary constant: serialises concurrent CREATE TABLE IF NOT EXISTS.
_DDL_LOCK = 0x5707CAFE

# Connections kept between publishes of one process: a PostgreSQL connection is
# a forked server process, far dearer than the fenced write itself.
# Keyed by process id too: a connection inherited through fork() is the parent's.
_idle: dict[tuple[int, str], list[psycopg.Connection[tuple[Any, ...]]]] = {}
_ensured: set[tuple[str, str]] = set()
_pool_lock = threading.Lock()
_POOL_SIZE = 4


class PostgresSink(_SqlSink):
    """A table in PostgreSQL; the fence row is locked (``FOR UPDATE``) for the write."""

    now_sql = "clock_timestamp()"
    lock_suffix = " FOR UPDATE"

    def __init__(self, conninfo: str, table: str, *, fenced: bool = True) -> None:
        self.conninfo = conninfo
        self.table = table
        self.fenced = fenced
        self.name = f"{redact(conninfo)} table {table}"
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None

    def _q(self, sql: str) -> str:
        return sql.replace("%", "%%").replace("?", "%s")

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        with _pool_lock:
            idle = _idle.get((os.getpid(), self.conninfo), [])
            conn = idle.pop() if idle else None
            ensured = (self.conninfo, self.table) in _ensured
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=10)
            if not ensured:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
                    for stmt in _schema(self.table, pg=True):
                        conn.execute(stmt)
                    have = {row[0] for row in conn.execute(
                        "SELECT column_name FROM information_schema.columns"
                        " WHERE table_schema = current_schema() AND table_name = %s",
                        (self.table,))}
                try:
                    missing_columns(self.table, self.name, have)
                except InfraError:
                    conn.close()
                    raise
                with _pool_lock:
                    _ensured.add((self.conninfo, self.table))
        except psycopg.OperationalError as exc:
            raise InfraError(
                f"cannot reach the PostgreSQL sink {self.name}: {str(exc).strip()}"
            ) from exc
        self._conn = conn
        return conn

    def write(self, w: Write) -> WriteResult:
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("BEGIN")
                try:
                    result = self._apply(cur, w)
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
                cur.execute("COMMIT" if result.status == "applied" else "ROLLBACK")
        except psycopg.OperationalError as exc:
            conn.close()
            return WriteResult("failed", w.token, message=f"PostgreSQL sink {self.name}: {exc}")
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.errors.UndefinedTable):
                with _pool_lock:
                    _ensured.discard((self.conninfo, self.table))
            return WriteResult("failed", w.token, message=f"PostgreSQL sink {self.name}: {exc}")
        return result

    def lookup(self, idempotency_key: str, key: str) -> WriteResult | None:
        row = self._connect().execute(
            "SELECT fencing_token FROM stockade_sink_effects WHERE idempotency_key = %s",
            (idempotency_key,),
        ).fetchone()
        return None if row is None else WriteResult("already", int(row[0]), message="already applied")

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None or conn.closed:
            return
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            with _pool_lock:
                idle = _idle.setdefault((os.getpid(), self.conninfo), [])
                if len(idle) < _POOL_SIZE:
                    idle.append(conn)
                    return
        conn.close()
