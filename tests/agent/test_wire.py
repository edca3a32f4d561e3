"""Provider translation, both ways, for OpenAI chat completions and Anthropic messages."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stockade.agent import wire

CONVO: list[dict[str, Any]] = [
    {"role": "system", "text": "rules"},
    {"role": "user", "text": "fix billing/utils.py"},
    {"role": "assistant", "text": "", "tool_calls": [{"id": "c1", "name": "read_file", "arguments": '{"path": "a"}'}]},
    {"role": "tool", "results": [{"id": "c1", "name": "read_file", "content": "x", "is_error": True}]},
]


def test_to_openai() -> None:
    body = wire.to_openai("gpt", CONVO, ["read_file"])
    assert body["model"] == "gpt"
    assert body["messages"] == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "fix billing/utils.py"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "x"},
    ]
    assert body["tools"][0]["function"]["strict"] is True
    assert body["parallel_tool_calls"] is False


def test_to_anthropic() -> None:
    body = wire.to_anthropic("claude", CONVO, ["read_file"])
    assert body["system"] == "rules"
    assert body["max_tokens"] > 0
    assert body["messages"] == [
        {"role": "user", "content": "fix billing/utils.py"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "read_file", "input": {"path": "a"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "x", "is_error": True}]},
    ]
    assert body["tools"][0]["input_schema"]["additionalProperties"] is False


@pytest.mark.parametrize(
    ("provider", "body", "text", "calls", "usage"),
    [
        (
            "openai",
            {
                "choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "apply_patch", "arguments": '{"diff": "x"}'}}]},
                    "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3},
            },
            "",
            [{"id": "call_1", "name": "apply_patch", "arguments": '{"diff": "x"}'}],
            (7, 3),
        ),
        ("openai", {"choices": [{"message": {"content": "done"}, "finish_reason": "stop"}]}, "done", [], (None, None)),
        (
            "anthropic",
            {
                "type": "message",
                "content": [{"type": "text", "text": "ok "}, {"type": "tool_use", "id": "t1", "name": "list_dir", "input": {"path": ".."}}],
                "stop_reason": "tool_use",
                "usage": {"input_tokens": 9, "output_tokens": 4},
            },
            "ok ",
            [{"id": "t1", "name": "list_dir", "arguments": json.dumps({"path": ".."})}],
            (9, 4),
        ),
    ],
)
def test_parse(provider: str, body: dict[str, Any], text: str, calls: list[dict[str, str]], usage: tuple[int | None, int | None]) -> None:
    r = wire.parse_response(provider, body)
    assert r.text == text
    assert list(r.tool_calls) == calls
    assert (r.input_tokens, r.output_tokens) == usage


@pytest.mark.parametrize(("provider", "body"), [("openai", {"choices": []}), ("openai", {}), ("anthropic", {"type": "error", "error": {}}), ("anthropic", {})])
def test_parse_rejects_garbage(provider: str, body: dict[str, Any]) -> None:
    with pytest.raises(wire.WireError):
        wire.parse_response(provider, body)


@pytest.mark.parametrize(
    ("provider", "base", "url"),
    [
        ("openai", None, "https://api.openai.com/v1/chat/completions"),
        ("openai", "http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1/chat/completions"),
        ("anthropic", None, "https://api.anthropic.com/v1/messages"),
        ("anthropic", "http://h:1/v1", "http://h:1/v1/messages"),
    ],
)
def test_endpoint(provider: str, base: str | None, url: str) -> None:
    assert wire.endpoint(provider, base) == url


@pytest.mark.parametrize(("spec", "ok"), [("openai/gpt-4.1-mini", True), ("anthropic/claude-x", True), ("ollama/x", False), ("gpt", False)])
def test_split_model(spec: str, ok: bool) -> None:
    if ok:
        assert wire.split_model(spec)[1] == spec.split("/", 1)[1]
    else:
        with pytest.raises(ValueError):
            wire.split_model(spec)
