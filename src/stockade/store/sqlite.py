"""SQLite implementation of the run store (WAL mode, one file per root).

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from stockade.store.base import (
    ArtifactRecord,
    AttemptRecord,
    Event,
    ItemRecord,
    RunExists,
    RunRecord,
    Store,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    workflow TEXT NOT NULL,
    workflow_path TEXT NOT NULL,
    workflow_sha256 TEXT NOT NULL,
    root TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    sandbox TEXT NOT NULL,
    enforced INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS items (
    run_id TEXT NOT NULL,
    step TEXT NOT NULL,
    item INTEGER NOT NULL,
    status TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    result TEXT,
    value TEXT,
    message TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL NOT NULL,
    PRIMARY KEY (run_id, step, item)
);
CREATE TABLE IF NOT EXISTS artifacts (
    run_id TEXT NOT NULL,
    step TEXT NOT NULL,
    item INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size INTEGER NOT NULL,
    PRIMARY KEY (run_id, step, item, name)
);
CREATE TABLE IF NOT EXISTS attempts (
    run_id TEXT NOT NULL,
    step TEXT NOT NULL,
    item INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    exit_code INTEGER,
    started_at REAL NOT NULL,
    ended_at REAL NOT NULL,
    message TEXT NOT NULL,
    PRIMARY KEY (run_id, step, item, attempt)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_run ON events (run_id, id);
"""


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


class SQLiteStore(Store):
    """A run store in one SQLite file. One connection, serialised by a lock."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=30.0
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=30000")
        self._db.executescript(SCHEMA)

    # -- helpers -----------------------------------------------------------

    def _tx(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in statements:
                    self._db.execute(sql, args)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    # -- runs --------------------------------------------------------------

    def create_run(self, run: RunRecord) -> None:
        try:
            self._tx([(
                "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?)",
                (run.run_id, run.workflow, run.workflow_path, run.workflow_sha256, run.root,
                 run.status, run.started_at, run.ended_at, run.sandbox, int(run.enforced)),
            )])
        except sqlite3.IntegrityError as exc:
            raise RunExists(run.run_id) from exc

    def update_run(self, run_id: str, *, status: str, ended_at: float | None) -> None:
        self._tx([("UPDATE runs SET status=?, ended_at=? WHERE run_id=?", (status, ended_at, run_id))])

    @staticmethod
    def _run(row: tuple[Any, ...]) -> RunRecord:
        return RunRecord(
            run_id=row[0], workflow=row[1], workflow_path=row[2], workflow_sha256=row[3],
            root=row[4], status=row[5], started_at=row[6], ended_at=row[7], sandbox=row[8],
            enforced=bool(row[9]),
        )

    def get_run(self, run_id: str) -> RunRecord | None:
        rows = self._rows("SELECT * FROM runs WHERE run_id=?", (run_id,))
        return self._run(rows[0]) if rows else None

    def list_runs(self, limit: int = 50) -> list[RunRecord]:
        rows = self._rows("SELECT * FROM runs ORDER BY started_at DESC, run_id DESC LIMIT ?", (limit,))
        return [self._run(r) for r in rows]

    # -- attempts and items ------------------------------------------------

    def record_attempt(self, attempt: AttemptRecord) -> None:
        a = attempt
        self._tx([(
            "INSERT OR REPLACE INTO attempts VALUES (?,?,?,?,?,?,?,?,?)",
            (a.run_id, a.step, a.item, a.attempt, a.outcome, a.exit_code, a.started_at,
             a.ended_at, a.message),
        )])

    def attempts(self, run_id: str, step: str, item: int) -> list[AttemptRecord]:
        rows = self._rows(
            "SELECT * FROM attempts WHERE run_id=? AND step=? AND item=? ORDER BY attempt",
            (run_id, step, item),
        )
        return [AttemptRecord(*r) for r in rows]

    def complete_item(self, item: ItemRecord, outputs: list[ArtifactRecord]) -> None:
        i = item
        stmts: list[tuple[str, tuple[Any, ...]]] = [
            ("DELETE FROM artifacts WHERE run_id=? AND step=? AND item=?", (i.run_id, i.step, i.item)),
            (
                "INSERT OR REPLACE INTO items VALUES (?,?,?,?,?,?,?,?,?,?)",
                (i.run_id, i.step, i.item, i.status, i.attempt, _dump(i.result), _dump(i.value),
                 i.message, i.started_at, i.ended_at),
            ),
        ]
        for a in outputs:
            stmts.append((
                "INSERT INTO artifacts VALUES (?,?,?,?,?,?,?)",
                (a.run_id, a.step, a.item, a.attempt, a.name, a.sha256, a.size),
            ))
        self._tx(stmts)

    def forget_item(self, run_id: str, step: str, item: int) -> None:
        self._tx([
            ("DELETE FROM artifacts WHERE run_id=? AND step=? AND item=?", (run_id, step, item)),
            ("DELETE FROM items WHERE run_id=? AND step=? AND item=?", (run_id, step, item)),
        ])

    def items(self, run_id: str, step: str | None = None) -> list[ItemRecord]:
        where, args = ("run_id=?", (run_id,)) if step is None else ("run_id=? AND step=?", (run_id, step))
        arts: dict[tuple[str, int], list[ArtifactRecord]] = {}
        for r in self._rows(f"SELECT * FROM artifacts WHERE {where} ORDER BY name", args):
            arts.setdefault((r[1], r[2]), []).append(ArtifactRecord(*r))
        out = []
        for r in self._rows(f"SELECT * FROM items WHERE {where} ORDER BY step, item", args):
            out.append(ItemRecord(
                run_id=r[0], step=r[1], item=r[2], status=r[3], attempt=r[4],
                result=json.loads(r[5]) if r[5] is not None else None,
                value=json.loads(r[6]) if r[6] is not None else None,
                message=r[7], started_at=r[8], ended_at=r[9],
                outputs=tuple(arts.get((r[1], r[2]), ())),
            ))
        return out

    # -- events ------------------------------------------------------------

    def add_event(self, event: Event) -> None:
        self._tx([(
            "INSERT INTO events (run_id, at, kind, data) VALUES (?,?,?,?)",
            (event.run_id, event.at, event.kind, _dump(event.data)),
        )])

    def events(self, run_id: str, after_id: int = 0) -> list[Event]:
        rows = self._rows(
            "SELECT id, run_id, at, kind, data FROM events WHERE run_id=? AND id>? ORDER BY id",
            (run_id, after_id),
        )
        return [Event(run_id=r[1], at=r[2], kind=r[3], data=json.loads(r[4]), id=r[0]) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
