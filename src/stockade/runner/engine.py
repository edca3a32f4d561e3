"""The engine: the I/O shell around the scheduler.

It answers the scheduler's actions (expand a step into keyed items, start an
attempt on the executor, record what finished, stop everything on an
interrupt) and feeds outcomes back as events. All bookkeeping (the store's
records through ``runner.ledger``, views, progress) happens on this one
thread; attempts run on the executor.

An interrupt (Ctrl-C, SIGTERM from ``stockade cancel``) only sets a flag and
wakes the loop: raising ``KeyboardInterrupt`` wherever the main thread
happens to be could leave a lock held (the store's, the executor's) and hang
the engine until the jails end. The loop turns the flag into an
``Interrupt`` event, cancels the running jails and keeps collecting outcomes
until every attempt has reported.

Must not import the CLI.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade.plan import Plan
from stockade.runner.attempt import (
    ITEM_ERRORS,
    Attempt,
    ItemRef,
    Outcome,
    RunContext,
    after_interrupt,
    error_message,
)
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
from stockade.runner.executor import Executor
from stockade.runner.fanout import items_of
from stockade.runner.gcpace import collector_paced
from stockade.runner.kinds import inline_kind, is_inline, makes_attempt_folders
from stockade.runner.kinds.process import (
    network_mode,
    resources_of,
)
from stockade.runner.ledger import FLUSH_SECONDS, Ledger
from stockade.runner.prefetch import FolderPrefetch
from stockade.runner.report import Reporter
from stockade.runner.resume import record_lost_attempts, verified_items
from stockade.runner.reuse import (
    NO_MATCH,
    UNKEYED,
    Keyed,
    lookup,
    not_reused_because,
    take,
    unseen_reads,
)
from stockade.runner.scheduler import Scheduler
from stockade.runner.status import ITEM_BAD, AttemptStatus, ItemStatus, RunStatus, StepStatus
from stockade.runner.summary import RunSummary
from stockade.runner.views import ItemResult, artifacts_of, step_view
from stockade.spec import Spec
from stockade.spec.model import Step
from stockade.store.base import ItemRecord, add_usage, sum_usage, tally_json
from stockade.workspace.layout import ItemDir, RunDir

#: The folders of attempts made only to key items (``_find_reusable``).
_NO_DIRS = ItemDir(Path("/nonexistent"))


@dataclass(slots=True)
class _Item:
    index: int
    key: str
    value: Any
    #: The attempt number before this execution's first (from disk on resume).
    base: int = 0
    outcome: Outcome | None = None
    #: The item's reuse key and the earlier items that share it, when there are any.
    reuse: Keyed | None = None
    #: Why a run with reuse on runs the item (``ItemRecord.not_reused``).
    not_reused: str | None = None
    #: Agent tokens spent by this item's attempts so far (None: none yet).
    usage: dict[str, int] | None = None
    #: Resume looked for attempts a dead engine left (once per item).
    resumed: bool = False


@dataclass
class _StepRun:
    step: Step
    items: list[_Item] = field(default_factory=list)
    results: dict[int, ItemResult] = field(default_factory=dict)
    retries: int = 0
    reused: int = 0
    #: Why no item of the step is reused though the run reuses; None: they may be.
    no_reuse: str | None = None


class Engine:
    """Executes one run (fresh or resumed) of a loaded, planned workflow."""

    def __init__(
        self,
        *,
        spec: Spec,
        plan: Plan,
        run: RunDir,
        context: RunContext,
        executor: Executor,
        vars: Mapping[str, Any],
        reporter: Reporter,
        resume: bool = False,
        reuse: bool = False,
        rng: random.Random | None = None,
        prefetch: FolderPrefetch | None = None,
    ) -> None:
        self.spec, self.plan, self.run, self.ctx = spec, plan, run, context
        #: Makes items' folders ahead of their turn (a local executor's runs).
        self.prefetch = prefetch
        self.store = context.store
        self.executor = executor
        self.vars = dict(vars)
        self.reporter = reporter
        self.resume = resume
        self.reuse = reuse
        self.steps = {s.id: _StepRun(s) for s in spec.workflow.steps}
        self.views: dict[str, dict[str, Any]] = {}
        self.messages: list[str] = []
        self.verified: dict[tuple[str, int], ItemRecord] = {}
        self._index = {s.id: i for i, s in enumerate(spec.workflow.steps)}
        self.scheduler = Scheduler(
            [StepInfo(s.id, tuple(dict.fromkeys(s.needs)), s.retries, s.retry_delay,
                      s.on_item_failure == "continue", is_inline(s))
             for s in spec.workflow.steps],
            plan.order, slots=executor.slots, rng=rng,
        )
        self._interrupts = 0
        self._handled_interrupts = 0
        self.ledger = Ledger(run.run_id, self.store, context.masker, context.clock)
        self._cancellers: list[threading.Thread] = []
        # Each action's handler by its type: a few actions per item, so a
        # chain of isinstance tests was measurable on a large keep:.
        self._handlers: dict[type, Callable[[Any], list[Action] | None]] = {
            Expand: lambda a: self.scheduler.handle(self._expand(a.step)),
            StepStarted: self._step_started,
            StartAttempt: self._start,
            StartInline: self._start_inline,
            RetryScheduled: self._retry_scheduled,
            ItemFinished: self._item_finished,
            StepFinished: self._step_finished,
            CancelRunning: lambda a: self._cancel(),
        }

    # -- interrupts (called from a signal handler: set a flag, wake the loop) -------

    def interrupt(self) -> None:
        self._interrupts += 1
        self.executor.wake()

    # -- the loop -------------------------------------------------------------------

    def execute(self) -> RunSummary:
        if self.resume:
            kinds = {s.id: s.kind for s in self.spec.workflow.steps}
            self.verified = verified_items(self.run, self.store, kinds, self.ctx.clock,
                                           self.reporter.echo)
        with collector_paced():
            return self._execute()

    def _execute(self) -> RunSummary:
        status: RunStatus | None = None
        try:
            status = self._apply(self.scheduler.handle(Start(self.ctx.clock())))
            while status is None:
                status = self._check_interrupt()
                if status is not None:
                    break
                wake = self.scheduler.next_wakeup()
                timeout = FLUSH_SECONDS
                if wake is not None:
                    timeout = max(0.0, min(timeout, wake - self.ctx.clock()))
                done = self.executor.completed(timeout)
                # An interrupt that came while waiting goes before the outcomes
                # that came with it: attempts it ended (a cluster gone for good)
                # are then interrupted attempts of an interrupted run, not failures.
                status = self._check_interrupt()
                if not done:
                    self.ledger.flush()
                for attempt, outcome in done:
                    status = self._apply(self._attempt_ended(attempt, outcome)) or status
                if status is None and wake is not None and self.ctx.clock() >= wake:
                    status = self._apply(self.scheduler.handle(Tick(self.ctx.clock())))
        finally:
            self.ledger.flush()
            for t in self._cancellers:
                t.join()
            if self.prefetch is not None:
                self.prefetch.close()
        return self._summary(status or RunStatus.INTERRUPTED)

    def _check_interrupt(self) -> RunStatus | None:
        if self._interrupts == self._handled_interrupts:
            return None
        first = self._handled_interrupts == 0
        self._handled_interrupts = self._interrupts
        if not first:
            # A second Ctrl-C: no grace period for the jails.
            self._cancel(grace=0.0)
            return None
        self.reporter.echo("interrupted: stopping running items (Ctrl-C again to kill at once)")
        if self.prefetch is not None:
            self.prefetch.clear()
        return self._apply(self.scheduler.handle(Interrupt(self.ctx.clock())))

    def _cancel(self, grace: float | None = None) -> None:
        # In a thread: killing waits for each jail's grace period, and the
        # loop must go on collecting the outcomes the kills produce.
        t = threading.Thread(target=self.ctx.jails.cancel, kwargs={"grace": grace},
                             name="cancel", daemon=True)
        t.start()
        self._cancellers.append(t)
        # A remote executor's attempts run in jails on other machines.
        self.executor.cancel()

    def _apply(self, actions: list[Action]) -> RunStatus | None:
        """Carry out actions; those that answer with an event feed it back at once."""
        todo = deque(actions)
        finished: RunStatus | None = None
        handlers = self._handlers
        while todo:
            action = todo.popleft()
            if isinstance(action, RunFinished):
                finished = action.status
                continue
            more = handlers[type(action)](action)
            if more:
                todo.extendleft(reversed(more))
        return finished

    # -- expand ---------------------------------------------------------------------

    def context(self, step: Step, item: Any = None, *, with_item: bool = False) -> dict[str, Any]:
        ctx: dict[str, Any] = {
            "vars": self.vars,
            "run": {"id": self.run.run_id},
            "steps": {n: self.views[n] for n in step.needs if n in self.views},
        }
        if with_item:
            ctx["item"] = item
        return ctx

    def _expand(self, sid: str) -> Event:
        sr = self.steps[sid]
        step = sr.step
        now = self.ctx.clock()
        try:
            values, keys = items_of(step, self.ctx, self.context)
        except ITEM_ERRORS as exc:
            message = self.ctx.masker.text(error_message(exc))
            self.ledger.step_record(sid, ItemStatus.ERRORED, message)
            self.messages.append(f"{sid}: {message}")
            return ExpandFailed(sid, message, now)
        sr.items = [_Item(i, k, v) for i, (k, v) in enumerate(zip(keys, values, strict=True))]
        done: set[int] = set()
        for it in sr.items:
            rec = self.verified.get((sid, it.index))
            if rec is not None and (not rec.key or rec.key == it.key):
                done.add(it.index)
                outputs = artifacts_of(rec, self.run.path, self.run.run_id)
                sr.results[it.index] = ItemResult(it.index, it.key, ItemStatus.SUCCEEDED,
                                                  it.value, rec.result, outputs)
        if not step.isolate and step.kind in ("run", "agent"):
            self.reporter.echo(f"{sid}: isolate: false - runs WITHOUT a sandbox (recorded)")
            self.ledger.event("isolation_opt_out", {"step": sid})
        if self.reuse and not is_inline(step):
            sr.no_reuse = not_reused_because(step)
            if sr.no_reuse is None:
                self._find_reusable(sr, done)
        # Not on resume: an item there may have attempts on disk already.
        if self.prefetch is not None and makes_attempt_folders(step) and not self.resume:
            ahead = [it.index for it in sr.items if it.index not in done
                     and not (it.reuse is not None and it.reuse.candidates)]
            # Only where the step's folder refused the spread flag: under a
            # spread folder, new folders are cheap and the helper thread cost
            # more CPU than it saved the slots (README, "Directory layout").
            if ahead and not self._spread(sid):
                self.prefetch.add(sid, ahead)
        return Expanded(sid, len(sr.items), now, frozenset(done))

    def _spread(self, sid: str) -> bool:
        """Make the step's folder; whether its item folders are spread."""
        try:
            return self.run.make_step(sid)
        except OSError:
            return False  # each attempt meets the error making its own folders

    def _find_reusable(self, sr: _StepRun, done: set[int]) -> None:
        """Key every item that is not kept already and look the keys up in one go."""
        t0 = time.perf_counter()
        # Keying reads no folder: the attempts skip building their paths.
        todo = [(it, self._attempt(sr.step, it, 1, dirs=False)) for it in sr.items
                if it.index not in done]
        found = lookup([a for _, a in todo], self.store, self.run.run_id)
        for (it, _), keyed in zip(todo, found, strict=True):
            if keyed.candidates:
                it.reuse = keyed
            else:
                it.not_reused = NO_MATCH if keyed.key else UNKEYED
        self.ledger.event("reuse_lookup", {
            "step": sr.step.id, "items": len(sr.items),
            "keyed": sum(1 for k in found if k.key), "candidates": sum(1 for k in found
                                                                        if k.candidates),
            "seconds": round(time.perf_counter() - t0, 4)})

    def _step_started(self, action: StepStarted) -> None:
        self.reporter.step_started(action.step, action.items)
        step = self.steps[action.step].step
        if step.kind in ("run", "agent"):
            # What the backend cannot apply of the step's resources (and of
            # a run: step's network), said once per step.
            backend = self.ctx.backend if step.isolate else self.ctx.none_backend
            notes = backend.unapplied(resources_of(step))
            if step.kind == "run":  # an agent's jail has no network
                notes += backend.network_gaps(network_mode(step))
            unseen = unseen_reads(step) if self.reuse and step.reuse is None else None
            if unseen:
                notes += (f"not reused from earlier runs: {unseen} "
                          "(reuse: true on the step allows it)",)
            for note in notes:
                self.reporter.echo(f"{action.step}: {note}")
        self.ledger.event("step_started", {"step": action.step, "items": action.items})
        sr = self.steps[action.step]
        keys = [it.key for it in sr.items]
        if any(k != str(n) for n, k in enumerate(keys)):
            # Records carry keys only once items finish: the web UI names the
            # running and pending ones from this (their indexes when absent).
            self.ledger.event("item_keys", {"step": action.step, "keys": keys})
        for index in sr.results:
            it = sr.items[index]
            self.reporter.item_finished(action.step, it.key, "kept", 0, "verified, not rerun")

    # -- attempts -------------------------------------------------------------------

    def _attempt(self, step: Step, it: _Item, try_: int, *, dirs: bool = True) -> Attempt:
        # Inline steps (keep:) make no attempts (``_start_inline``).
        return Attempt(
            run=self.ctx, step=step, item=ItemRef(step.id, it.index, it.key), value=it.value,
            number=it.base + try_,
            dirs=self.run.item(step.id, it.index) if dirs else _NO_DIRS,
            context=self.context(step, it.value, with_item=step.for_each is not None),
        )

    def _start(self, action: StartAttempt) -> list[Action]:
        sr = self.steps[action.step]
        it = sr.items[action.index]
        step = sr.step
        if action.try_ == 1 and self.resume and not it.resumed:
            it.resumed = True
            it.base = record_lost_attempts(self.run.run_id, step.id, it.index,
                                           self.run.item(step.id, it.index), self.store,
                                           self.ctx.clock, publish=step.publish is not None)
        attempt = self._attempt(step, it, action.try_)
        if self.prefetch is not None and action.try_ == 1:
            self.prefetch.claim(step.id, it.index)
        if action.try_ == 1 and it.reuse is not None and it.reuse.candidates:
            reused = self._reuse(attempt, it, it.reuse)
            if reused is not None:
                return self._attempt_ended(attempt, reused)
        self.reporter.item_started(step.id, it.key)
        self.executor.submit(attempt)
        return []

    def _start_inline(self, action: StartInline) -> list[Action]:
        """Evaluate a batch of an inline step's items here, on the engine's thread.

        They make no attempt record, folder or process; each item's outcome is
        kept for ``_item_finished``, and the scheduler hears of them all at once.
        """
        sr = self.steps[action.step]
        step = sr.step
        items = [sr.items[index] for index in action.indexes]
        outs = inline_kind(step).run_all(
            step, self.context(step),
            [(it.value, it.base + try_) for it, try_ in zip(items, action.tries, strict=True)],
            self.ctx)
        ended: list[tuple[int, AttemptStatus, bool]] = []
        for index, it, out in zip(action.indexes, items, outs, strict=True):
            it.outcome = out
            ended.append((index, out.status, out.retryable))
        return self.scheduler.handle(InlineEnded(action.step, tuple(ended), self.ctx.clock()))

    def _reuse(self, attempt: Attempt, it: _Item, keyed: Keyed) -> Outcome | None:
        """Take the item from an earlier run if one still verifies; None: it runs."""
        try:
            taken = take(attempt, keyed, self.ctx.clock())
        except OSError as exc:
            taken = f"the earlier item's outputs could not be placed here ({exc.strerror})"
        finally:
            it.reuse = None
        if isinstance(taken, str):
            # An earlier item matched: why it was passed over is news (as resume
            # says of its own items).
            it.not_reused = taken
            self.reporter.echo(f"{attempt.item}: not reused: {taken}; it runs")
            return None
        return taken

    def _attempt_ended(self, attempt: Attempt, outcome: Outcome) -> list[Action]:
        sr = self.steps[attempt.step.id]
        it = sr.items[attempt.item.index]
        if self._interrupts:
            # This loop ran the signal's handler before it read the outcome.
            outcome = after_interrupt(outcome)
        it.outcome = outcome
        if outcome.usage:
            it.usage = add_usage(it.usage or {}, outcome.usage)
        self.ledger.attempt_ended(attempt.step.id, attempt.item.index, outcome)
        if outcome.status is AttemptStatus.LOST:
            self._lost(attempt, it, outcome)
        return self.scheduler.handle(AttemptEnded(
            attempt.step.id, attempt.item.index, outcome.status, self.ctx.clock(),
            outcome.retryable))

    def _lost(self, attempt: Attempt, it: _Item, outcome: Outcome) -> None:
        """An attempt that went down with its worker (the scheduler starts the
        next, with the next number, without counting it against ``retries``)."""
        worker = (outcome.provenance or {}).get("worker") or {}
        self.reporter.echo(f"{attempt.item}: attempt {outcome.attempt} lost "
                           f"({self.ctx.masker.text(outcome.message)}); it runs again")
        self.ledger.event("attempt_lost", {
            "step": attempt.step.id, "item": attempt.item.index, "key": it.key,
            "attempt": outcome.attempt, "worker": worker.get("name"), "why": outcome.message,
        })

    def _retry_scheduled(self, action: RetryScheduled) -> None:
        sr = self.steps[action.step]
        it = sr.items[action.index]
        sr.retries += 1
        message = it.outcome.message if it.outcome else ""
        # The attempt's own number, as show and logs give it (past attempts
        # of a resumed run included).
        self.reporter.item_retrying(action.step, it.key, it.base + action.try_ - 1,
                                    action.delay, message)
        self.ledger.event("retry_scheduled", {
            "step": action.step, "item": action.index, "key": it.key,
            "attempt": it.base + action.try_, "at": action.at, "delay": round(action.delay, 3),
            "after": message,
        })

    def _item_finished(self, action: ItemFinished) -> None:
        sr = self.steps[action.step]
        it = sr.items[action.index]
        out = it.outcome
        status = action.status
        if out is None:  # never started (interrupted before its turn)
            now = self.ctx.clock()
            out = Outcome(AttemptStatus.INTERRUPTED, 0, message="not started: run interrupted",
                          started_at=now, ended_at=now)
        rec = self.ledger.item_finished(
            action.step, action.index, status, out, key=it.key, value=it.value, usage=it.usage,
            not_reused=None if out.reused_from or not out.attempt else it.not_reused or sr.no_reuse)
        sr.results[action.index] = ItemResult(action.index, it.key, status, it.value, out.result,
                                              artifacts_of(rec, self.run.path, self.run.run_id))
        if status in ITEM_BAD:
            self.messages.append(f"{action.step}/{it.key}: {status}: {out.message}")
        # What later steps read is in sr.results; the outcome (with its
        # provenance, a few KiB per item) is in the store now: a 100,000-item
        # run must not keep them all.
        it.outcome = None
        if status is ItemStatus.INTERRUPTED and out.attempt == 0:
            return
        shown = "reused" if out.reused_from else str(status)
        if out.reused_from:
            sr.reused += 1
        self.reporter.item_finished(action.step, it.key, shown, out.attempt, out.message,
                                    out.stderr_tail if status in ITEM_BAD else "")

    def _step_finished(self, action: StepFinished) -> None:
        sr = self.steps[action.step]
        self.ledger.flush()
        if action.status is StepStatus.SKIPPED:
            # The reason only: show, logs and the UI print the status beside it.
            self.ledger.step_record(action.step, ItemStatus.SKIPPED, action.message)
        if self.scheduler.usable(action.step):
            good = [r for r in sr.results.values() if r.status is ItemStatus.SUCCEEDED]
            self.views[action.step] = step_view(sr.step.kind, sr.step.for_each is not None, good)
        # Every record of the step is written: its tally goes with the event,
        # so show and the UI need not count a finished run's records again.
        tally = self.store.step_tallies(self.run.run_id, [action.step]).get(action.step)
        self.ledger.event("step_finished", {"step": action.step, "status": str(action.status),
                                           "tally": tally_json(tally)})
        self.reporter.step_finished(action.step, str(action.status), action.message)

    def _summary(self, status: RunStatus) -> RunSummary:
        statuses = {sid: self.scheduler.step_status(sid) for sid in self.steps}
        # A skipped step that never had items has the one record _step_finished
        # wrote, as show and the UI count it.
        counts = {sid: dict(Counter(str(r.status) for r in sr.results.values()))
                  or ({"skipped": 1} if statuses[sid] is StepStatus.SKIPPED else {})
                  for sid, sr in self.steps.items()}
        retries = {sid: sr.retries for sid, sr in self.steps.items() if sr.retries}
        reused = {sid: sr.reused for sid, sr in self.steps.items() if sr.reused}
        # From the store, so a resumed run counts the items it kept too; only
        # runs with agent steps have any (and only they pay for the read).
        agents = any(sr.step.kind == "agent" for sr in self.steps.values())
        usage = sum_usage(self.store.items(self.run.run_id)) if agents else {}
        return RunSummary(status, statuses, counts, tuple(self.messages), retries, reused, usage)

