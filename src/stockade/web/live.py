"""Live updates: each page's state as a small snapshot, and the changes between two.

A ticker belongs to one event stream (one open page). ``tick`` computes the
page's small state (counts, statuses, the rows of the page on screen, new
log bytes) and returns only what changed since the last tick, or None; the
page applies it to the elements it names, so a text selection elsewhere on
the page survives. Must not import the engine, the sandbox or the CLI.
"""

from __future__ import annotations

import codecs
import contextlib
from dataclasses import dataclass, field
from typing import Any

from stockade.runner.runs import state
from stockade.runner.status import RunStatus
from stockade.store.base import RunRecord, Store
from stockade.web import items as itemsmod
from stockade.web.detail import item_url
from stockade.web.model import (
    FAILED,
    FinalCache,
    Folds,
    Reuse,
    RunRows,
    binned,
    pack,
    running_spans,
    span_rows,
    step_views,
)

#: How many of a run's failures its page lists (the step pages list them all).
FAILURES_SHOWN = 20
#: The most of one log a tick sends. A log further behind than this skips to its
#: last window (the page marks the gap): at a fixed share per tick, a step that
#: writes faster than the stream sends would never be caught up.
WINDOW = 256 << 10


def diff(old: Any, new: Any) -> Any:
    """What changed from ``old`` to ``new`` (nested dicts); a key that went away maps to None.

    Returns ``_SAME`` when nothing did. Lists and scalars are replaced whole.
    """
    if isinstance(old, dict) and isinstance(new, dict):
        out = {}
        for k, v in new.items():
            d = diff(old.get(k, _MISSING), v)
            if d is not _SAME:
                out[k] = d
        for k in old:
            if k not in new:
                out[k] = None
        return out if out else _SAME
    return _SAME if old == new else new


_SAME: Any = object()
_MISSING: Any = object()


def changes(old: Any, new: Any) -> dict[str, Any] | None:
    d = diff(old, new)
    if d is _SAME:
        return None
    assert isinstance(d, dict)
    return d


def run_json(record: RunRecord, status: RunStatus) -> dict[str, Any]:
    return {"status": str(status), "ended_at": record.ended_at, "started_at": record.started_at,
            "resume": f"stockade resume {record.run_id}"
            if status in (RunStatus.CRASHED, RunStatus.INTERRUPTED, RunStatus.FAILED) else ""}


# -- the runs list ------------------------------------------------------------------


@dataclass
class RunsTicker:
    rows: RunRows
    status: str | None = None
    workflow: str | None = None
    last: dict[str, Any] = field(default_factory=dict)

    def snapshot(self) -> dict[str, Any]:
        return {r.record.run_id: _row(r.to_json()) for r in
                self.rows.rows(status=self.status, workflow=self.workflow)}

    def tick(self) -> dict[str, Any] | None:
        now = self.snapshot()
        d = changes(self.last, now)
        new = [k for k in now if k not in self.last]
        self.last = now
        if d is None:
            return None
        # New rows whole (the page builds them), changed rows by field.
        return {"rows": {k: (now[k] if k in new else v) for k, v in d.items()},
                "order": list(now), "new": new}


def _row(r: dict[str, Any]) -> dict[str, Any]:
    # The duration ticks on the page itself; only its end is news.
    return {k: v for k, v in r.items() if k != "duration"}


# -- one run ------------------------------------------------------------------------


