"""``publish()``: one fenced, idempotent write of one publish item.

The order matters and is the whole design:

1. refuse a payload whose ``$artifact`` objects are not references to
   artifacts this run recorded, with their content (``check_provenance``);
2. the effect record ``run_id/step/item`` in the store: ``done`` -> nothing to
   do; ``fenced`` -> stays fenced (a newer run won; a resume must not
   overwrite it); ``claimed`` -> an earlier attempt may have written: ask the
   sink before writing again;
3. refuse a run older than its window unless ``allow_stale``;
4. take the lease (token from the store, expiry on the database clock); a run
   that started before the last run to publish under this lease is fenced out
   (a newer run wins; ``allow_stale`` overrides);
5. claim the effect, write through the sink (which checks the fence and the
   idempotency key in the same transaction as the write), finish the effect;
6. warn when the payload equals the lease's previous publish from a run with
   other inputs (a flat series).

Every exit, refusals included, releases this item's use of the lease; the
lease itself is freed when the run's last item lets go (or at its TTL after a
crash). A crash anywhere leaves at worst a ``claimed`` effect, which step 2
resolves when the item is rerun.

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stockade.publish.payload import artifact_objects, content_sha256, describe, form_problem
from stockade.publish.sink import Sink, SinkUrlError, Write, WriteResult, open_sink, redact
from stockade.refs import ARTIFACT
from stockade.store.base import ArtifactRecord, Effect, Event, Lease, PublishRecord, Store


@dataclass(frozen=True)
class PublishRequest:
    run_id: str
    step: str
    item: int
    attempt: int
    to: str
    base_dir: Path
    key: str
    payload: Any
    lease: str
    lease_ttl: float
    max_age: float
    run_started_at: float
    allow_stale: bool
    input_fingerprint: str

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}/{self.step}/{self.item}"


@dataclass(frozen=True)
class PublishOutcome:
    status: str  # "succeeded" | "fenced" | "failed"
    message: str
    token: int | None
    winner_token: int | None = None
    already_applied: bool = False
    warnings: tuple[str, ...] = ()
    #: False for refusals: publishing again would be refused the same way.
    retryable: bool = True


FLAT_SERIES_EVENT = "publish.flat_series"
LEASE_WAIT_EVENT = "publish.lease_wait"
LEASE_WAIT_FLOOR = 300.0


def _failed(message: str, token: int | None = None) -> PublishOutcome:
    return PublishOutcome("failed", message, token)


def _refused(message: str) -> PublishOutcome:
    """A publish that must not happen; trying again would be refused the same way."""
    return PublishOutcome("failed", message, None, retryable=False)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def check_provenance(req: PublishRequest, store: Store) -> str | None:
    """Why the payload may not be published, or None.

    Every object holding the ``$artifact`` key must be one the engine wrote for
    an artifact of this run: its exact shape, a text that is the content its
    sha256 names, and a step, item, output name, attempt, sha256 and size
    that the run's records hold. Anything else (forged by a step's output,
    from another run, tampered with) refuses the whole payload.
    """
    objects = list(artifact_objects(req.payload))
    foreign = [(p, o) for p, o in objects
               if isinstance(o.get(ARTIFACT), dict) and o[ARTIFACT].get("run_id") != req.run_id]
    if foreign:
        path, obj = foreign[0]
        m = obj[ARTIFACT]
        return (
            f"refused: the payload carries artifact {describe(m)} from run {m.get('run_id')},"
            f" not from this run {req.run_id} ({len(foreign)} foreign artifact(s); at payload{path})"
        )
    recorded: dict[str, dict[tuple[int, str], ArtifactRecord]] = {}
    for path, obj in objects:
        why = form_problem(obj) or _unrecorded(obj[ARTIFACT], req.run_id, store, recorded)
        if why:
            return (f"refused: payload{path} is not a reference to an artifact of this run: {why}"
                    f" (only steps.X.outputs[...] put one in a payload)")
    return None


def _unrecorded(meta: dict[str, Any], run_id: str, store: Store,
                recorded: dict[str, dict[tuple[int, str], ArtifactRecord]]) -> str | None:
    """Why the run's records do not hold the artifact ``meta`` names, or None."""
    step = meta["step"]
    if step not in recorded:
        recorded[step] = {(o.item, o.name): o for i in store.items(run_id, step) for o in i.outputs}
    if not recorded[step]:
        return f"run {run_id} has no step {step!r} with outputs"
    known = recorded[step].get((meta["item"], meta["name"]))
    if known is None:
        return f"run {run_id} recorded no output {meta['name']!r} of {step}/{meta['item']}"
    for name in ("sha256", "size", "attempt"):
        if getattr(known, name) != meta[name]:
            return (f"artifact {describe(meta)} has {name} {meta[name]}, but run {run_id}"
                    f" recorded {getattr(known, name)}")
    return None


