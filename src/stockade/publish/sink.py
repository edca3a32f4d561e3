"""What every sink does, and choosing a sink from a ``publish.to`` URL.

A sink applies one write under a fencing token and says what happened as a
value (applied, already applied, fenced, failed). It raises ``InfraError`` only
when it cannot be reached at all.

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from stockade.store.base import Store

TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class SinkUrlError(ValueError):
    """``publish.to`` does not name a sink this engine can write to."""


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


def split_table(url: str) -> tuple[str, str]:
    """``...?table=t&x=y`` -> (``...?x=y``, ``t``), the table name checked."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    tables = [v for k, v in query if k == "table"]
    if len(tables) != 1:
        raise SinkUrlError(f"sink URL {redact(url)!r} needs exactly one ?table=NAME")
    table = tables[0]
    if not TABLE_NAME.match(table):
        raise SinkUrlError(f"table name {table!r} must match {TABLE_NAME.pattern}")
    rest = urlencode([(k, v) for k, v in query if k != "table"], safe="/")
    return urlunsplit(parts._replace(query=rest)), table


def redact(url: str) -> str:
    """The URL without a password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def _local_path(rest: str, base_dir: Path) -> Path:
    # sqlite:///rel.db and file://rel/dir are relative to the workflow's folder;
    # one more slash (sqlite:////abs.db, file:///abs/dir) makes them absolute.
    p = Path(rest)
    return p if p.is_absolute() else (base_dir / p)


def open_sink(to: str, base_dir: Path, store: Store) -> Sink:
    """The sink named by a rendered ``publish.to``; ``SinkUrlError`` if it names none."""
    if to.startswith("sqlite://"):
        from stockade.publish.sql import SQLiteSink

        body, _, query = to[len("sqlite://"):].partition("?")
        _, table = split_table("sqlite:?" + query)
        # sqlite:///rel.db -> "/rel.db" -> "rel.db"; sqlite:////abs.db -> "/abs.db".
        path = body[1:] if body.startswith("/") else ""
        if not path:
            raise SinkUrlError(f"sink URL {to!r} names no database file")
        return SQLiteSink(_local_path(path, base_dir), table)
    if to.startswith(("postgresql://", "postgres://")):
        from stockade.publish.sql import PostgresSink

        conninfo, table = split_table(to)
        return PostgresSink(conninfo, table)
    if to.startswith("file://"):
        from stockade.publish.directory import DirectorySink

        rest = to[len("file://"):]
        if not rest or "?" in rest or "#" in rest:
            raise SinkUrlError(f"sink URL {to!r}: use file:///abs/dir or file://rel/dir")
        return DirectorySink(_local_path(rest, base_dir).resolve(), store)
    if to.startswith(("http://", "https://")):
        from stockade.publish.http import HttpSink

        return HttpSink(to)
    raise SinkUrlError(
        f"unknown sink {redact(to)!r}: use sqlite:///file.db?table=t, postgresql://...?table=t,"
        " file:///dir or http(s)://..."
    )
