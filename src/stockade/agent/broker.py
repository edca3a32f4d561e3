"""The host broker: the only way a jailed agent reaches a model or writes a file.

Serves one end of a socketpair whose other end only the item's own jail
holds (there is no listening socket, no path and no name to reach it by),
holds the API keys from the host environment, keeps the conversation
(``stockade.agent.conversation``: the jail sends only its tool results),
forwards model calls with httpx (``stockade.agent.transport``: retries with
backoff, a finite request timeout), records every call in
``meta/transcript.jsonl`` (a call-started record, then the request's delta,
the response with its headers and request id, latency, token usage; keys
masked), enforces ``max_turns``, the step timeout and the token ``budget``,
fails the item on a stop reason that leaves no usable answer, gives a model
that answers with text but never wrote the declared ``outputs`` one
reminder, and decides every write (``stockade.agent.desk``: it re-checks
the target, echoes ``WRITE TARGET: path``, records the intent in
``meta/writes.jsonl``, asks the operator under ``approve: ask`` and records
the sha256 the jail reports afterwards).

Must not import the runner, workspace or cli.
"""

from __future__ import annotations

import contextlib
import json
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

from stockade.agent import endpoints, provider_errors, transport, wire
from stockade.agent.conversation import Conversation, body_delta, missing_outputs, reminder, verdict
from stockade.agent.desk import WriteDesk, os_reason
from stockade.agent.gate import Snapshot
from stockade.agent.record import Recorder, mask_headers
from stockade.agent.tools import WRITE_TOOLS

__all__ = ["Broker", "BrokerConfig", "BrokerServer", "Recorder"]

#: Response headers that carry the provider's id of a request.
REQUEST_ID_HEADERS = ("x-request-id", "request-id", "apim-request-id", "x-ms-request-id")
#: How many optional fields a conversation may drop after servers rejected them.
MAX_FALLBACKS = 3
DEFAULT_REQUEST_TIMEOUT = 600.0


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
    #: seconds for one model call (always finite)
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    settings: wire.Settings = field(default_factory=wire.Settings)
    endpoint: endpoints.StepEndpoint | None = None
    #: input + output tokens the item may spend; None: no cap
    budget_tokens: int | None = None
    #: the step's declared ``outputs`` (relative to out/)
    outputs: tuple[str, ...] = ()


def _usage_zero() -> dict[str, int]:
    return {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0, "reasoning_tokens": 0,
            "model_calls": 0}


