"""The Dask executor: attempts run on the workers of an existing Dask cluster, each jailed.

``DaskExecutor`` implements ``executor.Executor``. ``run:`` and ``agent:``
attempts become jobs (``runner.remote.build``, on a few engine threads),
run as Dask tasks (``runner.worker.dask_task``; when more ``run:`` jobs are
ready than the workers have threads, several to a task, see ``batches``) and
come back as outcomes (``runner.remote.complete``). ``publish:`` attempts need the store and the
sinks: they run here on the engine, as the local executor runs them.

A worker that dies takes its attempts with it: the scheduler's
``remove-worker`` event names the tasks it was processing; each of their
attempts becomes a ``lost`` attempt (the scheduler runs the item again in a fresh attempt, not
counted against ``retries``) and its Dask task is cancelled, so Dask's own
rerun of it stops within a second wherever it started. A lost connection to
the scheduler cancels every task (Dask's client does so); those attempts are
lost too and run again once the client reconnects. A client that gives up
reconnecting ends the run as interrupted, resumable, with the reason.

Must not import the engine or the CLI; distributed is imported when an
executor is made.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from queue import Empty, SimpleQueue
from typing import Any

from stockade.runner.attempt import Attempt, Outcome
from stockade.runner.dask_cluster import Cluster
from stockade.runner.executor import Done, LocalExecutor, drain
from stockade.runner.jobs import JobResult, WorkerInfo
from stockade.runner.remote import Pending, RemoteSettings, build, complete
from stockade.runner.status import AttemptStatus

#: Engine threads that turn attempts into jobs and results into outcomes.
ENGINE_THREADS = 4
#: How long attempts may wait with no worker to run on before the run stops
#: (interrupted, resumable); ``$STOCKADE_DASK_WAIT_WORKERS`` seconds overrides it.
WAIT_WORKERS = 300.0
WAIT_WORKERS_ENV = "STOCKADE_DASK_WAIT_WORKERS"
WORKER_CHECK_EVERY = 2.0


#: Items waiting on the cluster per worker thread, and in all: enough
#: for two tasks of ``BATCH_MAX`` each (see ``batches``).
QUEUED_PER_THREAD = 24
QUEUED_MAX = 256


def default_slots(threads: int) -> int:
    """Attempts in flight on a cluster of ``threads`` worker threads: each has
    up to 24 more waiting on the cluster (256 at most in all: each holds its
    inline inputs in memory here), enough for two full tasks per thread. With
    1 waiting per thread, threads idled through the engine's round trip: 1,000
    small items on 2 workers took 22.8 s against 16.3 s for bare
    ``client.map``; with 24 and ``batches``, 11.7 s against 9.6 s, of which
    the one-item runs' start-up is 0.9 s (``bench/bench_dask.py``)."""
    return threads + min(QUEUED_PER_THREAD * threads, QUEUED_MAX)


