"""``notify:``: post a JSON summary of the run to webhooks when it ends.

The body is ``{run_id, workflow, status, fenced, failed: [{step, key, status,
message}], duration, started_at, ended_at, resume}``; a hook's ``secret``
(a name from ``secrets:``) is sent as ``Authorization: Bearer``. Each hook is
posted once, with an ``Idempotency-Key`` of ``run_id/notify/N`` (a 5xx, a 429
or a broken connection is retried under the same key, with backoff). A hook
that cannot be reached is reported and recorded as an event; it never
changes the run's status.

Must not import the CLI.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from stockade.runner.env import Masker
from stockade.runner.status import ITEM_BAD, ItemStatus, RunStatus
from stockade.runner.summary import RunSummary
from stockade.spec import Spec
from stockade.spec.sinkurl import redact
from stockade.store.base import Event, ItemRecord, Store

ATTEMPTS = 4
BACKOFF = 0.5
TIMEOUT = 10.0
#: At most this many failed items are listed in a notification.
MAX_FAILED = 50


#: The item statuses a notification lists as failed: those that fail the run
#: (as plain text: a store's driver may write an enum member by its name).
BAD = sorted(str(s) for s in ITEM_BAD)


def body(spec: Spec, run_id: str, summary: RunSummary, store: Store, started: float,
         ended: float) -> dict[str, Any]:
    # Counted by the store, and only the listed items read: reading every
    # record of a 100,000-item run takes about 3 s.
    tallies = store.step_tallies(run_id)
    declared = [s.id for s in spec.workflow.steps]
    bad_counts = {sid: sum(t.counts.get(s, 0) for s in BAD) for sid, t in tallies.items()}
    bad: list[ItemRecord] = []
    for sid in [s for s in declared if s in tallies] + sorted(set(tallies) - set(declared)):
        if bad_counts[sid] and len(bad) < MAX_FAILED:
            bad += store.item_page(run_id, sid, statuses=BAD, limit=MAX_FAILED - len(bad))
    return {
        "run_id": run_id,
        "workflow": spec.workflow.name,
        "status": str(summary.status),
        "fenced": any(t.counts.get(str(ItemStatus.FENCED), 0) for t in tallies.values()),
        "failed": [{"step": i.step, "key": i.label, "status": i.status, "message": i.message}
                   for i in bad],
        "failed_count": sum(bad_counts.values()),
        "started_at": started,
        "ended_at": ended,
        "duration": round(ended - started, 3),
        "resume": None if summary.status is RunStatus.SUCCEEDED else f"stockade resume {run_id}",
    }


def wanted(on: list[str], status: str, fenced: bool) -> bool:
    return status in on or (fenced and "fenced" in on)


def notify_all(spec: Spec, run_id: str, summary: RunSummary, started: float, ended: float,
               env: Mapping[str, str], store: Store, echo: Callable[[str], None],
               masker: Masker, *, sleep: Callable[[float], None] = time.sleep) -> None:
    payload = masker.value(body(spec, run_id, summary, store, started, ended))
    for n, hook in enumerate(spec.workflow.notify):
        if not wanted(list(hook.on), payload["status"], payload["fenced"]):
            continue
        headers = {"Idempotency-Key": f"{run_id}/notify/{n}"}
        if hook.secret:
            headers["Authorization"] = f"Bearer {env.get(hook.secret, '')}"
        ok, detail = post(hook.url, payload, headers, sleep=sleep)
        where = redact(hook.url)
        store.add_event(Event(run_id, time.time(), "notify_sent" if ok else "notify_failed",
                              {"hook": n, "url": where, "detail": masker.text(detail)}))
        if not ok:
            echo(f"warning: notify {where}: {masker.text(detail)}")


def post(url: str, payload: Any, headers: Mapping[str, str], *,
         sleep: Callable[[float], None] = time.sleep) -> tuple[bool, str]:
    last = ""
    with httpx.Client(timeout=TIMEOUT, follow_redirects=False) as client:
        for n in range(ATTEMPTS):
            if n:
                sleep(BACKOFF * 2 ** (n - 1))
            try:
                r = client.post(url, json=payload, headers=dict(headers))
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if 200 <= r.status_code < 300:
                return True, f"HTTP {r.status_code}"
            last = f"HTTP {r.status_code}"
            if r.status_code < 500 and r.status_code != 429:
                return False, f"answered {last}"
    return False, f"gave up after {ATTEMPTS} tries (last: {last})"


