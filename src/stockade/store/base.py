"""The run store interface: runs, items, attempts, artifacts, events.

One contract (``tests/contract/test_store_contract.py``) is run against every
implementation (SQLite, PostgreSQL). Timestamps are passed in by callers (an
injected clock) so the store itself never reads the client's wall clock for
run records; leases use the database's clock (see ``stockade.publish``).

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

RUN_STATUSES = ("running", "succeeded", "failed", "interrupted", "errored")
ITEM_STATUSES = ("succeeded", "failed", "errored", "fenced", "skipped")


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    workflow: str
    workflow_path: str
    workflow_sha256: str
    root: str
    status: str
    started_at: float
    ended_at: float | None = None
    sandbox: str = "none"
    enforced: bool = False


@dataclass(frozen=True)
class ArtifactRecord:
    """A file an item wrote under ``out/``; ``name`` is its path relative to ``out/``."""

    run_id: str
    step: str
    item: int
    attempt: int
    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ItemRecord:
    """The completion record of one item: written once per finished item.

    ``result`` and ``value`` are JSON values. ``outputs`` is filled by readers.
    """

    run_id: str
    step: str
    item: int
    status: str
    attempt: int
    result: Any = None
    value: Any = None
    message: str = ""
    started_at: float = 0.0
    ended_at: float = 0.0
    outputs: tuple[ArtifactRecord, ...] = field(default=())


@dataclass(frozen=True)
class AttemptRecord:
    run_id: str
    step: str
    item: int
    attempt: int
    outcome: str
    exit_code: int | None
    started_at: float
    ended_at: float
    message: str = ""


@dataclass(frozen=True)
class Event:
    run_id: str
    at: float
    kind: str
    data: dict[str, Any]
    id: int = 0


class RunExists(Exception):
    """``create_run`` was given a run id the store already has."""


class Store(abc.ABC):
    """Durable records of runs. Implementations must be safe to share between threads."""

    @abc.abstractmethod
    def create_run(self, run: RunRecord) -> None:
        """Insert a new run; raise ``RunExists`` if the id is taken."""

    @abc.abstractmethod
    def update_run(self, run_id: str, *, status: str, ended_at: float | None) -> None: ...

    @abc.abstractmethod
    def get_run(self, run_id: str) -> RunRecord | None: ...

    @abc.abstractmethod
    def list_runs(self, limit: int = 50) -> list[RunRecord]:
        """Newest first."""

    @abc.abstractmethod
    def record_attempt(self, attempt: AttemptRecord) -> None: ...

    @abc.abstractmethod
    def attempts(self, run_id: str, step: str, item: int) -> list[AttemptRecord]:
        """Oldest first."""

    @abc.abstractmethod
    def complete_item(self, item: ItemRecord, outputs: list[ArtifactRecord]) -> None:
        """Atomically replace the item's completion record and its artifacts."""

    @abc.abstractmethod
    def forget_item(self, run_id: str, step: str, item: int) -> None:
        """Drop a completion record that did not verify (before it is rerun)."""

    @abc.abstractmethod
    def items(self, run_id: str, step: str | None = None) -> list[ItemRecord]:
        """Completion records with their outputs, ordered by step then item."""

    @abc.abstractmethod
    def add_event(self, event: Event) -> None: ...

    @abc.abstractmethod
    def events(self, run_id: str, after_id: int = 0) -> list[Event]:
        """Events with ``id > after_id``, oldest first."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
