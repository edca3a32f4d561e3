"""The local executor: every attempt reports exactly once, threads are made only
when none is idle, a bug in a kind is an errored outcome, and ``close`` waits
for running attempts and drops the rest. Real threads; the attempts' work is
injected (``run=``), and gates (events) order it, never sleeps."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from queue import SimpleQueue

from stockade.runner.attempt import Outcome
from stockade.runner.executor import LocalExecutor
from stockade.runner.status import AttemptStatus


@dataclass(frozen=True)
class FakeAttempt:
    """What the executor reads of an attempt (its number, its clock)."""

    name: str
    number: int = 1

    def clock(self) -> float:
        return 123.0


def ok(attempt: FakeAttempt) -> Outcome:
    return Outcome(AttemptStatus.SUCCEEDED, attempt.number, result=attempt.name)


def collect(ex: LocalExecutor, n: int) -> dict[str, Outcome]:
    got: dict[str, Outcome] = {}
    while len(got) < n:
        for attempt, outcome in ex.completed(30):
            assert attempt.name not in got, "an attempt reported twice"  # type: ignore[attr-defined]
            got[attempt.name] = outcome  # type: ignore[attr-defined]
    return got


def test_every_attempt_reports_once_and_idle_threads_are_reused() -> None:
    ex = LocalExecutor(8, run=ok)  # type: ignore[arg-type]
    try:
        # One at a time, as a run with --jobs 8 and one ready item at a time does.
        for i in range(50):
            ex.submit(FakeAttempt(f"a{i}"))  # type: ignore[arg-type]
            assert collect(ex, 1)[f"a{i}"].result == f"a{i}"
        assert len(ex._threads) == 1
    finally:
        ex.close()


def test_threads_grow_to_the_slots_and_no_further() -> None:
    gate = threading.Event()
    started = threading.Semaphore(0)

    def held(attempt: FakeAttempt) -> Outcome:
        started.release()
        assert gate.wait(30)
        return ok(attempt)

    ex = LocalExecutor(3, run=held)  # type: ignore[arg-type]
    try:
        for i in range(3):
            ex.submit(FakeAttempt(f"h{i}"))  # type: ignore[arg-type]
        for _ in range(3):
            assert started.acquire(timeout=30)  # all three run at once
        assert len(ex._threads) == 3
        gate.set()
        assert sorted(collect(ex, 3)) == ["h0", "h1", "h2"]
        for i in range(6):  # more than the slots, queued: still three threads
            ex.submit(FakeAttempt(f"m{i}"))  # type: ignore[arg-type]
        assert len(collect(ex, 6)) == 6
        assert len(ex._threads) == 3
    finally:
        ex.close()


def test_a_bug_in_a_kind_is_an_errored_outcome() -> None:
    def broken(attempt: FakeAttempt) -> Outcome:
        raise KeyError("nope")

    ex = LocalExecutor(2, run=broken)  # type: ignore[arg-type]
    try:
        ex.submit(FakeAttempt("b", number=3))  # type: ignore[arg-type]
        out = collect(ex, 1)["b"]
    finally:
        ex.close()
    assert out.status is AttemptStatus.ERRORED
    assert out.attempt == 3 and not out.retryable
    assert out.message == "internal error: KeyError: 'nope'"
    assert out.started_at == out.ended_at == 123.0


def test_wake_ends_a_wait_for_outcomes_at_once() -> None:
    ex = LocalExecutor(1, run=ok)  # type: ignore[arg-type]
    got: list[object] = []
    # A wait of an hour that only the wake can end within the join below.
    waiter = threading.Thread(target=lambda: got.append(ex.completed(3600)), daemon=True)
    try:
        waiter.start()
        ex.wake()
        waiter.join(60)
        assert not waiter.is_alive(), "wake did not end the wait"
        assert got == [[]]
    finally:
        ex.close()


def test_outcomes_go_to_the_queue_given() -> None:
    done: SimpleQueue[object] = SimpleQueue()
    ex = LocalExecutor(1, run=ok, done=done)  # type: ignore[arg-type]
    try:
        ex.submit(FakeAttempt("q"))  # type: ignore[arg-type]
        attempt, outcome = done.get(timeout=30)  # type: ignore[misc]
        assert attempt == FakeAttempt("q") and outcome.result == "q"
    finally:
        ex.close()


def test_close_waits_for_running_attempts_and_drops_the_rest() -> None:
    started = threading.Event()
    ran: list[str] = []
    ex: LocalExecutor

    def held(attempt: FakeAttempt) -> Outcome:
        ran.append(attempt.name)
        started.set()
        # Until close has begun (it drops the queue under the lock it sets
        # the flag under): only then may this attempt end.
        for _ in range(3000):
            with ex._lock:
                if ex._closed:
                    return ok(attempt)
            threading.Event().wait(0.01)
        raise AssertionError("close never began")

    ex = LocalExecutor(1, run=held)  # type: ignore[arg-type]
    ex.submit(FakeAttempt("running"))  # type: ignore[arg-type]
    ex.submit(FakeAttempt("queued"))  # type: ignore[arg-type]
    assert started.wait(30)
    ex.close()
    assert ran == ["running"]
    assert not any(t.is_alive() for t in ex._threads)
    try:
        ex.submit(FakeAttempt("late"))  # type: ignore[arg-type]
    except RuntimeError as exc:
        assert "closed" in str(exc)
    else:
        raise AssertionError("a closed executor took an attempt")
