"""The host broker: the only way a jailed agent reaches a model or writes a file.

Serves one end of a socketpair whose other end only the item's own jail
holds (there is no listening socket, no path and no name to reach it by),
holds the API keys from the host environment, forwards model calls with
httpx, records every request and response (latency, token usage, keys
masked) in ``meta/transcript.jsonl``,
enforces ``max_turns`` and the step timeout, and decides every write: it
re-checks the target, echoes ``WRITE TARGET: path``, records the intent in
``meta/writes.jsonl``, asks the operator under ``approve: ask`` and records the
sha256 the jail reports afterwards.

Must not import the runner, workspace or cli.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx

from stockade.agent import guard, wire
from stockade.agent.gate import Snapshot, sha256_file
from stockade.agent.tools import WRITE_TOOLS

MASK = "***"
#: Provider answers worth one more try: rate limits and server errors.
_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


class Recorder:
    """Append-only JSONL files in ``meta/`` with every secret value masked."""

    def __init__(self, meta_dir: Path, secrets: list[str], clock: Callable[[], float] = time.time) -> None:
        self._dir = meta_dir
        self._secrets = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)
        self._clock = clock
        self._lock = threading.Lock()

    def mask(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, MASK)
        return text

    def append(self, name: str, record: dict[str, Any]) -> None:
        line = self.mask(json.dumps({"time": round(self._clock(), 3), **record}, ensure_ascii=False))
        with self._lock, open(self._dir / name, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _mask_headers(h: Mapping[str, str]) -> dict[str, str]:
    return {k: (MASK if k.lower() in ("authorization", "x-api-key", "api-key") else v) for k, v in h.items()}


@dataclass
class BrokerConfig:
    provider: str
    model: str
    prompt: str
    tools: tuple[str, ...]
    writes: tuple[str, ...]
    max_turns: int
    approve: str
    interactive: bool
    timeout: float | None
    work_dir: Path


@dataclass
class BrokerState:
    calls: int = 0
    finished: dict[str, Any] | None = None
    #: path -> sha256 reported after the write (and confirmed by re-hashing)
    written: dict[str, str] = field(default_factory=dict)
    #: path -> bytes before the first tool write (None: did not exist)
    before: dict[str, bytes | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    pending: set[str] = field(default_factory=set)


class Broker:
    """The request handling, independent of the socket server around it."""

    def __init__(
        self,
        cfg: BrokerConfig,
        *,
        host_env: Mapping[str, str],
        recorder: Recorder,
        snapshot: Snapshot,
        echo: Callable[[str], None],
        ask: Callable[[str], bool],
        clock: Callable[[], float] = time.monotonic,
        http: httpx.Client | None = None,
    ) -> None:
        self.cfg = cfg
        self.state = BrokerState()
        self._env = host_env
        self._rec = recorder
        self._snap = snapshot
        self._echo = echo
        self._ask = ask
        self._clock = clock
        self._deadline = None if cfg.timeout is None else clock() + cfg.timeout
        self._lock = threading.Lock()
        prefix = cfg.provider.upper()
        self._key = host_env.get(f"{prefix}_API_KEY") or None
        self._url = wire.endpoint(cfg.provider, host_env.get(f"{prefix}_BASE_URL") or None)
        # A local server (vLLM, llama.cpp, Ollama) is never reached through an
        # HTTP(S)_PROXY the host may have set for the internet.
        local = httpx.URL(self._url).host in ("127.0.0.1", "localhost", "::1")
        self._http = http or httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0), trust_env=not local)

    def close(self) -> None:
        self._http.close()

    def handle(self, route: str, payload: dict[str, Any]) -> dict[str, Any]:
        with self._lock:  # one jail, one conversation: keep records in order
            if self.state.finished is not None:
                # The verdict is recorded once; nothing may change it or
                # spend the key after it.
                return {"ok": False, "error": "the agent already finished"}
            if route == "/model":
                return self._model(payload)
            if route == "/write/intent":
                return self._intent(payload)
            if route == "/write/done":
                return self._done(payload)
            if route == "/finish":
                self.state.finished = payload
                self._rec.append("transcript.jsonl", {"event": "finish", **{k: payload.get(k) for k in ("ok", "result", "message", "turns")}})
                return {"ok": True}
            return {"ok": False, "error": f"unknown route {route}"}

    # -- model calls ----------------------------------------------------------

    def _remaining(self) -> float | None:
        return None if self._deadline is None else self._deadline - self._clock()

    def _model(self, payload: dict[str, Any]) -> dict[str, Any]:
        remaining = self._remaining()
        if remaining is not None and remaining <= 0:
            return self._refuse(f"step timeout ({self.cfg.timeout:g}s) reached; no more model calls")
        if self.state.calls >= self.cfg.max_turns:
            return self._refuse(f"max_turns ({self.cfg.max_turns}) reached; no more model calls")
        self.state.calls += 1
        messages = payload.get("messages")
        if not isinstance(messages, list):
            return {"ok": False, "error": "bad request from the jail: messages must be a list"}
        # The step's tool list is the host's to decide, not the jail's.
        body = wire.build_request(self.cfg.provider, self.cfg.model, messages, list(self.cfg.tools))
        headers = wire.headers(self.cfg.provider, self._key)
        for attempt in range(1, 4):
            remaining = self._remaining()
            if remaining is not None and remaining <= 0:
                return self._refuse(f"step timeout ({self.cfg.timeout:g}s) reached during a model call")
            record: dict[str, Any] = {
                "event": "model_call",
                "n": self.state.calls,
                "attempt": attempt,
                "provider": self.cfg.provider,
                "model": self.cfg.model,
                "url": self._url,
                "request": {"headers": _mask_headers(headers), "body": body},
            }
            t0 = time.perf_counter()
            try:
                resp = self._http.post(
                    self._url, json=body, headers=headers, timeout=None if remaining is None else max(remaining, 0.1)
                )
            except httpx.HTTPError as e:
                record.update(latency_ms=round((time.perf_counter() - t0) * 1000, 2), error=f"{type(e).__name__}: {e}")
                self._rec.append("transcript.jsonl", record)
                if attempt < 3 and not isinstance(e, httpx.TimeoutException):
                    time.sleep(0.2 * attempt)
                    continue
                return {"ok": False, "error": f"model call failed: {type(e).__name__}: {e}"}
            latency = round((time.perf_counter() - t0) * 1000, 2)
            try:
                data: Any = resp.json()
            except ValueError:
                data = resp.text[:10_000]
            record.update(response={"status": resp.status_code, "body": data}, latency_ms=latency)
            if resp.status_code >= 400:
                record["error"] = f"HTTP {resp.status_code}"
                self._rec.append("transcript.jsonl", record)
                if resp.status_code in _RETRY_STATUS and attempt < 3:
                    time.sleep(0.2 * attempt)
                    continue
                return {"ok": False, "error": f"the model provider answered HTTP {resp.status_code}: {str(data)[:300]}"}
            try:
                reply = wire.parse_response(self.cfg.provider, data)
            except wire.WireError as e:
                record["error"] = str(e)
                self._rec.append("transcript.jsonl", record)
                return {"ok": False, "error": str(e)}
            record["usage"] = {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens}
            record["stop"] = reply.stop
            self._rec.append("transcript.jsonl", record)
            return {"ok": True, "text": reply.text, "tool_calls": list(reply.tool_calls)}
        raise AssertionError("unreachable")

    def _refuse(self, why: str) -> dict[str, Any]:
        self._rec.append("transcript.jsonl", {"event": "refused", "reason": why})
        return {"ok": False, "error": why}

    # -- writes ---------------------------------------------------------------

    def _check_target(self, tool: str, raw: Any) -> str:
        if tool not in WRITE_TOOLS or tool not in self.cfg.tools:
            raise guard.PathRejected(f"{tool!r} is not a write tool of this step")
        rel = guard.check_write_target(
            raw, writes=self.cfg.writes, prompt=self.cfg.prompt if tool == "apply_patch" else None
        )
        if not guard.is_symlink_free(self.cfg.work_dir, rel):
            raise guard.PathRejected(f"path {rel!r} goes through a symlink")
        host = guard.resolve_inside(self.cfg.work_dir, rel)
        exists = os.path.lexists(host)
        if tool == "create_file" and exists:
            raise guard.PathRejected(f"{rel!r} already exists")
        if tool == "apply_patch" and not host.is_file():
            raise guard.PathRejected(f"{rel!r} is not an existing file")
        # The file must still be what the snapshot or our last write says; a
        # change made some other way must not be laundered by a tool write.
        expected = self.state.written.get(rel)
        if expected is None:
            entry = self._snap.get(rel)
            expected = entry.digest if entry is not None and entry.kind == "file" else None
        current = sha256_file(host) if exists and host.is_file() else None
        if current != expected:
            raise guard.PathRejected(f"{rel!r} was changed outside the write tools; refusing to write it")
        return rel

    def _intent(self, payload: dict[str, Any]) -> dict[str, Any]:
        tool = str(payload.get("tool"))
        try:
            rel = self._check_target(tool, payload.get("path"))
        except guard.PathRejected as e:
            self._rec.append("writes.jsonl", {"event": "rejected", "tool": tool, "path": str(payload.get("path")), "reason": str(e)})
            return {"ok": False, "error": str(e)}
        self._echo(f"WRITE TARGET: {rel}")
        self._rec.append("writes.jsonl", {"event": "intent", "tool": tool, "path": rel})
        if self.cfg.approve == "ask":
            if not self.cfg.interactive:
                why = f"approve: ask needs a terminal and there is none; the write to {rel} was refused"
                self._rec.append("writes.jsonl", {"event": "refused", "tool": tool, "path": rel, "reason": why})
                return {"ok": False, "error": why}
            if not self._ask(rel):
                why = f"the operator refused the write to {rel}"
                self._rec.append("writes.jsonl", {"event": "refused", "tool": tool, "path": rel, "reason": why})
                return {"ok": False, "error": why}
            self._rec.append("writes.jsonl", {"event": "approved", "tool": tool, "path": rel})
        if rel not in self.state.before:
            host = self.cfg.work_dir / rel
            self.state.before[rel] = host.read_bytes() if host.is_file() else None
        self.state.pending.add(rel)
        return {"ok": True}

    def _done(self, payload: dict[str, Any]) -> dict[str, Any]:
        rel = str(payload.get("path"))
        reported = str(payload.get("sha256"))
        if rel not in self.state.pending:
            self.state.problems.append(f"write of {rel} reported without an approved intent")
            return {"ok": False, "error": "no approved intent for this path"}
        self.state.pending.discard(rel)
        host = self.cfg.work_dir / rel
        actual = sha256_file(host) if host.is_file() and not host.is_symlink() else None
        self._rec.append(
            "writes.jsonl", {"event": "written", "tool": payload.get("tool"), "path": rel, "sha256": actual, "reported": reported}
        )
        if actual != reported:
            self.state.problems.append(f"{rel}: sha256 on disk {actual} differs from the one reported {reported}")
        self.state.written[rel] = actual or ""
        return {"ok": True}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Link

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("content-length") or 0)
            payload = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(payload, dict):
                raise ValueError("not an object")
            answer = self.server.broker.handle(self.path, payload)
        except ValueError as e:
            answer = {"ok": False, "error": f"bad request: {e}"}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if self.server.broker.state.finished is not None:
            self.close_connection = True  # the conversation is over

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def address_string(self) -> str:
        return "jail"


class _Link(socketserver.BaseServer):
    """The one connection's ``server``: what the handler reaches the broker through."""

    def __init__(self, broker: Broker) -> None:
        super().__init__("jail", _Handler)
        self.broker = broker


class BrokerServer:
    """The broker on its end of the jail's socketpair, served from a daemon thread.

    Sends ``preamble`` first (the jail's boot image, see ``ship``), then
    answers HTTP/1.1 requests on that one connection until the jail finishes
    or closes it. No other connection can ever reach it.
    """

    def __init__(self, broker: Broker, conn: socket.socket, preamble: bytes = b"") -> None:
        self.broker = broker
        self._conn = conn
        self._preamble = preamble
        self._link = _Link(broker)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="stockade-broker", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            self._conn.sendall(self._preamble)
            self._link.finish_request(self._conn, "jail")
        except OSError:
            pass  # the jail went away, or stop() shut the connection
        # After /finish (or the jail's hang-up) the broker hangs up too:
        # whatever still holds the other end gets nothing more.
        with contextlib.suppress(OSError):
            self._conn.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        # Wakes the thread wherever it waits on the jail (recv or send).
        with contextlib.suppress(OSError):
            self._conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(5)
        self._conn.close()
        self.broker.close()
