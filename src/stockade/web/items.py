"""A step's items a page at a time, and one item with its attempts, files and logs.

Pages are by item index (``0..total``) so running and pending items have their
place next to finished ones; a status filter pages through the store's
records instead. Must not import the engine, the sandbox or the CLI.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade.runner.history import item_dir, kind_of
from stockade.runner.runs import run_path, state
from stockade.runner.status import RunStatus
from stockade.store.base import AttemptRecord, ItemRecord, RunRecord, StepTally, Store
from stockade.web.model import (
    FAILED,
    Fold,
    Folds,
    attempt_started,
    running_indexes,
    step_status,
)
from stockade.workspace.layout import ItemDir

#: Filters of the step page and the stored statuses each one shows.
FILTERS: dict[str, tuple[str, ...]] = {
    "done": ("succeeded",), "failed": FAILED, "skipped": ("skipped",),
    "interrupted": ("interrupted",),
}
#: Filters computed from the folder and the events rather than records.
DERIVED = ("running", "pending", "retried")
#: How much of a log an item page shows before it follows.
LOG_TAIL = 64 << 10


@dataclass
class Row:
    index: int
    key: str
    status: str
    attempt: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    message: str = ""
    retried: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "key": self.key, "status": self.status,
                "attempt": self.attempt, "started_at": self.started_at,
                "ended_at": self.ended_at, "message": self.message[:300],
                "retried": self.retried}


def row_of(rec: ItemRecord, fold: Fold) -> Row:
    return Row(rec.item, rec.label, rec.status, rec.attempt, rec.started_at or None,
               rec.ended_at or None, rec.message, rec.item in fold.retried.get(rec.step, ()))


def unfinished_row(record: RunRecord, fold: Fold, step: str, index: int,
                   running: set[int]) -> Row:
    key = fold.key(step, index)
    if index not in running:
        return Row(index, key, "pending", retried=index in fold.retried.get(step, ()))
    idir = ItemDir(run_path(record) / step / str(index))
    n = idir.last_attempt()
    status = "running"
    wanted = fold.retry_next.get(step, {}).get(index)
    if wanted is not None and wanted > n:
        status = "retrying"
    return Row(index, key, status, n, attempt_started(idir, n) if n else None,
               retried=index in fold.retried.get(step, ()))


@dataclass
class StepPage:
    step: str
    kind: str
    status: str
    total: int
    rows: list[Row]
    matching: int
    page: int
    limit: int
    filter: str
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def pages(self) -> int:
        return max(1, -(-self.matching // self.limit))


def step_page(store: Store, folds: Folds, record: RunRecord, step: str, *, page: int = 0,
              limit: int = 100, filter: str = "",
              tallies: dict[str, StepTally] | None = None) -> StepPage:
    fold = folds.get(record.run_id)
    live = state(record) is RunStatus.RUNNING
    tally = (store.recorded_tallies(record) if tallies is None else tallies).get(step)
    status = step_status(fold, step, tally, live)
    recorded = tally.total if tally else 0
    total = max(fold.totals.get(step, 0), recorded)
    spans = None
    running: set[int] = set()
    if live and status == "running":
        spans = store.item_spans(record.run_id, step=step)
        running = running_indexes(store, record, step, spans)
        if running:
            total = max(total, max(running) + 1)
    rows: list[Row]
    if not filter:
        page = last_page_at_most(page, total, limit)
        lo = page * limit
        hi = min(total, lo + limit)
        recs = {r.item: r for r in store.item_page(record.run_id, step, from_index=lo,
                                                   limit=limit) if r.item < hi}
        rows = [row_of(recs[i], fold) if i in recs else
                unfinished_row(record, fold, step, i, running) for i in range(lo, hi)]
        matching = total
    elif filter in FILTERS:
        wanted = FILTERS[filter]
        matching = sum(n for s, n in (tally.counts if tally else {}).items() if s in wanted)
        page = last_page_at_most(page, matching, limit)
        lo = page * limit
        rows = [row_of(r, fold) for r in store.item_page(record.run_id, step, offset=lo,
                                                         limit=limit, statuses=wanted)]
    elif filter in DERIVED:
        if filter == "running":
            chosen = sorted(running)
        elif filter == "retried":
            chosen = sorted(fold.retried.get(step, ()))
        else:
            spans = store.item_spans(record.run_id, step=step) if spans is None else spans
            done = {s.item for s in spans} | running
            chosen = [i for i in range(total) if i not in done]
        matching = len(chosen)
        page = last_page_at_most(page, matching, limit)
        lo = page * limit
        rows = []
        for i in chosen[lo:lo + limit]:
            rec = store.find_item(record.run_id, step, index=i)
            rows.append(row_of(rec, fold) if rec else
                        unfinished_row(record, fold, step, i, running))
    else:
        raise ValueError(f"unknown filter {filter!r}")
    return StepPage(step, kind_of(record, step), status, total, rows, matching, page, limit,
                    filter)


def last_page_at_most(page: int, matching: int, limit: int) -> int:
    """``page`` (from 0), or the last page there is: a page past the end (a URL
    typed, or kept while a filter's items went away) shows the end, and a number
    too big for the store never reaches it."""
    return max(0, min(page, -(-matching // limit) - 1))


# -- one item ---------------------------------------------------------------------


@dataclass
class Located:
    """An item as a URL names it: its record when it has finished."""

    step: str
    index: int
    key: str
    record: ItemRecord | None


def locate(store: Store, folds: Folds, record: RunRecord, step: str, text: str) -> Located | None:
    """``KEY`` or ``#N``: the recorded item, or one the engine has keyed but not finished."""
    fold = folds.get(record.run_id)
    if text.startswith("#") and text[1:].isdigit():
        index: int | None = int(text[1:])
        rec = store.find_item(record.run_id, step, index=index)
    else:
        rec = store.find_item(record.run_id, step, key=text)
        index = rec.item if rec else fold.index(step, text)
    if rec is not None:
        return Located(step, rec.item, rec.label, rec)
    if index is None:
        return None
    total = fold.totals.get(step)
    exists = (run_path(record) / step / str(index)).is_dir()
    if not exists and (total is None or index >= total):
        return None
    return Located(step, index, fold.key(step, index), None)


@dataclass
class AttemptView:
    number: int
    outcome: str
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    message: str = ""
    stdout_size: int = 0
    stderr_size: int = 0
    #: The Dask worker that ran it (its name; ``worker_at``: address and host), if any.
    worker: str = ""
    worker_at: str = ""


def attempts_of(store: Store, record: RunRecord, loc: Located, live: bool) -> list[AttemptView]:
    """Recorded attempts, and those on disk the store has not seen end (running or lost)."""
    idir = ItemDir(run_path(record) / loc.step / str(loc.index))
    recorded: dict[int, AttemptRecord] = {
        a.attempt: a for a in store.attempts(record.run_id, loc.step, loc.index)}
    numbers = sorted(set(recorded) | set(idir.attempt_numbers()))
    if loc.record is not None and loc.record.attempt:
        numbers = sorted(set(numbers) | {loc.record.attempt})
    out = []
    on_disk = set(idir.attempt_numbers())
    for n in numbers:
        sizes = (_size(idir.stdout(n)), _size(idir.stderr(n)))
        a = recorded.get(n)
        if a is not None:
            out.append(AttemptView(n, a.outcome, a.exit_code, a.started_at, a.ended_at,
                                   a.message, *sizes, *_worker(a.provenance)))
        elif loc.record is not None and loc.record.attempt == n:
            r = loc.record
            out.append(AttemptView(n, r.status, None, r.started_at, r.ended_at, r.message,
                                   *sizes))
        elif n in on_disk:
            out.append(AttemptView(n, "running" if live else "lost", None,
                                   attempt_started(idir, n), None, "", *sizes))
    return out


def _worker(provenance: dict[str, Any] | None) -> tuple[str, str]:
    """(name, "address on host") of the worker an attempt's provenance names."""
    w = (provenance or {}).get("worker")
    if not isinstance(w, dict):
        return "", ""
    name = str(w.get("name") or w.get("address") or "")
    where = " on ".join(str(w[k]) for k in ("address", "host") if w.get(k))
    return name, where


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_log(record: RunRecord, step: str, index: int, attempt: int, stream: str,
             offset: int | None = None, limit: int = LOG_TAIL) -> tuple[bytes, int, int]:
    """Bytes of an attempt's capture: from ``offset``, or the tail when None.

    Returns ``(data, start, size)``: where the data begins and the file's size.
    """
    if stream not in ("stdout", "stderr"):
        raise ValueError(stream)
    meta = run_path(record) / step / str(index) / "meta"
    path = meta / f"{attempt}.{'out' if stream == 'stdout' else 'err'}"
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - limit) if offset is None else min(max(0, offset), size)
            f.seek(start)
            return f.read(min(limit, size - start)), start, size
    except OSError:
        return b"", 0, 0


def kind(record: RunRecord, step: str) -> str:
    return kind_of(record, step)


def idir_of(record: RunRecord, loc: Located) -> ItemDir:
    if loc.record is not None:
        return item_dir(record, loc.record)
    return ItemDir(run_path(record) / loc.step / str(loc.index))


def read_jsonl(path: Path, limit: int = 2000) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
        import json

        for line in f:
            if len(out) >= limit:
                break
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict):
                    out.append(value)
    return out
