"""The SQLite store's file: its schema and migrations, and opening it.

Opening makes the folder, switches the file to WAL (racing other engines
that open the same new file), creates the tables and brings an older file up
to date. A file that cannot be used ends in an ``InfraError`` that names it
and the options choosing another.

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

from stockade.errors import InfraError

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
    key TEXT NOT NULL DEFAULT '',
    reused_from TEXT,
    usage TEXT NOT NULL DEFAULT '{}',
    not_reused TEXT,
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
    provenance TEXT,
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
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS lease_users (
    name TEXT NOT NULL,
    holder TEXT NOT NULL,
    user TEXT NOT NULL,
    PRIMARY KEY (name, holder, user)
);
CREATE TABLE IF NOT EXISTS fences (
    scope TEXT PRIMARY KEY,
    high_water INTEGER NOT NULL,
    holder TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS effects (
    key TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    step TEXT NOT NULL,
    item INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    lease TEXT NOT NULL,
    sink TEXT NOT NULL,
    sink_key TEXT NOT NULL,
    payload_sha256 TEXT NOT NULL,
    status TEXT NOT NULL,
    token INTEGER,
    claimed_at REAL NOT NULL,
    finished_at REAL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS effects_run ON effects (run_id, key);
CREATE TABLE IF NOT EXISTS reuse_index (
    key TEXT NOT NULL,
    run_id TEXT NOT NULL,
    step TEXT NOT NULL,
    item INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (key, run_id, step, item)
);
CREATE INDEX IF NOT EXISTS reuse_run ON reuse_index (run_id);
CREATE TABLE IF NOT EXISTS removed_runs (
    run_id TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS last_publish (
    lease TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    payload_sha256 TEXT NOT NULL,
    input_fingerprint TEXT NOT NULL,
    at REAL NOT NULL,
    run_started_at REAL NOT NULL DEFAULT 0,
    token INTEGER NOT NULL DEFAULT 0
);
"""


def connect(path: str) -> sqlite3.Connection:
    """A connection to the store at ``path`` (or ``:memory:``), set up and migrated."""
    db: sqlite3.Connection | None = None
    try:
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30.0)
        db.execute("PRAGMA busy_timeout=30000")
        _wal(db)
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(SCHEMA)
        _migrate(db)
    except (OSError, sqlite3.DatabaseError) as exc:
        if db is not None:
            db.close()
        if path != ":memory:" and os.path.isfile(path) and _on_read_only(path):
            return _read_only(path)
        raise InfraError(_unusable(path, exc)) from None
    return db


def _on_read_only(path: str) -> bool:
    """Whether ``path`` is on a read-only filesystem, where SQLite cannot make a
    WAL store's shared-memory file (and no one can change the store)."""
    try:
        return bool(os.statvfs(os.path.dirname(os.path.abspath(path))).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _read_only(path: str) -> sqlite3.Connection:
    """The store opened for reading only: ``runs``, ``show`` and ``logs`` work on a
    root mounted read-only (an archive, a snapshot); a write says where and why
    (``SQLiteStore``). ``immutable``: on a read-only mount no one changes it."""
    uri = f"file:{quote(os.path.abspath(path))}?immutable=1"
    try:
        return sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
    except sqlite3.DatabaseError as exc:
        raise InfraError(_unusable(path, exc)) from None


def _wal(db: sqlite3.Connection) -> None:
    # Switching a new file to WAL while another connection does the same
    # answers "database is locked" at once: SQLite skips the busy handler
    # there. Several engines (or test threads) opening one new store race
    # on it, so wait and retry, as the busy handler would have.
    for delay in (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0):
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            time.sleep(delay)
    db.execute("PRAGMA journal_mode=WAL")


def _migrate(db: sqlite3.Connection) -> None:
    # Stores made before last_publish learnt who published and with which token.
    have = {r[1] for r in db.execute("PRAGMA table_info(last_publish)")}
    for col, decl in (("run_started_at", "REAL NOT NULL DEFAULT 0"),
                      ("token", "INTEGER NOT NULL DEFAULT 0")):
        if col not in have:
            db.execute(f"ALTER TABLE last_publish ADD COLUMN {col} {decl}")
    # Stores made before items had keys, reuse origins, token usage, reasons
    # for not reusing.
    columns = {r[1] for r in db.execute("PRAGMA table_info(items)")}
    if "key" not in columns:
        db.execute("ALTER TABLE items ADD COLUMN key TEXT NOT NULL DEFAULT ''")
    if "reused_from" not in columns:
        db.execute("ALTER TABLE items ADD COLUMN reused_from TEXT")
    if "usage" not in columns:
        db.execute("ALTER TABLE items ADD COLUMN usage TEXT NOT NULL DEFAULT '{}'")
    if "not_reused" not in columns:
        db.execute("ALTER TABLE items ADD COLUMN not_reused TEXT")
    if "provenance" not in {r[1] for r in db.execute("PRAGMA table_info(attempts)")}:
        db.execute("ALTER TABLE attempts ADD COLUMN provenance TEXT")
    # After the key column exists: looking an item up by key in a 10,000-item step.
    db.execute("CREATE INDEX IF NOT EXISTS items_key ON items (run_id, step, key)")
    # Counts per step and status read from the index alone (``show`` and
    # the UI on a 100,000-item run: 150 ms of table scan to 40 ms).
    db.execute("CREATE INDEX IF NOT EXISTS items_tally ON items "
               "(run_id, step, status, started_at, ended_at)")


#: Where a user points stockade at another store, said after why this one fails.
_ELSEWHERE = "choose another root (--root, $STOCKADE_HOME) or store ($STOCKADE_STORE)"


def _unusable(path: str, exc: BaseException) -> str:
    """Why the store file at ``path`` cannot be opened, and what to change."""
    where = Path(path)
    if isinstance(exc, OSError):
        return (f"cannot make the run store's folder {where.parent}: "
                f"{exc.strerror or exc}; {_ELSEWHERE}")
    if "not a database" in str(exc):
        return f"{where} is not a SQLite database: move it aside or {_ELSEWHERE}"
    if where.is_dir():
        return (f"{where} is a folder, not the run store's database file: move it aside "
                f"or {_ELSEWHERE}")
    return (f"cannot open the run store {where}: {exc}; make it and its folder readable and "
            f"writable for this user, or {_ELSEWHERE}")
