"""The scheduler: which step and item comes next, as a pure state machine.

Events go in (``handle``), actions come out (both in ``runner.events``); nothing here starts a thread,
touches a file or reads a clock. Time arrives inside the events, and retry
jitter comes from an injected ``random.Random``, so every decision (order,
slots, retries with their backoff, skips after a failure, the interrupt) is
tested with tables of events and expected actions (``tests/unit/test_scheduler.py``).

The engine (``runner.engine``) is the I/O shell around it: it answers
``Expand`` by rendering the step's ``for_each`` and ``key`` templates, runs
``StartAttempt`` through an executor, records ``ItemFinished`` and the rest,
and feeds the outcomes back as ``AttemptEnded``. The items of an inline step
(``keep:``) take no job slot: the ones ready together start in batches of
up to ``INLINE_BATCH``, each one ``StartInline`` answered by one ``InlineEnded``.

Life of a step: ``pending`` until every step it needs is done; then skipped
(a need failed and does not continue past failures, or the run was
interrupted) or expanded into items, ``running`` while items run, and
finally ``succeeded``, ``failed`` or ``interrupted``. Life of an item:
``pending`` (waiting for a job slot) -> ``running`` -> done, or ``retrying``
for its backoff delay and back to ``pending``; an attempt ``lost`` with its
worker (a remote executor's) puts the item back at the head of the queue at
once, up to ``MAX_LOST`` times, without using a retry.

Imports nothing of stockade but ``stockade.runner.status`` and its vocabulary,
``stockade.runner.events``.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from stockade.runner.events import (
    Action,
    AttemptEnded,
    CancelRunning,
    Event,
    Expand,
    Expanded,
    ExpandFailed,
    InlineEnded,
    Interrupt,
    ItemFinished,
    RetryScheduled,
    RunFinished,
    Start,
    StartAttempt,
    StartInline,
    StepFinished,
    StepInfo,
    StepStarted,
    Tick,
)
from stockade.runner.status import (
    ATTEMPT_FINAL,
    ITEM_BAD,
    STEP_DONE,
    AttemptStatus,
    ItemStatus,
    RunStatus,
    StepStatus,
    item_status,
)

#: The longest wait before a retry, whatever ``retry_delay`` and the attempt count say.
MAX_RETRY_DELAY = 60.0
#: Each retry delay is multiplied by a factor drawn from [1 - JITTER, 1 + JITTER].
JITTER = 0.2
#: Attempts of one item that may be ``lost`` (their worker died) and run again at
#: once, not counted against ``retries``; one more ends the item as errored.
MAX_LOST = 3
#: Items of an inline step started by one ``StartInline``. The next batch starts
#: when this one has ended, so a 100,000-item ``keep:`` never holds the actions
#: and events of all its items at once.
INLINE_BATCH = 1024


# -- state --------------------------------------------------------------------------


@dataclass
class _Step:
    info: StepInfo
    status: StepStatus = StepStatus.PENDING
    expanding: bool = False
    expand_failed: bool = False
    total: int = 0
    items: list[ItemStatus] = field(default_factory=list)
    tries: list[int] = field(default_factory=list)
    #: Attempts lost with their worker, per item.
    lost: list[int] = field(default_factory=list)
    finished: int = 0
    bad: int = 0
    message: str = ""


class Scheduler:
    """Steps in DAG order, items through ``slots`` job slots, retries with backoff."""

    def __init__(
        self,
        steps: Sequence[StepInfo],
        order: Sequence[str],
        *,
        slots: int,
        rng: random.Random | None = None,
        inline_batch: int = INLINE_BATCH,
    ) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        if inline_batch < 1:
            raise ValueError("inline_batch must be at least 1")
        self.slots = slots
        self.inline_batch = inline_batch
        self._rng = rng or random.Random()
        self._steps = {s.id: _Step(s) for s in steps}
        self._order = list(order)
        self._pending_steps = list(order)
        self._ready: deque[tuple[str, int]] = deque()
        self._waiting: list[tuple[float, int, str, int]] = []
        self._seq = 0
        self.running = 0
        #: A ``StartInline`` is out and its ``InlineEnded`` has not come back.
        self._inline_running = False
        self.interrupted = False
        self.finished: RunStatus | None = None

    # -- queries ----------------------------------------------------------------

    def step_status(self, step: str) -> StepStatus:
        return self._steps[step].status

    def item_status(self, step: str, index: int) -> ItemStatus:
        return self._steps[step].items[index]

    def usable(self, step: str) -> bool:
        """Whether dependents of ``step`` may run (it succeeded, or continues past failures)."""
        st = self._steps[step]
        if st.status is StepStatus.SUCCEEDED:
            return True
        return (st.status is StepStatus.FAILED and st.info.continue_on_failure
                and not st.expand_failed)

    def next_wakeup(self) -> float | None:
        """When the earliest waiting retry is due (send a ``Tick`` then), or None."""
        return self._waiting[0][0] if self._waiting else None

    def counts(self, step: str) -> Mapping[ItemStatus, int]:
        out: dict[ItemStatus, int] = {}
        for s in self._steps[step].items:
            out[s] = out.get(s, 0) + 1
        return out

    # -- events -----------------------------------------------------------------

    def handle(self, event: Event) -> list[Action]:
        """Apply one event; return what the engine must do now, in order."""
        if self.finished is not None:
            raise RuntimeError(f"the run already finished ({self.finished}); got {event!r}")
        out: list[Action] = []
        if isinstance(event, Start):
            self._release_waiting(event.now)
        elif isinstance(event, Expanded):
            self._expanded(event, out)
        elif isinstance(event, ExpandFailed):
            self._expand_failed(event, out)
        elif isinstance(event, AttemptEnded):
            self._attempt_ended(event.step, event.index, event.status, event.now,
                                event.retryable, out)
            self._release_waiting(event.now)
        elif isinstance(event, InlineEnded):
            if not self._steps[event.step].info.inline:
                raise ValueError(f"step {event.step!r} is not inline")
            if not self._inline_running:
                raise ValueError(f"no inline batch of {event.step!r} is running")
            self._inline_running = False
            for index, status, retryable in event.ended:
                self._attempt_ended(event.step, index, status, event.now, retryable, out)
            self._release_waiting(event.now)
        elif isinstance(event, Tick):
            self._release_waiting(event.now)
        elif isinstance(event, Interrupt):
            self._interrupt(event, out)
        else:  # pragma: no cover - the union is closed
            raise TypeError(f"not a scheduler event: {event!r}")
        self._advance(out)
        return out

    def _expanded(self, ev: Expanded, out: list[Action]) -> None:
        st = self._running_step(ev.step)
        st.expanding = False
        st.total = ev.items
        st.items = [ItemStatus.PENDING] * ev.items
        st.tries = [0] * ev.items
        st.lost = [0] * ev.items
        out.append(StepStarted(ev.step, ev.items))
        for index in sorted(ev.done):
            if not 0 <= index < ev.items:
                raise ValueError(f"{ev.step}: verified item {index} is not among {ev.items} items")
            st.items[index] = ItemStatus.SUCCEEDED
            st.finished += 1
        if self.interrupted:
            self._drop_unstarted(st, out)
        else:
            self._ready.extend((ev.step, i) for i in range(ev.items) if i not in ev.done)
        self._maybe_finish_step(st, out)

    def _expand_failed(self, ev: ExpandFailed, out: list[Action]) -> None:
        st = self._running_step(ev.step)
        st.expanding = False
        st.expand_failed = True
        st.status, st.message = StepStatus.FAILED, ev.message
        out.append(StepFinished(ev.step, StepStatus.FAILED, ev.message))

    def _attempt_ended(self, sid: str, index: int, status: AttemptStatus, now: float,
                       retryable: bool, out: list[Action]) -> None:
        st = self._steps[sid]
        if st.items[index] is not ItemStatus.RUNNING:
            raise ValueError(f"{sid}/{index} is not running ({st.items[index]})")
        if not st.info.inline:
            self.running -= 1
        if status is AttemptStatus.LOST and not self.interrupted \
                and st.lost[index] < MAX_LOST:
            # Its worker died: the item runs again at once in a fresh attempt
            # (the next number), ahead of the queue; the loss is not one of its retries.
            st.lost[index] += 1
            st.items[index] = ItemStatus.PENDING
            self._ready.appendleft((sid, index))
            return
        try_ = st.tries[index]
        failures = try_ - st.lost[index]  # the attempts that count against ``retries``
        retry = (status not in ATTEMPT_FINAL and retryable and not self.interrupted
                 and failures <= st.info.retries)
        if retry:
            delay = self.retry_delay(st.info.retry_delay, failures)
            st.items[index] = ItemStatus.RETRYING
            self._seq += 1
            heapq.heappush(self._waiting, (now + delay, self._seq, sid, index))
            out.append(RetryScheduled(sid, index, try_ + 1, now + delay, delay))
            return
        self._finish_item(st, index, item_status(status), out)
        self._maybe_finish_step(st, out)

    def retry_delay(self, base: float, try_: int) -> float:
        """``base`` doubled for each earlier try, capped, with +/-20% jitter."""
        delay = min(MAX_RETRY_DELAY, base * 2.0 ** (try_ - 1))
        return min(MAX_RETRY_DELAY, delay * self._rng.uniform(1 - JITTER, 1 + JITTER))

    def _interrupt(self, ev: Interrupt, out: list[Action]) -> None:
        if self.interrupted:
            return
        self.interrupted = True
        for sid in self._pending_steps:
            st = self._steps[sid]
            st.status, st.message = StepStatus.SKIPPED, ev.reason
            out.append(StepFinished(sid, StepStatus.SKIPPED, ev.reason))
        self._pending_steps.clear()
        touched: dict[str, _Step] = {}
        for sid, index in self._ready:
            st = self._steps[sid]
            self._finish_item(st, index, ItemStatus.INTERRUPTED, out)
            touched[sid] = st
        self._ready.clear()
        for _, _, sid, index in sorted(self._waiting):
            st = self._steps[sid]
            self._finish_item(st, index, ItemStatus.INTERRUPTED, out)
            touched[sid] = st
        self._waiting.clear()
        for st in touched.values():
            self._maybe_finish_step(st, out)
        if self.running:
            out.append(CancelRunning())

    # -- progress ---------------------------------------------------------------

    def _advance(self, out: list[Action]) -> None:
        """Start every step whose needs are done, then fill the free job slots."""
        progressed = True
        while progressed:
            progressed = self._start_steps(out)
            while self._ready and not self.interrupted:
                sid, index = self._ready[0]
                st = self._steps[sid]
                if st.info.inline:
                    # One batch at a time: the next starts when this one has ended.
                    if not self._inline_running:
                        self._start_inline(sid, st, out)
                    break
                if self.running >= self.slots:
                    break
                self._ready.popleft()
                st.items[index] = ItemStatus.RUNNING
                st.tries[index] += 1
                self.running += 1
                out.append(StartAttempt(sid, index, st.tries[index]))
        if self.finished is None and not self._pending_steps and not self.running \
                and not self._ready and not self._waiting \
                and all(s.status in STEP_DONE for s in self._steps.values()):
            self.finished = self._run_status()
            out.append(RunFinished(self.finished))

    def _start_inline(self, sid: str, st: _Step, out: list[Action]) -> None:
        """Start the inline step's items at the head of the queue, as one batch (no slots)."""
        indexes: list[int] = []
        ready = self._ready
        while ready and ready[0][0] == sid and len(indexes) < self.inline_batch:
            index = ready.popleft()[1]
            st.items[index] = ItemStatus.RUNNING
            st.tries[index] += 1
            indexes.append(index)
        self._inline_running = True
        out.append(StartInline(sid, tuple(indexes), tuple(st.tries[i] for i in indexes)))

    def _start_steps(self, out: list[Action]) -> bool:
        started = False
        for sid in list(self._pending_steps):
            st = self._steps[sid]
            needs = [self._steps[n] for n in st.info.needs]
            if any(n.status not in STEP_DONE for n in needs):
                continue
            self._pending_steps.remove(sid)
            started = True
            blocked = [n.info.id for n in needs if not self.usable(n.info.id)]
            if blocked:
                st.status = StepStatus.SKIPPED
                st.message = f"{', '.join(blocked)} did not succeed"
                out.append(StepFinished(sid, StepStatus.SKIPPED, st.message))
                continue
            st.status, st.expanding = StepStatus.RUNNING, True
            out.append(Expand(sid))
        return started

    def _finish_item(self, st: _Step, index: int, status: ItemStatus, out: list[Action]) -> None:
        st.items[index] = status
        st.finished += 1
        if status in ITEM_BAD:
            st.bad += 1
        out.append(ItemFinished(st.info.id, index, status))

    def _maybe_finish_step(self, st: _Step, out: list[Action]) -> None:
        if st.status is not StepStatus.RUNNING or st.expanding or st.finished < st.total:
            return
        if any(s is ItemStatus.INTERRUPTED for s in st.items):
            st.status, st.message = StepStatus.INTERRUPTED, "run interrupted"
        elif st.bad:
            st.status = StepStatus.FAILED
            noun = "item" if st.total == 1 else "items"
            st.message = f"{st.bad} of {st.total} {noun} did not succeed"
            if st.info.continue_on_failure:
                st.message += " (on_item_failure: continue)"
        else:
            st.status = StepStatus.SUCCEEDED
        out.append(StepFinished(st.info.id, st.status, st.message))

    def _drop_unstarted(self, st: _Step, out: list[Action]) -> None:
        for i, s in enumerate(st.items):
            if s is ItemStatus.PENDING:
                self._finish_item(st, i, ItemStatus.INTERRUPTED, out)

    def _release_waiting(self, now: float) -> None:
        while self._waiting and self._waiting[0][0] <= now:
            _, _, sid, index = heapq.heappop(self._waiting)
            self._steps[sid].items[index] = ItemStatus.PENDING
            self._ready.append((sid, index))

    def _running_step(self, step: str) -> _Step:
        st = self._steps[step]
        if not st.expanding:
            raise ValueError(f"step {step!r} was not being expanded")
        return st

    def _run_status(self) -> RunStatus:
        if self.interrupted:
            return RunStatus.INTERRUPTED
        if all(s.status is StepStatus.SUCCEEDED for s in self._steps.values()):
            return RunStatus.SUCCEEDED
        return RunStatus.FAILED


__all__ = [
    "Action", "AttemptEnded", "CancelRunning", "Event", "Expand", "ExpandFailed", "Expanded",
    "InlineEnded", "Interrupt", "ItemFinished", "RetryScheduled", "RunFinished", "Scheduler",
    "Start", "StartAttempt", "StartInline", "StepFinished", "StepInfo", "StepStarted", "Tick",
]
