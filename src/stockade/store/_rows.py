"""Row <-> record conversions shared by the SQLite and PostgreSQL stores.

Both stores lay their tables out in the same column order, so one function per
record type serves both. Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from stockade.store.base import (
    ArtifactRecord,
    AttemptRecord,
    Effect,
    ItemRecord,
    ItemSpan,
    ReuseCandidate,
    RunRecord,
    StepTally,
)

#: The items table's columns in the order ``item_from_row`` reads them: named, never
#: ``*``, since stores migrated by ALTER TABLE hold them in the order they were added.
ITEM_COLUMNS = "run_id, step, item, status, attempt, result, value, message, started_at, ended_at, key, reused_from, usage, not_reused"


#: One encoder for every row: ``json.dumps`` with any argument builds a new
#: encoder per call, which was a tenth of the engine thread's time on a keep:.
_ENCODER = json.JSONEncoder(sort_keys=True, ensure_ascii=False)


def dump_json(value: Any) -> str:
    # The encoder builds its C scanner afresh on every call that is not a
    # string: the commonest values (an item's index, a keep:'s boolean, an
    # empty result) are spelt here, as ``json`` spells them.
    kind = type(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value)
    return _ENCODER.encode(value)


#: Texts ``dump_json`` writes for the commonest values, read without the
#: decoder: ``json.loads`` (four columns a row) was two thirds of turning a
#: large run's rows into records. Immutable values only: a caller may keep them.
_LITERALS: dict[str, Any] = {"null": None, "true": True, "false": False, '""': ""}
_MISSING = object()


def load_json(text: str | None) -> Any:
    if text is None:
        return None
    value = _LITERALS.get(text, _MISSING)
    if value is not _MISSING:
        return value
    # A non-negative integer as dump_json spells it (no sign, no leading zero).
    if text.isascii() and text.isdigit() and (len(text) == 1 or text[0] != "0"):
        return int(text)
    return json.loads(text)


def run_from_row(row: Sequence[Any]) -> RunRecord:
    return RunRecord(
        run_id=row[0], workflow=row[1], workflow_path=row[2], workflow_sha256=row[3],
        root=row[4], status=row[5], started_at=row[6], ended_at=row[7], sandbox=row[8],
        enforced=bool(row[9]),
    )


def item_from_row(r: Sequence[Any], outputs: Sequence[ArtifactRecord]) -> ItemRecord:
    return ItemRecord(
        run_id=r[0], step=r[1], item=r[2], status=r[3], attempt=r[4],
        result=load_json(r[5]), value=load_json(r[6]),
        message=r[7], started_at=r[8], ended_at=r[9], outputs=tuple(outputs),
        key=r[10] if len(r) > 10 and r[10] else str(r[2]),
        reused_from=load_json(r[11]) if len(r) > 11 else None,
        usage=_usage(r[12]) if len(r) > 12 else {},
        not_reused=r[13] if len(r) > 13 else None,
    )


def attempt_from_row(r: Sequence[Any]) -> AttemptRecord:
    return AttemptRecord(
        run_id=r[0], step=r[1], item=int(r[2]), attempt=int(r[3]), outcome=r[4],
        exit_code=r[5], started_at=float(r[6]), ended_at=float(r[7]), message=r[8],
        provenance=load_json(r[9]) if len(r) > 9 else None,
    )


def _usage(text: str | None) -> dict[str, int]:
    value = load_json(text) if text else None
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}


def effect_from_row(r: Sequence[Any]) -> Effect:
    return Effect(
        key=r[0], run_id=r[1], step=r[2], item=int(r[3]), attempt=int(r[4]), lease=r[5],
        sink=r[6], sink_key=r[7], payload_sha256=r[8], status=r[9],
        token=None if r[10] is None else int(r[10]), claimed_at=float(r[11]),
        finished_at=None if r[12] is None else float(r[12]), message=r[13],
    )


#: The columns of an ``ItemSpan``, in its field order; a record made before keys
#: answers to its index as text (both stores' SQL).
SPAN_COLUMNS = ("step, item, CASE WHEN key = '' THEN CAST(item AS TEXT) ELSE key END, status, "
                "attempt, started_at, ended_at")


def spans_from_rows(rows: Sequence[Sequence[Any]]) -> list[ItemSpan]:
    return list(map(ItemSpan._make, rows))


def tallies_from_rows(rows: Sequence[Sequence[Any]]) -> dict[str, StepTally]:
    """Rows of ``step, status, count, min(started_at), max(ended_at)``."""
    counts: dict[str, dict[str, int]] = {}
    spans: dict[str, tuple[float | None, float | None]] = {}
    for step, status, n, first, last in rows:
        counts.setdefault(step, {})[status] = int(n)
        lo, hi = spans.get(step, (None, None))
        lo = float(first) if lo is None else min(lo, float(first))
        hi = float(last) if hi is None else max(hi, float(last))
        spans[step] = (lo, hi)
    return {s: StepTally(s, c, *spans[s]) for s, c in counts.items()}


def run_tallies_from_rows(rows: Sequence[Sequence[Any]]) -> dict[str, dict[str, int]]:
    """Rows of ``run_id, status, count``."""
    out: dict[str, dict[str, int]] = {}
    for run_id, status, n in rows:
        out.setdefault(run_id, {})[status] = int(n)
    return out


def reuse_found(rows: Iterable[Sequence[Any]], limit: int,
               outputs_of: Callable[[str, str, list[int]], Iterable[Sequence[Any]]]
               ) -> dict[str, list[ReuseCandidate]]:
    """The first ``limit`` candidates per key from index rows ``(key, run_id,
    step, item, attempt, root, result)`` newest first, each with its outputs.

    ``outputs_of(run_id, step, items)`` reads those items' artifact rows (in
    column order, by item and name), one call per step: by the artifacts'
    primary key, only for the candidates kept (joining the index read every
    indexed item's outputs, four times what ``limit=1`` takes).
    """
    kept: dict[str, list[Sequence[Any]]] = {}
    for row in rows:
        got = kept.setdefault(row[0], [])
        if len(got) < limit:
            got.append(row)
    by_step: dict[tuple[str, str], set[int]] = {}
    for got in kept.values():
        for row in got:
            by_step.setdefault((row[1], row[2]), set()).add(row[3])
    outputs: dict[tuple[str, str, int, int], list[ArtifactRecord]] = {}
    for (run_id, step), items in by_step.items():
        for a in outputs_of(run_id, step, sorted(items)):
            outputs.setdefault((a[0], a[1], a[2], a[3]), []).append(ArtifactRecord(*a))
    return {key: [ReuseCandidate(key, run_id, step, item, attempt, root,
                                 tuple(outputs.get((run_id, step, item, attempt), ())),
                                 load_json(result))
                  for _, run_id, step, item, attempt, root, result in got]
            for key, got in kept.items()}
