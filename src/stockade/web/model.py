"""What the web UI shows of runs and steps, computed from the store, events and folders.

A run's events are folded once and brought up to date by id (``Folds``), so a
page or a live tick of a 10,000-item run reads only what is new. Counts come
from the store's tallies; which items are running comes from the run folder
(an item's folder exists from its first attempt, its record only once it has
finished), and only while the run's engine lives. Items not yet finished are
named by the keys the engine recorded when their step started (``item_keys``),
or by their index.

Must not import the engine, the sandbox or the CLI.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stockade.runner.history import read_manifest
from stockade.runner.runs import run_path, state
from stockade.runner.status import RunStatus
from stockade.store.base import ItemSpan, RunRecord, StepTally, Store
from stockade.workspace.layout import ItemDir

T = TypeVar("T")

#: Item statuses counted as failed, in the order they are shown.
FAILED = ("failed", "errored", "fenced")
#: Every item status a page may show (the first five are never stored).
STATUSES = ("pending", "running", "retrying", "succeeded", "failed", "errored", "fenced",
            "skipped", "interrupted")
#: The events a run's page needs, folded in order.
FOLDED = ("step_started", "step_finished", "retry_scheduled", "item_keys", "agent_usage",
          "run_resumed", "run_finished")
#: The order and names of the per-step counts.
COUNTS = ("done", "running", "pending", "failed", "retried", "reused", "skipped", "interrupted")


def group(status: str) -> str:
    """The count an item status adds to."""
    if status == "succeeded":
        return "done"
    if status in FAILED:
        return "failed"
    return status


@dataclass
class Fold:
    """What a run's events say so far."""

    last_id: int = 0
    totals: dict[str, int] = field(default_factory=dict)
    #: The last ``step_started`` / ``step_finished`` status of each step.
    status: dict[str, str] = field(default_factory=dict)
    keys: dict[str, list[str]] = field(default_factory=dict)
    index_of: dict[str, dict[str, int]] = field(default_factory=dict)
    retried: dict[str, set[int]] = field(default_factory=dict)
    #: step -> item -> the attempt a retry was scheduled for.
    retry_next: dict[str, dict[int, int]] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)
    usage_by_step: dict[str, dict[str, int]] = field(default_factory=dict)
    #: How many times the run was resumed (its duration spans the gaps).
    resumes: int = 0

    def apply(self, kind: str, data: dict[str, Any]) -> None:
        step = str(data.get("step", ""))
        if kind == "run_resumed":
            self.resumes += 1
        elif kind == "step_started":
            self.totals[step] = int(data.get("items") or 0)
            self.status[step] = "running"
        elif kind == "step_finished":
            self.status[step] = str(data.get("status", ""))
        elif kind == "retry_scheduled":
            item = int(data.get("item", -1))
            self.retried.setdefault(step, set()).add(item)
            self.retry_next.setdefault(step, {})[item] = int(data.get("attempt") or 0)
        elif kind == "item_keys":
            keys = [str(k) for k in data.get("keys") or []]
            self.keys[step] = keys
            self.index_of[step] = {k: n for n, k in enumerate(keys)}
        elif kind == "agent_usage":
            for k, v in (data.get("usage") or {}).items():
                if isinstance(v, int) and not isinstance(v, bool):
                    self.usage[k] = self.usage.get(k, 0) + v
                    per = self.usage_by_step.setdefault(step, {})
                    per[k] = per.get(k, 0) + v

    def key(self, step: str, index: int) -> str:
        keys = self.keys.get(step)
        return keys[index] if keys is not None and 0 <= index < len(keys) else str(index)

    def index(self, step: str, key: str) -> int | None:
        """The index of an item named by ``key`` (its index as text without keys)."""
        known = self.index_of.get(step)
        if known is not None:
            return known.get(key)
        return int(key) if key.isdigit() else None


class Folds:
    """Folded events per run, brought up to date by event id; a few runs kept."""

    def __init__(self, store: Store, keep: int = 64) -> None:
        self.store = store
        self._keep = keep
        self._folds: OrderedDict[str, Fold] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_id: str) -> Fold:
        with self._lock:
            fold = self._folds.pop(run_id, None) or Fold()
            self._folds[run_id] = fold
            while len(self._folds) > self._keep:
                self._folds.popitem(last=False)
            for ev in self.store.events_of([run_id], FOLDED, after_id=fold.last_id):
                fold.apply(ev.kind, ev.data)
                fold.last_id = ev.id
            return fold


