"""The run store interface: runs, items, attempts, artifacts, events.

One contract (``tests/contract/test_store_contract.py``) is run against every
implementation (SQLite, PostgreSQL). Timestamps are passed in by callers (an
injected clock) so the store itself never reads the client's wall clock for
run records; leases use the database's clock (see ``stockade.publish``).

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

RUN_STATUSES = ("running", "succeeded", "failed", "interrupted", "errored")
ITEM_STATUSES = ("succeeded", "failed", "errored", "fenced", "skipped")
#: An effect is claimed before the write and finished as done or fenced after it;
#: one left "claimed" is ambiguous and is reconciled by asking the sink.
EFFECT_STATUSES = ("claimed", "done", "fenced")


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
    #: The item's key (``STEP/KEY``); its index as text for records made before keys.
    key: str = ""
    #: ``{run_id, step, item, attempt}`` of the earlier item whose outputs were reused.
    reused_from: dict[str, Any] | None = None
    #: Agent token usage summed over the item's attempts: input_tokens,
    #: output_tokens, cached_tokens, reasoning_tokens, model_calls (empty for
    #: items that call no model).
    usage: dict[str, int] = field(default_factory=dict)
    #: Why the item ran instead of being taken from an earlier run, when its run
    #: reused ("no earlier item with the same key", a tampered earlier output,
    #: the step's reuse being off); None when it was reused or the run did not reuse.
    not_reused: str | None = None

    @property
    def label(self) -> str:
        return self.key or str(self.item)


def add_usage(total: dict[str, int], more: Mapping[str, int]) -> dict[str, int]:
    """``total`` plus ``more``, key by key (a new dict)."""
    out = dict(total)
    for k, v in more.items():
        if isinstance(v, int) and not isinstance(v, bool):
            out[k] = out.get(k, 0) + v
    return out


#: Index entries kept per reuse key, newest first. Every run indexes what it
#: ran or reused, so without a bound a key nightly reused gains an entry a
#: night and every lookup reads them all; the newest few are what a lookup
#: takes (``reuse_candidates`` returns at most 3, never the asking run's own).
REUSE_KEEP = 4


def sum_usage(items: Iterable[ItemRecord]) -> dict[str, int]:
    """The token usage of ``items`` together (a run's, a step's)."""
    total: dict[str, int] = {}
    for i in items:
        total = add_usage(total, i.usage)
    return total


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
    #: What went in and came out, with hashes (``workspace.records.Provenance`` as JSON).
    provenance: dict[str, Any] | None = None


@dataclass(frozen=True)
class Event:
    run_id: str
    at: float
    kind: str
    data: dict[str, Any]
    id: int = 0


@dataclass(frozen=True)
class Lease:
    """A lease as the store holds it. ``expires_at`` is on the database's clock.

    ``token`` only grows: it goes up by one whenever the lease changes hands and
    stays the same while one holder keeps (or re-takes) it.
    """

    name: str
    holder: str
    token: int
    expires_at: float


@dataclass(frozen=True)
class Effect:
    """The record of one publish effect, keyed by its idempotency key ``run_id/step/item``."""

    key: str
    run_id: str
    step: str
    item: int
    attempt: int
    lease: str
    sink: str
    sink_key: str
    payload_sha256: str
    status: str = "claimed"
    token: int | None = None
    claimed_at: float = 0.0
    finished_at: float | None = None
    message: str = ""


@dataclass(frozen=True)
class FenceCheck:
    """The answer of ``advance_fence``: whether ``token`` passed, and the mark after the check."""

    accepted: bool
    high_water: int
    holder: str


@dataclass(frozen=True)
class PublishRecord:
    """The last publish under a lease: to notice a flat series across runs, and to keep
    an older run from overwriting what a newer run published."""

    lease: str
    run_id: str
    key: str
    payload_sha256: str
    input_fingerprint: str
    at: float
    run_started_at: float = 0.0
    token: int = 0


@dataclass(frozen=True)
class ReuseEntry:
    """A succeeded item indexed under its reuse key (everything that could change its outputs)."""

    key: str
    run_id: str
    step: str
    item: int
    attempt: int
    created_at: float


@dataclass(frozen=True)
class ReuseCandidate:
    """An earlier item with this key, the root its files are under, and its outputs."""

    key: str
    run_id: str
    step: str
    item: int
    attempt: int
    root: str
    outputs: tuple[ArtifactRecord, ...]
    #: The earlier item's result (``steps.X.result``), a JSON value.
    result: Any = None


@dataclass(frozen=True)
class StepTally:
    """How many of a step's recorded items have each status, and when they ran.

    ``started_at`` is the earliest item start and ``ended_at`` the latest item
    end among the step's records (None when it has none).
    """

    step: str
    counts: dict[str, int]
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class ItemSpan(NamedTuple):
    """The light part of an item record (no result, value or outputs): for timelines
    and for telling which items of a step are recorded. A tuple: a 10,000-item run's
    spans are read on every look at its timeline."""

    step: str
    item: int
    key: str
    status: str
    attempt: int
    started_at: float
    ended_at: float


#: Run statuses only an engine that returned writes (``runner.status.RunStatus``).
FINAL_RUN_STATUSES = frozenset({"succeeded", "failed", "interrupted", "errored"})


def tally_json(tally: StepTally | None) -> dict[str, Any] | None:
    """A step's tally as its ``step_finished`` event holds it (None: no records)."""
    if tally is None:
        return None
    return {"counts": dict(tally.counts), "started_at": tally.started_at,
            "ended_at": tally.ended_at}


