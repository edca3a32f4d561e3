"""Executors: where an attempt runs. One interface; a local thread pool first.

The engine hands an ``Attempt`` to ``submit`` and collects ``(attempt,
outcome)`` pairs from ``completed``; it never learns how or where the
attempt ran. ``cancel`` stops every running attempt (their outcomes still
arrive, as ``interrupted``); ``close`` releases workers.

Must not import the engine or the CLI.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import Protocol

from stockade.runner.attempt import Attempt, Outcome
from stockade.runner.kinds import kind_of
from stockade.runner.status import AttemptStatus
from stockade.sandbox import launch_here

Done = tuple[Attempt, Outcome]


class Executor(Protocol):
    """Runs attempts somewhere and reports each one's outcome exactly once."""

    #: How many attempts may run at once (the scheduler's job slots).
    slots: int

    def submit(self, attempt: Attempt) -> None: ...

    def completed(self, timeout: float) -> list[Done]:
        """Outcomes that arrived, waiting up to ``timeout`` seconds for the first."""
        ...

    def wake(self) -> None:
        """Make a waiting ``completed`` return now (an interrupt arrived)."""
        ...

    def cancel(self) -> None:
        """Stop every running attempt; their outcomes still arrive."""
        ...

    def close(self) -> None: ...


def drain(done: SimpleQueue[Done | None], timeout: float) -> list[Done] | None:
    """What finished: wait up to ``timeout`` for the first, then take the rest
    without waiting. None when nothing came in time (a ``wake`` gives ``[]``)."""
    try:
        first = done.get(timeout=max(0.0, timeout))
    except Empty:
        return None
    out = [] if first is None else [first]
    while True:
        try:
            more = done.get_nowait()
        except Empty:
            return out
        if more is not None:
            out.append(more)


class LocalExecutor:
    """Attempts on up to ``slots`` worker threads of this process, each in its own jail.

    There are as many threads as attempts have been in flight at once (at
    most ``slots``), so a run with ``--jobs 64`` and two items at a time
    keeps two. Each thread takes attempts from one queue and puts
    ``(attempt, outcome)`` on another: no future, condition or semaphore per
    attempt (``concurrent.futures`` took about a dozen lock operations for
    each, and its import, with ``logging``, about 4 ms of the run path's).
    ``run`` is what runs an attempt (injected by tests); ``done`` is the
    queue outcomes go to (the Dask executor shares its own).
    """

    def __init__(self, slots: int, run: Callable[[Attempt], Outcome] | None = None,
                 done: SimpleQueue[Done | None] | None = None) -> None:
        self.slots = max(1, slots)
        self._run = run or _run
        self._todo: SimpleQueue[Attempt | None] = SimpleQueue()
        self._done: SimpleQueue[Done | None] = SimpleQueue() if done is None else done
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        #: Attempts submitted whose outcome is not out yet.
        self._in_flight = 0
        self._closed = False

    def submit(self, attempt: Attempt) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the executor is closed")
            self._in_flight += 1
            if self._in_flight > len(self._threads) and len(self._threads) < self.slots:
                t = threading.Thread(target=self._work, name=f"item_{len(self._threads)}",
                                     daemon=True)
                self._threads.append(t)
                t.start()
            self._todo.put(attempt)

    def _work(self) -> None:
        # Each item thread waits for the jails it starts and lives until
        # ``close``: it may start them itself (``sandbox.launch_here``).
        launch_here()
        while (attempt := self._todo.get()) is not None:
            outcome = _guarded(self._run, attempt)
            with self._lock:
                self._in_flight -= 1
            self._done.put((attempt, outcome))

    def completed(self, timeout: float) -> list[Done]:
        return drain(self._done, timeout) or []

    def wake(self) -> None:
        self._done.put(None)

    def cancel(self) -> None:
        """The jails are the run's (``RunContext.jails``); the engine cancels them there."""

    def close(self) -> None:
        """Wait for the running attempts; those not started yet are dropped."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
            with contextlib.suppress(Empty):
                while True:
                    self._todo.get_nowait()
            for _ in threads:
                self._todo.put(None)
        for t in threads:
            t.join()


def _run(attempt: Attempt) -> Outcome:
    return kind_of(attempt.step).run(attempt)


def _guarded(run: Callable[[Attempt], Outcome], attempt: Attempt) -> Outcome:
    """``run(attempt)``; a bug in a kind becomes an errored outcome, not a lost item."""
    try:
        return run(attempt)
    except BaseException as exc:  # whatever it was, the item must still end
        now = attempt.clock()
        return Outcome(AttemptStatus.ERRORED, attempt.number, started_at=now, ended_at=now,
                       message=f"internal error: {type(exc).__name__}: {exc}", retryable=False)
