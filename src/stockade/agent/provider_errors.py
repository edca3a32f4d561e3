"""Provider error answers -> one readable message with a hint, and fallback decisions.

Reads the error shapes real servers send (OpenAI and Azure ``{"error":
{message, type, code, param}}``, Anthropic ``{"type": "error", "error":
{type, message}}``, Ollama ``{"error": "..."}``, vLLM and other FastAPI
servers ``{"message": ...}`` or ``{"detail": ...}``, a failed Responses API
response), also inside an HTTP 200. ``describe`` shows the provider's own
``message``, ``type`` and ``code`` with a hint for the usual causes (a base
URL without ``/v1``, a vLLM started without tool parsing, llama.cpp without
``--jinja``, a context window too small). ``rejected_field`` names the
optional request field a 400 complains about, so the broker can send the
request again without it, once.

Pure. Standard library only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_MESSAGE = 800
#: What a transcript keeps of an error body (a server may send megabytes, on every retry).
MAX_RECORDED_BODY = 64 << 10

#: Optional fields the broker may leave out after a server rejected them, per
#: provider, longest first (``max_completion_tokens`` before ``max_tokens``).
FALLBACK_FIELDS: dict[str, tuple[str, ...]] = {
    "openai": ("max_completion_tokens", "parallel_tool_calls", "reasoning_effort", "max_tokens",
               "temperature", "strict"),
    "azure": ("max_completion_tokens", "parallel_tool_calls", "reasoning_effort", "max_tokens",
              "temperature", "strict"),
    "openai-responses": ("parallel_tool_calls", "temperature", "reasoning", "strict"),
    "anthropic": ("output_config", "strict"),
}


@dataclass(frozen=True)
class ErrorInfo:
    message: str
    type: str = ""
    code: str = ""
    param: str = ""


def _s(v: Any) -> str:
    return "" if v is None else (v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))


def extract(body: Any) -> ErrorInfo | None:
    """The error a body carries, or None when it carries none."""
    if isinstance(body, str):
        text = body.strip()
        return ErrorInfo(text[:MAX_MESSAGE]) if text else None
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict):
        return ErrorInfo(_s(err.get("message")) or _s(err), _s(err.get("type")),
                         _s(err.get("code")), _s(err.get("param")))
    if isinstance(err, str) and err:
        return ErrorInfo(err, _s(body.get("type")), _s(body.get("code")))
    if body.get("object") == "error" or body.get("type") == "error":
        return ErrorInfo(_s(body.get("message")) or _s(body), _s(body.get("type")), _s(body.get("code")))
    if "detail" in body:
        return ErrorInfo(_s(body["detail"]))
    if "message" in body and not any(k in body for k in ("choices", "content", "output")):
        return ErrorInfo(_s(body["message"]), _s(body.get("type")), _s(body.get("code")))
    return None


def error_in_ok_body(provider: str, body: Any) -> ErrorInfo | None:
    """An error inside an HTTP 200 (proxies do this), or None for a real answer."""
    if not isinstance(body, dict):
        return extract(body)
    if provider == "openai-responses" and body.get("status") == "failed":
        return extract(body) or ErrorInfo("the response failed", code="failed")
    success = {"openai": "choices", "azure": "choices", "openai-responses": "output",
               "anthropic": "content"}[provider]
    if success in body and body.get("type") != "error":
        return None
    return extract(body)


def _hints(status: int, info: ErrorInfo, url: str, provider: str, key_var: str,
           key_sent: bool) -> list[str]:
    text = f"{info.message} {info.type} {info.code}".lower()
    out: list[str] = []
    if status in (401, 403):
        if not key_sent:
            out.append("no key was sent: set the provider's key variable (or endpoint.api_key_env)")
        else:
            out.append(f"the server did not accept the key in {key_var or 'the key variable'}")
    if status == 404:
        path = urlsplit(url).path
        if provider in ("openai", "openai-responses") and "/v1/" not in path + "/":
            out.append("the base URL probably lacks /v1 (for example "
                       "OPENAI_BASE_URL=http://127.0.0.1:8000/v1)")
        elif "model" in text or "deployment" in text:
            out.append("check the model name" + (" (for azure/: the deployment name)"
                                                  if provider == "azure" else ""))
    if "enable-auto-tool-choice" in text or "tool-call-parser" in text or \
            ("auto" in text and "tool choice" in text):
        out.append("start vLLM with --enable-auto-tool-choice --tool-call-parser <parser for "
                   "the model> (hermes for Qwen, llama3_json for Llama 3.x, mistral, ...)")
    if "jinja" in text:
        out.append("start llama-server with --jinja so it uses the model's tool-calling template")
    if "does not support tools" in text:
        out.append("this model has no tool calling on this server; pick one that does")
    if "context_length" in text or "context length" in text or "context window" in text \
            or "maximum context" in text or "too many tokens" in text:
        out.append("the conversation no longer fits the model's context window (Ollama: raise "
                   "num_ctx or OLLAMA_CONTEXT_LENGTH; vLLM: --max-model-len); give the step "
                   "smaller inputs or fewer turns")
    return out


def describe(status: int, body: Any, *, url: str, provider: str, key_var: str = "",
             key_sent: bool = True, tries: int = 1) -> str:
    """One message: what the provider said, its type and code, and what to do."""
    info = extract(body) or ErrorInfo(f"(no error message; body {_s(body)[:200]!r})")
    head = f"the model provider answered HTTP {status}"
    if status == 200:
        head += " with an error instead of a reply"
    tags = ", ".join(x for x in (info.type, f"code {info.code}" if info.code else "",
                                 f"param {info.param}" if info.param else "") if x)
    message = info.message if len(info.message) <= MAX_MESSAGE else info.message[:MAX_MESSAGE] + "..."
    out = f"{head}" + (f" ({tags})" if tags else "") + f": {message}"
    if tries > 1:
        out += f" (after {tries} tries)"
    hints = _hints(status, info, url, provider, key_var, key_sent)
    if hints:
        out += "; " + "; ".join(hints)
    return out


def not_a_reply(status: int, headers: dict[str, str], body: Any, size: int,
                location: str) -> tuple[str, bool]:
    """(message, retryable) for a 1xx/3xx answer, or a 2xx whose body is not JSON.

    ``location`` is the redirect's target as it may be shown (no credentials).
    """
    h = {k.lower(): v for k, v in headers.items()}
    if not 200 <= status < 300:
        if 300 <= status < 400:
            where = f"to {location}" if location else "without a Location"
            return (f"the model provider answered HTTP {status}, a redirect {where}; redirects "
                    "are not followed (the key would travel with them): set the base URL to "
                    "the address it points to", False)
        return f"the model provider answered HTTP {status}, which is no reply", True
    ctype = h.get("content-type", "").split(";")[0].strip() or "no content-type"
    text = body if isinstance(body, str) else ""
    start = json.dumps(text.strip()[:60], ensure_ascii=False)
    out = (f"the model provider answered HTTP {status} with a body that is not JSON ({ctype}, "
           f"{size:,} bytes, starting {start})")
    if "event-stream" in ctype:
        return (out + ": the server is streaming, which stockade never asks for; a proxy in "
                "between may force it: call the server directly or turn streaming off there"), False
    if "json" in ctype:
        return (out + ": the JSON is cut off or malformed; the server or a proxy may have ended "
                "the answer early (see its log)"), True
    hint = ("the base URL probably leads to a web page or a login portal, not the API"
            if "html" in ctype else "check the base URL")
    return (out + f": {hint} (an OpenAI-compatible server's base URL ends in /v1, for example "
            "http://127.0.0.1:8000/v1; Anthropic's has no /v1)"), False


def recorded_body(body: Any, size: int, sha256: str) -> Any:
    """An error body as a transcript keeps it: whole up to ``MAX_RECORDED_BODY``, else its
    start with the full size and sha256."""
    text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    if len(text) <= MAX_RECORDED_BODY and size <= MAX_RECORDED_BODY:
        return body
    return {"truncated": text[:MAX_RECORDED_BODY],
            "note": f"the body had {size:,} bytes (sha256 {sha256}); the first "
                    f"{MAX_RECORDED_BODY >> 10} KiB of it are kept"}


def rejected_field(status: int, body: Any, candidates: tuple[str, ...]) -> str | None:
    """The optional field (one of ``candidates``, all sent) a 400 or 422 rejects, if named."""
    if status not in (400, 422):
        return None
    info = extract(body)
    if info is None:
        return None
    if info.param:
        param = info.param.rsplit(".", 1)[-1]
        for c in candidates:
            if param == c or info.param.startswith(c):
                return c
    text = info.message
    for c in candidates:
        if re.search(rf"(?<![A-Za-z0-9_]){re.escape(c)}(?![A-Za-z0-9_])", text):
            return c
    if "effort" in text and "output_config" in candidates:
        return "output_config"
    return None