class DaskExecutor:
    """Attempts as tasks on a Dask cluster; see the module docstring."""

    def __init__(self, client: Any, cluster: Cluster, settings: RemoteSettings,
                 slots: int | None = None) -> None:
        self.client = client
        self.cluster = cluster
        self.settings = settings
        threads = client.nthreads()
        usable = [n for a, n in threads.items()
                  if cluster.allowed is None or a in cluster.allowed]
        self._threads_n = max(1, sum(usable))
        self.slots = max(1, slots or default_slots(self._threads_n))
        self._done: SimpleQueue[Done | None] = SimpleQueue()
        self._pool = ThreadPoolExecutor(ENGINE_THREADS, thread_name_prefix="remote")
        # publish: attempts run here, as the local executor runs them.
        self._local = LocalExecutor(min(self.slots, 8), done=self._done)
        self._lock = threading.Lock()
        #: Attempt key -> (its pending job, the future of the task it is in).
        self._running: dict[str, tuple[Pending, Any]] = {}
        #: Task key -> the attempt keys it runs.
        self._tasks: dict[str, list[str]] = {}
        self._cancelled = False
        self.broken = ""
        self._checked = 0.0
        self._idle_since: float | None = None
        #: Called once when the cluster is gone for good (the engine's interrupt).
        self.on_broken: Callable[[], None] | None = None
        #: ``step/item/attempt`` -> worker name, for the manifest.
        self.placements: dict[str, str] = {}
        self._outbox: SimpleQueue[str | None] = SimpleQueue()
        self._inbox: SimpleQueue[tuple[str, Any] | None] = SimpleQueue()
        self._threads = [threading.Thread(target=self._submitter, name="dask-submit",
                                          daemon=True),
                         threading.Thread(target=self._collector, name="dask-collect",
                                          daemon=True)]
        for t in self._threads:
            t.start()
        client.subscribe_topic("all", self._event)

    # -- the Executor interface ------------------------------------------------------

    def submit(self, attempt: Attempt) -> None:
        if attempt.step.kind not in ("run", "agent"):
            self._local.submit(attempt)
            return
        self._pool.submit(self._launch, attempt)

    def completed(self, timeout: float) -> list[Done]:
        out = drain(self._done, timeout)
        if out is None:
            self._check_client()
            return []
        return out

    def wake(self) -> None:
        self._done.put(None)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            futures = _unique(f for _, f in self._running.values() if f is not None)
        if futures:
            with contextlib.suppress(Exception):
                self.client.cancel(futures)

    def close(self) -> None:
        self._outbox.put(None)
        self._inbox.put(None)
        self._threads[0].join(30)
        self._threads[1].join(30)
        self._pool.shutdown(wait=True)
        self._local.close()
        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic("all")
        with contextlib.suppress(Exception):
            self.client.close(timeout=10)

    # -- attempts ----------------------------------------------------------------------

    def _emit(self, attempt: Attempt, outcome: Outcome) -> None:
        self._done.put((attempt, outcome))

    def _launch(self, attempt: Attempt) -> None:
        try:
            built = build(attempt, self.settings)
        except Exception as exc:  # a bug must end the item, never lose it
            now = attempt.clock()
            self._emit(attempt, Outcome(AttemptStatus.ERRORED, attempt.number, started_at=now,
                                        ended_at=now, retryable=False,
                                        message=f"internal error: {type(exc).__name__}: {exc}"))
            return
        if isinstance(built, Outcome):
            self._emit(attempt, built)
            return
        key = "stockade-" + built.job.id.replace("/", "-")
        with self._lock:
            if self._cancelled or self.broken:
                why = self.broken or "interrupted before it started"
                self._pool.submit(self._finish, key, built, None,
                                  why if self.broken else "", None)
                return
            self._running[key] = (built, None)
        self._outbox.put(key)

    def _submitter(self) -> None:
        """Sends jobs to the scheduler in batches: one graph update for all that are ready."""
        from stockade.runner.worker import dask_task

        while True:
            first = self._outbox.get()
            if first is None:
                return
            keys = [first, *_gather_more(self._outbox)]
            stop = None in keys
            with self._lock:
                batch = [(k, self._running[k][0]) for k in keys
                         if k is not None and k in self._running]
            if batch:
                self._send(dask_task, batch)
            if stop:
                return

    def _send(self, task: Any, ready: list[tuple[str, Pending]]) -> None:
        workers = list(self.cluster.allowed) if self.cluster.allowed is not None else None
        with self._lock:
            waiting = len(self._tasks)
        groups = batches(ready, self._threads_n, waiting)
        names = [f"{keys[0]}+{len(keys) - 1}" if len(keys) > 1 else keys[0]
                 for keys in ([k for k, _ in g] for g in groups)]
        with self._lock:
            for name, group in zip(names, groups, strict=True):
                self._tasks[name] = [k for k, _ in group]
        try:
            tasks = self.client.map(task, [[p.job for _, p in g] for g in groups],
                                    key=names, pure=False, workers=workers,
                                    allow_other_workers=False)
        except Exception as exc:
            with self._lock:
                for key, _ in ready:
                    self._running.pop(key, None)
                for name in names:
                    self._tasks.pop(name, None)
            self._check_client()  # a client that gave up: the run stops, resumable
            for key, pending in ready:
                self._finish(key, pending, None,
                             f"could not submit to the Dask scheduler: {exc}", None)
            return
        late = []
        with self._lock:
            for group, fut in zip(groups, tasks, strict=True):
                alive = False
                for key, pending in group:
                    if key in self._running:
                        self._running[key] = (pending, fut)
                        alive = True
                if self._cancelled or not alive:
                    late.append(fut)  # or settled meanwhile (the cluster broke)
        if late:
            with contextlib.suppress(Exception):
                self.client.cancel(_unique(late))
        if self.broken:
            self._settle_all()
            return
        for name, fut in zip(names, tasks, strict=True):
            fut.add_done_callback(lambda f, name=name: self._inbox.put((name, f)))

    def _collector(self) -> None:
        """Fetches finished results in batches (one gather for all that are done)."""
        while True:
            first = self._inbox.get()
            if first is None:
                return
            entries = [first, *_gather_more(self._inbox)]
            stop = None in entries
            done = [e for e in entries if e is not None]
            finished = [(n, f) for n, f in done if f.status == "finished"]
            for name, fut in done:
                if fut.status != "finished":
                    self._pool.submit(self._collect, name, fut)
            if finished:
                self._gather(finished)
            if stop:
                return

    def _gather(self, finished: list[tuple[str, Any]]) -> None:
        try:
            results = self.client.gather([f for _, f in finished])
        except Exception:
            # One of them went away between finishing and being fetched: one by one.
            for name, fut in finished:
                self._pool.submit(self._collect, name, fut)
            return
        for (name, _), result in zip(finished, results, strict=True):
            self._settle(name, result, "")

    def _settle(self, name: str, results: list[Any] | None, why: str,
                default: Any = None) -> None:
        """Finish the attempts of task ``name`` still running here (a lost
        worker may have settled some) with their results, or else ``default``
        and ``why``."""
        with self._lock:
            keys = self._tasks.pop(name, [])
            entries = [(k, self._running.pop(k, None)) for k in keys]
        for n, (key, entry) in enumerate(entries):
            if entry is None:
                continue  # already settled (lost with its worker)
            result = results[n] if results is not None and n < len(results) else default
            self._pool.submit(self._finish, key, entry[0], result, why, None)

    def _collect(self, name: str, fut: Any) -> None:
        results: list[Any] | None = None
        failed = None
        why = ""
        try:
            if fut.status == "finished":
                results = list(fut.result())
            elif fut.status == "cancelled":
                why = "" if self._cancelled else \
                    "the connection to the Dask scheduler was lost during this attempt"
            else:
                exc = fut.exception()
                why = _describe(exc)
                if type(exc).__name__ != "KilledWorker":
                    # Not a lost worker: the task itself failed (a bug, a missing install).
                    failed = JobResult("error", WorkerInfo("?", "", "", "", False), message=why)
        except Exception as exc:
            why = _describe(exc)
        self._settle(name, results, why, failed)

    def _finish(self, key: str, pending: Pending, result: Any, why: str,
                where: dict[str, Any] | None) -> None:
        try:
            outcome = complete(pending, result, self.settings, lost=why, where=where)
        except Exception as exc:
            now = pending.attempt.clock()
            outcome = Outcome(AttemptStatus.ERRORED, pending.attempt.number, started_at=now,
                              ended_at=now, retryable=False,
                              message=f"internal error: {type(exc).__name__}: {exc}")
        if self._cancelled and outcome.status is AttemptStatus.LOST:
            outcome.status, outcome.retryable = AttemptStatus.INTERRUPTED, False
        a = pending.attempt
        worker = (outcome.provenance or {}).get("worker") or {}
        if worker:
            self.placements[f"{a.step.id}/{a.item.index}/{a.number}"] = str(worker.get("name"))
        self._emit(a, outcome)

    # -- the cluster ---------------------------------------------------------------------

    def _event(self, event: Any) -> None:
        """Scheduler events (on the client's event loop: only bookkeeping here)."""
        _, msg = event
        if not isinstance(msg, dict) or msg.get("action") != "remove-worker":
            return
        address = str(msg.get("worker", ""))
        tasks = set(msg.get("processing-tasks") or ())
        lost: list[tuple[str, Pending, Any]] = []
        with self._lock:
            for name in tasks & set(self._tasks):
                for key in self._tasks.pop(name):
                    entry = self._running.pop(key, None)
                    if entry is not None:
                        lost.append((key, *entry))
        if not lost:
            return
        info = dict(self.cluster.workers.get(address) or {"name": address, "address": address})
        where = {"name": info.get("name", address), "address": address,
                 "host": info.get("host", ""), "backend": info.get("backend", ""),
                 "enforced": bool(info.get("enforced"))}
        self._pool.submit(self._lose, lost, where)

    def _lose(self, lost: list[tuple[str, Pending, Any]], where: dict[str, Any]) -> None:
        # Dask reruns a dead worker's tasks elsewhere: cancelled, so that rerun stops.
        futures = _unique(f for _, _, f in lost if f is not None)
        if futures:
            with contextlib.suppress(Exception):
                self.client.cancel(futures)
        for key, pending, _ in lost:
            self._finish(key, pending, None,
                         f"worker {where['name']} ({where['address']}) died during this attempt",
                         where)

    def _check_client(self) -> None:
        """Notice a cluster that is gone: no scheduler, or no worker to run on for a while."""
        if self.broken:
            return
        if self.client.status in ("closed", "closing"):
            self._break(f"the Dask scheduler at {self.cluster.scheduler} is unreachable and "
                        "the client gave up reconnecting; start it again and resume the run")
            return
        now = time.monotonic()
        if self.client.status != "running" or now - self._checked < WORKER_CHECK_EVERY:
            return
        self._checked = now
        with self._lock:
            waiting = bool(self._running)
        try:
            threads = self.client.nthreads()
        except Exception:
            return  # reconnecting: the client's own timeout decides
        usable = [a for a in threads if self.cluster.allowed is None or a in self.cluster.allowed]
        if usable or not waiting:
            self._idle_since = None
            return
        if self._idle_since is None:
            self._idle_since = now
            return
        limit = float(os.environ.get(WAIT_WORKERS_ENV) or WAIT_WORKERS)
        if now - self._idle_since >= limit:
            which = "workers" if self.cluster.allowed is None else "enforced workers"
            self._break(f"the Dask cluster at {self.cluster.scheduler} has had no {which} "
                        f"for {limit:g} s (workers stop when their scheduler restarts): start "
                        "them again and resume the run")

    def _break(self, why: str) -> None:
        self.broken = why
        # The engine hears of the interrupt before any attempt it ends.
        if self.on_broken is not None:
            self.on_broken()
        self.cancel()
        if self.client.status in ("closed", "closing"):
            # A closed client never reports its futures again: they end here.
            self._settle_all()

    def _settle_all(self) -> None:
        with self._lock:
            left = list(self._running.items())
            self._running.clear()
            self._tasks.clear()
        for key, (pending, _) in left:
            self._pool.submit(self._finish, key, pending, None, self.broken, None)


