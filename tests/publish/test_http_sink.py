"""The HTTP sink against a real ``http.server`` on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from stockade.publish import PublishRequest, publish
from stockade.publish.http import HttpSink
from stockade.publish.sink import Write
from stockade.store import SQLiteStore


@dataclass
class Receiver:
    """A sink service: dedupes by Idempotency-Key, fences by Fencing-Token, and can be
    told to fail the next N requests with a status (after or before applying)."""

    fail_next: list[int] = field(default_factory=list)
    fail_after_apply: bool = False
    fenced_status: int = 409
    seen: list[dict[str, Any]] = field(default_factory=list)
    applied: dict[str, dict[str, Any]] = field(default_factory=dict)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    high_water: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, headers: dict[str, str], body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        with self.lock:
            self.seen.append({"headers": headers, "body": body})
            key = headers.get("Idempotency-Key", "")
            token = int(headers.get("Fencing-Token", "-1"))
            status = self.fail_next.pop(0) if self.fail_next else 200
            if status != 200 and not self.fail_after_apply:
                return status, {}, b"try again"
            if key in self.applied:
                return status, {"Idempotent-Replayed": "true"}, b"{}"
            if token < self.high_water:
                return self.fenced_status, {"Fencing-Token": str(self.high_water)}, b"stale"
            self.high_water = token
            self.applied[key] = body
            self.rows[body["key"]] = body
            return status, {}, b"{}"


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(n))
            status, headers, payload = rec.handle(dict(self.headers.items()), body)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    t.start()
    yield rec, f"http://127.0.0.1:{server.server_address[1]}/reports"
    server.shutdown()
    server.server_close()


def sink(url: str, **kw: Any) -> HttpSink:
    return HttpSink(url, backoff=0.0, **kw)


def w(run: str = "A", token: int = 1, item: int = 0, key: str = "2026-09-14") -> Write:
    return Write(f"{run}/pub/{item}", key, {"total": 3}, run, token, "L")


def test_body_and_headers(receiver: tuple[Receiver, str]) -> None:
    rec, url = receiver
    r = sink(url).write(w("A", 7))
    assert r.status == "applied"
    [req] = rec.seen
    assert req["body"] == {"key": "2026-09-14", "payload": {"total": 3}, "run_id": "A",
                           "fencing_token": 7}
    assert (req["headers"]["Idempotency-Key"], req["headers"]["Fencing-Token"]) == ("A/pub/0", "7")


@pytest.mark.parametrize(
    ("failures", "after_apply", "status", "tries"),
    [
        ([503], False, "applied", 2),
        ([500, 502, 504], False, "applied", 4),
        ([503], True, "already", 2),          # applied, answer lost, retry recognised
        ([429], False, "applied", 2),
        ([503] * 5, False, "failed", 5),      # gave up
        ([400], False, "failed", 1),          # not retried
    ],
)
def test_retries_keep_one_idempotency_key(receiver: tuple[Receiver, str], failures: list[int],
                                          after_apply: bool, status: str, tries: int) -> None:
    rec, url = receiver
    rec.fail_next, rec.fail_after_apply = list(failures), after_apply
    r = sink(url, attempts=5).write(w())
    assert r.status == status
    assert len(rec.seen) == tries
    assert {s["headers"]["Idempotency-Key"] for s in rec.seen} == {"A/pub/0"}
    assert len(rec.applied) == (0 if status == "failed" else 1)


@pytest.mark.parametrize("code", [409, 412])
def test_conflict_means_fenced(receiver: tuple[Receiver, str], code: int) -> None:
    rec, url = receiver
    rec.fenced_status = code
    assert sink(url).write(w("B", 9)).status == "applied"
    r = sink(url).write(w("A", 4, key="other"))
    assert (r.status, r.token, r.winner_token) == ("fenced", 4, 9)
    assert "token 4 < newer token 9" in r.message
    assert set(rec.rows) == {"2026-09-14"}


def test_unreachable_server_fails(tmp_path: Path) -> None:
    r = sink("http://127.0.0.1:9/x", attempts=2, timeout=1.0).write(w())
    assert r.status == "failed" and "gave up after 2 tries" in r.message


def test_publish_over_http_exhausted_then_resumed(receiver: tuple[Receiver, str], tmp_path: Path) -> None:
    """5xx until the budget is spent (one of them after applying), then a resume:
    the retry reuses the key and the server's effect happens once."""
    rec, url = receiver
    store = SQLiteStore(tmp_path / "s.db")
    r = PublishRequest(run_id="A", step="pub", item=0, attempt=1, to=url, base_dir=tmp_path,
                       key="2026-09-14", payload={"total": 3}, lease="wf.pub", lease_ttl=30,
                       max_age=86400, run_started_at=store.db_now(), allow_stale=False,
                       input_fingerprint="fp")
    rec.fail_next, rec.fail_after_apply = [500] * 5, True
    first = publish(r, store)
    assert first.status == "failed" and "Idempotency-Key A/pub/0" in first.message
    effect = store.get_effect("A/pub/0")
    assert effect is not None and effect.status == "claimed"
    second = publish(r, store)
    assert (second.status, second.already_applied) == ("succeeded", True)
    third = publish(r, store)
    assert third.already_applied and len(rec.seen) == 6
    assert len(rec.applied) == 1