# -- a run's steps ---------------------------------------------------------------


@dataclass
class StepView:
    id: str
    kind: str
    needs: list[str]
    fan_out: bool
    status: str
    total: int | None
    counts: dict[str, int]
    started_at: float | None = None
    ended_at: float | None = None
    usage: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "needs": self.needs, "fan_out": self.fan_out,
                "status": self.status, "total": self.total, **self.counts,
                "started_at": self.started_at, "ended_at": self.ended_at, "usage": self.usage}


def attempt_started(idir: ItemDir, n: int) -> float | None:
    """When attempt ``n`` began, near enough: its stdout capture's change time (made
    on its first byte), else the fresh ``work/``'s."""
    for path in (idir.stdout(n), idir.work):
        try:
            return os.stat(path).st_ctime
        except OSError:
            continue
    return None


def started_indexes(record: RunRecord, step: str) -> set[int]:
    """Items of ``step`` whose folder exists: they started at least one attempt."""
    try:
        with os.scandir(run_path(record) / step) as it:
            return {int(e.name) for e in it if e.name.isdigit()}
    except OSError:
        return set()


def running_indexes(store: Store, record: RunRecord, step: str,
                    spans: Sequence[ItemSpan] | None = None) -> set[int]:
    """Items of a step of a live run that started and have no record yet."""
    started = started_indexes(record, step)
    if not started:
        return set()
    if spans is None:
        spans = store.item_spans(record.run_id, step=step)
    return started - {s.item for s in spans}


def step_status(fold: Fold, step: str, tally: StepTally | None, live: bool) -> str:
    st = fold.status.get(step)
    if st == "running" and not live:
        return "interrupted"
    if st:
        return st
    if tally is not None and tally.counts:
        # Records without events: a step that errored before it could start.
        return "failed" if any(s in FAILED for s in tally.counts) else "skipped"
    return "pending"


def step_views(store: Store, record: RunRecord, folds: Folds, *,
               manifest: dict[str, Any] | None = None,
               reused: dict[str, int] | None = None,
               cache: FinalCache | None = None) -> tuple[list[StepView], RunStatus]:
    """Every step of the plan with its counts, in plan order (recorded extras after)."""
    manifest = read_manifest(record) if manifest is None else manifest
    run_state = state(record)
    live = run_state is RunStatus.RUNNING
    fold = folds.get(record.run_id)
    tallies = cache.get("tallies", record, run_state, lambda: store.recorded_tallies(record)) \
        if cache is not None else store.recorded_tallies(record)
    declared = [s for s in manifest.get("steps") or [] if isinstance(s, dict) and "id" in s]
    known = {str(s["id"]) for s in declared}
    declared += [{"id": s} for s in sorted(tallies) if s not in known]
    views = []
    for s in declared:
        sid = str(s["id"])
        tally = tallies.get(sid)
        status = step_status(fold, sid, tally, live)
        counts = dict.fromkeys(COUNTS, 0)
        for st, n in (tally.counts if tally else {}).items():
            g = group(st)
            if g in counts:
                counts[g] += n
        recorded = tally.total if tally else 0
        if live and status == "running":
            counts["running"] = len(running_indexes(store, record, sid))
        total = fold.totals.get(sid)
        if total is not None or recorded:
            total = max(total or 0, recorded)
            counts["pending"] = max(0, total - recorded - counts["running"])
        counts["retried"] = len(fold.retried.get(sid, ()))
        counts["reused"] = (reused or {}).get(sid, 0)
        views.append(StepView(
            id=sid, kind=str(s.get("kind", "")), needs=[str(n) for n in s.get("needs", [])],
            fan_out=bool(s.get("fan_out", False)), status=status, total=total, counts=counts,
            started_at=tally.started_at if tally else None,
            ended_at=tally.ended_at if tally else None,
            usage=dict(fold.usage_by_step.get(sid, {})),
        ))
    return views, run_state


# -- reuse: items whose outputs were taken from an earlier run ------------------------


