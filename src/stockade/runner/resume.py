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
from stockade.workspace.artifacts import sha256_file
from stockade.workspace.layout import ItemDir, RunDir


def verified_items(run: RunDir, store: Store, kinds: dict[str, str],
                   clock: Callable[[], float]) -> dict[tuple[str, int], ItemRecord]:
    """The succeeded items whose records and files still verify; the rest are forgotten."""
    kept: dict[tuple[str, int], ItemRecord] = {}
    for rec in store.items(run.run_id):
        if rec.status != ItemStatus.SUCCEEDED or kinds.get(rec.step) in (None, "keep"):
            continue
        if verifies(run, rec):
            kept[(rec.step, rec.item)] = rec
        else:
            store.forget_item(rec.run_id, rec.step, rec.item)
            store.add_event(Event(run.run_id, clock(), "unverified",
                                  {"step": rec.step, "item": rec.item}))
    return kept


def verifies(run: RunDir, rec: ItemRecord) -> bool:
    idir = run.item(rec.step, rec.item)
    if any(a.run_id != run.run_id for a in rec.outputs):
        return False
    for name, expected in ((a.name, (a.sha256, a.size)) for a in rec.outputs):
        try:
            if sha256_file(idir.out / name) != expected:
                return False
        except OSError:
            return False
    return True


def record_lost_attempts(run_id: str, step: str, index: int, idir: ItemDir, store: Store,
                         clock: Callable[[], float]) -> int:
    """Record attempts a crashed engine left unfinished; return the last attempt number."""
    on_disk = idir.attempt_numbers()
    if not on_disk:
        return 0
    known = {a.attempt for a in store.attempts(run_id, step, index)}
    for n in on_disk:
        if n not in known:
            at = clock()
            store.record_attempt(AttemptRecord(
                run_id, step, index, n, AttemptStatus.LOST, None, at, at,
                "the engine stopped during this attempt"))
    return on_disk[-1]
