"""The run store: pick an implementation from a URL (``--store`` / ``STOCKADE_STORE``).

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

from pathlib import Path

from stockade.errors import UserError
from stockade.store.base import (
    EFFECT_STATUSES,
    ArtifactRecord,
    AttemptRecord,
    Effect,
    Event,
    FenceCheck,
    ItemRecord,
    ItemSpan,
    Lease,
    PublishRecord,
    ReuseCandidate,
    ReuseEntry,
    RunExists,
    RunRecord,
    StepTally,
    Store,
)
from stockade.store.sqlite import SQLiteStore

__all__ = [
    "EFFECT_STATUSES",
    "ArtifactRecord",
    "AttemptRecord",
    "Effect",
    "Event",
    "FenceCheck",
    "ItemRecord",
    "ItemSpan",
    "Lease",
    "PublishRecord",
    "ReuseCandidate",
    "ReuseEntry",
    "RunExists",
    "RunRecord",
    "SQLiteStore",
    "StepTally",
    "Store",
    "open_store",
]


def open_store(url: str | None, root: Path) -> Store:
    """``None`` or ``""``: SQLite at ``root/stockade.db``; ``sqlite:///path`` (relative to
    the current directory; ``sqlite:////abs`` absolute); ``postgresql://...`` or
    ``postgres://...``: PostgreSQL. Raises ``UserError`` for anything else and
    ``InfraError`` when the database cannot be reached."""
    if not url:
        return SQLiteStore(Path(root) / "stockade.db")
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not path:
            raise UserError(f"store URL {url!r} names no file (sqlite:///path/to/stockade.db)")
        return SQLiteStore(path if path == ":memory:" else Path(path))
    if url.startswith(("postgresql://", "postgres://")):
        from stockade.store.postgres import PostgresStore

        return PostgresStore(url)
    raise UserError(
        f"unknown store URL {url!r}: use sqlite:///path/to/stockade.db or postgresql://..."
    )