#: How long the submitter and the collector wait for more of a batch once
#: one entry is there, and the batch they stop waiting at. Each scheduler
#: round trip (a graph update, a gather) costs the scheduler and this engine
#: about a millisecond of CPU whatever its size: one per item made them
#: compete with the jails for the CPUs.
BATCH_WAIT = 0.01
BATCH_SIZE = 32


def _gather_more(q: SimpleQueue[Any]) -> list[Any]:
    """What else comes into ``q`` within ``BATCH_WAIT`` (up to ``BATCH_SIZE``); stops
    at once at ``None`` (closing)."""
    out = _drain(q)
    deadline = time.monotonic() + BATCH_WAIT
    while len(out) < BATCH_SIZE and None not in out:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            out.append(q.get(timeout=left))
        except Empty:
            break
        out += _drain(q)
    return out


#: The most small jobs one Dask task runs.
BATCH_MAX = 8


def batches(ready: list[tuple[str, Pending]], threads: int, waiting: int
            ) -> list[list[tuple[str, Pending]]]:
    """``ready`` jobs as Dask tasks, with ``waiting`` tasks already on the
    cluster. While each thread has two tasks waiting, ``run:`` jobs go
    ``BATCH_MAX`` to a task; otherwise as many as make two tasks per thread
    (one each when no more are ready), so no thread idles while another has
    a long batch. An agent's job always has a task of its own."""
    runs = [r for r in ready if r[1].job.kind == "run"]
    out = [[r] for r in ready if r[1].job.kind != "run"]
    if waiting >= 2 * threads:
        size = BATCH_MAX
    else:
        size = max(1, min(BATCH_MAX, len(runs) // (2 * threads)))
    out += [runs[i:i + size] for i in range(0, len(runs), size)]
    return out


def _unique(futures: Any) -> list[Any]:
    """Each future once (the attempts of a batch share one)."""
    seen: dict[int, Any] = {}
    for f in futures:
        seen.setdefault(id(f), f)
    return list(seen.values())


def _drain(q: SimpleQueue[Any]) -> list[Any]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except Empty:
            return out


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "the attempt's task ended without a result"
    name = type(exc).__name__
    if name == "KilledWorker":
        return f"every worker that started it died ({exc})"
    return f"the attempt's task failed on the cluster: {name}: {exc}"


__all__ = ["DaskExecutor", "batches", "default_slots"]
