"""OpenAI chat completions (``openai/`` and ``azure/``): request bodies and replies.

Sends only what the model accepts: no ``parallel_tool_calls`` and no
``temperature`` for o-series models, ``max_completion_tokens`` for reasoning
models; ``omit`` names optional fields a server rejected at run time
(``max_tokens`` in ``omit`` means "send it as ``max_completion_tokens``",
and the other way round). Assistant turns are replayed from the reply as it
came, with whitespace-only content dropped and tool arguments made valid JSON.

Pure. Standard library only, and ``stockade.agent.tools`` and ``stockade.agent.wire``.
"""

from __future__ import annotations

from typing import Any

from stockade.agent.tools import openai_tools
from stockade.agent.wire import (
    CONTENT_FILTER,
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

_STOPS = {"stop": END, "tool_calls": TOOL_USE, "function_call": TOOL_USE, "length": LENGTH,
          "content_filter": CONTENT_FILTER}


def _assistant(m: Message) -> dict[str, Any]:
    native = m.get("native")
    if isinstance(native, dict):
        return native
    text = m.get("text") or ""
    msg: dict[str, Any] = {"role": "assistant", "content": text if text.strip() else None}
    if m.get("tool_calls"):
        msg["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": arguments_json(c["arguments"])}}
            for c in m["tool_calls"]
        ]
    return msg


def build(model: str, messages: list[Message], tools: list[str], s: Settings,
          omit: frozenset[str]) -> Built:
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m["role"]
        if role in ("system", "user"):
            out.append({"role": role, "content": m["text"]})
        elif role == "assistant":
            out.append(_assistant(m))
        elif role == "tool":
            for r in m["results"]:
                out.append({"role": "tool", "tool_call_id": r["id"], "content": r["content"]})
        else:
            raise WireError(f"unknown internal role {role!r}")
    built = Built({"model": model, "messages": out})
    body, notes = built.body, built.notes
    if tools:
        body["tools"] = openai_tools(tools, strict="strict" not in omit)
        if o_series(model):
            notes.append(f"parallel_tool_calls not sent: {model} (o-series) rejects it")
        elif "parallel_tool_calls" not in omit:
            body["parallel_tool_calls"] = False
    if s.max_tokens is not None:
        new_name = reasoning_model(model)
        if "max_tokens" in omit:
            new_name = True
        elif "max_completion_tokens" in omit:
            new_name = False
        body["max_completion_tokens" if new_name else "max_tokens"] = s.max_tokens
    if s.temperature is not None:
        if reasoning_model(model):
            notes.append(f"temperature not sent: {model} takes only its default")
        elif "temperature" not in omit:
            body["temperature"] = s.temperature
    if s.reasoning_effort is not None and "reasoning_effort" not in omit:
        body["reasoning_effort"] = s.reasoning_effort
    if s.tool_choice is not None and tools:
        body["tool_choice"] = s.tool_choice
    return built


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # some servers answer with content parts
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


def _usage(body: dict[str, Any]) -> Usage:
    t = Tally(body.get("usage"))
    return Usage(
        input_tokens=t.get("prompt_tokens"),
        output_tokens=t.get("completion_tokens"),
        cached_tokens=t.get("prompt_tokens_details", "cached_tokens"),
        reasoning_tokens=t.get("completion_tokens_details", "reasoning_tokens"),
        notes=tuple(t.notes),
    )


def _shape(where: str, value: Any, wanted: str) -> WireError:
    found = "missing or null" if value is None else kind_of(value)
    return WireError(f"not an OpenAI chat completion: {where} is {found}, not {wanted}")


def parse(body: dict[str, Any]) -> Reply:
    if body.get("choices") == []:
        # Some servers answer an empty generation with no choice at all.
        return Reply("", (), _usage(body), OTHER, "no choices")
    choices = body.get("choices")
    if not isinstance(choices, list):
        raise _shape("choices", choices, "a list")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise _shape("choices[0]", choice, "an object")
    msg = choice.get("message")
    if not isinstance(msg, dict):
        raise _shape("choices[0].message", msg, "an object")
    listed = msg.get("tool_calls") or []
    if not isinstance(listed, list):
        raise _shape("choices[0].message.tool_calls", listed, "a list")
    raw_calls = [c for c in listed if isinstance(c, dict)]
    ids = unique_ids([str(c.get("id") or "") for c in raw_calls], "call")
    calls: list[dict[str, str]] = []
    for i, (cid, c) in enumerate(zip(ids, raw_calls, strict=True)):
        fn = c.get("function")
        if not isinstance(fn, dict) or not fn.get("name"):
            raise _shape(f"choices[0].message.tool_calls[{i}].function", fn, "an object with a name")
        calls.append({"id": cid, "name": str(fn["name"]), "arguments": raw_arguments(fn.get("arguments"))})
    text = _text(msg.get("content"))
    refusal = str(msg.get("refusal") or "")
    finish = str(choice.get("finish_reason") or "")
    stop = REFUSAL if refusal else _STOPS.get(finish, OTHER)
    if stop in (END, OTHER) and calls:
        stop = TOOL_USE  # some servers say "stop" for a reply with tool calls
    native: dict[str, Any] = {"role": "assistant", "content": text if text.strip() else None}
    if calls:
        native["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": arguments_json(c["arguments"])}}
            for c in calls
        ]
    return Reply(
        text=text,
        tool_calls=tuple(calls),
        usage=_usage(body),
        stop=stop,
        stop_raw=finish,
        refusal=refusal,
        native=native,
    )