def _take_lease(
    req: PublishRequest, store: Store, holder: str, sleep: Callable[[float], None], wait: float,
    clock: Callable[[], float],
) -> Lease | str:
    # Counted in sleeps, not by the clock: an injected clock may stand still.
    waited = 0.0
    pause = 0.02
    while True:
        lease = store.acquire_lease(req.lease, holder, req.lease_ttl, user=req.idempotency_key)
        if lease is not None:
            return lease
        if waited == 0.0:
            other = store.get_lease(req.lease)
            # Say why the item is quiet: it may wait up to the lease's TTL.
            store.add_event(Event(run_id=req.run_id, at=clock(), kind=LEASE_WAIT_EVENT, data={
                "step": req.step, "item": req.item, "lease": req.lease,
                "holder": other.holder if other else "", "token": other.token if other else None,
                "expires_at": other.expires_at if other else None, "max_wait": wait,
            }))
        if waited >= wait:
            other = store.get_lease(req.lease)
            who = f" by {other.holder} (token {other.token})" if other else ""
            return f"lease {req.lease!r} is held{who}; gave up after waiting {wait:.0f} s"
        sleep(pause)
        waited += pause
        pause = min(pause * 2, 0.5)


def publish(
    req: PublishRequest, store: Store, *, clock: Callable[[], float] = time.time,
    holder: str | None = None, sleep: Callable[[float], None] = time.sleep,
    lease_wait: float | None = None,
) -> PublishOutcome:
    """Publish one item. Ordinary outcomes are values; ``InfraError`` means the sink or
    the store cannot be reached. ``holder`` defaults to the run id, so every item of
    a run shares one token; ``lease_wait`` bounds the wait for another holder's lease
    (default: the lease's TTL, at least ``LEASE_WAIT_FLOOR``: a short TTL is there to
    take over from dead holders quickly, not to give up on live ones)."""
    holder = holder or req.run_id
    try:
        wait = max(req.lease_ttl, LEASE_WAIT_FLOOR) if lease_wait is None else lease_wait
        return _checked(req, store, clock=clock, holder=holder, sleep=sleep, lease_wait=wait)
    finally:
        # Every exit lets go of this item's use of the lease, so an item that crashed
        # while holding it frees it when it is rerun, whatever the rerun decides. A
        # failure here only leaves the lease to expire at its TTL.
        with contextlib.suppress(Exception):
            store.release_lease(req.lease, holder, user=req.idempotency_key)


