"""The OpenAI Responses API (``openai-responses/``): request bodies and replies.

For models served only there (and for reasoning models, whose reasoning
items must be handed back between tool calls). Stateless on our side: every
request carries the whole conversation as ``input`` items, the model's own
output items (reasoning, messages, function calls, with their ids) replayed
as they came, tool arguments made valid JSON.

Pure. Standard library only, and ``stockade.agent.tools`` and ``stockade.agent.wire``.
"""

from __future__ import annotations

from typing import Any

from stockade.agent.tools import responses_tools
from stockade.agent.wire import (
    CONTENT_FILTER,
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
    arguments_json,
    kind_of,
    o_series,
    raw_arguments,
    reasoning_model,
    unique_ids,
)

_INCOMPLETE = {"max_output_tokens": LENGTH, "content_filter": CONTENT_FILTER}


def _rebuilt(m: Message) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    text = m.get("text") or ""
    if text.strip():
        items.append({"role": "assistant", "content": text})
    for c in m.get("tool_calls") or []:
        items.append({"type": "function_call", "call_id": c["id"], "name": c["name"],
                      "arguments": arguments_json(c["arguments"])})
    return items


def build(model: str, messages: list[Message], tools: list[str], s: Settings,
          omit: frozenset[str]) -> Built:
    system: list[str] = []
    items: list[dict[str, Any]] = []
    for m in messages:
        role = m["role"]
        if role == "system":
            system.append(m["text"])
        elif role == "user":
            items.append({"role": "user", "content": m["text"]})
        elif role == "assistant":
            native = m.get("native")
            items.extend(native if isinstance(native, list) else _rebuilt(m))
        elif role == "tool":
            items.extend({"type": "function_call_output", "call_id": r["id"], "output": r["content"]}
                         for r in m["results"])
        else:
            raise WireError(f"unknown internal role {role!r}")
    built = Built({"model": model, "input": items})
    body, notes = built.body, built.notes
    if system:
        body["instructions"] = "\n\n".join(system)
    if tools:
        body["tools"] = responses_tools(tools, strict="strict" not in omit)
        if o_series(model):
            notes.append(f"parallel_tool_calls not sent: {model} (o-series) rejects it")
        elif "parallel_tool_calls" not in omit:
            body["parallel_tool_calls"] = False
        if s.tool_choice is not None:
            body["tool_choice"] = s.tool_choice
    if s.max_tokens is not None:
        body["max_output_tokens"] = s.max_tokens
    if s.temperature is not None:
        if reasoning_model(model):
            notes.append(f"temperature not sent: {model} takes only its default")
        elif "temperature" not in omit:
            body["temperature"] = s.temperature
    if s.reasoning_effort is not None and "reasoning" not in omit:
        body["reasoning"] = {"effort": s.reasoning_effort}
    return built


def _native(item: dict[str, Any]) -> dict[str, Any] | None:
    """An output item as an input item (only the fields the API takes back)."""
    kind = item.get("type")
    if kind == "reasoning":
        out: dict[str, Any] = {"type": "reasoning", "id": str(item.get("id") or ""),
                               "summary": [{"type": "summary_text", "text": str(p.get("text") or "")}
                                           for p in item.get("summary") or [] if isinstance(p, dict)]}
        if isinstance(item.get("encrypted_content"), str):
            out["encrypted_content"] = item["encrypted_content"]
        return out
    if kind == "message":
        parts = []
        for p in item.get("content") or []:
            if not isinstance(p, dict):
                continue
            if p.get("type") == "output_text" and str(p.get("text") or "").strip():
                parts.append({"type": "output_text", "text": str(p["text"]), "annotations": []})
            elif p.get("type") == "refusal":
                parts.append({"type": "refusal", "refusal": str(p.get("refusal") or "")})
        if not parts:
            return None
        return {"type": "message", "id": str(item.get("id") or ""), "role": "assistant",
                "status": "completed", "content": parts}
    return None


def parse(body: dict[str, Any]) -> Reply:
    try:
        output = body["output"]
        if not isinstance(output, list):
            raise WireError(f"not an OpenAI Responses API response: output is {kind_of(output)}, "
                            "not a list")
        texts: list[str] = []
        refusals: list[str] = []
        fcalls = [o for o in output if isinstance(o, dict) and o.get("type") == "function_call"]
        ids = iter(unique_ids([str(o.get("call_id") or "") for o in fcalls], "call"))
        calls: list[dict[str, str]] = []
        native: list[dict[str, Any]] = []
        for item in output:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "function_call":
                cid = next(ids)
                args = raw_arguments(item.get("arguments"))
                calls.append({"id": cid, "name": str(item["name"]), "arguments": args})
                fc: dict[str, Any] = {"type": "function_call", "call_id": cid, "name": str(item["name"]),
                                      "arguments": arguments_json(args)}
                if item.get("id"):
                    fc["id"] = str(item["id"])
                native.append(fc)
                continue
            if item.get("type") == "message":
                for p in item.get("content") or []:
                    if isinstance(p, dict) and p.get("type") == "output_text":
                        texts.append(str(p.get("text") or ""))
                    elif isinstance(p, dict) and p.get("type") == "refusal":
                        refusals.append(str(p.get("refusal") or ""))
            kept = _native(item)
            if kept is not None:
                native.append(kept)
        status = str(body.get("status") or "")
    except (KeyError, TypeError, AttributeError) as e:
        raise WireError(f"not an OpenAI Responses API response: missing {e}") from None
    details = body.get("incomplete_details") if isinstance(body.get("incomplete_details"), dict) else {}
    assert isinstance(details, dict)
    reason = str(details.get("reason") or "")
    if refusals:
        stop = REFUSAL
    elif status == "incomplete":
        stop = _INCOMPLETE.get(reason, CONTEXT_WINDOW if "context" in reason else OTHER)
    elif calls:
        stop = TOOL_USE
    else:
        stop = END if status in ("completed", "") else OTHER
    t = Tally(body.get("usage"))
    return Reply(
        text="".join(texts),
        tool_calls=tuple(calls),
        usage=Usage(
            input_tokens=t.get("input_tokens"),
            output_tokens=t.get("output_tokens"),
            cached_tokens=t.get("input_tokens_details", "cached_tokens"),
            reasoning_tokens=t.get("output_tokens_details", "reasoning_tokens"),
            notes=tuple(t.notes),
        ),
        stop=stop,
        stop_raw=status + (f" ({reason})" if reason else ""),
        refusal=" ".join(refusals),
        native=native,
    )