@dataclass
class RunTicker:
    store: Store
    folds: Folds
    reuse: Reuse
    run_id: str
    final: FinalCache | None = None
    last: dict[str, Any] = field(default_factory=dict)
    failures_seen: set[str] = field(default_factory=set)
    spans_seen: set[tuple[int, int, int]] = field(default_factory=set)
    reuse_done: bool = False
    _running: list[Any] = field(default_factory=list)

    def state(self) -> tuple[dict[str, Any], list[Any]]:
        record = self.store.get_run(self.run_id)
        if record is None:
            return {"gone": True}, []
        if self.reuse_done and record.status != "running":
            reused = self.reuse.cached(record.run_id)
        else:
            reused, self.reuse_done = self.reuse.scan(self.store, record)
        steps, status = step_views(self.store, record, self.folds, reused=reused,
                                   cache=self.final)
        fold = self.folds.get(self.run_id)
        snap = {"run": run_json(record, status), "usage": dict(fold.usage),
                "steps": {s.id: {k: v for k, v in s.to_json().items()
                                 if k not in ("id", "kind", "needs", "fan_out")}
                          for s in steps}}
        return snap, [record, steps]

    def _seen_spans(self, spans: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        fresh = []
        for s in spans:
            k = (s[0], s[1], s[3])
            if k not in self.spans_seen:
                self.spans_seen.add(k)
                fresh.append(s)
        return fresh

    def tick(self) -> dict[str, Any] | None:
        snap, extra = self.state()
        d = changes(self.last, snap)
        self.last = snap
        out: dict[str, Any] = dict(d or {})
        if not extra:
            return out or None
        record, steps = extra
        if d is not None and "steps" in d:
            fails = failures(self.store, self.folds, record, steps)
            new = [f for f in fails if f["url"] not in self.failures_seen]
            if new:
                self.failures_seen |= {f["url"] for f in new}
                out["failures"] = new
            if binned(steps):
                # The page counts nothing itself: it fetches the counts again.
                out["timeline_stale"] = True
            else:
                # Spans that ended lately: records land a little after their
                # items end, so the window overlaps and the seen set drops repeats.
                fresh = self._seen_spans(span_rows(self.store, record, steps,
                                                   ended_after=self._after(record)))
                if fresh:
                    out["spans"] = pack(fresh)
        running = running_spans(self.store, record, steps) \
            if snap["run"]["status"] == "running" else []
        if running != self._running:
            self._running = running
            out["running"] = running
        return out or None

    def _after(self, record: RunRecord) -> float:
        ends = [s["ended_at"] for s in (self.last.get("steps") or {}).values()
                if s.get("ended_at")]
        return float(max(ends, default=record.started_at)) - 120.0


def failures(store: Store, folds: Folds, record: RunRecord, steps: list[Any],
             limit: int = FAILURES_SHOWN) -> list[dict[str, Any]]:
    """The first failed items of the run, in step order, with their stderr's last lines."""
    out: list[dict[str, Any]] = []
    for s in steps:
        if len(out) >= limit or not s.counts.get("failed"):
            continue
        for rec in store.item_page(record.run_id, s.id, limit=limit - len(out), statuses=FAILED):
            tail = ""
            if rec.attempt:
                data, _, _ = itemsmod.read_log(record, rec.step, rec.item, rec.attempt, "stderr",
                                               None, 4096)
                text = data.decode("utf-8", errors="replace").rstrip("\n")
                tail = "\n".join(text.splitlines()[-10:])
            out.append({"url": item_url(record.run_id, rec.step, rec.label), "step": rec.step,
                        "key": rec.label, "status": rec.status, "attempt": rec.attempt,
                        "message": rec.message, "stderr": tail})
    return out


# -- one step's page ----------------------------------------------------------------


@dataclass
class StepTicker:
    store: Store
    folds: Folds
    run_id: str
    step: str
    page: int
    limit: int
    filter: str
    final: FinalCache | None = None
    last: dict[str, Any] = field(default_factory=dict)

    def snapshot(self) -> dict[str, Any]:
        record = self.store.get_run(self.run_id)
        if record is None:
            return {"gone": True}
        views, status = step_views(self.store, record, self.folds, cache=self.final)
        tallies = self.final.get("tallies", record, status,
                                 lambda: self.store.recorded_tallies(record)) \
            if self.final is not None else None
        sp = itemsmod.step_page(self.store, self.folds, record, self.step, page=self.page,
                                limit=self.limit, filter=self.filter, tallies=tallies)
        counts = next((v.to_json() for v in views if v.id == self.step), {})
        return {"run": run_json(record, status), "status": sp.status, "total": sp.total,
                "matching": sp.matching, "counts": counts,
                "rows": {str(r.index): r.to_json() for r in sp.rows}}

    def tick(self) -> dict[str, Any] | None:
        now = self.snapshot()
        d = changes(self.last, now)
        self.last = now
        return d


# -- one item's page ----------------------------------------------------------------


@dataclass
class LogFollow:
    offset: int
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))


