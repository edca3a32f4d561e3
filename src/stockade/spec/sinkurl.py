"""The ``publish.to`` URL grammar: which sinks a workflow can name.

Pure: parsing only, nothing is opened. ``spec`` checks literal URLs with it at
load time (so ``validate`` reports a bad sink with its position) and
``publish.sink`` opens what it parsed.

Must not import workspace, sandbox, runner, agent, publish, store, web or cli.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class SinkUrlError(ValueError):
    """``publish.to`` does not name a sink this engine can write to."""


@dataclass(frozen=True)
class SinkTarget:
    """What a ``publish.to`` URL names, before anything is opened."""

    kind: Literal["sqlite", "postgresql", "file", "http"]
    #: sqlite: the database path as written (relative to the workflow's folder unless
    #: absolute); postgresql: the conninfo without ``table``; file: the folder; http: the URL.
    location: str
    table: str = ""


def split_table(url: str, shown: str | None = None) -> tuple[str, str]:
    """``...?table=t&x=y`` -> (``...?x=y``, ``t``), the table name checked;
    ``shown``: the URL as messages name it (default ``url``)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    tables = [v for k, v in query if k == "table"]
    if len(tables) != 1:
        raise SinkUrlError(f"sink URL {redact(shown or url)!r} needs exactly one ?table=NAME "
                           f"({'none' if not tables else f'{len(tables)} given'})")
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


def parse_sink_url(to: str) -> SinkTarget:
    """Check a ``publish.to`` URL without opening anything; ``SinkUrlError`` says what is wrong."""
    if to.startswith("sqlite://"):
        body, _, query = to[len("sqlite://"):].partition("?")
        _, table = split_table("sqlite:?" + query, to)
        # sqlite:///rel.db -> "/rel.db" -> "rel.db"; sqlite:////abs.db -> "/abs.db".
        path = body[1:] if body.startswith("/") else ""
        if not path:
            raise SinkUrlError(f"sink URL {to!r} names no database file "
                               "(sqlite:///file.db?table=t, relative to the workflow)")
        return SinkTarget("sqlite", path, table)
    if to.startswith(("postgresql://", "postgres://")):
        conninfo, table = split_table(to)
        return SinkTarget("postgresql", conninfo, table)
    if to.startswith("file://"):
        rest = to[len("file://"):]
        if not rest or "?" in rest or "#" in rest:
            raise SinkUrlError(f"sink URL {to!r}: use file:///abs/dir or file://rel/dir")
        return SinkTarget("file", rest)
    if to.startswith(("http://", "https://")):
        if not urlsplit(to).hostname:
            raise SinkUrlError(f"sink URL {redact(to)!r} names no host")
        return SinkTarget("http", to)
    raise SinkUrlError(
        f"unknown sink {redact(to)!r}: use sqlite:///file.db?table=t, postgresql://...?table=t,"
        " file:///dir or http(s)://..."
    )
