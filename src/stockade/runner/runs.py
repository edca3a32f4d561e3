"""Finding runs and items by what people type, and telling crashed runs apart.

``resolve_run`` takes ``last``, a full id or a unique prefix of at least 4
characters; ``resolve_item`` takes ``STEP``, ``STEP/KEY`` or ``STEP/#N``.
``state`` says ``crashed`` for a ``running`` run whose engine no longer holds
its lock. ``retention`` picks the runs ``stockade gc`` may delete, never one
that is running. The CLI and the web UI call these; they hold no I/O of
their own beyond the store and the run folders.

Must not import the engine or the CLI.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stockade.errors import InfraError, UserError
from stockade.runner.status import AttemptStatus, ItemStatus, RunStatus
from stockade.store.base import ItemRecord, RunRecord, Store
from stockade.workspace.layout import RunDir
from stockade.workspace.runlock import LOCK_NAME, Holder, is_held, read_holder

MIN_PREFIX = 4


def resolve_run(store: Store, text: str) -> RunRecord:
    """``last``, an exact id, or a unique prefix (at least 4 characters)."""
    if not text:
        raise UserError("no run id given: use a run id, a prefix of one, or 'last'")
    if text == "last":
        newest = store.list_runs(1)
        if not newest:
            raise UserError("there are no runs yet (see `stockade run`)")
        return newest[0]
    exact = store.get_run(text)
    if exact is not None:
        return exact
    if len(text) < MIN_PREFIX:
        raise UserError(f"no run {text!r}; a prefix needs at least {MIN_PREFIX} characters "
                        "(see `stockade runs`)")
    found = store.find_runs(text, limit=11)
    if not found:
        raise UserError(f"no run {text!r} (see `stockade runs`)")
    if len(found) > 1:
        listed = "\n".join(f"  {r.run_id}  {r.workflow}  {r.status}" for r in found[:10])
        more = "\n  ..." if len(found) > 10 else ""
        raise UserError(f"run prefix {text!r} is ambiguous; it matches:\n{listed}{more}")
    return found[0]


def run_path(record: RunRecord) -> Path:
    return RunDir(Path(record.root), record.run_id).path


def state(record: RunRecord) -> RunStatus:
    """The run's status as a person should read it (``crashed`` is never stored)."""
    status = RunStatus(record.status) if record.status in RunStatus._value2member_map_ \
        else RunStatus.ERRORED
    if status is not RunStatus.RUNNING:
        return status
    path = run_path(record)
    holder = read_holder(path)
    if not path.exists() or (holder is not None and holder.host != os.uname().nodename):
        # Run by an engine on another machine (a shared store): its lock is not ours to test.
        return status
    if is_held(path):
        return status
    # The engine makes the folder, then opens and locks engine.lock: a folder
    # without the file for a moment is an engine starting, not a dead one.
    if not os.path.lexists(path / LOCK_NAME) and _age(path) < STARTING_GRACE:
        return status
    return RunStatus.CRASHED


#: How long a run folder may lack its lock file before its run counts as crashed.
STARTING_GRACE = 30.0


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return float("inf")


@dataclass(frozen=True)
class ItemAddress:
    step: str
    key: str | None = None
    index: int | None = None

    def __str__(self) -> str:
        if self.index is not None:
            return f"{self.step}/#{self.index}"
        return self.step if self.key is None else f"{self.step}/{self.key}"


def parse_item(text: str) -> ItemAddress:
    step, sep, rest = text.partition("/")
    if not step:
        raise UserError(f"{text!r}: expected STEP, STEP/KEY or STEP/#N")
    if not sep:
        return ItemAddress(step)
    if not rest:
        raise UserError(f"{text!r}: expected STEP/KEY or STEP/#N after the '/'")
    if rest.startswith("#"):
        if not rest[1:].isdigit():
            raise UserError(f"{text!r}: STEP/#N takes a number after '#'")
        return ItemAddress(step, index=int(rest[1:]))
    return ItemAddress(step, key=rest)