def tally_from_json(step: str, data: Any) -> StepTally | None:
    if not isinstance(data, dict):
        return None
    return StepTally(step, {str(k): int(v) for k, v in (data.get("counts") or {}).items()},
                     data.get("started_at"), data.get("ended_at"))


class RunExists(Exception):
    """``create_run`` was given a run id the store has, or had (``removed``)."""

    def __init__(self, run_id: str, *, removed: bool = False) -> None:
        super().__init__(run_id)
        self.removed = removed


class Store(abc.ABC):
    """Durable records of runs. Implementations must be safe to share between threads."""

    @abc.abstractmethod
    def create_run(self, run: RunRecord) -> None:
        """Insert a new run; raise ``RunExists`` if the id is taken, or was by a
        run since deleted: an id names one run for good (a sink's idempotency
        key ``run_id/step/item`` would take a new run's publish for the old one's)."""

    @abc.abstractmethod
    def update_run(self, run_id: str, *, status: str, ended_at: float | None) -> None: ...

    @abc.abstractmethod
    def get_run(self, run_id: str) -> RunRecord | None: ...

    @abc.abstractmethod
    def list_runs(self, limit: int = 50) -> list[RunRecord]:
        """Newest first."""

    @abc.abstractmethod
    def find_runs(self, prefix: str, limit: int = 20) -> list[RunRecord]:
        """Runs whose id starts with ``prefix`` (taken literally), newest first."""

    @abc.abstractmethod
    def delete_run(self, run_id: str) -> None:
        """Forget a run: its record, items, attempts, artifacts, events, effects and its
        entries in the reuse index. Its id is kept, and never given again.

        Leases, fences and the last publish per lease stay: they belong to the
        sinks' series, not to one run.
        """

    @abc.abstractmethod
    def record_attempt(self, attempt: AttemptRecord) -> None: ...

    @abc.abstractmethod
    def attempts(self, run_id: str, step: str, item: int) -> list[AttemptRecord]:
        """Oldest first."""

    @abc.abstractmethod
    def complete_item(self, item: ItemRecord, outputs: list[ArtifactRecord]) -> None:
        """Atomically replace the item's completion record and its artifacts."""

    def record_batch(
        self,
        attempts: list[AttemptRecord],
        items: list[tuple[ItemRecord, list[ArtifactRecord]]],
    ) -> None:
        """Record finished attempts and items together; one transaction where the
        implementation can (the runner batches its bookkeeping through this)."""
        for a in attempts:
            self.record_attempt(a)
        for item, outputs in items:
            self.complete_item(item, outputs)

    # -- reuse across runs ----------------------------------------------------

    @abc.abstractmethod
    def index_reuse(self, entries: list[ReuseEntry]) -> None:
        """Add succeeded items to the reuse index (one transaction)."""

    @abc.abstractmethod
    def reuse_candidates(self, keys: list[str], *, exclude_run: str = "",
                         limit: int = 3) -> dict[str, list[ReuseCandidate]]:
        """For each key, up to ``limit`` indexed items whose run still exists, newest first,
        with their recorded outputs (never from ``exclude_run``)."""

    @abc.abstractmethod
    def forget_item(self, run_id: str, step: str, item: int) -> None:
        """Drop a completion record that did not verify (before it is rerun)."""

    @abc.abstractmethod
    def items(self, run_id: str, step: str | None = None) -> list[ItemRecord]:
        """Completion records with their outputs, ordered by step then item."""

    # -- reading large runs a page at a time (the web UI) ------------------

    @abc.abstractmethod
    def item_page(self, run_id: str, step: str, *, offset: int = 0, limit: int = 100,
                  statuses: Sequence[str] | None = None,
                  from_index: int = 0) -> list[ItemRecord]:
        """One page (at most 1,000) of a step's records with their outputs, ordered by
        item index: those with ``item >= from_index`` and, when ``statuses`` is given,
        a status in it, skipping the first ``offset`` of them."""

    @abc.abstractmethod
    def find_item(self, run_id: str, step: str, *, index: int | None = None,
                  key: str | None = None) -> ItemRecord | None:
        """The record with this index, or else with this key (the label ``STEP/KEY``
        shows, so a record made before keys is found by its index as text)."""

    @abc.abstractmethod
    def step_tallies(self, run_id: str,
                     steps: Sequence[str] | None = None) -> dict[str, StepTally]:
        """Per step (of ``steps``, or all): the count of records by status and the
        span of their times. Counted from the item records: O(items)."""

    def recorded_tallies(self, run: RunRecord) -> dict[str, StepTally]:
        """``step_tallies``, taking each step's from its ``step_finished`` event
        when the run's engine finished.

        The engine writes a step's tally into that event once the step's last
        record is written, so ``show`` and the UI on a finished 100,000-item
        run read a few events instead of counting every record. Only a run
        whose engine returned has a final status (a dead engine leaves it
        ``running``; a resume sets it ``running`` before it forgets or
        rewrites a record), so then every step's latest event is its
        ``step_finished``, written after its last record. A step whose event
        has no tally (an older engine's) is counted from its records.
        """
        if run.status not in FINAL_RUN_STATUSES:
            return self.step_tallies(run.run_id)
        latest: dict[str, dict[str, Any]] = {}
        for ev in self.events_of([run.run_id], ["step_started", "step_finished"]):
            step = ev.data.get("step")
            if isinstance(step, str):
                latest[step] = ev.data if ev.kind == "step_finished" else {}
        out: dict[str, StepTally] = {}
        counted = [s for s, data in latest.items() if "tally" not in data]
        if counted or not latest:
            out.update(self.step_tallies(run.run_id, counted or None))
        for step, data in latest.items():
            tally = tally_from_json(step, data.get("tally")) if "tally" in data else None
            if tally is not None:
                out[step] = tally
        return dict(sorted(out.items()))  # in step order, as counting gives them

    @abc.abstractmethod
    def run_tallies(self, run_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        """Per run: the count of item records by status (runs without any are absent)."""

    @abc.abstractmethod
    def item_spans(self, run_id: str, *, step: str | None = None,
                   ended_after: float | None = None) -> list[ItemSpan]:
        """Light records ordered by step then item; only those of ``step``, or those
        that ended after ``ended_after``, when given."""

    @abc.abstractmethod
    def span_bins(self, run_id: str, origin: float, width: float) -> list[tuple[str, str, int, int]]:
        """``(step, status, bin, count)``: how many items of each step and status
        ended in each slice ``[origin + bin * width, origin + (bin + 1) * width)``
        (items skipped before any attempt left out), for the timeline of a run
        too big to draw item by item."""

    @abc.abstractmethod
    def events_of(self, run_ids: Sequence[str], kinds: Sequence[str],
                  after_id: int = 0) -> list[Event]:
        """The events of these runs and kinds with ``id > after_id``, oldest first."""

    @abc.abstractmethod
    def reused_counts(self, run_id: str) -> dict[str, int]:
        """Per step, how many items were taken from an earlier run."""

    @abc.abstractmethod
    def get_item(self, run_id: str, step: str, item: int) -> ItemRecord | None:
        """One item's completion record with its outputs."""

    @abc.abstractmethod
    def add_event(self, event: Event) -> None: ...

    @abc.abstractmethod
    def events(self, run_id: str, after_id: int = 0) -> list[Event]:
        """Events with ``id > after_id``, oldest first."""

    # -- leases (database clock; ``now`` overrides it in tests only) --------

    @abc.abstractmethod
    def db_now(self) -> float:
        """The database's clock, seconds since the epoch."""

    @abc.abstractmethod
    def acquire_lease(
        self, name: str, holder: str, ttl: float, *, user: str = "", now: float | None = None
    ) -> Lease | None:
        """Take or extend lease ``name`` for ``holder`` until ``now + ttl``.

        Succeeds when the lease is free, expired, or already ``holder``'s; the
        token grows by one only when the holder changes. ``user`` names one
        concurrent user inside the holder (an item of a run): the lease is freed
        by ``release_lease`` only when the holder's last user leaves. Returns
        None when another holder has it.
        """

    @abc.abstractmethod
    def renew_lease(
        self, name: str, holder: str, token: int, ttl: float, *, now: float | None = None
    ) -> Lease | None:
        """Extend an unexpired lease still held with ``token``; None if it was lost."""

    @abc.abstractmethod
    def release_lease(
        self, name: str, holder: str, *, user: str = "", now: float | None = None
    ) -> None:
        """Drop ``user``; when the holder has no users left the lease expires now.

        The holder and token stay, so the same holder re-taking it keeps its token.
        """

    @abc.abstractmethod
    def get_lease(self, name: str) -> Lease | None: ...

    # -- fences kept in the store (directory sinks) --------------------------

    @abc.abstractmethod
    def advance_fence(self, scope: str, token: int, holder: str) -> FenceCheck:
        """In one transaction: accept ``token`` if it is >= the high-water mark and raise
        the mark to it; otherwise refuse and report the mark and who set it."""

    @abc.abstractmethod
    def get_fence(self, scope: str) -> FenceCheck | None: ...

    # -- publish effects -----------------------------------------------------

    @abc.abstractmethod
    def claim_effect(self, effect: Effect) -> Effect:
        """Record ``effect`` as claimed unless one with its key is already done or
        fenced; return what the store now holds for that key."""

    @abc.abstractmethod
    def finish_effect(
        self, key: str, *, status: str, token: int | None, at: float, message: str = ""
    ) -> None:
        """Move a claimed effect to ``done`` or ``fenced``."""

    @abc.abstractmethod
    def get_effect(self, key: str) -> Effect | None: ...

    @abc.abstractmethod
    def effects(self, run_id: str) -> list[Effect]:
        """A run's effects ordered by key."""

    @abc.abstractmethod
    def swap_last_publish(self, record: PublishRecord) -> PublishRecord | None:
        """Store ``record`` as the lease's last publish; return the one it replaced."""

    @abc.abstractmethod
    def get_last_publish(self, lease: str) -> PublishRecord | None: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
