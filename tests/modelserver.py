"""A scripted model server on loopback speaking the real provider wire formats.

``POST /v1/chat/completions`` answers as OpenAI chat completions (``tool_calls``)
and ``POST /v1/messages`` as Anthropic messages (``tool_use`` blocks). What the
"model" says is a script: a list of turns indexed by how many assistant
messages the request already carries, so one server can drive several agents
in parallel without keeping per-conversation state. A script may also be a
function of the request.

The server checks what real providers check (the key, required fields, tool
results answering the previous tool calls) and records every request it got,
headers included, so tests can prove the key arrived here and nowhere else.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Call:
    """One tool call; ``args`` is a dict, or raw JSON text (OpenAI sends text)."""

    name: str
    args: dict[str, Any] | str


@dataclass(frozen=True)
class Turn:
    text: str = ""
    calls: tuple[Call, ...] = ()
    #: answer with this HTTP error instead (e.g. 503 to exercise retries)
    status: int = 200


def say(text: str) -> Turn:
    return Turn(text=text)


def calls(*cs: Call, text: str = "") -> Turn:
    return Turn(text=text, calls=tuple(cs))


@dataclass
class Seen:
    provider: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    def tool_results(self) -> list[str]:
        """The tool results this request carries (last turn only)."""
        msgs = self.body.get("messages", [])
        if self.provider == "openai":
            out: list[str] = []
            for m in reversed(msgs):
                if m.get("role") != "tool":
                    break
                out.insert(0, m["content"])
            return out
        last = msgs[-1] if msgs else {}
        if isinstance(last.get("content"), list):
            return [b["content"] for b in last["content"] if b.get("type") == "tool_result"]
        return []

    def first_user_text(self) -> str:
        for m in self.body.get("messages", []):
            if m.get("role") == "user":
                c = m["content"]
                return c if isinstance(c, str) else ""
        return ""


Script = list[Turn] | Callable[[Seen, int], Turn]


@dataclass
class ModelServer:
    script: Script
    key: str = "sk-test-0123456789abcdef"
    #: called for every accepted request before answering (e.g. to inspect the jail)
    on_request: Callable[[Seen], None] | None = None
    seen: list[Seen] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def openai_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, provider: str) -> dict[str, str]:
        if provider == "openai":
            return {"OPENAI_API_KEY": self.key, "OPENAI_BASE_URL": self.openai_base}
        return {"ANTHROPIC_API_KEY": self.key, "ANTHROPIC_BASE_URL": self.anthropic_base}

    def __enter__(self) -> ModelServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- answering ------------------------------------------------------------

    def answer(self, provider: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, dict[str, Any]]:
        problem = _check(provider, headers, body, self.key)
        seen = Seen(provider, path, headers, body if isinstance(body, dict) else {})
        with self._lock:
            self.seen.append(seen)
            if problem:
                self.errors.append(problem)
        if problem:
            status = 401 if "key" in problem else 400
            return status, _error(provider, problem)
        if self.on_request is not None:
            self.on_request(seen)
        n = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        if callable(self.script):
            turn = self.script(seen, n)
        else:
            turn = self.script[n] if n < len(self.script) else say("(script exhausted)")
        if turn.status != 200:
            return turn.status, _error(provider, f"scripted HTTP {turn.status}")
        return 200, (_openai_reply if provider == "openai" else _anthropic_reply)(body, turn, n)


def _error(provider: str, message: str) -> dict[str, Any]:
    if provider == "openai":
        return {"error": {"message": message, "type": "invalid_request_error"}}
    return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


def _check(provider: str, headers: dict[str, str], body: Any, key: str) -> str:
    if provider == "openai":
        if headers.get("authorization") != f"Bearer {key}":
            return "invalid api key"
    else:
        if headers.get("x-api-key") != key:
            return "invalid x-api-key"
        if not headers.get("anthropic-version"):
            return "anthropic-version header is required"
    if not isinstance(body, dict) or not body.get("model") or not isinstance(body.get("messages"), list):
        return "model and messages are required"
    for t in body.get("tools", []):
        schema = t["function"]["parameters"] if provider == "openai" else t["input_schema"]
        if schema.get("additionalProperties") is not False or set(schema["required"]) != set(schema["properties"]):
            return f"strict tool schema required for {t}"
    if provider == "openai":
        pending: set[str] = set()
        for m in body["messages"]:
            if m["role"] == "tool":
                if m.get("tool_call_id") not in pending:
                    return "tool message does not answer a tool call"
                pending.discard(m["tool_call_id"])
            elif pending:
                return "tool calls left unanswered"
            if m["role"] == "assistant":
                pending = {c["id"] for c in m.get("tool_calls") or []}
        return ""
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens is required"
    prev_role, pending = "", set()
    for m in body["messages"]:
        if m["role"] not in ("user", "assistant") or m["role"] == prev_role:
            return "roles must alternate user/assistant"
        content = m["content"]
        if m["role"] == "user" and pending:
            answered = {b["tool_use_id"] for b in content if isinstance(b, dict) and b.get("type") == "tool_result"}
            if answered != pending:
                return "tool_use blocks must be answered by tool_result blocks"
        pending = set()
        if m["role"] == "assistant" and isinstance(content, list):
            for b in content:
                if b.get("type") == "text" and not b.get("text"):
                    return "text content blocks must be non-empty"
            pending = {b["id"] for b in content if b.get("type") == "tool_use"}
        prev_role = m["role"]
    return ""


def _openai_reply(body: dict[str, Any], turn: Turn, n: int) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
    if turn.calls:
        msg["tool_calls"] = [
            {
                "id": f"call_{n}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.args if isinstance(c.args, str) else json.dumps(c.args)},
            }
            for i, c in enumerate(turn.calls)
        ]
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": body["model"],
        "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if turn.calls else "stop"}],
        "usage": {"prompt_tokens": 100 + n, "completion_tokens": 10 + n, "total_tokens": 110 + 2 * n},
    }


def _anthropic_reply(body: dict[str, Any], turn: Turn, n: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if turn.text:
        content.append({"type": "text", "text": turn.text})
    for i, c in enumerate(turn.calls):
        args = json.loads(c.args) if isinstance(c.args, str) else c.args
        content.append({"type": "tool_use", "id": f"toolu_{n}_{i}", "name": c.name, "input": args})
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": "tool_use" if turn.calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 200 + n, "output_tokens": 20 + n},
    }


def _make_handler(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in two writes; without this, Nagle and
            # delayed ACKs add ~40 ms to every call, as no real server does.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:
            if self.path.rstrip("/").endswith("/chat/completions"):
                provider = "openai"
            elif self.path.rstrip("/").endswith("/v1/messages"):
                provider = "anthropic"
            else:
                self._send(404, {"error": f"no route {self.path}"})
                return
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(400, _error(provider, "body is not JSON"))
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, answer = server.answer(provider, self.path, headers, body)
            self._send(status, answer)

        def _send(self, status: int, obj: dict[str, Any]) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
