"""What the engine hands back when a run ends: statuses, counts, messages, usage.

A value: the session reports it, ``notify:`` posts it. Must not import the
engine, the executors or the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from stockade.runner.status import RunStatus, StepStatus


@dataclass(frozen=True)
class RunSummary:
    """How a run (or a resumed part of it) ended: what ``stockade run`` prints and
    ``notify:`` posts."""

    status: RunStatus
    steps: Mapping[str, StepStatus]
    items: Mapping[str, Mapping[str, int]]
    messages: tuple[str, ...]
    #: Attempts that were retries, per step.
    retries: Mapping[str, int] = field(default_factory=dict)
    #: Items taken from earlier runs, per step.
    reused: Mapping[str, int] = field(default_factory=dict)
    #: Agent token usage of the whole run, from the store (``show`` gives the same).
    usage: Mapping[str, int] = field(default_factory=dict)
