"""One model call over HTTP, with the official SDKs' retry policy and a finite deadline.

Rate limits and overloads (408, 409, 429, 529 and every 5xx) are retried
inside the call: the wait is ``retry-after-ms`` or ``retry-after`` (seconds
or an HTTP date) when the server sends one between 0 and 60 s, else 0.5 s
doubling to 8 s with up to 25% jitter taken off, as the OpenAI and Anthropic
SDKs do; ``x-should-retry`` overrides the status. Other 4xx answers are
final. A read that stalls ends at the call's deadline (``request_timeout``,
capped by the step's own timeout): the body is streamed so a server that
trickles bytes cannot stretch it either. ``post`` reports every try
(``on_try``) before it is sent and after it ended, so the transcript shows a
call in flight when the step's timeout kills it.

Must not import the runner, workspace or cli.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

INITIAL_DELAY = 0.5
MAX_DELAY = 8.0
MAX_RETRY_AFTER = 60.0
#: Retries of a rate limit or server error (the SDKs default to 2; agent items
#: are long and a run should ride out a short overload).
MAX_RETRIES = 4
#: A timed-out call is tried once more: a stalled server usually stays stalled.
MAX_TIMEOUT_RETRIES = 1
#: Connection failures (refused, reset).
MAX_CONNECT_RETRIES = 2
RETRY_STATUS = frozenset({408, 409, 429, 529})
#: Largest response body read (a model reply is far smaller).
MAX_BODY = 64 << 20


def backoff(retry: int, rand: float) -> float:
    """The wait before retry number ``retry`` (0-based) without a retry-after: 0.5 s x 2^n,
    at most 8 s, minus up to 25% jitter (``rand`` in [0, 1))."""
    return min(INITIAL_DELAY * 2.0 ** retry, MAX_DELAY) * (1 - 0.25 * rand)


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The server's requested wait in seconds, if it sent a usable one (0 < s <= 60)."""
    h = {k.lower(): v for k, v in headers.items()}
    wait: float | None = None
    if "retry-after-ms" in h:
        try:
            wait = float(h["retry-after-ms"]) / 1000
        except ValueError:
            wait = None
    if wait is None and "retry-after" in h:
        raw = h["retry-after"].strip()
        try:
            wait = float(raw)
        except ValueError:
            parsed = email.utils.parsedate_tz(raw)
            if parsed is not None:
                wait = email.utils.mktime_tz(parsed) - (time.time() if now is None else now)
    if wait is None or not 0 < wait <= MAX_RETRY_AFTER:
        return None
    return wait


def should_retry(status: int, headers: Mapping[str, str]) -> bool:
    h = {k.lower(): v for k, v in headers.items()}
    flag = h.get("x-should-retry", "").strip().lower()
    if flag in ("true", "false"):
        return flag == "true"
    return status in RETRY_STATUS or status >= 500


@dataclass
class Try:
    """One HTTP try of a call, as ``on_try`` sees it."""

    number: int
    started: float
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    #: whether the body parsed as JSON (else ``body`` is the start of its text)
    is_json: bool = True
    #: the body's size in bytes and sha256, as it came
    size: int = 0
    sha256: str = ""
    #: transport failure ("ReadTimeout: ..."), or ""
    error: str = ""
    timed_out: bool = False
    latency_ms: float = 0.0
    #: seconds slept before the next try, when there is one
    wait: float | None = None


@dataclass
class Answer:
    """How a call ended: the last try, and how many there were."""

    last: Try
    tries: int


class DeadlineReached(Exception):
    """The call's deadline passed before an answer (or before the next try)."""


def _read(resp: httpx.Response, deadline: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in resp.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY:
            raise httpx.ReadError(f"response larger than {MAX_BODY >> 20} MiB")
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout("the response did not finish before the request timeout")
    return b"".join(chunks)


def _decode(data: bytes) -> tuple[Any, bool]:
    try:
        return json.loads(data), True
    except (ValueError, RecursionError):
        return data[:10_000].decode("utf-8", errors="replace"), False


def post(
    client: httpx.Client,
    url: str,
    body: dict[str, Any],
    headers: Mapping[str, str],
    *,
    request_timeout: float,
    remaining: Callable[[], float | None],
    on_try: Callable[[Try, bool], None],
    sleep: Callable[[float], None] = time.sleep,
    rand: Callable[[], float] = random.random,
) -> Answer:
    """Send ``body`` until an answer that is not retried, or retries run out.

    ``remaining()`` is the step's time left (None: no step timeout); a try
    never outlives it. ``on_try(try, started)`` is called with
    ``started=True`` before each try and ``False`` after it ended.
    """
    payload = json.dumps(body, ensure_ascii=False).encode()
    status_retries = timeout_retries = connect_retries = 0
    n = 0
    while True:
        n += 1
        left = remaining()
        budget = request_timeout if left is None else min(request_timeout, left)
        if budget <= 0:
            raise DeadlineReached
        t = Try(n, time.monotonic())
        on_try(t, True)
        deadline = t.started + budget
        timeout = httpx.Timeout(budget, connect=min(budget, 10.0))
        try:
            with client.stream("POST", url, content=payload, headers=dict(headers),
                               timeout=timeout) as resp:
                data = _read(resp, deadline)
                t.status = resp.status_code
                t.headers = dict(resp.headers)
                t.body, t.is_json = _decode(data)
                t.size, t.sha256 = len(data), hashlib.sha256(data).hexdigest()
        except httpx.HTTPError as e:
            t.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            t.timed_out = isinstance(e, httpx.TimeoutException)
        t.latency_ms = round((time.monotonic() - t.started) * 1000, 2)
        retry = False
        if t.error:
            if t.timed_out and timeout_retries < MAX_TIMEOUT_RETRIES:
                timeout_retries += 1
                retry = True
            elif not t.timed_out and connect_retries < MAX_CONNECT_RETRIES:
                connect_retries += 1
                retry = True
            wait = backoff(n - 1, rand())
        else:
            assert t.status is not None
            if t.status >= 400 and should_retry(t.status, t.headers) and status_retries < MAX_RETRIES:
                status_retries += 1
                retry = True
            asked = retry_after(t.headers)
            wait = asked if asked is not None else backoff(status_retries - 1, rand())
        if retry:
            left = remaining()
            if left is not None and left <= wait:
                retry = False  # the step's timeout comes first
            else:
                t.wait = round(wait, 3)
        on_try(t, False)
        if not retry:
            return Answer(t, n)
        sleep(wait)