class Reuse:
    """Counts items the store records with ``reused_from``, per step (one query), and
    keeps the last answer per run for the pages drawn between scans."""

    def __init__(self, store: Store | None = None, keep: int = 64) -> None:
        self._store = store
        self._last: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._keep = keep
        self._lock = threading.Lock()

    def cached(self, run_id: str) -> dict[str, int]:
        with self._lock:
            hit = self._last.get(run_id)
        if hit is None and self._store is not None:
            return self._remember(run_id, self._store.reused_counts(run_id))
        return dict(hit or {})

    def scan(self, store: Store, record: RunRecord,
             budget: float = 0.2) -> tuple[dict[str, int], bool]:
        """Counts per step, and that they are complete (always: it is one query)."""
        return self._remember(record.run_id, store.reused_counts(record.run_id)), True

    def _remember(self, run_id: str, counts: dict[str, int]) -> dict[str, int]:
        with self._lock:
            self._last[run_id] = counts
            self._last.move_to_end(run_id)
            while len(self._last) > self._keep:
                self._last.popitem(last=False)
        return dict(counts)


# -- the runs list -------------------------------------------------------------------


@dataclass
class RunRow:
    record: RunRecord
    status: RunStatus
    done: int
    total: int
    failed: int
    usage: dict[str, int]

    @property
    def duration(self) -> float | None:
        end = self.record.ended_at or (time.time() if self.status is RunStatus.RUNNING else None)
        return None if end is None else max(0.0, end - self.record.started_at)

    def to_json(self) -> dict[str, Any]:
        r = self.record
        return {"run_id": r.run_id, "workflow": r.workflow, "status": str(self.status),
                "started_at": r.started_at, "ended_at": r.ended_at, "duration": self.duration,
                "done": self.done, "total": self.total, "failed": self.failed,
                "usage": self.usage, "sandbox": r.sandbox, "enforced": r.enforced}


class RunRows:
    """Rows of the runs list. A finished run's counts never change: they are kept."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._final: dict[tuple[str, str, float | None], RunRow] = {}
        self._lock = threading.Lock()

    def rows(self, *, status: str | None = None, workflow: str | None = None,
             limit: int = 100) -> list[RunRow]:
        chosen: list[tuple[RunRecord, RunStatus]] = []
        for r in self.store.list_runs(limit * 10 if (status or workflow) else limit):
            st = state(r)
            if (status and str(st) != status) or (workflow and r.workflow != workflow):
                continue
            chosen.append((r, st))
            if len(chosen) >= limit:
                break
        out: dict[str, RunRow] = {}
        todo: list[tuple[RunRecord, RunStatus]] = []
        with self._lock:
            for r, st in chosen:
                hit = self._final.get((r.run_id, str(st), r.ended_at))
                if hit is not None:
                    out[r.run_id] = RunRow(r, st, hit.done, hit.total, hit.failed, hit.usage)
                else:
                    todo.append((r, st))
        if todo:
            for row in self._compute(todo):
                out[row.record.run_id] = row
                if row.status is not RunStatus.RUNNING and row.status is not RunStatus.CRASHED:
                    with self._lock:
                        self._final[(row.record.run_id, str(row.status), row.record.ended_at)] = row
        return [out[r.run_id] for r, _ in chosen]

    def _compute(self, todo: Sequence[tuple[RunRecord, RunStatus]]) -> Iterable[RunRow]:
        ids = [r.run_id for r, _ in todo]
        tallies = self.store.run_tallies(ids)
        totals: dict[str, dict[str, int]] = {}
        usage: dict[str, dict[str, int]] = {}
        for ev in self.store.events_of(ids, ("step_started", "agent_usage")):
            if ev.kind == "step_started":
                totals.setdefault(ev.run_id, {})[str(ev.data.get("step"))] = \
                    int(ev.data.get("items") or 0)
            else:
                u = usage.setdefault(ev.run_id, {})
                for k, v in (ev.data.get("usage") or {}).items():
                    if isinstance(v, int) and not isinstance(v, bool):
                        u[k] = u.get(k, 0) + v
        for r, st in todo:
            counts = tallies.get(r.run_id, {})
            done = sum(counts.values())
            failed = sum(n for s, n in counts.items() if s in FAILED)
            total = max(done, sum(totals.get(r.run_id, {}).values()))
            yield RunRow(r, st, done, total, failed, usage.get(r.run_id, {}))


def workflows(store: Store, limit: int = 1000) -> list[str]:
    """The workflow names of recent runs (for the filter)."""
    return sorted({r.workflow for r in store.list_runs(limit)})


# -- the timeline ----------------------------------------------------------------------


def span_rows(store: Store, record: RunRecord, steps: Sequence[StepView],
              ended_after: float | None = None) -> list[tuple[Any, ...]]:
    """``(step index, item, status code, start ms, end ms, key or None)`` per recorded
    item, times relative to the run's start; the key only when it is not the index."""
    index = {s.id: n for n, s in enumerate(steps)}
    code = {s: n for n, s in enumerate(STATUSES)}
    t0 = record.started_at
    return [
        (index[step], item, code.get(status, 0), int((a - t0) * 1000), int((b - t0) * 1000),
         None if key == str(item) else key)
        for step, item, key, status, attempt, a, b in
        store.item_spans(record.run_id, ended_after=ended_after)
        if step in index and (attempt > 0 or status != "skipped")
    ]


