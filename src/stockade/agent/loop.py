"""The agent tool loop as a generator, without I/O.

``agent_loop`` yields a ``ModelRequest`` and receives a ``ModelReply``; for
each tool call in the reply it yields the ``ToolCall`` and receives a
``ToolResult``. It returns ``Finished``. Whoever drives it (the jail, a test)
does the talking; the loop only keeps the conversation and the turn count.

The conversation uses one internal message model, plain JSON-ready dicts:

- ``{"role": "system" | "user", "text": str}``
- ``{"role": "assistant", "text": str, "tool_calls": [{"id", "name", "arguments"}]}``
  (``arguments`` is the raw JSON text the model produced)
- ``{"role": "tool", "results": [{"id", "name", "content", "is_error"}]}``

``stockade.agent.wire`` translates it to and from each provider.

Imports only the standard library.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]

SYSTEM_PROMPT = """\
You are an agent working inside a sandboxed work directory; every path you use is \
relative to it. Use the tools to read the inputs and to write what the request asks for.
Rules enforced by the engine (a call that breaks one is rejected and does nothing):
- Write tools take no defaults: give every argument explicitly. Unknown or alias \
arguments are errors.
- create_file makes a new file only; apply_patch changes an existing file that the \
request names, with a unified diff.
- Writes are allowed only inside: {writes}.
When you are done, answer with your final message and no tool calls."""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ModelRequest:
    messages: tuple[Message, ...]
    tools: tuple[str, ...]


@dataclass(frozen=True)
class ModelReply:
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    #: Set when no reply could be had (provider error, turn limit, timeout).
    error: str = ""


@dataclass(frozen=True)
class ToolResult:
    content: str
    is_error: bool = False


@dataclass(frozen=True)
class Finished:
    ok: bool
    result: str
    message: str
    turns: int
    tool_calls: int = 0


@dataclass
class _State:
    messages: list[Message] = field(default_factory=list)
    calls: int = 0


Loop = Generator[ModelRequest | ToolCall, ModelReply | ToolResult, Finished]


def agent_loop(prompt: str, tools: tuple[str, ...], writes: tuple[str, ...], max_turns: int) -> Loop:
    """Run the conversation for at most ``max_turns`` model calls."""
    st = _State(
        [
            {"role": "system", "text": SYSTEM_PROMPT.format(writes=", ".join(writes) or "(nowhere)")},
            {"role": "user", "text": prompt},
        ]
    )
    last_text = ""
    for turn in range(1, max_turns + 1):
        reply = yield ModelRequest(tuple(st.messages), tools)
        if not isinstance(reply, ModelReply):
            raise TypeError("a ModelRequest must be answered with a ModelReply")
        if reply.error:
            return Finished(False, last_text, reply.error, turn, st.calls)
        last_text = reply.text
        st.messages.append(
            {
                "role": "assistant",
                "text": reply.text,
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls],
            }
        )
        if not reply.tool_calls:
            return Finished(True, reply.text, "", turn, st.calls)
        results: list[dict[str, Any]] = []
        for call in reply.tool_calls:
            res = yield call
            if not isinstance(res, ToolResult):
                raise TypeError("a ToolCall must be answered with a ToolResult")
            st.calls += 1
            results.append({"id": call.id, "name": call.name, "content": res.content, "is_error": res.is_error})
        st.messages.append({"role": "tool", "results": results})
    return Finished(
        False, last_text, f"max_turns ({max_turns}) reached without a final answer", max_turns, st.calls
    )


def drive(
    loop: Loop,
    model: Callable[[ModelRequest], ModelReply],
    tool: Callable[[ToolCall], ToolResult],
) -> Finished:
    """Run a loop to the end with synchronous handlers."""
    try:
        step = next(loop)
        while True:
            answer: ModelReply | ToolResult = model(step) if isinstance(step, ModelRequest) else tool(step)
            step = loop.send(answer)
    except StopIteration as stop:
        result: Finished = stop.value
        return result
