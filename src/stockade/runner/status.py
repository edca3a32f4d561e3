"""One status vocabulary for runs, steps, items and attempts.

Statuses are ``StrEnum`` members, so they are stored and printed as their
plain values (``"succeeded"``) and compare equal to those strings: records
written before this module existed still read back. The named subsets below
are the only place that says which statuses count as finished, good or bad.

Imports nothing from the rest of the package.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    ERRORED = "errored"
    #: Never stored: shown for a ``running`` run whose engine no longer holds its lock.
    CRASHED = "crashed"


class StepStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"


class ItemStatus(StrEnum):
    #: Not started yet (its step is waiting, or it waits for a job slot).
    PENDING = "pending"
    RUNNING = "running"
    #: Failed once and waits for its retry delay.
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ERRORED = "errored"
    FENCED = "fenced"
    SKIPPED = "skipped"
    #: Not finished because the run was interrupted; ``resume`` runs it again.
    INTERRUPTED = "interrupted"


class AttemptStatus(StrEnum):
    SUCCEEDED = "succeeded"
    #: The process ran and failed (exit status, signal, timeout, limit, missing outputs).
    FAILED = "failed"
    #: The attempt could not run as declared (template, input, refusal, infrastructure).
    ERRORED = "errored"
    #: A publish whose fencing token lost to a newer one.
    FENCED = "fenced"
    #: Started by an engine that died before it finished (found on resume).
    LOST = "lost"
    #: Stopped by an interrupt or ``stockade cancel``.
    INTERRUPTED = "interrupted"


#: Runs that are over (a crashed run is not: it can be resumed).
RUN_DONE: frozenset[RunStatus] = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.INTERRUPTED, RunStatus.ERRORED}
)
#: Steps whose items will not change any more.
STEP_DONE: frozenset[StepStatus] = frozenset(
    {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.INTERRUPTED}
)
#: Items that reached their final status in this run.
ITEM_DONE: frozenset[ItemStatus] = frozenset(
    {ItemStatus.SUCCEEDED, ItemStatus.FAILED, ItemStatus.ERRORED, ItemStatus.FENCED,
     ItemStatus.SKIPPED, ItemStatus.INTERRUPTED}
)
#: Items that count against the run (it exits 1).
ITEM_BAD: frozenset[ItemStatus] = frozenset(
    {ItemStatus.FAILED, ItemStatus.ERRORED, ItemStatus.FENCED}
)
#: Attempt endings that end the item, whatever ``retries`` says.
ATTEMPT_FINAL: frozenset[AttemptStatus] = frozenset(
    {AttemptStatus.SUCCEEDED, AttemptStatus.FENCED, AttemptStatus.INTERRUPTED}
)


_ITEM_STATUS = {
    AttemptStatus.SUCCEEDED: ItemStatus.SUCCEEDED,
    AttemptStatus.FAILED: ItemStatus.FAILED,
    AttemptStatus.ERRORED: ItemStatus.ERRORED,
    AttemptStatus.FENCED: ItemStatus.FENCED,
    AttemptStatus.LOST: ItemStatus.ERRORED,
    AttemptStatus.INTERRUPTED: ItemStatus.INTERRUPTED,
}


def item_status(attempt: AttemptStatus) -> ItemStatus:
    """The item status an attempt's ending leaves when no retry follows."""
    return _ITEM_STATUS[attempt]