#: How many of a step's keys a message about a missing item lists.
_KEYS_SHOWN = 10


def resolve_item(store: Store, run_id: str, text: str, *, steps: Sequence[str] = ()) -> ItemRecord:
    """The item ``text`` names in a run; a step alone names its only item.

    Looks up the one record (and, for a message, the step's first keys): on a
    100,000-item run, reading the step whole took seconds.
    """
    addr = parse_item(text)
    hit: ItemRecord | None = None
    if addr.index is not None:
        hit = store.find_item(run_id, addr.step, index=addr.index)
    elif addr.key is not None:
        hit = store.find_item(run_id, addr.step, key=addr.key)
        if hit is None and addr.key.isdigit():
            # A number that is no item's key is taken as the item's position.
            hit = store.find_item(run_id, addr.step, index=int(addr.key))
    if hit is not None:
        return hit
    first = store.item_page(run_id, addr.step, limit=_KEYS_SHOWN + 1)
    if not first:
        known = ", ".join(steps or sorted(store.step_tallies(run_id))) or "none yet"
        raise UserError(f"run {run_id} has no step {addr.step!r} with items (steps: {known})")
    keys = ", ".join(i.label for i in first[:_KEYS_SHOWN]) + (
        ", ..." if len(first) > _KEYS_SHOWN else "")
    if addr.index is None and addr.key is None:
        if len(first) == 1:
            return first[0]
        total = store.step_tallies(run_id, [addr.step])[addr.step].total
        raise _name_one(addr.step, total, keys)
    raise UserError(f"run {run_id} has no item {text!r} (keys of {addr.step}: {keys})")


def _name_one(step: str, total: int, keys: str) -> UserError:
    return UserError(f"step {step!r} has {total} items; name one as {step}/KEY or {step}/#N "
                     f"(keys: {keys})")


#: The statuses ``unfinished_item`` gives an item that began and has no record.
UNFINISHED = (ItemStatus.RUNNING, AttemptStatus.LOST)


def find_item(store: Store, record: RunRecord, text: str, *,
              steps: Sequence[str] = ()) -> ItemRecord:
    """The item ``text`` names: its record, or else, for an item that began
    and has no record yet, one made from what is on disk (``running`` while
    the engine lives, ``lost`` after it died), so ``show`` and ``logs`` can
    follow it."""
    try:
        return resolve_item(store, record.run_id, text, steps=steps)
    except UserError:
        # A run that ended recorded every item that began.
        if state(record) not in (RunStatus.RUNNING, RunStatus.CRASHED):
            raise
        found = unfinished_item(store, record, text)
        if found is None:
            raise
        return found


def unfinished_item(store: Store, record: RunRecord, text: str) -> ItemRecord | None:
    """A record for the item ``text`` names if it began and has none yet, else
    None; a step alone that has several items is a ``UserError`` naming them."""
    addr = parse_item(text)
    keys: list[str] | None = None
    for event in store.events_of([record.run_id], ["item_keys"]):
        if event.data.get("step") == addr.step:
            keys = [str(k) for k in event.data.get("keys") or []]
    index = addr.index
    if index is None and addr.key is None:
        if keys is not None and len(keys) > 1:
            raise _name_one(addr.step, len(keys), ", ".join(keys[:_KEYS_SHOWN])
                            + (", ..." if len(keys) > _KEYS_SHOWN else ""))
        index = 0
    elif index is None and addr.key is not None:
        index = keys.index(addr.key) if keys and addr.key in keys else (
            int(addr.key) if addr.key.isdigit() else None)
    if index is None:
        return None
    attempts = RunDir(Path(record.root), record.run_id).item(addr.step, index).attempt_numbers()
    if not attempts:
        return None
    live = state(record) is RunStatus.RUNNING
    key = keys[index] if keys is not None and 0 <= index < len(keys) else str(index)
    status = ItemStatus.RUNNING if live else AttemptStatus.LOST
    return ItemRecord(record.run_id, addr.step, index, status,
                      attempts[-1], key=key,
                      message="" if live else "the engine stopped during this attempt")


