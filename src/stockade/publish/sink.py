"""What every sink does, and choosing a sink from a ``publish.to`` URL.

A sink applies one write under a fencing token and says what happened as a
value (applied, already applied, fenced, failed). It raises ``InfraError`` only
when it cannot be reached at all.

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from stockade.spec.sinkurl import (
    TABLE_NAME,
    SinkTarget,
    SinkUrlError,
    parse_sink_url,
    redact,
    split_table,
)
from stockade.store.base import Store


@dataclass(frozen=True)
class Write:
    """One fenced write. ``idempotency_key`` is ``run_id/step/item``."""

    idempotency_key: str
    key: str
    payload: Any
    run_id: str
    token: int
    lease: str


@dataclass(frozen=True)
class WriteResult:
    status: Literal["applied", "already", "fenced", "failed"]
    token: int | None
    winner_token: int | None = None
    winner_run: str = ""
    message: str = ""


class Sink(abc.ABC):
    """A place ``publish:`` writes to. ``name`` is the URL with secrets removed."""

    name: str

    @abc.abstractmethod
    def write(self, w: Write) -> WriteResult:
        """Apply ``w`` unless its token is below the sink's high-water mark for ``w.lease``
        (or the row's own token), or its idempotency key has already been applied."""

    @abc.abstractmethod
    def lookup(self, idempotency_key: str, key: str) -> WriteResult | None:
        """Did the write with this idempotency key (to sink key ``key``) land? An ``already`` result if it did, None if it did
        not or the sink cannot tell (then writing again under the same key is safe)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


def fenced_message(token: int, winner: int, winner_run: str, where: str) -> str:
    who = f" (written by run {winner_run})" if winner_run else ""
    return f"fenced out at {where}: token {token} < newer token {winner}{who}"


def _local_path(rest: str, base_dir: Path) -> Path:
    # sqlite:///rel.db and file://rel/dir are relative to the workflow's folder;
    # one more slash (sqlite:////abs.db, file:///abs/dir) makes them absolute.
    p = Path(rest)
    return p if p.is_absolute() else (base_dir / p)


def open_sink(to: str, base_dir: Path, store: Store) -> Sink:
    """The sink named by a rendered ``publish.to``; ``SinkUrlError`` if it names none."""
    target = parse_sink_url(to)
    if target.kind == "sqlite":
        from stockade.publish.sql import SQLiteSink

        return SQLiteSink(_local_path(target.location, base_dir), target.table)
    if target.kind == "postgresql":
        from stockade.publish.sql import PostgresSink

        return PostgresSink(target.location, target.table)
    if target.kind == "file":
        from stockade.publish.directory import DirectorySink

        return DirectorySink(_local_path(target.location, base_dir).resolve(), store)
    from stockade.publish.http import HttpSink

    return HttpSink(to)


__all__ = [
    "TABLE_NAME", "Sink", "SinkTarget", "SinkUrlError", "Write", "WriteResult", "fenced_message",
    "open_sink", "parse_sink_url", "redact", "split_table",
]
