"""Every request body the broker builds conforms to the official API definitions.

The definitions are the request types of the official ``openai`` and
``anthropic`` Python SDKs (installed as test dependencies; no network),
checked strictly by ``tests/sdkschema.py``: unknown fields, missing required
fields and wrong types are all errors. The bodies come from the broker's own
builders over conversations that hold everything a run produces (tool calls
and results, replayed provider content with thinking blocks and reasoning
items, malformed tool arguments, the outputs reminder, every ``params``
setting, fallbacks), and from a real broker talking to the scripted server
(which validates each request it gets the same way).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from modelserver import Call, ModelServer, Turn, say
from sdkschema import validate_request

from stockade.agent import wire
from stockade.agent.broker import Broker, BrokerConfig, Recorder
from stockade.agent.conversation import Conversation, reminder
from stockade.agent.gate import snapshot

pytest.importorskip("openai", reason="the openai SDK is a test dependency (pip install -e '.[test]')")
pytest.importorskip("anthropic", reason="the anthropic SDK is a test dependency (pip install -e '.[test]')")

RAW_REPLIES: dict[str, dict[str, Any]] = {
    "openai": {"choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", "content": "  ", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a", "off'}},
        {"id": "call_2", "type": "function", "function": {"name": "create_file",
                                                          "arguments": '{"path": "out/r.md", "content": "x"}'}}]}}]},
    "openai-responses": {"status": "completed", "output": [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}],
         "encrypted_content": "gAAAA"},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Reading.", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file",
         "arguments": "not json", "status": "completed"},
        {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "create_file",
         "arguments": '{"path": "out/r.md", "content": "x"}', "status": "completed"}]},
    "anthropic": {"type": "message", "stop_reason": "tool_use", "content": [
        {"type": "thinking", "thinking": "plan", "signature": "SIG"},
        {"type": "redacted_thinking", "data": "OPAQUE"},
        {"type": "text", "text": "\n", "citations": None},
        {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "a"}},
        {"type": "tool_use", "id": "call_2", "name": "create_file", "input": {"path": "out/r.md", "content": "x"}}]},
}
RAW_REPLIES["azure"] = RAW_REPLIES["openai"]

SETTINGS = [
    wire.Settings(),
    wire.Settings(max_tokens=2048, temperature=0.7, reasoning_effort="high", tool_choice="required"),
    wire.Settings(max_tokens=20000, reasoning_effort="max", tool_choice="auto",
                  thinking={"type": "enabled", "budget_tokens": 4096}),
    wire.Settings(thinking={"type": "adaptive"}, tool_choice="none"),
]
MODELS = {"openai": ["gpt-4.1-mini", "o3", "gpt-5"], "azure": ["my-deployment"],
          "openai-responses": ["gpt-4.1", "o4-mini"], "anthropic": ["claude-sonnet-4-5", "claude-3-5-haiku-latest"]}
OMITS = [frozenset(), frozenset({"parallel_tool_calls", "strict", "max_tokens", "temperature", "reasoning",
                                 "reasoning_effort", "output_config"})]


def conversation(provider: str) -> list[dict[str, Any]]:
    """A conversation as a run builds it: a tool turn, its results, a text turn, the reminder."""
    c = Conversation("Summarise data.csv into out/report.md.", ["out/**"], ["report.md"])
    c.add_reply(wire.parse_response(provider, RAW_REPLIES[provider]))
    assert c.add_results([{"id": "call_1", "name": "read_file", "content": "error: bad JSON", "is_error": True},
                          {"id": "call_2", "name": "create_file", "content": "created out/r.md", "is_error": False}]) is None
    c.add_reply(wire.Reply("Here it is.", (), wire.Usage(), wire.END, native=None))
    c.add_user(reminder(["report.md"], ["create_file"]))
    return c.messages


CASES = [(p, m, s, o) for p, models in MODELS.items() for m, s, o in itertools.product(models, SETTINGS, OMITS)
         if not (s.thinking and p != "anthropic") and not (s.temperature is not None and p == "anthropic")
         and not (p == "anthropic" and s.thinking and s.tool_choice == "required")]


@pytest.mark.parametrize(("provider", "model", "settings", "omit"), CASES)
def test_built_bodies_conform(provider: str, model: str, settings: wire.Settings, omit: frozenset[str]) -> None:
    body = wire.build_request(provider, model, conversation(provider), ["read_file", "list_dir", "create_file",
                                                                         "apply_patch"], settings, omit).body
    assert validate_request(provider, body) == []


@pytest.mark.parametrize(
    ("provider", "body", "problem"),
    [
        ("openai", {"model": "m", "messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": "no"},
         "expected true/false"),
        ("openai", {"model": "m", "messages": [{"role": "assistant", "content": "x", "thinking": "t"}]},
         "unknown field 'thinking'"),
        ("openai", {"model": "m", "messages": [], "max_tokens": 1.5}, "expected an integer"),
        ("anthropic", {"model": "m", "messages": []}, "missing required field 'max_tokens'"),
        ("anthropic", {"model": "m", "max_tokens": 5, "messages": [], "temperature": 0.5}, "unknown field 'temperature'"),
        ("anthropic", {"model": "m", "max_tokens": 5, "messages": [
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}]}, "body.messages[0].content"),
        ("anthropic", {"model": "m", "max_tokens": 5, "messages": [], "tools": [
            {"name": "x", "input_schema": {"type": "object"}, "strict": "yes"}]}, "body.tools[0]"),
        ("openai-responses", {"model": "m", "input": [{"type": "function_call", "name": "f"}]}, "body.input"),
        ("openai-responses", {"model": "m", "input": [], "reasoning_effort": "low"}, "unknown field 'reasoning_effort'"),
    ],
)
def test_the_validator_rejects_what_the_api_rejects(provider: str, body: dict[str, Any], problem: str) -> None:
    """Negative controls: the check above could fail."""
    errors = validate_request(provider, body)
    assert any(problem in e for e in errors), errors


@pytest.mark.parametrize("provider", ["openai", "openai-responses", "azure", "anthropic"])
def test_a_live_broker_sends_only_conforming_bodies(tmp_path: Path, provider: str) -> None:
    """Through the broker, with retries, a fallback and the reminder: the server validates every request."""
    script = [
        Turn(status=503),
        Turn(thinking=("t",), calls=(Call("read_file", '{"path": "data.txt"'),
                                     Call("create_file", {"path": "out/x.md", "content": "x"}))),
        say("The report: ..."),
        Turn(thinking=("t2",), calls=(Call("create_file", {"path": "out/report.md", "content": "r"}),)),
        say("done"),
    ]
    n = iter(range(100))

    def answer(seen: object, turn: int) -> Turn:
        return script[next(n)]

    work, meta = tmp_path / "work", tmp_path / "meta"
    (work / "out").mkdir(parents=True)
    meta.mkdir()
    model = {"anthropic": "claude-sonnet-4-5", "azure": "dep"}.get(provider, "gpt-4.1")
    with ModelServer(answer, validate=True, rejects=frozenset({"parallel_tool_calls"})) as srv:
        cfg = BrokerConfig(provider=provider, model=model, prompt="write out/report.md",
                           tools=("read_file", "create_file"), writes=("out/**",), max_turns=10, approve="auto",
                           interactive=False, timeout=None, work_dir=work, outputs=("report.md",),
                           settings=wire.Settings(max_tokens=9000, thinking={"type": "enabled", "budget_tokens": 2048})
                           if provider == "anthropic" else wire.Settings(max_tokens=500, temperature=0.1))
        b = Broker(cfg, host_env=srv.env(provider), recorder=Recorder(meta, [srv.key]), snapshot=snapshot(work),
                   echo=lambda s: None, ask=lambda p: True, sleep=lambda s: None)
        first = b.handle("/model", {})
        assert first["ok"], first
        ids = [c["id"] for c in first["tool_calls"]]
        second = b.handle("/model", {"results": [{"id": i, "name": "x", "content": "r", "is_error": False} for i in ids]})
        assert second["ok"] and second["tool_calls"], second  # the reminder turn worked
        last = b.handle("/model", {"results": [{"id": second["tool_calls"][0]["id"], "name": "create_file",
                                                "content": "ok", "is_error": False}]})
    # out/report.md was never really written here and the reminder is spent: the item fails
    assert last["ok"] is False and "never wrote the declared outputs out/report.md" in last["error"]
    assert srv.errors == [], srv.errors
    assert len(srv.seen) >= 5
