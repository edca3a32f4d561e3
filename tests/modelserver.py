"""A scripted model server on loopback speaking the real provider wire formats.

Routes, as the real services lay them out:

- ``POST /v1/chat/completions``: OpenAI chat completions (``tool_calls``);
- ``POST /openai/deployments/NAME/chat/completions?api-version=V``: Azure's
  classic deployment URL (``api-key`` header);
- ``POST /v1/responses``: the OpenAI Responses API (output items);
- ``POST /v1/messages``: Anthropic messages (``tool_use``, ``thinking`` blocks).

What the "model" says is a script: a list of turns indexed by how many
assistant turns the request already carries, so one server can drive several
agents in parallel without keeping per-conversation state. A script may also
be a function of the request. A turn can also answer with an HTTP error and
headers (``retry-after``), stall (``delay``), stop for a reason (``stop``),
refuse, think (signed ``thinking`` blocks, reasoning items), send a raw
body (an HTTP 200 carrying an error) or raw bytes (an HTML page, a redirect).

The server checks what real providers check (the key, required fields, tool
results answering the previous tool calls, alternating roles, no
whitespace-only text, thinking blocks replayed with their signatures, replayed
tool arguments that parse as JSON as Ollama requires, optional fields some
models reject: ``rejects``), and with ``validate=True`` every body against
the official SDK request types (``tests/sdkschema.py``). It records every
request, headers included, so tests can prove the key arrived here and
nowhere else.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PROVIDERS = ("openai", "openai-responses", "azure", "anthropic")


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
    #: the provider's stop reason, as it words it (finish_reason, stop_reason,
    #: or for the Responses API an incomplete_details reason); default: the normal one
    stop: str | None = None
    #: answer with a refusal (OpenAI ``refusal``, Anthropic stop_reason ``refusal``)
    refusal: str | None = None
    #: Anthropic thinking blocks (text) before the rest; Responses: a reasoning summary
    thinking: tuple[str, ...] = ()
    #: Anthropic redacted_thinking blocks (opaque data)
    redacted: tuple[str, ...] = ()
    #: the ``usage`` object to send instead of the default one
    usage: dict[str, Any] | None = None
    #: extra response headers (``retry-after``, ``retry-after-ms``)
    headers: Mapping[str, str] = field(default_factory=dict)
    #: seconds to wait before answering (a stalled server)
    delay: float = 0.0
    #: a raw body to answer with (status ``status``), e.g. an error inside an HTTP 200
    body: dict[str, Any] | None = None
    #: bytes to answer with as they are (an HTML page, a stream, cut-off JSON); the
    #: content-type is ``headers``' or application/octet-stream
    raw: bytes | None = None


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
    query: dict[str, str] = field(default_factory=dict)

    def tool_results(self) -> list[str]:
        """The tool results this request carries (last turn only)."""
        if self.provider == "openai-responses":
            items = self.body.get("input", [])
            out_r: list[str] = []
            for it in reversed(items):
                if not isinstance(it, dict) or it.get("type") != "function_call_output":
                    break
                out_r.insert(0, it["output"])
            return out_r
        msgs = self.body.get("messages", [])
        if self.provider in ("openai", "azure"):
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
        key = "input" if self.provider == "openai-responses" else "messages"
        for m in self.body.get(key, []):
            if isinstance(m, dict) and m.get("role") == "user":
                c = m["content"]
                return c if isinstance(c, str) else ""
        return ""

    def user_texts(self) -> list[str]:
        key = "input" if self.provider == "openai-responses" else "messages"
        return [m["content"] for m in self.body.get(key, [])
                if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)]


Script = list[Turn] | Callable[[Seen, int], Turn]

#: Error messages of servers that reject an optional field, as they word them.
REJECT_MESSAGES = {
    "parallel_tool_calls": "Unsupported parameter: 'parallel_tool_calls' is not supported with this model.",
    "temperature": "Unsupported parameter: 'temperature' is not supported with this model.",
    "max_tokens": "Unsupported parameter: 'max_tokens' is not supported with this model. "
                  "Use 'max_completion_tokens' instead.",
    "strict": "tools.0.custom.strict: Extra inputs are not permitted",
}


@dataclass
class ModelServer:
    script: Script
    key: str = "sk-test-0123456789abcdef"
    #: called for every accepted request before answering (e.g. to inspect the jail)
    on_request: Callable[[Seen], None] | None = None
    #: optional fields this server answers 400 to (as o-series models, LiteLLM
    #: proxies or Claude models before 4.5 do)
    rejects: frozenset[str] = frozenset()
    #: check every request body against the official SDK request types
    validate: bool = False
    seen: list[Seen] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._signatures: set[str] = set()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base(self) -> str:
        return f"{self.root}/v1"

    @property
    def anthropic_base(self) -> str:
        return self.root

    def env(self, provider: str) -> dict[str, str]:
        if provider in ("openai", "openai-responses"):
            return {"OPENAI_API_KEY": self.key, "OPENAI_BASE_URL": self.openai_base}
        if provider == "azure":
            return {"AZURE_OPENAI_API_KEY": self.key, "AZURE_OPENAI_ENDPOINT": self.root}
        return {"ANTHROPIC_API_KEY": self.key, "ANTHROPIC_BASE_URL": self.anthropic_base}

    def __enter__(self) -> ModelServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- answering ------------------------------------------------------------

    def answer(self, provider: str, path: str, query: dict[str, str], headers: dict[str, str],
               body: Any) -> tuple[int, dict[str, Any] | bytes, Mapping[str, str]]:
        seen = Seen(provider, path, headers, body if isinstance(body, dict) else {}, query)
        problem = _check(provider, headers, query, body, self.key) or self._check_more(provider, body)
        if not problem and self.validate:
            from sdkschema import validate_request

            problem = "; ".join(validate_request(provider, body)[:3])
        with self._lock:
            self.seen.append(seen)
            if problem:
                self.errors.append(problem)
        if problem:
            status = 401 if "key" in problem else 400
            return status, _error(provider, problem), {}
        rejected = self._rejected(provider, body)
        if rejected:
            return 400, _error(provider, REJECT_MESSAGES.get(rejected, f"Unsupported parameter: '{rejected}'"),
                               param=rejected), {}
        if self.on_request is not None:
            self.on_request(seen)
        n = _turns(provider, body)
        if callable(self.script):
            turn = self.script(seen, n)
        else:
            turn = self.script[n] if n < len(self.script) else say("(script exhausted)")
        if turn.delay:
            self._closing.wait(turn.delay)
        if turn.raw is not None:
            return turn.status, turn.raw, turn.headers
        if turn.body is not None:
            return turn.status, turn.body, turn.headers
        if turn.status != 200:
            return turn.status, _error(provider, f"scripted HTTP {turn.status}"), turn.headers
        reply = {"openai": _openai_reply, "azure": _openai_reply, "openai-responses": _responses_reply,
                 "anthropic": _anthropic_reply}[provider](body, turn, n)
        if provider == "anthropic":
            with self._lock:
                self._signatures.update(b["signature"] for b in reply["content"] if b["type"] == "thinking")
        return 200, reply, turn.headers

    def _rejected(self, provider: str, body: dict[str, Any]) -> str | None:
        for name in sorted(self.rejects):
            if name == "strict":
                tools = body.get("tools") or []
                if any("strict" in t or "strict" in (t.get("function") or {}) for t in tools):
                    return name
            elif name in body:
                return name
        return None

    def _check_more(self, provider: str, body: Any) -> str:
        """What real services check beyond the basic shape."""
        if not isinstance(body, dict):
            return ""
        if provider == "anthropic":
            thinking = (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")
            for m in body.get("messages", []):
                content = m.get("content")
                if m.get("role") != "assistant" or not isinstance(content, list):
                    continue
                for b in content:
                    if b.get("type") == "text" and not b.get("text", "").strip():
                        return "messages: text content blocks must contain non-whitespace text"
                    if b.get("type") == "thinking" and b.get("signature") not in self._signatures:
                        return "messages: thinking block has an invalid signature"
                if thinking and any(b.get("type") == "tool_use" for b in content) and \
                        content[0].get("type") not in ("thinking", "redacted_thinking"):
                    return ("messages: Expected `thinking` or `redacted_thinking`, but found "
                            f"`{content[0].get('type')}`. When `thinking` is enabled, a final "
                            "`assistant` message must start with a thinking block")
        # Ollama and older vLLM parse the arguments of earlier tool calls.
        for args in _replayed_arguments(provider, body):
            try:
                ok = isinstance(json.loads(args), dict)
            except (ValueError, TypeError):
                ok = False
            if not ok:
                return f"invalid character in tool call arguments of an earlier turn: {args[:40]!r}"
        return ""


def _replayed_arguments(provider: str, body: dict[str, Any]) -> list[Any]:
    if provider == "openai-responses":
        return [i.get("arguments") for i in body.get("input", [])
                if isinstance(i, dict) and i.get("type") == "function_call"]
    if provider in ("openai", "azure"):
        return [c["function"].get("arguments") for m in body.get("messages", [])
                if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    return []


def _turns(provider: str, body: dict[str, Any]) -> int:
    """How many assistant turns the request carries."""
    if provider == "openai-responses":
        turns = set()
        for i in body.get("input", []):
            ident = str(i.get("id") or i.get("call_id") or "") if isinstance(i, dict) else ""
            if ident.startswith(("fc_", "msg_", "rs_", "call_")):
                turns.add(ident.split("_")[1])
            elif isinstance(i, dict) and i.get("role") == "assistant":
                turns.add(f"plain{len(turns)}")
        return len(turns)
    return sum(1 for m in body["messages"] if m.get("role") == "assistant")


def _error(provider: str, message: str, *, param: str | None = None) -> dict[str, Any]:
    if provider == "anthropic":
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": "unsupported_parameter" if param else None}}


def _check(provider: str, headers: dict[str, str], query: dict[str, str], body: Any, key: str) -> str:
    if provider in ("openai", "openai-responses"):
        if headers.get("authorization") != f"Bearer {key}":
            return "invalid api key"
    elif provider == "azure":
        if headers.get("api-key") != key:
            return "invalid api-key: Access denied due to invalid subscription key"
        if not query.get("api-version"):
            return "Missing required query parameter: api-version"
    else:
        if headers.get("x-api-key") != key:
            return "invalid x-api-key"
        if not headers.get("anthropic-version"):
            return "anthropic-version header is required"
    if provider == "openai-responses":
        if not isinstance(body, dict) or not body.get("model") or not isinstance(body.get("input"), list):
            return "model and input are required"
        pending_r: set[str] = set()
        for i in body["input"]:
            if i.get("type") == "function_call":
                pending_r.add(i["call_id"])
            elif i.get("type") == "function_call_output":
                if i.get("call_id") not in pending_r:
                    return f"No tool call found for function call output with call_id {i.get('call_id')}."
                pending_r.discard(i["call_id"])
        for t in body.get("tools", []):
            if t.get("parameters", {}).get("additionalProperties") is not False:
                return f"strict tool schema required for {t}"
        return ""
    if not isinstance(body, dict) or not body.get("model") or not isinstance(body.get("messages"), list):
        return "model and messages are required"
    for t in body.get("tools", []):
        schema = t["function"]["parameters"] if provider in ("openai", "azure") else t["input_schema"]
        if schema.get("additionalProperties") is not False or set(schema["required"]) != set(schema["properties"]):
            return f"strict tool schema required for {t}"
    if provider in ("openai", "azure"):
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
    msg: dict[str, Any] = {"role": "assistant", "content": turn.text or None, "refusal": turn.refusal}
    if turn.calls:
        msg["tool_calls"] = [
            {
                "id": f"call_{n}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.args if isinstance(c.args, str) else json.dumps(c.args)},
            }
            for i, c in enumerate(turn.calls)
        ]
    finish = turn.stop or ("tool_calls" if turn.calls else "stop")
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": body["model"],
        "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
        "usage": turn.usage or {"prompt_tokens": 100 + n, "completion_tokens": 10 + n,
                                "total_tokens": 110 + 2 * n},
    }


def _responses_reply(body: dict[str, Any], turn: Turn, n: int) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if turn.thinking:
        output.append({"type": "reasoning", "id": f"rs_{n}", "encrypted_content": None,
                       "summary": [{"type": "summary_text", "text": t} for t in turn.thinking]})
    if turn.refusal is not None:
        output.append({"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                       "content": [{"type": "refusal", "refusal": turn.refusal}]})
    elif turn.text:
        output.append({"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": turn.text, "annotations": [],
                                    "logprobs": []}]})
    for i, c in enumerate(turn.calls):
        output.append({"type": "function_call", "id": f"fc_{n}_{i}", "call_id": f"call_{n}_{i}",
                       "name": c.name, "status": "completed",
                       "arguments": c.args if isinstance(c.args, str) else json.dumps(c.args)})
    incomplete = turn.stop is not None and turn.stop not in ("completed",)
    return {
        "id": f"resp_{n}",
        "object": "response",
        "created_at": 1_700_000_000,
        "model": body["model"],
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": turn.stop} if incomplete else None,
        "output": output,
        "usage": turn.usage or {"input_tokens": 300 + n, "output_tokens": 30 + n, "total_tokens": 330 + 2 * n,
                                "input_tokens_details": {"cached_tokens": 100},
                                "output_tokens_details": {"reasoning_tokens": 5}},
    }


def _anthropic_reply(body: dict[str, Any], turn: Turn, n: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for j, t in enumerate(turn.thinking):
        content.append({"type": "thinking", "thinking": t, "signature": f"sig-{n}-{j}-{len(t)}"})
    for data in turn.redacted:
        content.append({"type": "redacted_thinking", "data": data})
    if turn.refusal is not None:
        content.append({"type": "text", "text": turn.refusal})
    elif turn.text:
        content.append({"type": "text", "text": turn.text, "citations": None})
    for i, c in enumerate(turn.calls):
        args = json.loads(c.args) if isinstance(c.args, str) and _is_json(c.args) else c.args
        content.append({"type": "tool_use", "id": f"toolu_{n}_{i}", "name": c.name,
                        "input": args if isinstance(args, dict) else {}})
    stop = turn.stop or ("refusal" if turn.refusal is not None else "tool_use" if turn.calls else "end_turn")
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": turn.usage or {"input_tokens": 200 + n, "output_tokens": 20 + n,
                                "cache_read_input_tokens": 50, "cache_creation_input_tokens": 0},
    }


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _route(path: str) -> str | None:
    p = path.rstrip("/")
    if "/openai/deployments/" in p and p.endswith("/chat/completions"):
        return "azure"
    if p.endswith("/v1/chat/completions"):
        return "openai"
    if p.endswith("/v1/responses"):
        return "openai-responses"
    if p.endswith("/v1/messages"):
        return "anthropic"
    return None


def _make_handler(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    counter = iter(range(1, 1 << 30))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in two writes; without this, Nagle and
            # delayed ACKs add ~40 ms to every call, as no real server does.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:
            parts = urlsplit(self.path)
            provider = _route(parts.path)
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            if provider is None:
                self._send(404, {"error": {"message": f"Not Found: {parts.path}", "type": "not_found"}}, {})
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(400, _error(provider, "body is not JSON"), {})
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            status, answer, extra = server.answer(provider, parts.path, query, headers, body)
            rid = f"req_{next(counter)}"
            ids = {"request-id": rid} if provider == "anthropic" else \
                {"apim-request-id": rid} if provider == "azure" else {"x-request-id": rid}
            self._send(status, answer, {**ids, **extra})

        def _send(self, status: int, obj: dict[str, Any] | bytes, headers: Mapping[str, str]) -> None:
            data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
            ctype = {k.lower(): v for k, v in headers.items()}.get("content-type") or \
                ("application/octet-stream" if isinstance(obj, bytes) else "application/json")
            try:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    if k.lower() != "content-type":
                        self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client gave up (a request timeout)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
