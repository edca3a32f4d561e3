"""The HTTP sink: ``POST`` the JSON body ``{key, payload, run_id, fencing_token}``.

Headers ``Idempotency-Key`` (``run_id/step/item``) and ``Fencing-Token`` let
the server apply an effect once and refuse stale holders. A 5xx, a 429 or a
broken connection is retried with the same key (so a write that landed but
whose answer was lost is not applied twice); 409 and 412 mean fenced out, and
the server may name the newer token in a ``Fencing-Token`` header or a JSON
body field ``fencing_token``/``high_water``. Any other status fails the write.

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from stockade.publish.sink import Sink, Write, WriteResult, fenced_message, redact

FENCED_STATUSES = (409, 412)
RETRY_STATUSES = (429,)


def _winner(response: httpx.Response) -> tuple[int | None, str]:
    header = response.headers.get("Fencing-Token", "")
    if header.strip().isdigit():
        return int(header), ""
    try:
        body: Any = response.json()
    except ValueError:
        return None, ""
    if isinstance(body, dict):
        for field in ("fencing_token", "high_water", "winner_token"):
            value = body.get(field)
            if isinstance(value, int) and not isinstance(value, bool):
                return value, str(body.get("run_id", ""))
    return None, ""


class HttpSink(Sink):
    def __init__(
        self, url: str, *, attempts: int = 5, backoff: float = 0.2, timeout: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url
        self.name = redact(url)
        self.attempts = attempts
        self.backoff = backoff
        self._sleep = sleep
        self._client = httpx.Client(timeout=timeout, follow_redirects=False)

    def write(self, w: Write) -> WriteResult:
        body = {"key": w.key, "payload": w.payload, "run_id": w.run_id, "fencing_token": w.token}
        headers = {"Idempotency-Key": w.idempotency_key, "Fencing-Token": str(w.token)}
        last = ""
        for n in range(self.attempts):
            if n:
                self._sleep(min(self.backoff * 2 ** (n - 1), 5.0))
            try:
                r = self._client.post(self.url, json=body, headers=headers)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if 200 <= r.status_code < 300:
                replayed = r.headers.get("Idempotent-Replayed", "").lower() == "true"
                return WriteResult("already" if replayed else "applied", w.token,
                                   message=f"HTTP {r.status_code}")
            if r.status_code in FENCED_STATUSES:
                winner, who = _winner(r)
                if winner is None:
                    msg = f"fenced out at {self.name}: HTTP {r.status_code} for token {w.token}"
                else:
                    msg = fenced_message(w.token, winner, who, self.name)
                return WriteResult("fenced", w.token, winner, who, msg)
            last = f"HTTP {r.status_code}: {r.text[:200].strip()}"
            if r.status_code < 500 and r.status_code not in RETRY_STATUSES:
                return WriteResult("failed", w.token, message=f"{self.name} answered {last}")
        return WriteResult(
            "failed", w.token,
            message=f"{self.name}: gave up after {self.attempts} tries with"
                    f" Idempotency-Key {w.idempotency_key} (last: {last})",
        )

    def lookup(self, idempotency_key: str, key: str) -> WriteResult | None:
        # HTTP has no standard way to ask; resending under the same
        # Idempotency-Key is the reconciliation the server is built for.
        return None

    def close(self) -> None:
        self._client.close()
