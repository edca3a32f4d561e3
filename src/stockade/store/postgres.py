"""PostgreSQL implementation of the run store, for several machines sharing work.

Same contract as ``SQLiteStore`` (one shared suite in ``tests/contract``). Tables
are prefixed ``stockade_`` so the store can live in a database that also holds
sink tables. Lease writes are single conditional statements in their own short
transaction, timed by ``clock_timestamp()`` so no client clock decides expiry.
The reads are the shared queries of ``store._sql``, spelt for PostgreSQL by
``to_postgres``; list parameters are one array each (``= ANY(%s)``).

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from stockade.errors import InfraError
from stockade.store._rows import (
    ITEM_COLUMNS,
    dump_json,
    effect_from_row,
)
from stockade.store._sql import SQLStore, to_postgres
from stockade.store.base import (
    REUSE_KEEP,
    ArtifactRecord,
    AttemptRecord,
    Effect,
    Event,
    FenceCheck,
    ItemRecord,
    Lease,
    PublishRecord,
    ReuseEntry,
    RunExists,
    RunRecord,
)
from stockade.store.pg_schema import SCHEMA

#: Arbitrary constant: serialises concurrent CREATE TABLE IF NOT EXISTS, which
#: PostgreSQL does not make safe on its own.
_SCHEMA_LOCK = 0x5707CADE

#: The database clock in seconds; ``clock_timestamp()`` moves inside a transaction.
NOW_SQL = "extract(epoch from clock_timestamp())::float8"


def connect(conninfo: str) -> psycopg.Connection[tuple[Any, ...]]:
    """An autocommit connection, or an ``InfraError`` that says what to fix."""
    try:
        return psycopg.connect(conninfo, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise InfraError(
            f"cannot reach PostgreSQL at {redact(conninfo)}: {str(exc).strip()}"
            " (check --store / STOCKADE_STORE and that the server is running)"
        ) from exc


def redact(conninfo: str) -> str:
    """The conninfo without a password, for messages."""
    if "://" in conninfo and "@" in conninfo:
        scheme, rest = conninfo.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}@{host}"
    return conninfo


class PostgresStore(SQLStore):
    """A run store in PostgreSQL. A small pool of autocommit connections, one per operation."""

    def __init__(self, conninfo: str, *, pool_size: int = 8) -> None:
        self.conninfo = conninfo
        self._pool_size = pool_size
        self._idle: list[psycopg.Connection[tuple[Any, ...]]] = []
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        with self._conn() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute(SCHEMA)

    # -- connections -------------------------------------------------------

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        with self._lock:
            if self._pid != os.getpid():
                # Forked: the idle connections belong to the parent; leave them be.
                self._idle, self._pid = [], os.getpid()
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed:
            conn = connect(self.conninfo)
        try:
            yield conn
        except psycopg.OperationalError as exc:
            conn.close()
            raise InfraError(f"PostgreSQL store at {redact(self.conninfo)}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        with self._lock:
            if not self._closed and len(self._idle) < self._pool_size:
                self._idle.append(conn)
                return
        conn.close()

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Cursor[tuple[Any, ...]]]:
        with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            yield cur

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._conn() as conn:
            return list(conn.execute(sql, args).fetchall())

    def _spell(self, sql: str) -> str:
        return to_postgres(sql)

    #: A list is one array parameter, whatever the number of values.
    _LIST_LIMIT = None

    def _one_of(self, column: str, values: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
        return f"{column} = ANY(?)", (list(values),)

    # -- runs --------------------------------------------------------------

    def create_run(self, run: RunRecord) -> None:
        try:
            with self._tx() as cur:
                cur.execute("SELECT 1 FROM stockade_removed_runs WHERE run_id=%s", (run.run_id,))
                if cur.fetchone() is not None:
                    raise RunExists(run.run_id, removed=True)
                cur.execute(
                    "INSERT INTO stockade_runs VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                    (run.run_id, run.workflow, run.workflow_path, run.workflow_sha256, run.root,
                     run.status, run.started_at, run.ended_at, run.sandbox, run.enforced),
                )
        except psycopg.errors.UniqueViolation as exc:
            raise RunExists(run.run_id) from exc

    def update_run(self, run_id: str, *, status: str, ended_at: float | None) -> None:
        with self._tx() as cur:
            cur.execute(
                "UPDATE stockade_runs SET status=%s, ended_at=%s WHERE run_id=%s",
                (status, ended_at, run_id),
            )

    def delete_run(self, run_id: str) -> None:
        with self._tx() as cur:
            for table in ("artifacts", "items", "attempts", "events", "effects", "reuse_index",
                          "runs"):
                cur.execute(f"DELETE FROM stockade_{table} WHERE run_id=%s", (run_id,))
            cur.execute("INSERT INTO stockade_removed_runs VALUES (%s) ON CONFLICT DO NOTHING",
                        (run_id,))

    # -- reuse across runs ---------------------------------------------------

    def index_reuse(self, entries: list[ReuseEntry]) -> None:
        if not entries:
            return
        with self._tx() as cur:
            cur.executemany(
                "INSERT INTO stockade_reuse_index VALUES (%s,%s,%s,%s,%s,%s)"
                " ON CONFLICT (key, run_id, step, item) DO UPDATE SET attempt=EXCLUDED.attempt,"
                " created_at=EXCLUDED.created_at",
                [(e.key, e.run_id, e.step, e.item, e.attempt, e.created_at) for e in entries])
            cur.execute(
                "DELETE FROM stockade_reuse_index x USING (SELECT key, run_id, step, item,"
                " ROW_NUMBER() OVER (PARTITION BY key ORDER BY created_at DESC) AS n"
                " FROM stockade_reuse_index WHERE key = ANY(%s)) d WHERE x.key = d.key"
                " AND x.run_id = d.run_id AND x.step = d.step AND x.item = d.item"
                " AND d.n > %s", (sorted({e.key for e in entries}), REUSE_KEEP))

    # -- attempts and items ------------------------------------------------

    def record_attempt(self, attempt: AttemptRecord) -> None:
        a = attempt
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO stockade_attempts VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
                " ON CONFLICT (run_id, step, item, attempt) DO UPDATE SET"
                " outcome=EXCLUDED.outcome, exit_code=EXCLUDED.exit_code,"
                " started_at=EXCLUDED.started_at, ended_at=EXCLUDED.ended_at,"
                " message=EXCLUDED.message, provenance=EXCLUDED.provenance",
                (a.run_id, a.step, a.item, a.attempt, a.outcome, a.exit_code, a.started_at,
                 a.ended_at, a.message, None if a.provenance is None else dump_json(a.provenance)),
            )

    def complete_item(self, item: ItemRecord, outputs: list[ArtifactRecord]) -> None:
        i = item
        with self._tx() as cur:
            cur.execute(
                "DELETE FROM stockade_artifacts WHERE run_id=%s AND step=%s AND item=%s",
                (i.run_id, i.step, i.item),
            )
            cur.execute(
                f"INSERT INTO stockade_items ({ITEM_COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
                " ON CONFLICT (run_id, step, item) DO UPDATE SET status=EXCLUDED.status,"
                " attempt=EXCLUDED.attempt, result=EXCLUDED.result, value=EXCLUDED.value,"
                " message=EXCLUDED.message, started_at=EXCLUDED.started_at,"
                " ended_at=EXCLUDED.ended_at, key=EXCLUDED.key, reused_from=EXCLUDED.reused_from,"
                " usage=EXCLUDED.usage, not_reused=EXCLUDED.not_reused",
                (i.run_id, i.step, i.item, i.status, i.attempt, dump_json(i.result), dump_json(i.value),
                 i.message, i.started_at, i.ended_at, i.key,
                 None if i.reused_from is None else dump_json(i.reused_from),
                 dump_json(dict(i.usage)), i.not_reused),
            )
            if outputs:
                cur.executemany(
                    "INSERT INTO stockade_artifacts VALUES (%s,%s,%s,%s,%s,%s,%s)",
                    [(a.run_id, a.step, a.item, a.attempt, a.name, a.sha256, a.size)
                     for a in outputs],
                )

    def forget_item(self, run_id: str, step: str, item: int) -> None:
        with self._tx() as cur:
            args = (run_id, step, item)
            cur.execute(
                "DELETE FROM stockade_artifacts WHERE run_id=%s AND step=%s AND item=%s", args
            )
            cur.execute("DELETE FROM stockade_items WHERE run_id=%s AND step=%s AND item=%s", args)

    def span_bins(self, run_id: str, origin: float, width: float) -> list[tuple[str, str, int, int]]:
        return [(r[0], r[1], int(r[2]), int(r[3])) for r in self._rows(
            "SELECT step, status, CAST(FLOOR((ended_at - %s) / %s) AS INTEGER) AS b, COUNT(*)"
            " FROM stockade_items WHERE run_id=%s AND (attempt>0 OR status<>'skipped')"
            " GROUP BY step, status, b", (origin, width, run_id))]

    # -- events ------------------------------------------------------------

    def add_event(self, event: Event) -> None:
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO stockade_events (run_id, at, kind, data) VALUES (%s,%s,%s,%s)",
                (event.run_id, event.at, event.kind, dump_json(event.data)),
            )

    # -- leases ------------------------------------------------------------

    def db_now(self) -> float:
        return float(self._rows(f"SELECT {NOW_SQL}")[0][0])

    def acquire_lease(
        self, name: str, holder: str, ttl: float, *, user: str = "", now: float | None = None
    ) -> Lease | None:
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO stockade_leases VALUES (%s, '', 0, 0) ON CONFLICT DO NOTHING", (name,)
            )
            row = cur.execute(
                "WITH t AS (SELECT COALESCE(%(now)s::float8, " + NOW_SQL + ") AS now)"
                " UPDATE stockade_leases SET"
                " token = CASE WHEN holder = %(holder)s THEN token ELSE token + 1 END,"
                " holder = %(holder)s, expires_at = t.now + %(ttl)s"
                " FROM t WHERE name = %(name)s AND (holder = %(holder)s OR expires_at <= t.now)"
                " RETURNING token, expires_at",
                {"now": now, "holder": holder, "ttl": ttl, "name": name},
            ).fetchone()
            if row is None:
                return None
            cur.execute(
                "DELETE FROM stockade_lease_users WHERE name = %s AND holder <> %s", (name, holder)
            )
            cur.execute(
                "INSERT INTO stockade_lease_users VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                (name, holder, user),
            )
            return Lease(name=name, holder=holder, token=int(row[0]), expires_at=float(row[1]))

    def renew_lease(
        self, name: str, holder: str, token: int, ttl: float, *, now: float | None = None
    ) -> Lease | None:
        with self._tx() as cur:
            row = cur.execute(
                "WITH t AS (SELECT COALESCE(%(now)s::float8, " + NOW_SQL + ") AS now)"
                " UPDATE stockade_leases SET expires_at = t.now + %(ttl)s FROM t"
                " WHERE name = %(name)s AND holder = %(holder)s AND token = %(token)s"
                " AND expires_at > t.now RETURNING expires_at",
                {"now": now, "ttl": ttl, "name": name, "holder": holder, "token": token},
            ).fetchone()
        if row is None:
            return None
        return Lease(name=name, holder=holder, token=token, expires_at=float(row[0]))

    def release_lease(
        self, name: str, holder: str, *, user: str = "", now: float | None = None
    ) -> None:
        with self._tx() as cur:
            # The lease row first, as acquire_lease takes it: the opposite
            # order (users, then lease) deadlocked against a concurrent acquire.
            cur.execute("SELECT 1 FROM stockade_leases WHERE name = %s FOR UPDATE", (name,))
            cur.execute(
                'DELETE FROM stockade_lease_users WHERE name = %s AND holder = %s AND "user" = %s',
                (name, holder, user),
            )
            cur.execute(
                "UPDATE stockade_leases SET expires_at ="
                " LEAST(expires_at, COALESCE(%(now)s::float8, " + NOW_SQL + "))"
                " WHERE name = %(name)s AND holder = %(holder)s AND NOT EXISTS"
                " (SELECT 1 FROM stockade_lease_users u"
                "  WHERE u.name = %(name)s AND u.holder = %(holder)s)",
                {"now": now, "name": name, "holder": holder},
            )

    # -- fences ------------------------------------------------------------

    def advance_fence(self, scope: str, token: int, holder: str) -> FenceCheck:
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO stockade_fences VALUES (%s, 0, '') ON CONFLICT DO NOTHING", (scope,)
            )
            row = cur.execute(
                "SELECT high_water, holder FROM stockade_fences WHERE scope = %s FOR UPDATE",
                (scope,),
            ).fetchone()
            assert row is not None
            if token < row[0]:
                return FenceCheck(accepted=False, high_water=int(row[0]), holder=str(row[1]))
            cur.execute(
                "UPDATE stockade_fences SET high_water = %s, holder = %s WHERE scope = %s",
                (token, holder, scope),
            )
            return FenceCheck(accepted=True, high_water=token, holder=holder)

    # -- effects -----------------------------------------------------------

    def claim_effect(self, effect: Effect) -> Effect:
        e = effect
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO stockade_effects VALUES"
                " (%s,%s,%s,%s,%s,%s,%s,%s,%s,'claimed',%s,%s,NULL,%s)"
                " ON CONFLICT (key) DO UPDATE SET attempt = EXCLUDED.attempt,"
                " lease = EXCLUDED.lease, sink = EXCLUDED.sink, sink_key = EXCLUDED.sink_key,"
                " payload_sha256 = EXCLUDED.payload_sha256, token = EXCLUDED.token,"
                " claimed_at = EXCLUDED.claimed_at, message = EXCLUDED.message"
                " WHERE stockade_effects.status = 'claimed'",
                (e.key, e.run_id, e.step, e.item, e.attempt, e.lease, e.sink, e.sink_key,
                 e.payload_sha256, e.token, e.claimed_at, e.message),
            )
            row = cur.execute("SELECT * FROM stockade_effects WHERE key = %s", (e.key,)).fetchone()
        assert row is not None
        return effect_from_row(row)

    def finish_effect(
        self, key: str, *, status: str, token: int | None, at: float, message: str = ""
    ) -> None:
        if status not in ("done", "fenced"):
            raise ValueError(f"an effect finishes as done or fenced, not {status!r}")
        with self._tx() as cur:
            cur.execute(
                "UPDATE stockade_effects SET status = %s, token = %s, finished_at = %s,"
                " message = %s WHERE key = %s AND status = 'claimed'",
                (status, token, at, message, key),
            )

    def swap_last_publish(self, record: PublishRecord) -> PublishRecord | None:
        r = record
        with self._tx() as cur:
            old = cur.execute(
                "SELECT lease, run_id, key, payload_sha256, input_fingerprint, at, run_started_at, token FROM stockade_last_publish WHERE lease = %s FOR UPDATE",
                (r.lease,),
            ).fetchone()
            cur.execute(
                "INSERT INTO stockade_last_publish (lease, run_id, key, payload_sha256, input_fingerprint, at, run_started_at, token) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)"
                " ON CONFLICT (lease) DO UPDATE SET run_id = EXCLUDED.run_id,"
                " key = EXCLUDED.key, payload_sha256 = EXCLUDED.payload_sha256,"
                " input_fingerprint = EXCLUDED.input_fingerprint, at = EXCLUDED.at,"
                " run_started_at = EXCLUDED.run_started_at, token = EXCLUDED.token",
                (r.lease, r.run_id, r.key, r.payload_sha256, r.input_fingerprint, r.at,
                 r.run_started_at, r.token),
            )
        return PublishRecord(*old) if old else None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
