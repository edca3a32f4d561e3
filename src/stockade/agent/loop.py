"""The agent tool loop as a generator, without I/O.

``agent_loop`` yields a ``ModelRequest`` and receives a ``ModelReply``; for
each tool call in the reply it yields the ``ToolCall`` and receives a
``ToolResult``. It returns ``Finished``. Whoever drives it (the jail, a test)
does the talking; the loop only runs the tools and counts the turns.

The conversation itself is kept on the host (``stockade.agent.conversation``,
in the broker): a ``ModelRequest`` carries only the results of the previous
reply's tool calls, ``{"id", "name", "content", "is_error"}`` each, so the
provider's own assistant content (thinking blocks, reasoning items) is
replayed by the host exactly as it came and never passes through the jail.

Imports only the standard library.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

Result = dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ModelRequest:
    #: the results of the previous reply's tool calls, in call order (none at first)
    results: tuple[Result, ...] = ()


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


Loop = Generator[ModelRequest | ToolCall, ModelReply | ToolResult, Finished]


def agent_loop(max_turns: int) -> Loop:
    """Run the conversation for at most ``max_turns`` model calls."""
    last_text = ""
    results: tuple[Result, ...] = ()
    executed = 0
    for turn in range(1, max_turns + 1):
        reply = yield ModelRequest(results)
        if not isinstance(reply, ModelReply):
            raise TypeError("a ModelRequest must be answered with a ModelReply")
        if reply.error:
            return Finished(False, last_text, reply.error, turn, executed)
        last_text = reply.text
        if not reply.tool_calls:
            return Finished(True, reply.text, "", turn, executed)
        out: list[Result] = []
        for call in reply.tool_calls:
            res = yield call
            if not isinstance(res, ToolResult):
                raise TypeError("a ToolCall must be answered with a ToolResult")
            executed += 1
            out.append({"id": call.id, "name": call.name, "content": res.content, "is_error": res.is_error})
        results = tuple(out)
    return Finished(False, last_text, f"max_turns ({max_turns}) reached without a final answer",
                    max_turns, executed)


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
