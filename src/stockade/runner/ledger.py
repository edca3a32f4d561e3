"""The run's records on their way to the store: built, masked, written in batches.

The engine hands every ended attempt and finished item to its ``Ledger``,
which makes the store's records of them (secrets masked in every message,
result and value) and writes them in one transaction per batch: at most
``FLUSH_EVERY`` items, or whatever finished in ``FLUSH_SECONDS``. Events
are written at once. A crash before a flush loses nothing that matters:
resume trusts an item only when the store and its completion file agree, so
an unflushed item simply runs again.

Time comes in as two clocks (the run's wall clock for records, a monotonic
one for the batch's age), so the batching is tested without sleeping.
Must not import the engine, the executors or the CLI.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from stockade.runner.attempt import Outcome
from stockade.runner.env import Masker
from stockade.runner.status import ItemStatus
from stockade.store.base import (
    ArtifactRecord,
    AttemptRecord,
    Event,
    ItemRecord,
    ReuseEntry,
    Store,
)
from stockade.workspace.artifacts import to_json_value

#: Bookkeeping of finished items is written in batches of this many, or this often.
#: The time bound keeps the store (show, the UI, resume) at most a quarter second
#: behind; the count bounds memory. A keep: over 100,000 items finishes tens of
#: thousands a second: batches of 64 made it pay a transaction every 64 items
#: (10,000/s against 14,000/s with 1,024, paired runs).
FLUSH_EVERY = 1024
FLUSH_SECONDS = 0.25


class Ledger:
    """One run's records not yet in the store, and when to write them."""

    def __init__(self, run_id: str, store: Store, masker: Masker, clock: Callable[[], float],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.run_id, self.store, self.masker = run_id, store, masker
        self._clock, self._monotonic = clock, monotonic
        self._attempts: list[AttemptRecord] = []
        self._items: list[tuple[ItemRecord, list[ArtifactRecord]]] = []
        self._reuse: list[ReuseEntry] = []
        self._flushed_at = monotonic()

    def event(self, kind: str, data: dict[str, Any]) -> None:
        self.store.add_event(Event(self.run_id, self._clock(), kind, self.masker.value(data)))

    def attempt_ended(self, step: str, index: int, outcome: Outcome) -> None:
        self._attempts.append(AttemptRecord(
            self.run_id, step, index, outcome.attempt, str(outcome.status), outcome.exit_code,
            outcome.started_at, outcome.ended_at, self.masker.text(outcome.message),
            outcome.provenance))

    def item_finished(self, step: str, index: int, status: ItemStatus, out: Outcome, *,
                      key: str, value: Any, usage: dict[str, int] | None,
                      not_reused: str | None = None) -> ItemRecord:
        """Record an item's end (``out``: its last attempt's outcome) and return
        its record; flush when the batch is full or old enough."""
        arts = [ArtifactRecord(self.run_id, step, index, out.attempt, o.name, o.sha256, o.size)
                for o in out.outputs]
        rec = ItemRecord(
            self.run_id, step, index, str(status), out.attempt,
            result=self.masker.value(to_json_value(out.result)),
            value=self.masker.value(to_json_value(value)),
            message=self.masker.text(out.message), started_at=out.started_at,
            ended_at=out.ended_at, outputs=tuple(arts), key=key, usage=usage or {},
            reused_from=dict(out.reused_from) if out.reused_from else None,
            not_reused=self.masker.text(not_reused) if not_reused else None,
        )
        self._items.append((rec, arts))
        if usage:
            # The store's item record is the total; the event lets live views fold it in.
            self.event("agent_usage", {"step": step, "item": index, "usage": dict(usage)})
        if status is ItemStatus.SUCCEEDED and out.reuse_key:
            # Every succeeded item is indexed, whether or not this run reuses.
            self._reuse.append(ReuseEntry(out.reuse_key, self.run_id, step, index, out.attempt,
                                          out.ended_at))
        if len(self._items) >= FLUSH_EVERY or \
                self._monotonic() - self._flushed_at >= FLUSH_SECONDS:
            self.flush()
        return rec

    def step_record(self, step: str, status: ItemStatus, message: str) -> None:
        """Write at once the one record of a step that ran no item (skipped, or
        its items could not be made), message masked."""
        now = self._clock()
        self.store.complete_item(ItemRecord(self.run_id, step, 0, str(status), 0,
                                            message=self.masker.text(message),
                                            started_at=now, ended_at=now), [])

    def flush(self) -> None:
        """Write what is pending, attempts and items in one transaction."""
        if self._attempts or self._items:
            self.store.record_batch(self._attempts, self._items)
            self._attempts, self._items = [], []
        if self._reuse:
            self.store.index_reuse(self._reuse)
            self._reuse = []
        self._flushed_at = self._monotonic()