def _checked(
    req: PublishRequest, store: Store, *, clock: Callable[[], float], holder: str,
    sleep: Callable[[float], None], lease_wait: float,
) -> PublishOutcome:
    if not req.key:
        return _refused("refused: the publish key rendered to an empty string")
    try:
        json.dumps(req.payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return _refused(f"refused: the payload is not a JSON value ({exc})")
    refusal = check_provenance(req, store)
    if refusal:
        return _refused(refusal)
    try:
        sink = open_sink(req.to, Path(req.base_dir), store)
    except SinkUrlError as exc:
        return _refused(str(exc))
    try:
        return _publish(req, store, sink, clock=clock, holder=holder, sleep=sleep,
                        lease_wait=lease_wait)
    finally:
        sink.close()


def _publish(
    req: PublishRequest, store: Store, sink: Sink, *, clock: Callable[[], float], holder: str,
    sleep: Callable[[float], None], lease_wait: float,
) -> PublishOutcome:
    idem = req.idempotency_key
    previous = store.get_effect(idem)
    if previous is not None and previous.status == "done":
        return PublishOutcome("succeeded", f"already applied with token {previous.token}",
                              previous.token, already_applied=True)
    if previous is not None and previous.status == "fenced":
        return PublishOutcome("fenced", previous.message, previous.token)
    if previous is not None:
        landed = sink.lookup(idem, req.key)
        if landed is not None:
            store.finish_effect(idem, status="done", token=landed.token, at=clock(),
                                message="reconciled: the sink had it")
            return PublishOutcome("succeeded", f"already applied with token {landed.token}"
                                  " (reconciled with the sink)", landed.token, already_applied=True)

    age = clock() - req.run_started_at
    if age > req.max_age and not req.allow_stale:
        return _refused(
            f"refused: run {req.run_id} started {_hours(age)} ago, outside its publish window"
            f" (publish.max_age {_hours(req.max_age)}); an old run must not publish old results"
            " as new. Start a new run, or resume with --allow-stale to publish anyway"
        )

    got = _take_lease(req, store, holder, sleep, lease_wait, clock)
    if isinstance(got, str):
        return _failed(got)
    lease = got
    # Checked under the lease, so no other run's publish can slip in between.
    newer = store.get_last_publish(req.lease)
    if (newer is not None and newer.run_id != req.run_id and not req.allow_stale
            and newer.run_started_at > req.run_started_at):
        return PublishOutcome(
            "fenced",
            f"fenced out: run {newer.run_id}, started after this run, already published"
            f" under lease {req.lease!r} with token {newer.token}; an older run does not"
            " overwrite a newer one (resume with --allow-stale to publish anyway)",
            lease.token, newer.token,
        )
    sha = content_sha256(req.payload)
    store.claim_effect(Effect(
        key=idem, run_id=req.run_id, step=req.step, item=req.item, attempt=req.attempt,
        lease=req.lease, sink=redact(req.to), sink_key=req.key, payload_sha256=sha,
        token=lease.token, claimed_at=clock(),
    ))
    result = sink.write(Write(idempotency_key=idem, key=req.key, payload=req.payload,
                              run_id=req.run_id, token=lease.token, lease=req.lease))
    return _finish(req, store, result, sha, clock)


def _finish(
    req: PublishRequest, store: Store, result: WriteResult, sha: str, clock: Callable[[], float],
) -> PublishOutcome:
    idem = req.idempotency_key
    if result.status == "fenced":
        store.finish_effect(idem, status="fenced", token=result.token, at=clock(),
                            message=result.message)
        return PublishOutcome("fenced", result.message, result.token, result.winner_token)
    if result.status == "failed":
        # Left "claimed": the write may or may not have landed; a retry asks the sink.
        return _failed(result.message, result.token)
    store.finish_effect(idem, status="done", token=result.token, at=clock(), message=result.message)
    if result.status == "already":
        return PublishOutcome("succeeded", f"already applied with token {result.token}",
                              result.token, already_applied=True)
    warnings = _flat_series(req, store, sha, result.token or 0, clock)
    return PublishOutcome("succeeded", f"published {req.key!r} with token {result.token}",
                          result.token, warnings=warnings)


def _short(key: str, most: int = 60) -> str:
    """A key for a one-line message: quoted, cut to ``most`` characters."""
    return repr(key) if len(key) <= most else f"{key[:most]!r}... ({len(key)} characters)"


def _flat_series(
    req: PublishRequest, store: Store, sha: str, token: int, clock: Callable[[], float],
) -> tuple[str, ...]:
    prev = store.swap_last_publish(PublishRecord(
        lease=req.lease, run_id=req.run_id, key=req.key, payload_sha256=sha,
        input_fingerprint=req.input_fingerprint, at=clock(),
        run_started_at=req.run_started_at, token=token,
    ))
    if (prev is None or prev.run_id == req.run_id or prev.payload_sha256 != sha
            or prev.input_fingerprint == req.input_fingerprint):
        return ()
    message = (
        f"payload for {_short(req.key)} is identical to the previous publish under lease"
        f" {req.lease!r} ({_short(prev.key)} from run {prev.run_id}) although the inputs differ:"
        " a flat series often means stale data"
    )
    store.add_event(Event(run_id=req.run_id, at=clock(), kind=FLAT_SERIES_EVENT, data={
        "step": req.step, "item": req.item, "lease": req.lease, "key": req.key,
        "previous_run": prev.run_id, "previous_key": prev.key, "payload_sha256": sha,
        "input_fingerprint": req.input_fingerprint,
        "previous_input_fingerprint": prev.input_fingerprint, "message": message,
    }))
    return (message,)
