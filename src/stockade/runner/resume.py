"""Which items of an interrupted or crashed run can be kept when it resumes.

An item is kept only when the store records it as succeeded (the record is
written in one transaction with its attempt and provenance, after the
attempt ended) and every output file it lists still hashes to the recorded
sha256 (never size or mtime). Attempts on disk that the store never saw
finish were cut short by the engine's death: they are recorded as ``lost``.
Must not import the engine or the CLI.
"""

from __future__ import annotations

from collections.abc import Callable

from stockade.runner.status import AttemptStatus, ItemStatus
from stockade.store.base import AttemptRecord, Event, ItemRecord, Store
from stockade.workspace.artifacts import outputs_problem
from stockade.workspace.layout import ItemDir, RunDir


def verified_items(run: RunDir, store: Store, kinds: dict[str, str],
                   clock: Callable[[], float],
                   say: Callable[[str], None] = lambda line: None,
                   ) -> dict[tuple[str, int], ItemRecord]:
    """The succeeded items whose records and files still verify; the rest are
    forgotten, and ``say`` is told which and why (they run again)."""
    kept: dict[tuple[str, int], ItemRecord] = {}
    for rec in store.items(run.run_id):
        if rec.status != ItemStatus.SUCCEEDED or kinds.get(rec.step) in (None, "keep"):
            continue
        why = unverified(run, rec)
        if why is None:
            kept[(rec.step, rec.item)] = rec
        else:
            store.forget_item(rec.run_id, rec.step, rec.item)
            store.add_event(Event(run.run_id, clock(), "unverified",
                                  {"step": rec.step, "item": rec.item, "why": why}))
            say(f"{rec.step}/{rec.label}: {why}; it runs again")
    return kept


def unverified(run: RunDir, rec: ItemRecord) -> str | None:
    """Why a succeeded item's recorded outputs no longer stand, or None."""
    for a in rec.outputs:
        if a.run_id != run.run_id:
            return f"its record names out/{a.name} of run {a.run_id}"
    return outputs_problem(run.item(rec.step, rec.item).out,
                           ((a.name, a.sha256, a.size) for a in rec.outputs))


def record_lost_attempts(run_id: str, step: str, index: int, idir: ItemDir, store: Store,
                         clock: Callable[[], float], *, publish: bool = False) -> int:
    """Record attempts a crashed engine left unfinished; return the last attempt number.

    A publish attempt leaves nothing on disk; its effect record (claimed as
    it began, with the attempt's number and time) names it instead."""
    # The engine records an attempt when it ends (one write per item, not
    # two): when one began is known only from a publish's claim.
    started: dict[int, float | None] = dict.fromkeys(idir.attempt_numbers())
    if publish and (effect := store.get_effect(f"{run_id}/{step}/{index}")) is not None:
        started[effect.attempt] = effect.claimed_at
    if not started:
        return 0
    known = {a.attempt for a in store.attempts(run_id, step, index)}
    for n in sorted(started):
        if n not in known:
            now = clock()
            began = started[n]
            store.record_attempt(AttemptRecord(
                run_id, step, index, n, AttemptStatus.LOST, None,
                now if began is None else began, now,
                "the engine stopped during this attempt" + (
                    " (when it began was not recorded: its times are the resume's)"
                    if began is None else "")))
    return max(started)