def pack(rows: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """Rows as columns: a 10,000-item timeline is a few arrays, not 10,000 objects."""
    cols = list(zip(*rows, strict=True)) if rows else [(), (), (), (), (), ()]
    keys = list(cols[5])
    return {"s": list(cols[0]), "i": list(cols[1]), "st": list(cols[2]), "a": list(cols[3]),
            "b": list(cols[4]), "k": keys if any(k is not None for k in keys) else []}


#: Above this many items a run's timeline comes as counts per slice of time
#: (``span_bins``), not item by item: 100,000 spans were 3.1 MiB and 0.95 s
#: for the first request, for a canvas a few hundred pixels wide.
SPAN_LIMIT = 20_000
#: Slices of the run's time in such a timeline.
BINS = 500


def binned(steps: Sequence[StepView]) -> bool:
    """Whether the run's timeline is counts per slice of time (``span_bins``)."""
    return sum(s.total or 0 for s in steps) > SPAN_LIMIT


def timeline(store: Store, record: RunRecord, steps: Sequence[StepView]) -> dict[str, Any]:
    """Every recorded item's span (or, for a big run, how many items ended in
    each slice of time) and the items running now, for the run's timeline."""
    out = {"t0": record.started_at, "steps": [s.id for s in steps], "statuses": list(STATUSES),
           "running": running_spans(store, record, steps)}
    if not binned(steps):
        return {**out, "spans": pack(span_rows(store, record, steps))}
    return {**out, "spans": pack([]), "bins": span_bins(store, record, steps)}


def span_bins(store: Store, record: RunRecord, steps: Sequence[StepView]) -> dict[str, Any]:
    """``{w: slice ms, s: step index, st: status code, b: slice, n: items}``, columns
    as ``pack`` makes them: the items of each step and status that ended in each slice."""
    t0 = record.started_at
    end = record.ended_at if record.ended_at is not None else time.time()
    # Whole milliseconds: the slices' bounds the page shows are exact.
    width_ms = max(1, math.ceil((end - t0) * 1000 / BINS))
    width = width_ms / 1000
    index = {s.id: n for n, s in enumerate(steps)}
    code = {s: n for n, s in enumerate(STATUSES)}
    rows = [(index[step], code.get(status, 0), max(b, 0), n)
            for step, status, b, n in store.span_bins(record.run_id, t0, width) if step in index]
    cols = list(zip(*rows, strict=True)) if rows else [(), (), (), ()]
    return {"w": width_ms, "s": list(cols[0]), "st": list(cols[1]),
            "b": list(cols[2]), "n": list(cols[3])}


def running_spans(store: Store, record: RunRecord, steps: Sequence[StepView]) -> list[list[Any]]:
    """``[step index, item, start ms]`` of the items running now."""
    out: list[list[Any]] = []
    if state(record) is not RunStatus.RUNNING:
        return out
    base = run_path(record)
    for n, s in enumerate(steps):
        if s.status != "running":
            continue
        for i in sorted(running_indexes(store, record, s.id)):
            idir = ItemDir(base / s.id / str(i))
            started = attempt_started(idir, max(1, idir.last_attempt()))
            out.append([n, i, int(((started or time.time()) - record.started_at) * 1000)])
    return out


class FinalCache:
    """Answers about runs that have ended, kept: they change only when the run does
    (a resume changes its status and end), which is part of the key."""

    def __init__(self, keep: int = 32) -> None:
        self._data: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._keep = keep
        self._lock = threading.Lock()

    def get(self, what: str, record: RunRecord, status: RunStatus,
            compute: Callable[[], T]) -> T:
        if status in (RunStatus.RUNNING, RunStatus.CRASHED):
            return compute()
        key = (what, record.run_id, str(status), record.ended_at)
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                hit: T = self._data[key]
                return hit
        value = compute()
        with self._lock:
            self._data[key] = value
            while len(self._data) > self._keep:
                self._data.popitem(last=False)
        return value