@dataclass
class BrokerState:
    calls: int = 0
    finished: dict[str, Any] | None = None
    #: tokens spent by this attempt's calls
    usage: dict[str, int] = field(default_factory=_usage_zero)
    #: why the model side ended the item, when it did
    failure: str = ""
    #: False when running the item again would end the same way (a 4xx, a refusal)
    retryable: bool = True
    #: optional fields left out after a server rejected them
    fallbacks: list[str] = field(default_factory=list)
    tool_calls: int = 0


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
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.cfg = cfg
        self.state = BrokerState()
        self._rec = recorder
        self._clock = clock
        self._sleep = sleep
        self._deadline = None if cfg.timeout is None else clock() + cfg.timeout
        self._lock = threading.Lock()
        self._target = endpoints.resolve(cfg.provider, cfg.model, cfg.endpoint, host_env)
        self._headers = endpoints.headers(cfg.provider, self._target.key)
        self._convo = Conversation(cfg.prompt, cfg.writes, cfg.outputs)
        #: The writes: what was asked, approved, written and found wrong.
        self.desk = WriteDesk(cfg.work_dir, cfg.tools, cfg.writes, cfg.prompt, cfg.approve,
                              cfg.interactive, snapshot, recorder, echo, ask)
        self._omit: set[str] = set()
        self._notes: set[str] = set()
        self._last_body: dict[str, Any] | None = None
        self._reminded = False
        # A local server (vLLM, llama.cpp, Ollama) is never reached through an
        # HTTP(S)_PROXY the host may have set for the internet.
        local = httpx.URL(self._target.url).host in ("127.0.0.1", "localhost", "::1")
        self._http = http or httpx.Client(
            timeout=httpx.Timeout(cfg.request_timeout, connect=min(cfg.request_timeout, 10.0)),
            trust_env=not local)

    def close(self) -> None:
        self._http.close()

    def handle(self, route: str, payload: dict[str, Any]) -> dict[str, Any]:
        with self._lock:  # one jail, one conversation: keep records in order
            # Nothing the broker tells the jail may carry a key (a server that
            # echoes it back, an error message quoting it).
            return self._rec.mask.value(self._route(route, payload))  # type: ignore[no-any-return]

    def _route(self, route: str, payload: dict[str, Any]) -> dict[str, Any]:
        if self.state.finished is not None:
            # The verdict is recorded once; nothing may change it or
            # spend the key after it.
            return {"ok": False, "error": "the agent already finished"}
        if route == "/model":
            return self._model(payload)
        if route == "/write/intent":
            return self.desk.intent(payload)
        if route == "/write/done":
            return self.desk.done(payload)
        if route == "/finish":
            self.state.finished = payload
            self._rec.append("transcript.jsonl", {"event": "finish", **{k: payload.get(k) for k in ("ok", "result", "message", "turns")}, "usage": self.state.usage})
            return {"ok": True}
        return {"ok": False, "error": f"unknown route {route}"}

    # -- model calls ----------------------------------------------------------

    def _remaining(self) -> float | None:
        return None if self._deadline is None else self._deadline - self._clock()

    def _fail(self, why: str, *, retryable: bool) -> dict[str, Any]:
        why = self._rec.mask.text(why)  # a provider may quote the key in its error
        self.state.failure = why
        self.state.retryable = self.state.retryable and retryable
        self._rec.append("transcript.jsonl", {"event": "failed", "reason": why, "retryable": retryable})
        return {"ok": False, "error": why}

    def _spent(self) -> int:
        return self.state.usage["input_tokens"] + self.state.usage["output_tokens"]

    def _model(self, payload: dict[str, Any]) -> dict[str, Any]:
        if self.state.failure:
            return {"ok": False, "error": self.state.failure}
        problem = self._convo.add_results(payload.get("results") or [])
        if problem:
            return {"ok": False, "error": f"bad request from the jail: {problem}"}
        cfg = self.cfg
        while True:
            remaining = self._remaining()
            if remaining is not None and remaining <= 0:
                return self._refuse(f"step timeout ({cfg.timeout:g}s) reached; no more model calls")
            if self.state.calls >= cfg.max_turns:
                return self._refuse(f"max_turns ({cfg.max_turns}) reached; no more model calls")
            if cfg.budget_tokens is not None and self._spent() >= cfg.budget_tokens:
                return self._fail(f"token budget ({cfg.budget_tokens}) used up: {self._spent()} "
                                  "tokens spent", retryable=False)
            self.state.calls += 1
            reply = self._call(self.state.calls)
            if isinstance(reply, dict):
                return reply
            if cfg.budget_tokens is not None and self._spent() > cfg.budget_tokens:
                return self._fail(f"token budget exceeded: {self._spent()} tokens spent over "
                                  f"{self.state.calls} model call(s), budget {cfg.budget_tokens}",
                                  retryable=False)
            why = verdict(reply, cfg.settings.max_tokens)
            if why:
                return self._fail(why, retryable=False)
            if not reply.tool_calls and cfg.outputs:
                missing = missing_outputs(cfg.outputs, self.desk.written)
                if missing:
                    self._convo.add_reply(reply)
                    if not self._reminded and self.state.calls < cfg.max_turns:
                        self._reminded = True
                        write_tools = [t for t in cfg.tools if t in WRITE_TOOLS]
                        text = reminder(missing, write_tools)
                        self._convo.add_user(text)
                        self._rec.append("transcript.jsonl", {"event": "reminder", "missing": missing, "text": text})
                        continue
                    never = " and never called a tool" if self.state.tool_calls == 0 else ""
                    hint = (" (a server that cannot parse the model's tool calls answers like this: "
                            "see examples/sceptic/README.md)" if never else "")
                    return self._fail(
                        "the model answered with text" + never + " but never wrote the declared "
                        "outputs " + ", ".join(f"out/{m}" for m in missing)
                        + (", also after a reminder" if self._reminded else "") + hint,
                        retryable=False)
            self._convo.add_reply(reply)
            self.state.tool_calls += len(reply.tool_calls)
            return {"ok": True, "text": reply.text,
                    "tool_calls": [dict(c) for c in reply.tool_calls]}

    def _note(self, n: int, notes: list[str]) -> None:
        fresh = [x for x in notes if x not in self._notes]
        if fresh:
            self._notes.update(fresh)
            self._rec.append("transcript.jsonl", {"event": "adjusted", "n": n, "notes": fresh})

    def _call(self, n: int) -> wire.Reply | dict[str, Any]:
        """One model call (its tries and fallbacks): a reply, or the jail's error answer."""
        cfg = self.cfg
        provider = cfg.provider
        key = wire.CONVERSATION_KEY[provider]
        offset = 0
        while True:
            built = wire.build_request(provider, cfg.model, self._convo.messages, list(cfg.tools),
                                       cfg.settings, frozenset(self._omit))
            self._note(n, built.notes)
            delta = body_delta(self._last_body, built.body, key)
            self._last_body = built.body
            base = {"event": "model_call", "n": n, "provider": provider, "model": cfg.model,
                    "url": self._target.shown}
            first = offset + 1

            def on_try(t: transport.Try, started: bool, offset: int = offset, first: int = first,
                       base: dict[str, Any] = base, delta: dict[str, Any] = delta) -> None:
                number = offset + t.number
                if started:
                    self._rec.append("transcript.jsonl", {"event": "call_started", "n": n, "try": number,
                                                          "url": self._target.shown,
                                                          "request_timeout": cfg.request_timeout})
                elif t.wait is not None:
                    self._rec.append("transcript.jsonl", self._try_record(base, t, number, first, delta))

            try:
                answer = transport.post(self._http, self._target.url, built.body, self._headers,
                                        request_timeout=cfg.request_timeout, remaining=self._remaining,
                                        on_try=on_try, sleep=self._sleep)
            except transport.DeadlineReached:
                return self._refuse(f"step timeout ({cfg.timeout:g}s) reached during a model call")
            t = answer.last
            record = self._try_record(base, t, offset + t.number, first, delta)
            offset += t.number
            if t.error:
                self._rec.append("transcript.jsonl", record)
                left = self._remaining()
                if t.timed_out and left is not None and left <= 0:
                    return self._refuse(f"step timeout ({cfg.timeout:g}s) reached during a model call")
                what = (f"no answer within request_timeout {cfg.request_timeout:g}s" if t.timed_out
                        else self._scrub(t.error))
                tried = f" (tried {offset} times)" if offset > 1 else ""
                # A server that stalled twice in a row is not retried again from
                # the start; a connection refused may be a server restarting.
                return self._fail(f"model call to {self._target.shown} failed: {what}{tried}",
                                  retryable=not t.timed_out)
            assert t.status is not None
            if t.status < 400 and (not 200 <= t.status < 300 or not t.is_json):
                self._rec.append("transcript.jsonl", record)
                why, again = provider_errors.not_a_reply(t.status, t.headers, t.body, t.size,
                                                         self._location(t.headers))
                return self._fail(why, retryable=again)
            if t.status >= 400:
                candidates = tuple(f for f in provider_errors.FALLBACK_FIELDS[provider]
                                   if _sent(built.body, f) and f not in self._omit)
                rejected = provider_errors.rejected_field(t.status, t.body, candidates)
                if rejected and len(self.state.fallbacks) < MAX_FALLBACKS:
                    self._omit.add(rejected)
                    self.state.fallbacks.append(rejected)
                    record["fallback"] = f"the server rejected {rejected}; sending the request again without it"
                    self._rec.append("transcript.jsonl", record)
                    continue
                self._rec.append("transcript.jsonl", record)
                message = provider_errors.describe(
                    t.status, t.body, url=self._target.shown, provider=provider,
                    key_var=self._target.key_var, key_sent=self._target.key is not None,
                    tries=answer.tries)
                # A request the server refuses (400, 401, 403, 404, 422) fails the
                # same way next time; only exhausted rate limits and overloads may.
                return self._fail(message, retryable=transport.should_retry(t.status, t.headers))
            error = provider_errors.error_in_ok_body(provider, t.body)
            if error is not None:
                self._rec.append("transcript.jsonl", record)
                return self._fail(provider_errors.describe(200, t.body, url=self._target.shown,
                                                           provider=provider), retryable=True)
            try:
                reply = wire.parse_response(provider, t.body)
            except wire.WireError as e:
                record["error"] = str(e)
                self._rec.append("transcript.jsonl", record)
                return self._fail(f"{e} (from {self._target.shown})", retryable=True)
            u = reply.usage
            for k, v in u.as_dict().items():
                self.state.usage[k] += v
            self.state.usage["model_calls"] += 1
            record.update(usage=u.as_dict(), stop=reply.stop, stop_raw=reply.stop_raw,
                          spent=self._spent())
            if u.notes:
                record["usage_notes"] = list(u.notes)
            self._rec.append("transcript.jsonl", record)
            return reply

    def _try_record(self, base: dict[str, Any], t: transport.Try, number: int, first: int,
                    delta: dict[str, Any]) -> dict[str, Any]:
        rec: dict[str, Any] = {**base, "try": number, "latency_ms": t.latency_ms}
        rec["request"] = ({"headers": mask_headers(self._headers), "body": delta} if number == first
                          else {"same_as_try": first})
        if t.error:
            rec["error"] = self._scrub(t.error)
        else:
            rid = next((t.headers[h] for h in REQUEST_ID_HEADERS if h in t.headers), None)
            ok = t.status is not None and 200 <= t.status < 300 and t.is_json
            headers = {k: (self._location(t.headers) if k.lower() == "location" else v)
                       for k, v in t.headers.items()}
            rec["response"] = {"status": t.status, "request_id": rid, "headers": headers,
                               "body": t.body if ok else
                               provider_errors.recorded_body(t.body, t.size, t.sha256)}
        if t.wait is not None:
            rec["retry_in"] = t.wait
        return rec

    def _location(self, headers: Mapping[str, str]) -> str:
        """A redirect's target, absolute and without credentials, or ""."""
        location = headers.get("location", "")
        if not location:
            return ""
        try:
            return endpoints.shown(str(httpx.URL(self._target.url).join(location)))
        except (httpx.InvalidURL, ValueError):
            return endpoints.shown(location)

    def _scrub(self, text: str) -> str:
        """``text`` with the call's URL as it may be shown (an httpx message may quote it)."""
        return text.replace(self._target.url, self._target.shown)

    def _refuse(self, why: str) -> dict[str, Any]:
        why = self._rec.mask.text(why)
        self._rec.append("transcript.jsonl", {"event": "refused", "reason": why})
        self.state.failure = self.state.failure or why
        return {"ok": False, "error": why}


def _sent(body: dict[str, Any], name: str) -> bool:
    """Whether an optional field is in a request body (``strict``: on any tool)."""
    if name == "strict":
        return any(isinstance(t, dict) and ("strict" in t or "strict" in (t.get("function") or {}))
                   for t in body.get("tools") or [])
    return name in body


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
        except OSError as e:
            # Whatever a request made the host's file system say, the jail
            # hears it as an error and the conversation goes on.
            answer = {"ok": False, "error": f"the broker could not do this: {os_reason(e)}"}
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
