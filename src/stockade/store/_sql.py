"""The store's reads, written once for every SQL dialect.

Queries here are spelt as SQLite spells them: ``?`` placeholders, the bare
table names. A dialect runs them through ``_read``, which hands ``_rows``
its own spelling (``to_postgres`` for PostgreSQL: ``%s``, tables prefixed
``stockade_``), and says how it matches a column against a list (``_in``).
The writes stay in each dialect: their transactions, conflicts and clocks
differ (``BEGIN IMMEDIATE`` and one connection; row locks on a pool).

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import abc
import functools
import json
import re
from collections.abc import Sequence
from typing import Any

from stockade.store._rows import (
    ITEM_COLUMNS,
    SPAN_COLUMNS,
    attempt_from_row,
    effect_from_row,
    item_from_row,
    reuse_found,
    run_from_row,
    run_tallies_from_rows,
    spans_from_rows,
    tallies_from_rows,
)
from stockade.store.base import (
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
    RunRecord,
    StepTally,
    Store,
)

#: Every table of the store, as SQLite names it (both schemas are checked
#: against it in ``tests/unit/test_store_sql.py``).
TABLES = ("runs", "items", "attempts", "artifacts", "events", "effects", "leases", "lease_users",
          "fences", "last_publish", "reuse_index", "removed_runs")
_TABLE = re.compile(r"\b(FROM|JOIN)(\s+)(" + "|".join(TABLES) + r")\b")


@functools.lru_cache(maxsize=256)
def to_postgres(sql: str) -> str:
    """A query of this module in PostgreSQL's spelling: ``%s`` for ``?`` (a
    literal ``%`` doubled, as psycopg wants it), ``stockade_`` before each
    table named after FROM or JOIN. Pure."""
    if "'?" in sql or "?'" in sql:
        raise ValueError(f"a '?' inside a string literal is ambiguous: {sql}")
    sql = sql.replace("%", "%%").replace("?", "%s")
    return _TABLE.sub(r"\1\2stockade_\3", sql)


class SQLStore(Store):
    """A ``Store`` whose reads are the queries below; subclasses add the writes."""

    @abc.abstractmethod
    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one query, spelt in the dialect's own way, and fetch every row."""

    def _spell(self, sql: str) -> str:
        """A query of this module in the dialect's spelling (SQLite's is ours)."""
        return sql

    #: The most values one ``_in`` list takes where a read may be given many
    #: (SQLite binds each value as a variable, and older builds allow 999);
    #: None: any number.
    _LIST_LIMIT: int | None = 500

    def _in(self, column: str, values: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
        """``column`` is one of ``values``: the condition and its arguments."""
        if not values:
            return "1=0", ()
        return self._one_of(column, values)

    def _one_of(self, column: str, values: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
        return f"{column} IN ({','.join('?' * len(values))})", tuple(values)

    def _chunks(self, values: Sequence[Any]) -> list[Sequence[Any]]:
        size = self._LIST_LIMIT or max(len(values), 1)
        return [values[i:i + size] for i in range(0, len(values), size)]

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self._rows(self._spell(sql), args)

    # -- runs --------------------------------------------------------------

    def get_run(self, run_id: str) -> RunRecord | None:
        rows = self._read("SELECT * FROM runs WHERE run_id=?", (run_id,))
        return run_from_row(rows[0]) if rows else None

    def list_runs(self, limit: int = 50) -> list[RunRecord]:
        rows = self._read("SELECT * FROM runs ORDER BY started_at DESC, run_id DESC LIMIT ?",
                          (limit,))
        return [run_from_row(r) for r in rows]

    def find_runs(self, prefix: str, limit: int = 20) -> list[RunRecord]:
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._read("SELECT * FROM runs WHERE run_id LIKE ? ESCAPE '\\' "
                          "ORDER BY started_at DESC, run_id DESC LIMIT ?", (pattern, limit))
        return [run_from_row(r) for r in rows if r[0].startswith(prefix)]

    def run_tallies(self, run_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        if not run_ids:
            return {}
        where, args = self._in("run_id", run_ids)
        return run_tallies_from_rows(self._read(
            f"SELECT run_id, status, COUNT(*) FROM items WHERE {where} GROUP BY run_id, status",
            args))

    # -- reuse across runs ---------------------------------------------------

    def reuse_candidates(self, keys: list[str], *, exclude_run: str = "",
                         limit: int = 3) -> dict[str, list[ReuseCandidate]]:
        rows: list[tuple[Any, ...]] = []
        for part in self._chunks(keys):
            cond, args = self._in("x.key", part)
            rows += self._read(
                "SELECT x.key, x.run_id, x.step, x.item, x.attempt, r.root, i.result"
                " FROM reuse_index x JOIN runs r ON r.run_id = x.run_id"
                " JOIN items i ON i.run_id = x.run_id AND i.step = x.step AND i.item = x.item"
                f" WHERE {cond} AND x.run_id != ? AND i.status = 'succeeded'"
                " AND i.attempt = x.attempt ORDER BY x.created_at DESC", (*args, exclude_run))
        # Each chunk's keys are disjoint, so newest-first per key holds across chunks.
        return reuse_found(rows, limit, self._outputs_of)

    def _outputs_of(self, run_id: str, step: str, items: list[int]) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        for part in self._chunks(items):  # ``items`` is sorted: so are the chunks' rows
            cond, args = self._in("item", part)
            rows += self._read(f"SELECT * FROM artifacts WHERE run_id = ? AND step = ? AND {cond}"
                               " ORDER BY item, name", (run_id, step, *args))
        return rows

    # -- items ---------------------------------------------------------------

    def get_item(self, run_id: str, step: str, item: int) -> ItemRecord | None:
        args = (run_id, step, item)
        rows = self._read(f"SELECT {ITEM_COLUMNS} FROM items WHERE run_id=? AND step=? AND item=?",
                          args)
        if not rows:
            return None
        arts = [ArtifactRecord(*r) for r in self._read(
            "SELECT * FROM artifacts WHERE run_id=? AND step=? AND item=? ORDER BY name", args)]
        return item_from_row(rows[0], arts)

    def find_item(self, run_id: str, step: str, *, index: int | None = None,
                  key: str | None = None) -> ItemRecord | None:
        select = f"SELECT {ITEM_COLUMNS} FROM items WHERE run_id=? AND step=?"
        if index is not None:
            rows = self._read(select + " AND item=?", (run_id, step, index))
        elif key is not None:
            rows = self._read(select + " AND key=?", (run_id, step, key))
            # An item made before items had keys answers to its index
            # (below 2**31: PostgreSQL's items.item is an integer).
            if not rows and key.isdigit() and int(key) < 2**31:
                rows = self._read(select + " AND key='' AND item=?", (run_id, step, int(key)))
        else:
            raise ValueError("find_item needs an index or a key")
        found = self._with_outputs(run_id, rows[:1])
        return found[0] if found else None

    def items(self, run_id: str, step: str | None = None) -> list[ItemRecord]:
        where, args = (("run_id=?", (run_id,)) if step is None
                       else ("run_id=? AND step=?", (run_id, step)))
        arts: dict[tuple[str, int], list[ArtifactRecord]] = {}
        for r in self._read(f"SELECT * FROM artifacts WHERE {where} ORDER BY name", args):
            arts.setdefault((r[1], r[2]), []).append(ArtifactRecord(*r))
        return [item_from_row(r, arts.get((r[1], r[2]), ())) for r in self._read(
            f"SELECT {ITEM_COLUMNS} FROM items WHERE {where} ORDER BY step, item", args)]

    def item_page(self, run_id: str, step: str, *, offset: int = 0, limit: int = 100,
                  statuses: Sequence[str] | None = None,
                  from_index: int = 0) -> list[ItemRecord]:
        where = "run_id=? AND step=? AND item>=?"
        args: tuple[Any, ...] = (run_id, step, from_index)
        if statuses is not None:
            cond, values = self._in("status", statuses)
            where, args = f"{where} AND {cond}", (*args, *values)
        rows = self._read(f"SELECT {ITEM_COLUMNS} FROM items WHERE {where} ORDER BY item "
                          "LIMIT ? OFFSET ?", (*args, max(0, min(limit, 1000)), max(0, offset)))
        return self._with_outputs(run_id, rows)

    def _with_outputs(self, run_id: str, rows: list[tuple[Any, ...]]) -> list[ItemRecord]:
        """The items of ``rows`` with their artifacts (one query per step)."""
        arts: dict[tuple[str, int], list[ArtifactRecord]] = {}
        by_step: dict[str, list[int]] = {}
        for r in rows:
            by_step.setdefault(r[1], []).append(r[2])
        for step, indexes in by_step.items():
            cond, values = self._in("item", indexes)
            for a in self._read(f"SELECT * FROM artifacts WHERE run_id=? AND step=? AND {cond} "
                                "ORDER BY name", (run_id, step, *values)):
                arts.setdefault((a[1], a[2]), []).append(ArtifactRecord(*a))
        return [item_from_row(r, arts.get((r[1], r[2]), ())) for r in rows]

    def item_spans(self, run_id: str, *, step: str | None = None,
                   ended_after: float | None = None) -> list[ItemSpan]:
        where = "run_id=?"
        args: tuple[Any, ...] = (run_id,)
        if step is not None:
            where, args = where + " AND step=?", (*args, step)
        if ended_after is not None:
            where, args = where + " AND ended_at>?", (*args, ended_after)
        return spans_from_rows(self._read(
            f"SELECT {SPAN_COLUMNS} FROM items WHERE {where} ORDER BY step, item", args))

    def step_tallies(self, run_id: str,
                     steps: Sequence[str] | None = None) -> dict[str, StepTally]:
        where = "run_id=?"
        args: tuple[Any, ...] = (run_id,)
        if steps is not None:
            cond, values = self._in("step", steps)
            where, args = f"{where} AND {cond}", (*args, *values)
        return tallies_from_rows(self._read(
            "SELECT step, status, COUNT(*), MIN(started_at), MAX(ended_at) FROM items "
            f"WHERE {where} GROUP BY step, status", args))

    def reused_counts(self, run_id: str) -> dict[str, int]:
        rows = self._read("SELECT step, count(*) FROM items WHERE run_id=? AND reused_from IS "
                          "NOT NULL GROUP BY step", (run_id,))
        return {str(step): int(n) for step, n in rows}

    def attempts(self, run_id: str, step: str, item: int) -> list[AttemptRecord]:
        rows = self._read(
            "SELECT * FROM attempts WHERE run_id=? AND step=? AND item=? ORDER BY attempt",
            (run_id, step, item),
        )
        return [attempt_from_row(r) for r in rows]

    # -- events --------------------------------------------------------------

    def events(self, run_id: str, after_id: int = 0) -> list[Event]:
        return _events(self._read(
            "SELECT id, run_id, at, kind, data FROM events WHERE run_id=? AND id>? ORDER BY id",
            (run_id, after_id)))

    def events_of(self, run_ids: Sequence[str], kinds: Sequence[str],
                  after_id: int = 0) -> list[Event]:
        if not run_ids or not kinds:
            return []
        runs, run_args = self._in("run_id", run_ids)
        of_kind, kind_args = self._in("kind", kinds)
        return _events(self._read(
            f"SELECT id, run_id, at, kind, data FROM events WHERE {runs} AND {of_kind} "
            "AND id>? ORDER BY id", (*run_args, *kind_args, after_id)))

    # -- leases, fences, effects, publishing ---------------------------------

    def get_lease(self, name: str) -> Lease | None:
        rows = self._read("SELECT name, holder, token, expires_at FROM leases WHERE name = ?",
                          (name,))
        if not rows or rows[0][2] == 0:
            return None
        r = rows[0]
        return Lease(name=r[0], holder=r[1], token=int(r[2]), expires_at=float(r[3]))

    def get_fence(self, scope: str) -> FenceCheck | None:
        rows = self._read("SELECT high_water, holder FROM fences WHERE scope = ?", (scope,))
        if not rows:
            return None
        return FenceCheck(accepted=True, high_water=int(rows[0][0]), holder=str(rows[0][1]))

    def get_effect(self, key: str) -> Effect | None:
        rows = self._read("SELECT * FROM effects WHERE key = ?", (key,))
        return effect_from_row(rows[0]) if rows else None

    def effects(self, run_id: str) -> list[Effect]:
        return [effect_from_row(r) for r in self._read(
            "SELECT * FROM effects WHERE run_id = ? ORDER BY key", (run_id,))]

    def get_last_publish(self, lease: str) -> PublishRecord | None:
        rows = self._read(
            "SELECT lease, run_id, key, payload_sha256, input_fingerprint, at, run_started_at,"
            " token FROM last_publish WHERE lease = ?", (lease,))
        return PublishRecord(*rows[0]) if rows else None


def _events(rows: list[tuple[Any, ...]]) -> list[Event]:
    return [Event(run_id=r[1], at=r[2], kind=r[3], data=json.loads(r[4]), id=int(r[0]))
            for r in rows]