def retention(runs: Sequence[RunRecord], *, keep: int | None, older_than: float | None,
              now: float) -> list[RunRecord]:
    """Runs ``gc`` deletes: beyond the newest ``keep``, or started before ``now - older_than``.

    A run whose engine is alive is never chosen, whatever its age.
    """
    ordered = sorted(runs, key=lambda r: (r.started_at, r.run_id), reverse=True)
    chosen = []
    for n, r in enumerate(ordered):
        old = older_than is not None and r.started_at < now - older_than
        extra = keep is not None and n >= keep
        if (old or extra) and state(r) is not RunStatus.RUNNING:
            chosen.append(r)
    return chosen


def remove_run(store: Store, record: RunRecord) -> None:
    """Delete a run's folder and its store records; refuse a running run."""
    if state(record) is RunStatus.RUNNING:
        raise UserError(f"run {record.run_id} is running; `stockade cancel {record.run_id}` "
                        "it first")
    path = run_path(record)
    # Renamed away first, in one step: a removal that fails part way (a
    # read-only root) leaves no half-deleted run that the store still lists.
    trash = path.with_name(f"{TRASH}{record.run_id}")
    if path.exists():
        try:
            os.rename(path, trash)
        except OSError as exc:
            raise InfraError(f"cannot delete run {record.run_id}: {path}: {exc.strerror}; "
                             "nothing was deleted") from None
    store.delete_run(record.run_id)
    shutil.rmtree(trash, ignore_errors=True)


#: The name a run's folder takes while it is deleted (``gc`` sweeps leftovers).
TRASH = ".deleting-"


def sweep_trash(runs_dir: Path) -> None:
    """Finish deletions a killed ``gc`` or ``rm`` left (``runs/.deleting-*``)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(runs_dir):
            if entry.name.startswith(TRASH):
                shutil.rmtree(entry.path, ignore_errors=True)


def signal_cancel(record: RunRecord) -> Holder:
    """Ask a running run's engine to stop (SIGTERM: it ends the run as ``interrupted``).

    Returns the engine that was signalled; refuses (``UserError``) a run that is
    not running, has no live engine here, or runs on another machine.
    """
    st = state(record)
    if st is not RunStatus.RUNNING:
        raise UserError(f"run {record.run_id} is not running ({st}); nothing to cancel")
    path = run_path(record)
    holder = read_holder(path)
    if holder is None or not is_held(path):
        raise UserError(f"run {record.run_id} has no live engine here to cancel")
    if holder.host != os.uname().nodename:
        raise UserError(f"run {record.run_id} is executed on {holder.host} (pid {holder.pid}); "
                        "cancel it there")
    try:
        os.kill(holder.pid, signal.SIGTERM)
    except ProcessLookupError:
        raise UserError(f"run {record.run_id}: its engine (pid {holder.pid}) is gone") from None
    except PermissionError:
        raise UserError(f"run {record.run_id}: not allowed to signal its engine "
                        f"(pid {holder.pid}); run cancel as the same user") from None
    return holder


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``45m``, ``90s``: more than nothing, always with its unit
    (a bare ``30`` meant 30 seconds to gc, and every run older went)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    t = text.strip().lower()
    age = None
    if t and t[-1] in units:
        with contextlib.suppress(ValueError):
            age = float(t[:-1]) * units[t[-1]]
    if age is None or not math.isfinite(age):
        raise UserError(f"--older-than {text!r}: use a number with s, m, h, d or w "
                        "(for example 30d)")
    if age <= 0:
        raise UserError(f"--older-than {text!r}: an age must be more than 0 (every run would "
                        "go); to delete all finished runs, use --keep 0")
    return age
