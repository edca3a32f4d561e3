"""Provider wire formats: OpenAI chat completions and Anthropic messages.

Translates the loop's internal messages (see ``stockade.agent.loop``) into a
provider request body, and a provider response body back into a reply plus
token usage. Pure: the broker does the HTTP.

Standard library only, and ``stockade.agent.tools``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stockade.agent.tools import anthropic_tools, openai_tools

PROVIDERS = ("openai", "anthropic")
ANTHROPIC_VERSION = "2023-06-01"
#: Anthropic honours ``strict`` on tool definitions under this beta.
ANTHROPIC_STRICT_BETA = "structured-outputs-2025-11-13"
DEFAULT_BASE = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
MAX_TOKENS = 8192


class WireError(ValueError):
    """A provider response that does not have the documented shape."""


@dataclass(frozen=True)
class Reply:
    text: str
    tool_calls: tuple[dict[str, str], ...]  # {"id", "name", "arguments"}
    input_tokens: int | None
    output_tokens: int | None
    stop: str


def split_model(spec: str) -> tuple[str, str]:
    """``openai/gpt-4.1-mini`` -> (``openai``, ``gpt-4.1-mini``)."""
    provider, sep, model = spec.partition("/")
    if not sep or provider not in PROVIDERS or not model:
        raise ValueError(f"model must be provider/name with provider one of {PROVIDERS}: {spec!r}")
    return provider, model


def endpoint(provider: str, base_url: str | None) -> str:
    base = (base_url or DEFAULT_BASE[provider]).rstrip("/")
    if provider == "openai":
        return base + "/chat/completions"
    # ANTHROPIC_BASE_URL is documented without the /v1 suffix; accept both.
    return base + ("/messages" if base.endswith("/v1") else "/v1/messages")


def headers(provider: str, key: str | None) -> dict[str, str]:
    h = {"content-type": "application/json"}
    if provider == "openai":
        if key:
            h["authorization"] = f"Bearer {key}"
    else:
        h["anthropic-version"] = ANTHROPIC_VERSION
        h["anthropic-beta"] = ANTHROPIC_STRICT_BETA
        if key:
            h["x-api-key"] = key
    return h


# -- OpenAI -----------------------------------------------------------------


def to_openai(model: str, messages: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m["role"]
        if role in ("system", "user"):
            out.append({"role": role, "content": m["text"]})
        elif role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": m.get("text") or None}
            if m.get("tool_calls"):
                msg["tool_calls"] = [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in m["tool_calls"]
                ]
            out.append(msg)
        elif role == "tool":
            for r in m["results"]:
                out.append({"role": "tool", "tool_call_id": r["id"], "content": r["content"]})
        else:
            raise WireError(f"unknown internal role {role!r}")
    body: dict[str, Any] = {"model": model, "messages": out}
    if tools:
        body["tools"] = openai_tools(tools)
        body["parallel_tool_calls"] = False
    return body


def from_openai(body: Any) -> Reply:
    try:
        choice = body["choices"][0]
        msg = choice["message"]
        calls: list[dict[str, str]] = []
        for i, c in enumerate(msg.get("tool_calls") or []):
            fn = c["function"]
            args = fn.get("arguments")
            calls.append(
                {
                    "id": str(c.get("id") or f"call_{i}"),
                    "name": str(fn["name"]),
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                }
            )
        usage = body.get("usage") or {}
        return Reply(
            text=msg.get("content") or "",
            tool_calls=tuple(calls),
            input_tokens=usage.get("prompt_tokens"),
            output_tokens=usage.get("completion_tokens"),
            stop=str(choice.get("finish_reason") or ""),
        )
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise WireError(f"not an OpenAI chat completion: missing {e}") from None


# -- Anthropic --------------------------------------------------------------


def _input_object(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def to_anthropic(model: str, messages: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m["role"]
        if role == "system":
            system.append(m["text"])
        elif role == "user":
            out.append({"role": "user", "content": m["text"]})
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            if m.get("text"):
                blocks.append({"type": "text", "text": m["text"]})
            for c in m.get("tool_calls") or []:
                blocks.append({"type": "tool_use", "id": c["id"], "name": c["name"], "input": _input_object(c["arguments"])})
            out.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "(no text)"}]})
        elif role == "tool":
            out.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": r["id"], "content": r["content"], "is_error": bool(r["is_error"])}
                        for r in m["results"]
                    ],
                }
            )
        else:
            raise WireError(f"unknown internal role {role!r}")
    body: dict[str, Any] = {"model": model, "max_tokens": MAX_TOKENS, "messages": out}
    if system:
        body["system"] = "\n\n".join(system)
    if tools:
        body["tools"] = anthropic_tools(tools)
    return body


def from_anthropic(body: Any) -> Reply:
    try:
        if body.get("type") == "error":
            raise WireError(f"Anthropic error: {body.get('error')}")
        texts: list[str] = []
        calls: list[dict[str, str]] = []
        for block in body["content"]:
            kind = block.get("type")
            if kind == "text":
                texts.append(block["text"])
            elif kind == "tool_use":
                calls.append({"id": str(block["id"]), "name": str(block["name"]), "arguments": json.dumps(block.get("input", {}))})
        usage = body.get("usage") or {}
        return Reply(
            text="".join(texts),
            tool_calls=tuple(calls),
            input_tokens=usage.get("input_tokens"),
            output_tokens=usage.get("output_tokens"),
            stop=str(body.get("stop_reason") or ""),
        )
    except (KeyError, TypeError, AttributeError) as e:
        raise WireError(f"not an Anthropic message: missing {e}") from None


def build_request(provider: str, model: str, messages: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
    return (to_openai if provider == "openai" else to_anthropic)(model, messages, tools)


def parse_response(provider: str, body: Any) -> Reply:
    return (from_openai if provider == "openai" else from_anthropic)(body)
