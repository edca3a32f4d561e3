"""The scheduler's vocabulary: the step facts it is given, the events it
takes in and the actions it gives out. Values only, frozen; the scheduler
(``runner.scheduler``) decides, the engine (``runner.engine``) carries out.

Imports nothing of stockade but ``stockade.runner.status``.
"""

from __future__ import annotations

from dataclasses import dataclass

from stockade.runner.status import AttemptStatus, ItemStatus, RunStatus, StepStatus


@dataclass(frozen=True)
class StepInfo:
    """What the scheduler needs to know of a step (taken from the spec)."""

    id: str
    needs: tuple[str, ...] = ()
    retries: int = 0
    retry_delay: float = 1.0
    #: ``on_item_failure: continue``: dependents run on the items that succeeded.
    continue_on_failure: bool = False
    #: Evaluated on the engine's thread without a process (``keep:``): takes no job slot.
    inline: bool = False


# -- events -------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    now: float


@dataclass(frozen=True)
class Expanded:
    """The engine expanded ``step`` into ``items`` items; ``done`` were verified on resume."""

    step: str
    items: int
    now: float
    done: frozenset[int] = frozenset()


@dataclass(frozen=True)
class ExpandFailed:
    """``for_each`` or ``key`` could not be rendered: the step fails without items."""

    step: str
    message: str
    now: float


@dataclass(frozen=True)
class AttemptEnded:
    step: str
    index: int
    status: AttemptStatus
    now: float
    #: False for outcomes that would end the same way again (template errors, refusals).
    retryable: bool = True


@dataclass(frozen=True)
class InlineEnded:
    """The items of one ``StartInline`` were evaluated: ``(index, status, retryable)`` each."""

    step: str
    ended: tuple[tuple[int, AttemptStatus, bool], ...]
    now: float


@dataclass(frozen=True)
class Tick:
    """Time passed (the engine sends it when ``next_wakeup`` is reached)."""

    now: float


@dataclass(frozen=True)
class Interrupt:
    now: float
    reason: str = "run interrupted"


Event = Start | Expanded | ExpandFailed | AttemptEnded | InlineEnded | Tick | Interrupt


# -- actions ------------------------------------------------------------------------


@dataclass(frozen=True)
class Expand:
    """Render the step's items (its needs are all done) and answer with ``Expanded``."""

    step: str


@dataclass(frozen=True)
class StepStarted:
    step: str
    items: int


@dataclass(frozen=True)
class StartAttempt:
    """Run one attempt of an item; ``try_`` counts attempts in this execution from 1."""

    step: str
    index: int
    try_: int


@dataclass(frozen=True)
class StartInline:
    """Evaluate these items of an inline step on the engine's thread, in order, and
    answer with one ``InlineEnded``: one action per batch of up to the scheduler's ``INLINE_BATCH``
    items, not one per item, because an inline item costs tens of microseconds and
    a keep: may have 100,000 of them."""

    step: str
    indexes: tuple[int, ...]
    tries: tuple[int, ...]


@dataclass(frozen=True)
class RetryScheduled:
    """The item failed and runs again at ``at`` (``delay`` seconds after it ended)."""

    step: str
    index: int
    try_: int
    at: float
    delay: float


@dataclass(frozen=True)
class ItemFinished:
    step: str
    index: int
    status: ItemStatus


@dataclass(frozen=True)
class StepFinished:
    step: str
    status: StepStatus
    message: str = ""


@dataclass(frozen=True)
class CancelRunning:
    """Stop every running attempt (an interrupt arrived)."""


@dataclass(frozen=True)
class RunFinished:
    status: RunStatus


Action = (Expand | StepStarted | StartAttempt | StartInline | RetryScheduled | ItemFinished
          | StepFinished | CancelRunning | RunFinished)
