"""The tool loop without a model or a jail: scripted replies in, requests out."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stockade.agent.loop import (
    Finished,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolResult,
    agent_loop,
    drive,
)

READ = ToolCall("c1", "read_file", '{"path": "a"}')


def scripted(replies: list[ModelReply]) -> tuple[Callable[[ModelRequest], ModelReply], list[ModelRequest]]:
    seen: list[ModelRequest] = []

    def model(req: ModelRequest) -> ModelReply:
        seen.append(req)
        return replies[len(seen) - 1]

    return model, seen


@pytest.mark.parametrize(
    ("replies", "max_turns", "ok", "result", "message", "turns"),
    [
        ([ModelReply("HOLDS")], 3, True, "HOLDS", "", 1),
        ([ModelReply("", (READ,)), ModelReply("done")], 3, True, "done", "", 2),
        ([ModelReply("", (READ,))] * 3, 3, False, "", "max_turns (3) reached", 3),
        ([ModelReply("thinking", (READ,)), ModelReply(error="provider down")], 3, False, "thinking", "provider down", 2),
        ([ModelReply(error="max_turns (1) reached")], 1, False, "", "max_turns (1)", 1),
    ],
)
def test_outcomes(replies: list[ModelReply], max_turns: int, ok: bool, result: str, message: str, turns: int) -> None:
    model, _ = scripted(replies)
    fin = drive(agent_loop(max_turns), model, lambda c: ToolResult("x"))
    assert (fin.ok, fin.result, fin.turns) == (ok, result, turns)
    assert message in fin.message


def test_requests_carry_the_results_of_the_previous_calls_in_order() -> None:
    """The host keeps the conversation: each request carries only the tool results."""
    two = (ToolCall("c1", "read_file", '{"path": "a"}'), ToolCall("c2", "list_dir", "{}"))
    model, seen = scripted([ModelReply("look", two), ModelReply("ok")])
    executed: list[str] = []

    def tool(call: ToolCall) -> ToolResult:
        executed.append(call.id)
        return ToolResult(f"result of {call.id}", is_error=call.id == "c2")

    fin = drive(agent_loop(5), model, tool)
    assert fin == Finished(True, "ok", "", 2, 2)
    assert executed == ["c1", "c2"]
    first, second = seen
    assert first.results == ()
    assert list(second.results) == [
        {"id": "c1", "name": "read_file", "content": "result of c1", "is_error": False},
        {"id": "c2", "name": "list_dir", "content": "result of c2", "is_error": True},
    ]


def test_wrong_answer_type_is_misuse() -> None:
    loop = agent_loop(2)
    next(loop)
    with pytest.raises(TypeError):
        loop.send(ToolResult("not a reply"))
