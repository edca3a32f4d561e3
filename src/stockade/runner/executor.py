"""Executors: where an attempt runs. One interface; a local thread pool first.

The engine hands an ``Attempt`` to ``submit`` and collects ``(attempt,
outcome)`` pairs from ``completed``; it never learns how or where the
attempt ran. ``cancel`` stops every running attempt (their outcomes still
arrive, as ``interrupted``); ``close`` releases workers.

Must not import the engine or the CLI.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
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
    """Attempts on ``slots`` worker threads of this process, each in its own jail."""

    def __init__(self, slots: int) -> None:
        self.slots = max(1, slots)
        # Each item thread waits for the jails it starts and lives until
        # ``close``: it may start them itself (``sandbox.launch_here``).
        self._pool = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="item",
                                        initializer=launch_here)
        self._done: SimpleQueue[Done | None] = SimpleQueue()

    def submit(self, attempt: Attempt) -> None:
        fut = self._pool.submit(_run, attempt)
        fut.add_done_callback(lambda f: self._done.put((attempt, _result(attempt, f))))

    def completed(self, timeout: float) -> list[Done]:
        return drain(self._done, timeout) or []

    def wake(self) -> None:
        self._done.put(None)

    def cancel(self) -> None:
        """The jails are the run's (``RunContext.jails``); the engine cancels them there."""

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _run(attempt: Attempt) -> Outcome:
    return kind_of(attempt.step).run(attempt)


def _result(attempt: Attempt, fut: Future[Outcome]) -> Outcome:
    """The attempt's outcome; a bug in a kind becomes an errored outcome, not a lost item."""
    now = attempt.clock()
    if fut.cancelled():
        return Outcome(AttemptStatus.INTERRUPTED, attempt.number, started_at=now, ended_at=now,
                       message="interrupted before it started", retryable=False)
    exc = fut.exception()
    if exc is None:
        return fut.result()
    return Outcome(AttemptStatus.ERRORED, attempt.number, started_at=now, ended_at=now,
                   message=f"internal error: {type(exc).__name__}: {exc}", retryable=False)