@dataclass
class ItemTicker:
    store: Store
    folds: Folds
    run_id: str
    step: str
    key: str
    #: (attempt, stream) -> where the page's copy ends.
    logs: dict[tuple[int, str], LogFollow] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    finished_sent: bool = False
    primed_unfinished: bool = False

    def snapshot(self) -> tuple[dict[str, Any], Any, Any]:
        record = self.store.get_run(self.run_id)
        if record is None:
            return {"gone": True}, None, None
        loc = itemsmod.locate(self.store, self.folds, record, self.step, self.key)
        if loc is None:
            return {"gone": True}, None, None
        live = state(record) is RunStatus.RUNNING
        atts = itemsmod.attempts_of(self.store, record, loc, live)
        status = loc.record.status if loc.record else (
            itemsmod.unfinished_row(record, self.folds.get(self.run_id), self.step, loc.index,
                                    {loc.index} if live and atts else set()).status)
        snap = {"run": run_json(record, state(record)), "status": status,
                "attempts": {str(a.number): a.__dict__ for a in atts}}
        return snap, record, loc

    def tick(self) -> dict[str, Any] | None:
        snap, record, loc = self.snapshot()
        out: dict[str, Any] = {}
        d = changes(self.last, snap)
        if d:
            out.update(d)
        self.last = snap
        if record is not None and loc is not None:
            logs: dict[str, str] = {}
            offsets: dict[str, int] = {}
            skipped: dict[str, int] = {}
            for n_text in snap["attempts"]:
                n = int(n_text)
                for stream in ("stdout", "stderr"):
                    follow = self.logs.get((n, stream))
                    if follow is None:
                        follow = self.logs[(n, stream)] = LogFollow(0)
                    data, start, gap = follow_log(record, self.step, loc.index, n, stream,
                                                  follow)
                    if gap:
                        skipped[f"{n}:{stream}"] = gap
                    if data:
                        follow.offset = start + len(data)
                        offsets[f"{n}:{stream}"] = follow.offset
                        text = follow.decoder.decode(data)
                        if text:
                            logs[f"{n}:{stream}"] = text
            if logs:
                out["logs"] = logs
            if offsets:
                out["offsets"] = offsets
            if skipped:
                out["skipped"] = skipped
            if loc.record is not None and self.primed_unfinished and not self.finished_sent:
                # The page was drawn before the item finished: it fetches the
                # parts that exist only now (outputs, provenance, transcript).
                out["finished"] = True
                self.finished_sent = True
        return out or None

    def prime(self, offsets: dict[tuple[int, str], int], finished: bool) -> None:
        """Where the page's copies of the logs end, and whether it showed a finished item."""
        self.primed_unfinished = not finished
        for k, off in offsets.items():
            self.logs[k] = LogFollow(off)


def follow_log(record: RunRecord, step: str, index: int, attempt: int, stream: str,
               follow: LogFollow, window: int = WINDOW) -> tuple[bytes, int, int]:
    """The log's bytes after ``follow.offset``, at most ``window`` of them: ``(data,
    start, skipped)``. Further behind than a window, it skips to the last window's
    first whole line, and ``skipped`` says how many bytes the page will not get."""
    data, start, size = itemsmod.read_log(record, step, index, attempt, stream,
                                          follow.offset, window)
    if size - follow.offset <= window:
        return data, start, 0
    data, start, size = itemsmod.read_log(record, step, index, attempt, stream, None, window)
    line = data.find(b"\n", 0, 16 << 10)
    if 0 <= line < len(data) - 1:
        data, start = data[line + 1:], start + line + 1
    # The bytes before the window may end inside a character: start decoding afresh.
    follow.decoder.reset()
    return data, start, max(0, start - follow.offset)


def parse_offsets(text: str) -> dict[tuple[int, str], int]:
    """``1:stdout:120,1:stderr:0`` -> {(1, "stdout"): 120, ...}."""
    out: dict[tuple[int, str], int] = {}
    for part in text.split(","):
        bits = part.split(":")
        if len(bits) == 3 and bits[0].isdigit() and bits[1] in ("stdout", "stderr") \
                and bits[2].isdigit():
            with contextlib.suppress(ValueError):
                out[(int(bits[0]), bits[1])] = int(bits[2])
    return out
