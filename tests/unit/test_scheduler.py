"""The scheduler as a table: events in, actions out; no threads, jails or clocks."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from stockade.runner.events import (
    AttemptEnded,
    CancelRunning,
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
from stockade.runner.scheduler import Scheduler
from stockade.runner.status import AttemptStatus as A
from stockade.runner.status import ItemStatus as I
from stockade.runner.status import RunStatus as R
from stockade.runner.status import StepStatus as S

OK, FAIL, ERR, FENCED, INTR = A.SUCCEEDED, A.FAILED, A.ERRORED, A.FENCED, A.INTERRUPTED


class _NoJitter(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return (a + b) / 2


def sched(steps: Sequence[StepInfo], slots: int = 2) -> Scheduler:
    return Scheduler(steps, [s.id for s in steps], slots=slots, rng=_NoJitter())


def names(actions: Sequence[Any]) -> list[str]:
    out = []
    for a in actions:
        if isinstance(a, Expand):
            out.append(f"expand {a.step}")
        elif isinstance(a, StepStarted):
            out.append(f"started {a.step} {a.items}")
        elif isinstance(a, StartAttempt):
            out.append(f"start {a.step}/{a.index}#{a.try_}")
        elif isinstance(a, StartInline):
            out.append(f"inline {a.step} " + " ".join(
                f"{i}#{t}" for i, t in zip(a.indexes, a.tries, strict=True)))
        elif isinstance(a, RetryScheduled):
            out.append(f"retry {a.step}/{a.index}#{a.try_} in {a.delay:g}")
        elif isinstance(a, ItemFinished):
            out.append(f"item {a.step}/{a.index} {a.status}")
        elif isinstance(a, StepFinished):
            out.append(f"step {a.step} {a.status}")
        elif isinstance(a, CancelRunning):
            out.append("cancel")
        elif isinstance(a, RunFinished):
            out.append(f"run {a.status}")
    return out


LINE = [StepInfo("a"), StepInfo("b", needs=("a",))]
DIAMOND = [StepInfo("a"), StepInfo("b", needs=("a",)), StepInfo("c", needs=("a",)),
           StepInfo("d", needs=("b", "c"))]


@pytest.mark.parametrize(("steps", "slots", "events", "expected"), [
    # A single step with one item.
    ([StepInfo("a")], 2, [Start(0), Expanded("a", 1, 0), AttemptEnded("a", 0, OK, 1)],
     [["expand a"], ["started a 1", "start a/0#1"], ["item a/0 succeeded", "step a succeeded",
                                                      "run succeeded"]]),
    # Two slots: the third item waits until one finishes.
    ([StepInfo("a")], 2, [Start(0), Expanded("a", 3, 0), AttemptEnded("a", 1, OK, 1)],
     [["expand a"], ["started a 3", "start a/0#1", "start a/1#1"],
      ["item a/1 succeeded", "start a/2#1"]]),
    # A need that succeeded starts its dependent.
    (LINE, 1, [Start(0), Expanded("a", 1, 0), AttemptEnded("a", 0, OK, 1)],
     [["expand a"], ["started a 1", "start a/0#1"],
      ["item a/0 succeeded", "step a succeeded", "expand b"]]),
    # A failed need skips its dependent, and the run fails.
    (LINE, 1, [Start(0), Expanded("a", 1, 0), AttemptEnded("a", 0, FAIL, 1)],
     [["expand a"], ["started a 1", "start a/0#1"],
      ["item a/0 failed", "step a failed", "step b skipped", "run failed"]]),
    # A refusal is never retried, whatever retries says.
    ([StepInfo("a", retries=3)], 1,
     [Start(0), Expanded("a", 1, 0), AttemptEnded("a", 0, ERR, 1, retryable=False)],
     [["expand a"], ["started a 1", "start a/0#1"],
      ["item a/0 errored", "step a failed", "run failed"]]),
    # A fenced publish is final, and fails the run.
    ([StepInfo("a", retries=3)], 1, [Start(0), Expanded("a", 1, 0), AttemptEnded("a", 0, FENCED, 1)],
     [["expand a"], ["started a 1", "start a/0#1"],
      ["item a/0 fenced", "step a failed", "run failed"]]),
    # Expansion failure fails the step and skips dependents.
    (LINE, 1, [Start(0), ExpandFailed("a", "for_each: bad", 0)],
     [["expand a"], ["step a failed", "step b skipped", "run failed"]]),
    # Zero items: the step succeeds at once.
    (LINE, 1, [Start(0), Expanded("a", 0, 0)],
     [["expand a"], ["started a 0", "step a succeeded", "expand b"]]),
    # Verified items (resume) are done without attempts.
    ([StepInfo("a")], 1, [Start(0), Expanded("a", 3, 0, frozenset({0, 2}))],
     [["expand a"], ["started a 3", "start a/1#1"]]),
    # continue: the dependent runs although an item failed; the run still fails.
    ([StepInfo("a", continue_on_failure=True), StepInfo("b", needs=("a",))], 2,
     [Start(0), Expanded("a", 2, 0), AttemptEnded("a", 0, FAIL, 1), AttemptEnded("a", 1, OK, 1),
      Expanded("b", 1, 1), AttemptEnded("b", 0, OK, 2)],
     [["expand a"], ["started a 2", "start a/0#1", "start a/1#1"], ["item a/0 failed"],
      ["item a/1 succeeded", "step a failed", "expand b"], ["started b 1", "start b/0#1"],
      ["item b/0 succeeded", "step b succeeded", "run failed"]]),
    # Inline steps (keep:) take no slot: all items start at once, as one batch...
    ([StepInfo("k", inline=True)], 1, [Start(0), Expanded("k", 3, 0)],
     [["expand k"], ["started k 3", "inline k 0#1 1#1 2#1"]]),
    # ... and end as one; each item finishes as if it had ended alone.
    ([StepInfo("k", inline=True)], 1,
     [Start(0), Expanded("k", 3, 0), InlineEnded("k", ((0, OK, True), (1, ERR, False),
                                                       (2, OK, True)), 1)],
     [["expand k"], ["started k 3", "inline k 0#1 1#1 2#1"],
      ["item k/0 succeeded", "item k/1 errored", "item k/2 succeeded", "step k failed",
       "run failed"]]),
    # Verified items are left out of the batch.
    ([StepInfo("k", inline=True)], 1, [Start(0), Expanded("k", 4, 0, frozenset({1, 2}))],
     [["expand k"], ["started k 4", "inline k 0#1 3#1"]]),
    # A retryable inline failure waits for its delay, then runs in a batch of its own.
    ([StepInfo("k", inline=True, retries=1)], 1,
     [Start(0), Expanded("k", 2, 0), InlineEnded("k", ((0, FAIL, True), (1, OK, True)), 1),
      Tick(3)],
     [["expand k"], ["started k 2", "inline k 0#1 1#1"], ["retry k/0#2 in 1", "item k/1 succeeded"],
      ["inline k 0#2"]]),
    # The queue keeps its order: an inline step's items queued behind a slotted
    # step's start as soon as those ahead of them have started.
    ([StepInfo("a"), StepInfo("k", inline=True)], 1,
     [Start(0), Expanded("a", 2, 0), Expanded("k", 2, 0), AttemptEnded("a", 0, OK, 1)],
     [["expand a", "expand k"], ["started a 2", "start a/0#1"], ["started k 2"],
      ["item a/0 succeeded", "start a/1#1", "inline k 0#1 1#1"]]),
])
def test_table(steps: list[StepInfo], slots: int, events: list[Any],
               expected: list[list[str]]) -> None:
    s = sched(steps, slots)
    got = [names(s.handle(e)) for e in events]
    assert got == expected


def test_diamond_waits_for_both_needs_and_finishes_in_order() -> None:
    s = sched(DIAMOND, slots=4)
    assert names(s.handle(Start(0))) == ["expand a"]
    s.handle(Expanded("a", 1, 0))
    assert names(s.handle(AttemptEnded("a", 0, OK, 1))) == [
        "item a/0 succeeded", "step a succeeded", "expand b", "expand c"]
    s.handle(Expanded("b", 1, 1))
    s.handle(Expanded("c", 1, 1))
    assert names(s.handle(AttemptEnded("b", 0, OK, 2))) == ["item b/0 succeeded",
                                                           "step b succeeded"]
    assert names(s.handle(AttemptEnded("c", 0, OK, 2))) == [
        "item c/0 succeeded", "step c succeeded", "expand d"]


def test_a_failed_branch_does_not_stop_an_independent_one() -> None:
    s = sched(DIAMOND, slots=4)
    s.handle(Start(0))
    s.handle(Expanded("a", 1, 0))
    s.handle(AttemptEnded("a", 0, OK, 1))
    s.handle(Expanded("b", 1, 1))
    s.handle(Expanded("c", 1, 1))
    assert names(s.handle(AttemptEnded("b", 0, FAIL, 2))) == ["item b/0 failed", "step b failed"]
    assert names(s.handle(AttemptEnded("c", 0, OK, 3))) == [
        "item c/0 succeeded", "step c succeeded", "step d skipped", "run failed"]


def test_retries_back_off_doubling_and_capped() -> None:
    s = sched([StepInfo("a", retries=10, retry_delay=8.0)], slots=1)
    s.handle(Start(0))
    s.handle(Expanded("a", 1, 0))
    delays = []
    now = 0.0
    for _ in range(5):
        acts = s.handle(AttemptEnded("a", 0, FAIL, now))
        retry = next(a for a in acts if isinstance(a, RetryScheduled))
        delays.append(retry.delay)
        assert s.next_wakeup() == pytest.approx(now + retry.delay)
        # Nothing starts before the delay is over.
        assert names(s.handle(Tick(now + retry.delay - 0.001))) == []
        now += retry.delay
        assert names(s.handle(Tick(now))) == [f"start a/0#{len(delays) + 1}"]
    assert delays == [8.0, 16.0, 32.0, 60.0, 60.0]


def test_retry_jitter_stays_within_twenty_percent() -> None:
    s = Scheduler([StepInfo("a")], ["a"], slots=1, rng=random.Random(7))
    for try_ in range(1, 4):
        for _ in range(200):
            d = s.retry_delay(2.0, try_)
            base = 2.0 * 2 ** (try_ - 1)
            assert 0.8 * base <= d <= 1.2 * base


def test_retries_run_out_and_the_item_fails() -> None:
    s = sched([StepInfo("a", retries=1, retry_delay=0)], slots=1)
    s.handle(Start(0))
    s.handle(Expanded("a", 1, 0))
    assert names(s.handle(AttemptEnded("a", 0, FAIL, 1))) == ["retry a/0#2 in 0", "start a/0#2"]
    assert names(s.handle(AttemptEnded("a", 0, FAIL, 2))) == [
        "item a/0 failed", "step a failed", "run failed"]
    assert s.item_status("a", 0) is I.FAILED


def test_a_retry_waiting_for_its_delay_frees_the_slot() -> None:
    s = sched([StepInfo("a", retries=1, retry_delay=5)], slots=1)
    s.handle(Start(0))
    s.handle(Expanded("a", 2, 0))
    assert names(s.handle(AttemptEnded("a", 0, FAIL, 1))) == ["retry a/0#2 in 5", "start a/1#1"]
    assert s.item_status("a", 0) is I.RETRYING
    assert names(s.handle(AttemptEnded("a", 1, OK, 2))) == ["item a/1 succeeded"]
    assert names(s.handle(Tick(6))) == ["start a/0#2"]


def test_interrupt_cancels_running_drops_queued_and_skips_pending_steps() -> None:
    s = sched([*LINE, StepInfo("c", needs=("b",))], slots=1)
    s.handle(Start(0))
    s.handle(Expanded("a", 3, 0))
    acts = names(s.handle(Interrupt(1)))
    assert acts == ["step b skipped", "step c skipped", "item a/1 interrupted",
                    "item a/2 interrupted", "cancel"]
    assert names(s.handle(AttemptEnded("a", 0, INTR, 2))) == [
        "item a/0 interrupted", "step a interrupted", "run interrupted"]
    assert s.finished is R.INTERRUPTED


def test_interrupt_drops_a_waiting_retry_and_a_second_interrupt_is_ignored() -> None:
    s = sched([StepInfo("a", retries=2, retry_delay=30)], slots=1)
    s.handle(Start(0))
    s.handle(Expanded("a", 1, 0))
    s.handle(AttemptEnded("a", 0, FAIL, 1))
    assert names(s.handle(Interrupt(2))) == ["item a/0 interrupted", "step a interrupted",
                                             "run interrupted"]


def test_an_interrupt_while_a_step_expands_interrupts_it_without_attempts() -> None:
    s = sched(LINE, slots=1)
    s.handle(Start(0))
    assert names(s.handle(Interrupt(0))) == ["step b skipped"]
    assert names(s.handle(Expanded("a", 2, 0))) == [
        "started a 2", "item a/0 interrupted", "item a/1 interrupted", "step a interrupted",
        "run interrupted"]


def test_a_failure_while_interrupted_is_not_retried() -> None:
    s = sched([StepInfo("a", retries=5)], slots=2)
    s.handle(Start(0))
    s.handle(Expanded("a", 2, 0))
    s.handle(Interrupt(1))
    assert names(s.handle(AttemptEnded("a", 0, FAIL, 2))) == ["item a/0 failed"]
    assert names(s.handle(AttemptEnded("a", 1, INTR, 2))) == [
        "item a/1 interrupted", "step a interrupted", "run interrupted"]


def test_an_inline_batch_for_a_slotted_step_is_misuse() -> None:
    s = sched([StepInfo("a")], slots=1)
    s.handle(Start(0))
    s.handle(Expanded("a", 1, 0))
    with pytest.raises(ValueError, match="not inline"):
        s.handle(InlineEnded("a", ((0, OK, True),), 1))


def test_an_inline_batch_that_never_started_is_misuse() -> None:
    s = sched([StepInfo("a"), StepInfo("k", inline=True)], slots=1)
    s.handle(Start(0))
    s.handle(Expanded("a", 1, 0))  # keeps the run going
    s.handle(Expanded("k", 1, 0))
    s.handle(InlineEnded("k", ((0, OK, True),), 1))
    with pytest.raises(ValueError, match="no inline batch"):
        s.handle(InlineEnded("k", ((0, OK, True),), 2))


@pytest.mark.parametrize("event", [
    AttemptEnded("a", 0, OK, 1),                     # not running
    Expanded("a", 1, 0),                              # not being expanded
])
def test_misuse_is_an_exception(event: Any) -> None:
    s = sched([StepInfo("a")], slots=1)
    with pytest.raises((ValueError, IndexError)):
        s.handle(event)


def test_nothing_is_accepted_after_the_run_finished() -> None:
    s = sched([StepInfo("a")], slots=1)
    s.handle(Start(0))
    s.handle(Expanded("a", 0, 0))
    assert s.finished is R.SUCCEEDED
    with pytest.raises(RuntimeError):
        s.handle(Tick(1))


def test_step_statuses_are_queryable() -> None:
    s = sched(LINE, slots=1)
    s.handle(Start(0))
    assert s.step_status("a") is S.RUNNING
    assert s.step_status("b") is S.PENDING


# -- attempts lost with their worker (a remote executor's) --------------------------


def test_a_lost_attempt_runs_again_at_once_without_using_a_retry() -> None:
    from stockade.runner.scheduler import MAX_LOST

    s = sched([StepInfo("a", retries=0)], slots=2)
    s.handle(Start(0))
    assert names(s.handle(Expanded("a", 2, 0))) == ["started a 2", "start a/0#1",
                                                    "start a/1#1"]
    # The next attempt at once, ahead of the queue.
    for n in range(MAX_LOST):
        assert names(s.handle(AttemptEnded("a", 0, A.LOST, 1))) == [f"start a/0#{n + 2}"]
    assert s.item_status("a", 0) is I.RUNNING
    # retries: 0 still allows nothing after a real failure...
    assert names(s.handle(AttemptEnded("a", 1, FAIL, 2))) == ["item a/1 failed"]
    # ...and one loss past MAX_LOST ends the item as errored.
    assert names(s.handle(AttemptEnded("a", 0, A.LOST, 3))) == [
        "item a/0 errored", "step a failed", "run failed"]


def test_losses_do_not_use_up_the_retries_or_their_backoff() -> None:
    s = sched([StepInfo("a", retries=1, retry_delay=10.0)], slots=1)
    s.handle(Start(0))
    s.handle(Expanded("a", 1, 0))
    assert names(s.handle(AttemptEnded("a", 0, A.LOST, 1))) == ["start a/0#2"]
    # The first real failure is retry 1 of 1, with the first retry's delay.
    (retry,) = s.handle(AttemptEnded("a", 0, FAIL, 2))
    assert isinstance(retry, RetryScheduled)
    assert (retry.try_, retry.delay) == (3, s.retry_delay(10.0, 1))


def test_a_lost_attempt_after_an_interrupt_is_not_run_again() -> None:
    s = sched([StepInfo("a")], slots=1)
    s.handle(Start(0))
    s.handle(Expanded("a", 1, 0))
    assert names(s.handle(Interrupt(1))) == ["cancel"]
    assert names(s.handle(AttemptEnded("a", 0, A.LOST, 2))) == [
        "item a/0 errored", "step a failed", "run interrupted"]


def test_a_large_inline_step_starts_one_batch_at_a_time() -> None:
    s = Scheduler([StepInfo("k", inline=True), StepInfo("a")], ["k", "a"], slots=1,
                  rng=_NoJitter(), inline_batch=2)
    assert names(s.handle(Start(0))) == ["expand k", "expand a"]
    assert names(s.handle(Expanded("k", 5, 0))) == ["started k 5", "inline k 0#1 1#1"]
    # The slotted step's items queue behind the inline step's remaining items.
    assert names(s.handle(Expanded("a", 1, 0))) == ["started a 1"]
    assert names(s.handle(InlineEnded("k", ((0, OK, True), (1, OK, True)), 1))) == [
        "item k/0 succeeded", "item k/1 succeeded", "inline k 2#1 3#1"]
    assert names(s.handle(InlineEnded("k", ((2, OK, True), (3, FAIL, False)), 2))) == [
        "item k/2 succeeded", "item k/3 failed", "inline k 4#1"]
    assert names(s.handle(InlineEnded("k", ((4, OK, True),), 3))) == [
        "item k/4 succeeded", "step k failed", "start a/0#1"]
    assert names(s.handle(AttemptEnded("a", 0, OK, 4))) == [
        "item a/0 succeeded", "step a succeeded", "run failed"]


@pytest.mark.parametrize(("slots", "inline_batch", "what"), [
    (0, 1, "slots"), (1, 0, "inline_batch"), (1, -3, "inline_batch"),
])
def test_no_slots_or_empty_inline_batches(slots: int, inline_batch: int, what: str) -> None:
    with pytest.raises(ValueError, match=f"{what} must be at least 1"):
        Scheduler([StepInfo("a")], ["a"], slots=slots, inline_batch=inline_batch)
