"""Anthropic messages (``anthropic/``): request bodies and replies.

Assistant turns are replayed as the provider sent them: ``thinking`` and
``redacted_thinking`` blocks kept in place with their signatures (the API
rejects a tool-use turn without them when thinking is on), whitespace-only
text blocks dropped (the API rejects them), tool inputs always objects.
``strict`` tool schemas go only to models that take them (Claude 4.5 and
later), with no beta header: structured outputs are generally available.

Pure. Standard library only, and ``stockade.agent.tools`` and ``stockade.agent.wire``.
"""

from __future__ import annotations

import json
from typing import Any

from stockade.agent.tools import anthropic_tools
from stockade.agent.wire import (
    CONTEXT_WINDOW,
    END,
    LENGTH,
    OTHER,
    REFUSAL,
    TOOL_USE,
    Built,
    Message,
    Reply,
    Settings,
    Tally,
    Usage,
    WireError,
    anthropic_strict,
    arguments_object,
    kind_of,
    num,
    unique_ids,
)

VERSION = "2023-06-01"
#: The output limit when the step sets none (the API requires one).
MAX_TOKENS = 8192
_STOPS = {"end_turn": END, "stop_sequence": END, "tool_use": TOOL_USE, "max_tokens": LENGTH,
          "refusal": REFUSAL, "model_context_window_exceeded": CONTEXT_WINDOW}
_TOOL_CHOICE = {"auto": "auto", "required": "any", "none": "none"}


def _rebuilt(m: Message) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    text = m.get("text") or ""
    if text.strip():
        blocks.append({"type": "text", "text": text})
    for c in m.get("tool_calls") or []:
        blocks.append({"type": "tool_use", "id": c["id"], "name": c["name"],
                       "input": arguments_object(c["arguments"])})
    return blocks


def build(model: str, messages: list[Message], tools: list[str], s: Settings,
          omit: frozenset[str]) -> Built:
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m["role"]
        if role == "system":
            system.append(m["text"])
        elif role == "user":
            out.append({"role": "user", "content": m["text"]})
        elif role == "assistant":
            native = m.get("native")
            blocks = native if isinstance(native, list) else _rebuilt(m)
            out.append({"role": "assistant", "content": blocks})
        elif role == "tool":
            out.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": r["id"], "content": r["content"],
                 "is_error": bool(r["is_error"])}
                for r in m["results"]
            ]})
        else:
            raise WireError(f"unknown internal role {role!r}")
    thinking = dict(s.thinking) if s.thinking else None
    budget = num(thinking.get("budget_tokens")) if thinking else 0
    max_tokens = s.max_tokens if s.max_tokens is not None else max(MAX_TOKENS, budget + 4096)
    built = Built({"model": model, "max_tokens": max_tokens, "messages": out})
    body, notes = built.body, built.notes
    if system:
        body["system"] = "\n\n".join(system)
    if tools:
        strict = anthropic_strict(model) and "strict" not in omit
        if not anthropic_strict(model):
            notes.append(f"strict tool schemas not sent: {model} is not known to take them "
                         "(Claude 4.5 and later do)")
        body["tools"] = anthropic_tools(tools, strict=strict)
        if s.tool_choice is not None:
            body["tool_choice"] = {"type": _TOOL_CHOICE[s.tool_choice]}
    # The Messages API has no temperature (validate refuses it for anthropic/).
    if thinking:
        body["thinking"] = thinking
    if s.reasoning_effort is not None and "output_config" not in omit:
        body["output_config"] = {"effort": s.reasoning_effort}
    return built


def _native(block: dict[str, Any]) -> dict[str, Any] | None:
    """A response block as a request block, or None when it is not to be replayed."""
    kind = block.get("type")
    if kind == "thinking":
        return {"type": "thinking", "thinking": str(block.get("thinking") or ""),
                "signature": str(block.get("signature") or "")}
    if kind == "redacted_thinking":
        return {"type": "redacted_thinking", "data": str(block.get("data") or "")}
    if kind == "text":
        text = str(block.get("text") or "")
        return {"type": "text", "text": text} if text.strip() else None
    return None


def parse(body: dict[str, Any]) -> Reply:
    try:
        content = body["content"]
        if not isinstance(content, list):
            raise WireError(f"not an Anthropic message: content is {kind_of(content)}, not a list")
        texts: list[str] = []
        uses = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
        ids = iter(unique_ids([str(b.get("id") or "") for b in uses], "toolu"))
        calls: list[dict[str, str]] = []
        native: list[dict[str, Any]] = []
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                texts.append(str(block.get("text") or ""))
            if block.get("type") == "tool_use":
                cid = next(ids)
                raw = block.get("input", {})
                args = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)
                calls.append({"id": cid, "name": str(block["name"]), "arguments": args})
                native.append({"type": "tool_use", "id": cid, "name": str(block["name"]),
                               "input": arguments_object(raw)})
                continue
            kept = _native(block)
            if kept is not None:
                native.append(kept)
        stop_raw = str(body.get("stop_reason") or "")
    except (KeyError, TypeError, AttributeError) as e:
        raise WireError(f"not an Anthropic message: missing {e}") from None
    stop = _STOPS.get(stop_raw, OTHER)
    if stop in (END, OTHER) and calls:
        stop = TOOL_USE
    text = "".join(texts)
    t = Tally(body.get("usage"))
    cache_read = t.get("cache_read_input_tokens")
    return Reply(
        text=text,
        tool_calls=tuple(calls),
        usage=Usage(
            input_tokens=t.get("input_tokens") + cache_read + t.get("cache_creation_input_tokens"),
            output_tokens=t.get("output_tokens"),
            cached_tokens=cache_read,
            notes=tuple(t.notes),
        ),
        stop=stop,
        stop_raw=stop_raw,
        refusal=text if stop == REFUSAL else "",
        native=native,
    )
