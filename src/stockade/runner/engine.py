"""The local executor: schedule steps in DAG order, fan out, retry, record.

A failed item fails its step; the step's dependents are skipped while
independent branches go on. Items run on ``jobs`` worker threads, each inside
its own jail; all bookkeeping (store writes, views) happens on the main thread.

Must not import the CLI.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any, Protocol

from stockade.errors import UserError
from stockade.expr import compile_template, render
from stockade.plan import Plan, expand
from stockade.runner.item import (
    ITEM_ERRORS,
    AttemptContext,
    AttemptOutcome,
    error_message,
    located,
    resources_of,
    run_attempt,
)
from stockade.runner.views import ItemResult, artifacts_of, step_view
from stockade.spec import Spec
from stockade.spec.model import Step
from stockade.store.base import ArtifactRecord, AttemptRecord, Event, ItemRecord, Store
from stockade.workspace.artifacts import sha256_file, to_json_value
from stockade.workspace.layout import ItemDir, RunDir, read_json, write_record

#: How many item tasks may wait in the pool beyond the ones running.
QUEUE_SLACK = 2
#: Bookkeeping of finished items is written in batches of this many, or this often.
FLUSH_EVERY = 64
FLUSH_SECONDS = 0.25


class Reporter(Protocol):
    """Progress output; the CLI has a live terminal one and a plain-lines one."""

    def step_started(self, step: str, items: int) -> None: ...
    def item_started(self, step: str, index: int) -> None: ...
    def item_finished(self, step: str, index: int, status: str, attempt: int, message: str) -> None: ...
    def step_finished(self, step: str, status: str, message: str) -> None: ...
    def echo(self, line: str) -> None: ...


@dataclass
class StepState:
    step: Step
    status: str = "pending"  # pending | running | succeeded | failed | skipped
    total: int = 0
    results: dict[int, ItemResult] = field(default_factory=dict)
    message: str = ""


@dataclass(frozen=True)
class RunSummary:
    status: str  # succeeded | failed | interrupted
    steps: Mapping[str, str]
    items: Mapping[str, Mapping[str, int]]
    messages: tuple[str, ...]


class Engine:
    """Executes one run (fresh or resumed) of a loaded, planned workflow."""

    def __init__(
        self,
        *,
        spec: Spec,
        plan: Plan,
        run: RunDir,
        store: Store,
        attempt_context: AttemptContext,
        vars: Mapping[str, Any],
        jobs: int,
        reporter: Reporter,
        resume: bool = False,
        publisher: Callable[..., AttemptOutcome],
        agent_factory: Callable[..., AttemptOutcome] | None = None,
    ) -> None:
        self.spec, self.plan, self.run, self.store = spec, plan, run, store
        self.vars = dict(vars)
        self.jobs = max(1, jobs)
        self.reporter = reporter
        self.resume = resume
        self.publisher = publisher
        self.agent_factory = agent_factory
        self.states = {s.id: StepState(s) for s in spec.workflow.steps}
        self.views: dict[str, dict[str, Any]] = {}
        self.messages: list[str] = []
        self.verified: dict[tuple[str, int], ItemRecord] = {}
        self._pending_attempts: list[AttemptRecord] = []
        self._pending_items: list[tuple[ItemRecord, list[ArtifactRecord]]] = []
        self._flushed_at = time.monotonic()
        self.ac = replace(attempt_context, locate=self.locate)
        self._index = {s.id: i for i, s in enumerate(spec.workflow.steps)}

    def locate(self, step: str, path: tuple[str | int, ...]) -> str:
        line, col = self.spec.position("steps", self._index[step], *path)
        return f"{self.spec.filename}:{line}:{col}"

    # -- context -------------------------------------------------------------

    def context(self, step: Step, item: Any = None, *, with_item: bool = False) -> dict[str, Any]:
        ctx: dict[str, Any] = {
            "vars": self.vars,
            "run": {"id": self.run.run_id},
            "steps": {n: self.views[n] for n in step.needs if n in self.views},
        }
        if with_item:
            ctx["item"] = item
        return ctx

    # -- resume --------------------------------------------------------------

    def load_verified(self) -> None:
        """Keep only completion records that still match the files on disk."""
        for rec in self.store.items(self.run.run_id):
            if rec.status != "succeeded":
                continue
            step = self.states.get(rec.step)
            if step is None or step.step.kind in ("keep",):
                continue
            if self._verifies(rec):
                self.verified[(rec.step, rec.item)] = rec
            else:
                self.store.forget_item(rec.run_id, rec.step, rec.item)
                self.store.add_event(Event(self.run.run_id, self.ac.clock(), "unverified",
                                           {"step": rec.step, "item": rec.item}))

    def _verifies(self, rec: ItemRecord) -> bool:
        idir = self.run.item(rec.step, rec.item)
        try:
            done = read_json(idir.completion)
        except (OSError, ValueError):
            return False
        if done.get("status") != "succeeded" or done.get("attempt") != rec.attempt \
                or done.get("run_id") != self.run.run_id:
            return False
        recorded = {a.name: (a.sha256, a.size) for a in rec.outputs}
        on_disk = {o["name"]: (o["sha256"], o["size"]) for o in done.get("outputs", [])}
        if recorded != on_disk:
            return False
        for name, (digest, size) in recorded.items():
            try:
                if sha256_file(idir.out / name) != (digest, size):
                    return False
            except OSError:
                return False
        return True

    # -- scheduling -----------------------------------------------------------

    def execute(self) -> RunSummary:
        if self.resume:
            self.load_verified()
        pending = deque(self.plan.order)
        queue: deque[tuple[Step, int, Any]] = deque()
        inflight: dict[Future[tuple[AttemptOutcome, list[AttemptRecord]]], tuple[Step, int, Any]] = {}
        finished: SimpleQueue[Future[tuple[AttemptOutcome, list[AttemptRecord]]]] = SimpleQueue()
        interrupted = False
        pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="item")
        try:
            while True:
                progressed = self._start_ready_steps(pending, queue)
                while queue and len(inflight) < self.jobs + QUEUE_SLACK and not self.ac.cancelled.is_set():
                    step, index, value = queue.popleft()
                    self.reporter.item_started(step.id, index)
                    fut = pool.submit(self._run_item, step, index, value)
                    inflight[fut] = (step, index, value)
                    fut.add_done_callback(finished.put)
                if not inflight:
                    if progressed:
                        continue
                    break
                # A queue of finished futures, not ``wait()``: that builds and
                # removes a waiter on every pending future for every item.
                try:
                    fut = finished.get(timeout=FLUSH_SECONDS)
                except Empty:
                    self.flush()
                    continue
                step, index, value = inflight.pop(fut)
                self._record(step, index, value, fut.result())
        except KeyboardInterrupt:
            interrupted = True
            self.cancel()
            for fut in list(inflight):
                step, index, value = inflight.pop(fut)
                with contextlib.suppress(KeyboardInterrupt):
                    self._record(step, index, value, fut.result())
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            self.flush()
        return self._summary(interrupted)

    def cancel(self) -> None:
        self.ac.cancelled.set()
        with self.ac.running_lock:
            jails = list(self.ac.running.values())
        for jail in jails:
            jail.kill(grace=1.0)

    def _start_ready_steps(self, pending: deque[str], queue: deque[tuple[Step, int, Any]]) -> bool:
        started = False
        for sid in list(pending):
            st = self.states[sid]
            needs = [self.states[n] for n in st.step.needs]
            if any(n.status in ("pending", "running") for n in needs):
                continue
            pending.remove(sid)
            started = True
            blocked = [n.step.id for n in needs if n.status != "succeeded"]
            if blocked:
                self._skip(st, f"skipped: {', '.join(blocked)} did not succeed")
                continue
            if self.ac.cancelled.is_set():
                self._skip(st, "skipped: run interrupted")
                continue
            try:
                with located(self.ac, sid, "for_each"):
                    items = self._items_of(st.step)
            except ITEM_ERRORS as exc:
                st.status, st.message = "failed", error_message(exc)
                self._record_step_error(st)
                continue
            st.status, st.total = "running", len(items)
            self.reporter.step_started(sid, len(items))
            if not st.step.isolate and st.step.kind in ("run", "agent"):
                self.reporter.echo(f"{sid}: isolate: false - runs WITHOUT a sandbox (recorded)")
                self.store.add_event(Event(self.run.run_id, self.ac.clock(), "isolation_opt_out",
                                           {"step": sid}))
            if st.step.kind in ("run", "agent"):
                backend = self.ac.backend if st.step.isolate else self.ac.none_backend
                for note in backend.unapplied(resources_of(st.step)):
                    self.reporter.echo(f"{sid}: {note}")
            self.store.add_event(Event(self.run.run_id, self.ac.clock(), "step_started",
                                       {"step": sid, "items": len(items)}))
            if st.step.kind == "keep":
                self._decide(st, items)
            else:
                for index, value in enumerate(items):
                    rec = self.verified.get((sid, index))
                    if rec is not None:
                        self._keep_verified(st, index, value, rec)
                    else:
                        queue.append((st.step, index, value))
            self._maybe_finish(st)
        return started

    def _items_of(self, step: Step) -> list[Any]:
        if step.for_each is None:
            return [None]
        if isinstance(step.for_each, str):
            value = render(compile_template(step.for_each), self.context(step), functions=self.ac.functions)
        else:
            value = step.for_each
        return expand(value)

    def _skip(self, st: StepState, message: str) -> None:
        st.status, st.message = "skipped", message
        now = self.ac.clock()
        self.store.complete_item(ItemRecord(self.run.run_id, st.step.id, 0, "skipped", 0,
                                            message=message, started_at=now, ended_at=now), [])
        self.reporter.step_finished(st.step.id, "skipped", message)

    def _record_step_error(self, st: StepState) -> None:
        now = self.ac.clock()
        self.store.complete_item(ItemRecord(self.run.run_id, st.step.id, 0, "errored", 0,
                                            message=st.message, started_at=now, ended_at=now), [])
        self.messages.append(f"{st.step.id}: {st.message}")
        self.reporter.step_finished(st.step.id, "failed", st.message)

    def _keep_verified(self, st: StepState, index: int, value: Any, rec: ItemRecord) -> None:
        outputs = artifacts_of(rec, self.run.path, self.run.run_id)
        st.results[index] = ItemResult(index, "succeeded", value, rec.result, outputs)
        self.reporter.item_finished(st.step.id, index, "kept", rec.attempt, "verified, not rerun")

    def _decide(self, st: StepState, items: list[Any]) -> None:
        """A ``keep:`` step: a rule fixed in the file, evaluated here, no process."""
        assert isinstance(st.step.keep, str)
        tmpl = compile_template(st.step.keep)
        for index, value in enumerate(items):
            now = self.ac.clock()
            try:
                with located(self.ac, st.step.id, "keep"):
                    decision = render(tmpl, self.context(st.step, value, with_item=True),
                                      functions=self.ac.functions)
                    if not isinstance(decision, bool):
                        raise UserError(
                            f"keep: must render true or false, got {type(decision).__name__}")
                status, message = "succeeded", "kept" if decision else "dropped"
            except ITEM_ERRORS as exc:
                decision, status = None, "errored"
                message = error_message(exc)
            st.results[index] = ItemResult(index, status, value, decision)
            self.store.complete_item(ItemRecord(
                self.run.run_id, st.step.id, index, status, 1, result=decision,
                value=to_json_value(value), message=message, started_at=now, ended_at=now), [])
            if status != "succeeded":
                self.messages.append(f"{st.step.id}/{index}: {message}")
            self.reporter.item_finished(st.step.id, index, status, 1, message)

    def _run_item(self, step: Step, index: int, value: Any) -> tuple[AttemptOutcome, list[AttemptRecord]]:
        idir = self.run.item(step.id, index)
        tctx = self.context(step, value, with_item=step.for_each is not None)
        outcome = AttemptOutcome("errored", 0)
        history: list[AttemptRecord] = []
        if self.resume:
            self._record_lost_attempts(step.id, index, idir)
        for _ in range(step.retries + 1):
            if step.publish is not None:
                outcome = self.publisher(self, step, index, idir, tctx)
            else:
                outcome = run_attempt(self.ac, step, index, idir, tctx,
                                      agent_factory=self.agent_factory)
            history.append(AttemptRecord(
                self.run.run_id, step.id, index, outcome.attempt, outcome.status,
                outcome.exit_code, outcome.started_at, outcome.ended_at, outcome.message))
            if outcome.status in ("succeeded", "fenced") or not outcome.retryable \
                    or self.ac.cancelled.is_set():
                break
        # The completion file first, then the store (on the main thread):
        # resume trusts only items on which both agree, so a crash between
        # the two reruns the item. (meta/ exists: every attempt began there.)
        write_record(idir.completion, {
            "run_id": self.run.run_id, "step": step.id, "item": index, "status": outcome.status,
            "attempt": outcome.attempt,
            "outputs": [{"name": o.name, "sha256": o.sha256, "size": o.size} for o in outcome.outputs],
        })
        return outcome, history

    def _record_lost_attempts(self, step: str, index: int, idir: ItemDir) -> None:
        """Attempts on disk that a crashed engine never recorded as finished."""
        known = {a.attempt for a in self.store.attempts(self.run.run_id, step, index)}
        for n in range(1, idir.last_attempt() + 1):
            if n not in known and idir.attempt_dir(n).exists():
                at = self.ac.clock()
                self.store.record_attempt(AttemptRecord(
                    self.run.run_id, step, index, n, "lost", None, at, at,
                    "the engine stopped during this attempt"))

    def _record(self, step: Step, index: int, value: Any,
                done: tuple[AttemptOutcome, list[AttemptRecord]]) -> None:
        outcome, history = done
        st = self.states[step.id]
        arts = [ArtifactRecord(self.run.run_id, step.id, index, outcome.attempt, o.name, o.sha256, o.size)
                for o in outcome.outputs]
        rec = ItemRecord(
            self.run.run_id, step.id, index, outcome.status, outcome.attempt,
            result=outcome.result, value=to_json_value(value), message=outcome.message,
            started_at=outcome.started_at, ended_at=outcome.ended_at, outputs=tuple(arts),
        )
        self._pending_attempts.extend(history)
        self._pending_items.append((rec, arts))
        if len(self._pending_items) >= FLUSH_EVERY or \
                time.monotonic() - self._flushed_at >= FLUSH_SECONDS:
            self.flush()
        st.results[index] = ItemResult(index, outcome.status, value, outcome.result,
                                       artifacts_of(rec, self.run.path, self.run.run_id))
        if outcome.status != "succeeded":
            self.messages.append(f"{step.id}/{index}: {outcome.status}: {outcome.message}")
        self.reporter.item_finished(step.id, index, outcome.status, outcome.attempt, outcome.message)
        self._maybe_finish(st)

    def flush(self) -> None:
        """Write the bookkeeping of finished items in one transaction.

        Batching keeps the store off the per-item path. A crash before a flush
        loses nothing that matters: resume trusts an item only when the store
        and its completion file agree, so an unflushed item simply runs again.
        """
        if self._pending_attempts or self._pending_items:
            self.store.record_batch(self._pending_attempts, self._pending_items)
            self._pending_attempts, self._pending_items = [], []
        self._flushed_at = time.monotonic()

    def _maybe_finish(self, st: StepState) -> None:
        if st.status != "running" or len(st.results) < st.total:
            return
        self.flush()
        bad = sum(r.status != "succeeded" for r in st.results.values())
        st.status = "failed" if bad else "succeeded"
        if bad:
            st.message = f"{bad} of {st.total} items did not succeed"
        else:
            self.views[st.step.id] = step_view(st.step.kind, st.step.for_each is not None,
                                               list(st.results.values()))
        self.store.add_event(Event(self.run.run_id, self.ac.clock(), "step_finished",
                                   {"step": st.step.id, "status": st.status}))
        self.reporter.step_finished(st.step.id, st.status, st.message)

    def _summary(self, interrupted: bool) -> RunSummary:
        counts: dict[str, dict[str, int]] = {}
        for sid, st in self.states.items():
            c: dict[str, int] = {}
            for r in st.results.values():
                c[r.status] = c.get(r.status, 0) + 1
            counts[sid] = c
        statuses = {sid: st.status for sid, st in self.states.items()}
        if interrupted or self.ac.cancelled.is_set():
            status = "interrupted"
        elif all(s == "succeeded" for s in statuses.values()):
            status = "succeeded"
        else:
            status = "failed"
        return RunSummary(status, statuses, counts, tuple(self.messages))


def workflow_dir(spec: Spec) -> Path:
    return Path(spec.filename).resolve().parent
