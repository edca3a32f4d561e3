"""SQLite implementation of the run store (WAL mode, one file per root).

The reads are the shared queries of ``store._sql``, and the file's schema,
migrations and opening are in ``store._sqlite_file``; here are the writes
with their transactions (``BEGIN IMMEDIATE`` on one connection;
``synchronous=FULL`` for leases, fences and effects).

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stockade.errors import InfraError
from stockade.store._rows import (
    ITEM_COLUMNS,
    dump_json,
    effect_from_row,
)
from stockade.store._sql import SQLStore
from stockade.store._sqlite_file import connect
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

#: The database clock in seconds. ``unixepoch('subsec')`` needs SQLite 3.42 and
#: returns NULL on the 3.40 this project runs on; julianday works everywhere.
NOW_SQL = "(julianday('now') - 2440587.5) * 86400.0"


_DELETE_OUTPUTS = "DELETE FROM artifacts WHERE run_id=? AND step=? AND item=?"
_INSERT_ITEM = f"INSERT OR REPLACE INTO items ({ITEM_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
_INSERT_OUTPUT = "INSERT INTO artifacts VALUES (?,?,?,?,?,?,?)"


class SQLiteStore(SQLStore):
    """A run store in one SQLite file. One connection, serialised by a lock."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        self._lock = threading.RLock()
        self._db = connect(self.path)

    # -- helpers -----------------------------------------------------------

    def _tx(
        self,
        statements: list[tuple[str, tuple[Any, ...]]]
        | Callable[[], list[tuple[str, tuple[Any, ...]]]],
    ) -> None:
        """Run ``statements`` in one write transaction; a callable is asked for
        them inside it (what they are may depend on what the store holds)."""
        with self._lock, self._writable():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if callable(statements):
                    statements = statements()
                # Runs of one statement go as one executemany (a batch of
                # finished items: a few calls instead of two per item).
                for sql, group in itertools.groupby(statements, key=lambda st: st[0]):
                    self._db.executemany(sql, [args for _, args in group])
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextmanager
    def _writable(self) -> Iterator[None]:
        """A store on a read-only filesystem (or a file this user may not
        write) is named with what to change, not a traceback from sqlite3."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "readonly" not in str(exc) and "read-only" not in str(exc):
                raise
            raise InfraError(f"the run store {self.path} cannot be written ({exc}); make the "
                             "root writable, or choose another root (--root, $STOCKADE_HOME) "
                             "or store ($STOCKADE_STORE)") from None

    @contextmanager
    def _durable_tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that is on disk when it returns (leases, fences, effects).

        ``synchronous`` cannot change inside a transaction, so it is raised around it.
        """
        with self._lock, self._writable():
            self._db.execute("PRAGMA synchronous=FULL")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            finally:
                self._db.execute("PRAGMA synchronous=NORMAL")

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    # -- runs --------------------------------------------------------------

    def create_run(self, run: RunRecord) -> None:
        def insert() -> list[tuple[str, tuple[Any, ...]]]:
            if self._db.execute("SELECT 1 FROM removed_runs WHERE run_id=?",
                                (run.run_id,)).fetchone():
                raise RunExists(run.run_id, removed=True)
            return [("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?)",
                     (run.run_id, run.workflow, run.workflow_path, run.workflow_sha256, run.root,
                      run.status, run.started_at, run.ended_at, run.sandbox,
                      int(run.enforced)))]

        try:
            self._tx(insert)
        except sqlite3.IntegrityError as exc:
            raise RunExists(run.run_id) from exc

    def update_run(self, run_id: str, *, status: str, ended_at: float | None) -> None:
        self._tx([("UPDATE runs SET status=?, ended_at=? WHERE run_id=?", (status, ended_at, run_id))])

    def delete_run(self, run_id: str) -> None:
        self._tx([(f"DELETE FROM {table} WHERE run_id=?", (run_id,))
                  for table in ("artifacts", "items", "attempts", "events", "effects",
                                "reuse_index", "runs")]
                 + [("INSERT OR IGNORE INTO removed_runs VALUES (?)", (run_id,))])

    # -- reuse across runs ---------------------------------------------------

    def index_reuse(self, entries: list[ReuseEntry]) -> None:
        if not entries:
            return
        stmts: list[tuple[str, tuple[Any, ...]]] = [
            ("INSERT OR REPLACE INTO reuse_index VALUES (?,?,?,?,?,?)",
             (e.key, e.run_id, e.step, e.item, e.attempt, e.created_at)) for e in entries]
        for part in self._chunks(sorted({e.key for e in entries})):
            cond, args = self._in("key", part)
            stmts.append((
                "DELETE FROM reuse_index WHERE (key, run_id, step, item) IN ("
                " SELECT key, run_id, step, item FROM (SELECT key, run_id, step, item,"
                " ROW_NUMBER() OVER (PARTITION BY key ORDER BY created_at DESC) AS n"
                f" FROM reuse_index WHERE {cond}) WHERE n > ?)",
                (*args, REUSE_KEEP)))
        self._tx(stmts)

    # -- attempts and items ------------------------------------------------

    @staticmethod
    def _attempt_stmt(a: AttemptRecord) -> tuple[str, tuple[Any, ...]]:
        return (
            "INSERT OR REPLACE INTO attempts VALUES (?,?,?,?,?,?,?,?,?,?)",
            (a.run_id, a.step, a.item, a.attempt, a.outcome, a.exit_code, a.started_at,
             a.ended_at, a.message, None if a.provenance is None else dump_json(a.provenance)),
        )

    def record_attempt(self, attempt: AttemptRecord) -> None:
        self._tx([self._attempt_stmt(attempt)])

    @staticmethod
    def _item_row(i: ItemRecord) -> tuple[Any, ...]:
        return (i.run_id, i.step, i.item, i.status, i.attempt, dump_json(i.result),
                dump_json(i.value), i.message, i.started_at, i.ended_at, i.key,
                None if i.reused_from is None else dump_json(i.reused_from),
                dump_json(dict(i.usage)) if i.usage else "{}", i.not_reused)

    @staticmethod
    def _output_row(a: ArtifactRecord) -> tuple[Any, ...]:
        return (a.run_id, a.step, a.item, a.attempt, a.name, a.sha256, a.size)

    def complete_item(self, item: ItemRecord, outputs: list[ArtifactRecord]) -> None:
        self._tx([(_DELETE_OUTPUTS, (item.run_id, item.step, item.item)),
                  (_INSERT_ITEM, self._item_row(item)),
                  *((_INSERT_OUTPUT, self._output_row(a)) for a in outputs)])

    def record_batch(
        self,
        attempts: list[AttemptRecord],
        items: list[tuple[ItemRecord, list[ArtifactRecord]]],
    ) -> None:
        if not attempts and not items:
            return

        def statements() -> list[tuple[str, tuple[Any, ...]]]:
            # A step of this run with no output recorded yet has no earlier
            # outputs to delete: one look per step and batch instead of a
            # DELETE per item (a third of the store's time on a keep: over
            # 100,000 items, whose items never have outputs).
            steps = {(item.run_id, item.step) for item, _ in items}
            with_outputs = {key for key in steps if self._db.execute(
                "SELECT 1 FROM artifacts WHERE run_id=? AND step=? LIMIT 1", key).fetchone()}
            # By kind, not by item (so _tx sends each kind at once): every
            # item's old outputs go before any new one is inserted, and an
            # item completes once per batch.
            return [
                *(self._attempt_stmt(a) for a in attempts),
                *((_DELETE_OUTPUTS, (i.run_id, i.step, i.item)) for i, _ in items
                  if (i.run_id, i.step) in with_outputs),
                *((_INSERT_ITEM, self._item_row(i)) for i, _ in items),
                *((_INSERT_OUTPUT, self._output_row(a)) for _, outputs in items for a in outputs),
            ]

        self._tx(statements)

    def forget_item(self, run_id: str, step: str, item: int) -> None:
        self._tx([
            ("DELETE FROM artifacts WHERE run_id=? AND step=? AND item=?", (run_id, step, item)),
            ("DELETE FROM items WHERE run_id=? AND step=? AND item=?", (run_id, step, item)),
        ])

    def span_bins(self, run_id: str, origin: float, width: float) -> list[tuple[str, str, int, int]]:
        return [(r[0], r[1], int(r[2]), int(r[3])) for r in self._rows(
            "SELECT step, status, CAST((ended_at - ?) / ? AS INTEGER) AS b, COUNT(*) FROM items "
            "WHERE run_id=? AND (attempt>0 OR status!='skipped') GROUP BY step, status, b",
            (origin, width, run_id))]

    # -- events ------------------------------------------------------------

    def add_event(self, event: Event) -> None:
        self._tx([(
            "INSERT INTO events (run_id, at, kind, data) VALUES (?,?,?,?)",
            (event.run_id, event.at, event.kind, dump_json(event.data)),
        )])

    # -- leases ------------------------------------------------------------

    def db_now(self) -> float:
        return float(self._rows(f"SELECT {NOW_SQL}")[0][0])

    def _now(self, db: sqlite3.Connection, now: float | None) -> float:
        if now is not None:
            return now
        return float(db.execute(f"SELECT {NOW_SQL}").fetchone()[0])

    def acquire_lease(
        self, name: str, holder: str, ttl: float, *, user: str = "", now: float | None = None
    ) -> Lease | None:
        with self._durable_tx() as db:
            t = self._now(db, now)
            db.execute(
                "INSERT OR IGNORE INTO leases VALUES (?, '', 0, 0.0)", (name,)
            )
            row = db.execute(
                "UPDATE leases SET"
                " token = CASE WHEN holder = ?1 THEN token ELSE token + 1 END,"
                " holder = ?1, expires_at = ?2 + ?3"
                " WHERE name = ?4 AND (holder = ?1 OR expires_at <= ?2)"
                " RETURNING token, expires_at",
                (holder, t, ttl, name),
            ).fetchone()
            if row is None:
                return None
            # Users of a previous holder are gone with its lease.
            db.execute("DELETE FROM lease_users WHERE name = ? AND holder <> ?", (name, holder))
            db.execute("INSERT OR IGNORE INTO lease_users VALUES (?, ?, ?)", (name, holder, user))
            return Lease(name=name, holder=holder, token=int(row[0]), expires_at=float(row[1]))

    def renew_lease(
        self, name: str, holder: str, token: int, ttl: float, *, now: float | None = None
    ) -> Lease | None:
        with self._durable_tx() as db:
            t = self._now(db, now)
            row = db.execute(
                "UPDATE leases SET expires_at = ?1 + ?2"
                " WHERE name = ?3 AND holder = ?4 AND token = ?5 AND expires_at > ?1"
                " RETURNING expires_at",
                (t, ttl, name, holder, token),
            ).fetchone()
            if row is None:
                return None
            return Lease(name=name, holder=holder, token=token, expires_at=float(row[0]))

    def release_lease(
        self, name: str, holder: str, *, user: str = "", now: float | None = None
    ) -> None:
        with self._durable_tx() as db:
            t = self._now(db, now)
            db.execute(
                "DELETE FROM lease_users WHERE name = ? AND holder = ? AND user = ?",
                (name, holder, user),
            )
            db.execute(
                "UPDATE leases SET expires_at = MIN(expires_at, ?1)"
                " WHERE name = ?2 AND holder = ?3 AND NOT EXISTS"
                " (SELECT 1 FROM lease_users u WHERE u.name = ?2 AND u.holder = ?3)",
                (t, name, holder),
            )

    # -- fences ------------------------------------------------------------

    def advance_fence(self, scope: str, token: int, holder: str) -> FenceCheck:
        with self._durable_tx() as db:
            db.execute("INSERT OR IGNORE INTO fences VALUES (?, 0, '')", (scope,))
            hw, who = db.execute(
                "SELECT high_water, holder FROM fences WHERE scope = ?", (scope,)
            ).fetchone()
            if token < hw:
                return FenceCheck(accepted=False, high_water=int(hw), holder=str(who))
            db.execute(
                "UPDATE fences SET high_water = ?, holder = ? WHERE scope = ?", (token, holder, scope)
            )
            return FenceCheck(accepted=True, high_water=token, holder=holder)

    # -- effects -----------------------------------------------------------

    def claim_effect(self, effect: Effect) -> Effect:
        e = effect
        with self._durable_tx() as db:
            db.execute(
                "INSERT INTO effects VALUES (?,?,?,?,?,?,?,?,?,'claimed',?,?,NULL,?)"
                " ON CONFLICT (key) DO UPDATE SET attempt = excluded.attempt,"
                " lease = excluded.lease, sink = excluded.sink, sink_key = excluded.sink_key,"
                " payload_sha256 = excluded.payload_sha256, token = excluded.token,"
                " claimed_at = excluded.claimed_at, message = excluded.message"
                " WHERE effects.status = 'claimed'",
                (e.key, e.run_id, e.step, e.item, e.attempt, e.lease, e.sink, e.sink_key,
                 e.payload_sha256, e.token, e.claimed_at, e.message),
            )
            row = db.execute("SELECT * FROM effects WHERE key = ?", (e.key,)).fetchone()
        return effect_from_row(row)

    def finish_effect(
        self, key: str, *, status: str, token: int | None, at: float, message: str = ""
    ) -> None:
        if status not in ("done", "fenced"):
            raise ValueError(f"an effect finishes as done or fenced, not {status!r}")
        with self._durable_tx() as db:
            db.execute(
                "UPDATE effects SET status = ?, token = ?, finished_at = ?, message = ?"
                " WHERE key = ? AND status = 'claimed'",
                (status, token, at, message, key),
            )

    def swap_last_publish(self, record: PublishRecord) -> PublishRecord | None:
        r = record
        with self._durable_tx() as db:
            old = db.execute(
                "SELECT lease, run_id, key, payload_sha256, input_fingerprint, at, run_started_at, token FROM last_publish WHERE lease = ?", (r.lease,)
            ).fetchone()
            db.execute(
                "INSERT OR REPLACE INTO last_publish (lease, run_id, key, payload_sha256, input_fingerprint, at, run_started_at, token) VALUES (?,?,?,?,?,?,?,?)",
                (r.lease, r.run_id, r.key, r.payload_sha256, r.input_fingerprint, r.at,
                 r.run_started_at, r.token),
            )
        return PublishRecord(*old) if old else None

    def close(self) -> None:
        with self._lock:
            self._db.close()
