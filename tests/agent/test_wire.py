"""Provider translation, both ways, for chat completions, the Responses API and Anthropic
messages; what each model is sent; stop reasons; usage; endpoints; error messages;
the retry schedule. Pure functions, exact expectations."""

from __future__ import annotations

import json
import time
from email.utils import formatdate
from typing import Any

import pytest

from stockade.agent import endpoints, provider_errors, transport, wire
from stockade.agent.conversation import body_delta, missing_outputs, verdict

CONVO: list[dict[str, Any]] = [
    {"role": "system", "text": "rules"},
    {"role": "user", "text": "fix billing/utils.py"},
    {"role": "assistant", "text": "  \n", "tool_calls": [{"id": "c1", "name": "read_file", "arguments": '{"path": "a"'}]},
    {"role": "tool", "results": [{"id": "c1", "name": "read_file", "content": "x", "is_error": True}]},
]


def build(provider: str, model: str, s: wire.Settings | None = None, omit: frozenset[str] = frozenset(),
          messages: list[dict[str, Any]] = CONVO) -> wire.Built:
    return wire.build_request(provider, model, messages, ["read_file"], s, omit)


def test_chat_body_rebuilds_turns_with_valid_json_arguments_and_no_blank_text() -> None:
    body = build("openai", "gpt-4.1").body
    assert body["messages"] == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "fix billing/utils.py"},
        # whitespace-only text is not replayed; malformed arguments are replayed as valid JSON
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x"},
    ]
    assert body["tools"][0]["function"]["strict"] is True
    assert body["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("model", "expected", "notes"),
    [
        ("gpt-4.1-mini", {"parallel_tool_calls": False, "max_tokens": 512, "temperature": 0.2,
                          "reasoning_effort": "low", "tool_choice": "required"}, 0),
        ("o3-mini", {"max_completion_tokens": 512, "reasoning_effort": "low", "tool_choice": "required"}, 2),
        ("openai/o1", {"max_completion_tokens": 512, "reasoning_effort": "low", "tool_choice": "required"}, 2),
        ("gpt-5", {"parallel_tool_calls": False, "max_completion_tokens": 512, "reasoning_effort": "low",
                   "tool_choice": "required"}, 1),
    ],
)
def test_chat_params_per_model(model: str, expected: dict[str, Any], notes: int) -> None:
    s = wire.Settings(max_tokens=512, temperature=0.2, reasoning_effort="low", tool_choice="required")
    built = build("openai", model, s)
    sent = {k: v for k, v in built.body.items() if k not in ("model", "messages", "tools")}
    assert sent == expected
    assert len(built.notes) == notes


def test_chat_fallbacks_leave_out_or_rename_what_a_server_rejected() -> None:
    s = wire.Settings(max_tokens=100, temperature=0.5)
    body = build("openai", "gpt-4.1", s, frozenset({"parallel_tool_calls", "max_tokens", "strict",
                                                    "temperature"})).body
    assert "parallel_tool_calls" not in body and "temperature" not in body
    assert body["max_completion_tokens"] == 100 and "max_tokens" not in body
    assert "strict" not in body["tools"][0]["function"]
    assert build("openai", "o3", s, frozenset({"max_completion_tokens"})).body["max_tokens"] == 100


@pytest.mark.parametrize(
    ("model", "strict"),
    [("claude-sonnet-4-5", True), ("claude-haiku-4-5-20251001", True), ("claude-opus-4-6", True),
     ("claude-opus-5", True), ("claude-sonnet-4-20250514", False), ("claude-opus-4-1-20250805", False),
     ("claude-3-5-sonnet-20241022", False), ("claude-3-7-sonnet-latest", False), ("my-proxy-model", False)],
)
def test_anthropic_strict_only_where_the_model_takes_it(model: str, strict: bool) -> None:
    built = build("anthropic", model)
    assert ("strict" in built.body["tools"][0]) is strict
    assert bool(built.notes) is not strict
    assert "anthropic-beta" not in endpoints.headers("anthropic", "k")


def test_anthropic_body() -> None:
    s = wire.Settings(thinking={"type": "enabled", "budget_tokens": 10000}, reasoning_effort="high",
                      tool_choice="required")
    body = build("anthropic", "claude-sonnet-4-5", s).body
    assert body["system"] == "rules"
    assert body["max_tokens"] == 14096  # above the thinking budget
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 10000}
    assert body["output_config"] == {"effort": "high"}
    assert body["tool_choice"] == {"type": "any"}
    assert body["messages"] == [
        {"role": "user", "content": "fix billing/utils.py"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "read_file", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "x", "is_error": True}]},
    ]
    assert build("anthropic", "claude-x", wire.Settings(max_tokens=300)).body["max_tokens"] == 300
    assert build("anthropic", "claude-x").body["max_tokens"] == 8192


def test_anthropic_replays_its_own_content_thinking_included() -> None:
    reply = wire.parse_response("anthropic", {
        "type": "message", "stop_reason": "tool_use",
        "content": [
            {"type": "thinking", "thinking": "let me look", "signature": "SIG"},
            {"type": "redacted_thinking", "data": "OPAQUE"},
            {"type": "text", "text": "\n\n", "citations": None},
            {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a"}},
        ],
        "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 90,
                  "cache_creation_input_tokens": 3},
    })
    assert reply.native == [
        {"type": "thinking", "thinking": "let me look", "signature": "SIG"},
        {"type": "redacted_thinking", "data": "OPAQUE"},
        {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a"}},
    ]
    assert reply.usage == wire.Usage(input_tokens=103, output_tokens=5, cached_tokens=90)
    msgs = [*CONVO[:2], {"role": "assistant", "text": reply.text, "tool_calls": list(reply.tool_calls),
                         "native": reply.native}]
    assert build("anthropic", "claude-sonnet-4-5", messages=msgs).body["messages"][1]["content"] == reply.native


def test_responses_body_and_replay() -> None:
    s = wire.Settings(max_tokens=64, temperature=0.3, reasoning_effort="medium", tool_choice="auto")
    body = build("openai-responses", "gpt-4.1", s).body
    assert body["instructions"] == "rules"
    assert body["input"] == [
        {"role": "user", "content": "fix billing/utils.py"},
        {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "x"},
    ]
    assert body["tools"] == [{"type": "function", "name": "read_file", "description": body["tools"][0]["description"],
                              "parameters": body["tools"][0]["parameters"], "strict": True}]
    assert (body["max_output_tokens"], body["temperature"], body["reasoning"], body["tool_choice"]) == \
        (64, 0.3, {"effort": "medium"}, "auto")
    o = build("openai-responses", "o4-mini", s).body
    assert "temperature" not in o and "parallel_tool_calls" not in o
    reply = wire.parse_response("openai-responses", {
        "status": "completed",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}],
             "encrypted_content": None},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read_file",
             "arguments": '{"path": "a"} trailing', "status": "completed"},
        ],
        "usage": {"input_tokens": 9, "output_tokens": 4, "input_tokens_details": {"cached_tokens": 2},
                  "output_tokens_details": {"reasoning_tokens": 3}},
    })
    assert reply.stop == wire.TOOL_USE and reply.tool_calls[0]["arguments"] == '{"path": "a"} trailing'
    assert reply.native == [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]},
        {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}", "id": "fc_1"},
    ]
    assert reply.usage == wire.Usage(9, 4, 2, 3)


@pytest.mark.parametrize(
    ("provider", "body", "stop"),
    [
        ("openai", {"choices": [{"message": {"content": "x"}, "finish_reason": "length"}]}, wire.LENGTH),
        ("openai", {"choices": [{"message": {"content": None, "refusal": "no"}, "finish_reason": "stop"}]}, wire.REFUSAL),
        ("openai", {"choices": [{"message": {"content": ""}, "finish_reason": "content_filter"}]}, wire.CONTENT_FILTER),
        ("openai", {"choices": [{"message": {"content": "a", "tool_calls": [
            {"id": "1", "function": {"name": "read_file", "arguments": "{}"}}]}, "finish_reason": "stop"}]}, wire.TOOL_USE),
        ("anthropic", {"content": [], "stop_reason": "max_tokens"}, wire.LENGTH),
        ("anthropic", {"content": [{"type": "text", "text": "I can't"}], "stop_reason": "refusal"}, wire.REFUSAL),
        ("anthropic", {"content": [], "stop_reason": "model_context_window_exceeded"}, wire.CONTEXT_WINDOW),
        ("anthropic", {"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}, wire.END),
        ("openai-responses", {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
                              "output": []}, wire.LENGTH),
        ("openai-responses", {"status": "incomplete", "incomplete_details": {"reason": "content_filter"},
                              "output": []}, wire.CONTENT_FILTER),
        ("openai-responses", {"status": "completed", "output": [{"type": "message", "content": [
            {"type": "refusal", "refusal": "no"}]}]}, wire.REFUSAL),
    ],
)
def test_stop_reasons_are_normalised(provider: str, body: dict[str, Any], stop: str) -> None:
    assert wire.parse_response(provider, body).stop == stop


@pytest.mark.parametrize(
    ("stop", "calls", "text", "needle"),
    [
        (wire.LENGTH, 1, "", "a tool call was cut off"),
        (wire.LENGTH, 0, "half a rep", "output limit"),
        (wire.REFUSAL, 0, "I won't", "refused"),
        (wire.CONTENT_FILTER, 0, "", "content filter"),
        (wire.CONTEXT_WINDOW, 0, "", "context window"),
        (wire.END, 0, "  ", "empty reply"),
        (wire.END, 0, "done", None),
        (wire.TOOL_USE, 1, "", None),
    ],
)
def test_verdict(stop: str, calls: int, text: str, needle: str | None) -> None:
    tc = tuple({"id": "1", "name": "create_file", "arguments": '{"path": "out/a'} for _ in range(calls))
    why = verdict(wire.Reply(text, tc, wire.Usage(), stop, "raw"), 4096)
    assert (why is None) if needle is None else (why is not None and needle in why)


def test_usage_of_chat_completions() -> None:
    r = wire.parse_response("openai", {
        "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4},
                  "completion_tokens_details": {"reasoning_tokens": 2}}})
    assert r.usage.as_dict() == {"input_tokens": 7, "output_tokens": 3, "cached_tokens": 4, "reasoning_tokens": 2}


def test_no_choice_at_all_is_an_empty_reply() -> None:
    reply = wire.parse_response("openai", {"choices": [], "usage": {"prompt_tokens": 5}})
    assert reply.usage.input_tokens == 5
    assert "empty reply (stop reason no choices)" in (verdict(reply, None) or "")


@pytest.mark.parametrize(("provider", "body"), [("openai", {"choices": None}), ("openai", {}), ("anthropic", {}),
                                                ("openai-responses", {"output": 3}), ("openai", [])])
def test_parse_rejects_garbage(provider: str, body: Any) -> None:
    with pytest.raises(wire.WireError):
        wire.parse_response(provider, body)


@pytest.mark.parametrize(
    ("provider", "base", "model", "url"),
    [
        ("openai", "https://api.openai.com/v1", "m", "https://api.openai.com/v1/chat/completions"),
        ("openai", "http://127.0.0.1:8000/v1/", "m", "http://127.0.0.1:8000/v1/chat/completions"),
        ("openai-responses", "https://api.openai.com/v1", "m", "https://api.openai.com/v1/responses"),
        ("anthropic", "https://api.anthropic.com", "m", "https://api.anthropic.com/v1/messages"),
        ("anthropic", "http://h:1/v1", "m", "http://h:1/v1/messages"),
        ("azure", "https://r.openai.azure.com/", "gpt 4o", "https://r.openai.azure.com/openai/deployments/"
                                                          "gpt%204o/chat/completions?api-version=2024-10-21"),
        ("azure", "https://r.openai.azure.com/openai", "d", "https://r.openai.azure.com/openai/deployments/"
                                                           "d/chat/completions?api-version=2024-10-21"),
    ],
)
def test_urls(provider: str, base: str, model: str, url: str) -> None:
    assert endpoints.url_for(provider, base, model) == url


def test_a_steps_own_base_url_never_gets_the_providers_key() -> None:
    env = {"OPENAI_API_KEY": "sk-default-123456", "TEAM": "sk-team-123456", "OPENAI_API_VERSION": "2025-01-01"}
    own = endpoints.resolve("openai", "m", endpoints.StepEndpoint("http://h:1/v1"), env)
    assert own == endpoints.Target("http://h:1/v1/chat/completions", None, "", "http://h:1/v1/chat/completions")
    team = endpoints.resolve("openai", "m", endpoints.StepEndpoint("http://h:1/v1", "TEAM"), env)
    assert team.key == "sk-team-123456" and team.key_var == "TEAM"
    default = endpoints.resolve("openai", "m", None, env)
    assert default.key == "sk-default-123456" and default.url.startswith("https://api.openai.com/v1")
    az = endpoints.resolve("azure", "dep", endpoints.StepEndpoint("https://r.x", "TEAM"), env)
    assert az.url.endswith("?api-version=2025-01-01")
    assert endpoints.headers("azure", "k") == {"content-type": "application/json", "api-key": "k"}


@pytest.mark.parametrize(
    ("provider", "step", "env", "fields"),
    [
        ("openai", None, {}, ["model"]),
        ("openai", None, {"OPENAI_BASE_URL": "http://h/v1"}, []),
        ("openai", endpoints.StepEndpoint("http://h/v1"), {}, []),
        ("openai", endpoints.StepEndpoint(api_key_env="TEAM"), {}, ["api_key_env"]),
        ("azure", None, {"AZURE_OPENAI_API_KEY": "k"}, ["model"]),
        ("azure", endpoints.StepEndpoint("https://r", "K"), {"K": "v"}, []),
        ("anthropic", None, {"ANTHROPIC_API_KEY": "k"}, []),
    ],
)
def test_credential_problems(provider: str, step: endpoints.StepEndpoint | None, env: dict[str, str],
                             fields: list[str]) -> None:
    assert [f for f, _m in endpoints.problems(provider, step, env)] == fields


def test_error_messages_show_message_type_code_and_a_hint() -> None:
    body = {"error": {"message": "The model `gpt-9` does not exist", "type": "invalid_request_error",
                      "code": "model_not_found", "param": None}}
    text = provider_errors.describe(404, body, url="http://127.0.0.1:8000/chat/completions", provider="openai")
    assert text.startswith("the model provider answered HTTP 404 (invalid_request_error, code model_not_found): "
                           "The model `gpt-9` does not exist")
    assert "lacks /v1" in text
    vllm = {"object": "error", "message": '"auto" tool choice requires --enable-auto-tool-choice and '
                                          "--tool-call-parser to be set", "type": "BadRequestError", "code": 400}
    assert "--tool-call-parser <parser" in provider_errors.describe(400, vllm, url="u/v1/x", provider="openai")
    assert "--jinja" in provider_errors.describe(500, {"error": {"message": "tools param requires --jinja flag"}},
                                                 url="u", provider="openai")
    assert "num_ctx" in provider_errors.describe(400, {"error": {"message": "context length exceeded",
                                                                 "code": "context_length_exceeded"}},
                                                 url="u", provider="openai")
    assert "did not accept the key in OPENAI_API_KEY" in provider_errors.describe(
        401, {"error": {"message": "bad key"}}, url="u", provider="openai", key_var="OPENAI_API_KEY")
    long = provider_errors.describe(400, {"error": {"message": "x" * 5000}}, url="u", provider="openai")
    assert len(long) < 1000 and "{" not in long


@pytest.mark.parametrize(
    ("provider", "body", "error"),
    [
        ("openai", {"error": {"message": "upstream failed", "type": "server_error"}}, True),
        ("openai", {"choices": [], "error": None}, False),
        ("anthropic", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}, True),
        ("openai-responses", {"status": "failed", "error": {"code": "server_error", "message": "x"}, "output": []}, True),
        ("openai", {"detail": "Not authenticated"}, True),
    ],
)
def test_errors_inside_an_http_200(provider: str, body: dict[str, Any], error: bool) -> None:
    assert (provider_errors.error_in_ok_body(provider, body) is not None) is error


@pytest.mark.parametrize(
    ("body", "candidates", "field"),
    [
        ({"error": {"message": "Unsupported parameter: 'parallel_tool_calls' is not supported with this model.",
                    "param": "parallel_tool_calls"}}, ("parallel_tool_calls", "temperature"), "parallel_tool_calls"),
        ({"error": {"message": "litellm.BadRequestError: parallel_tool_calls is not supported"}},
         ("parallel_tool_calls",), "parallel_tool_calls"),
        ({"error": {"message": "Use 'max_completion_tokens' instead of max_tokens."}},
         ("max_completion_tokens", "max_tokens"), "max_completion_tokens"),
        ({"type": "error", "error": {"type": "invalid_request_error",
                                     "message": "tools.0.custom.strict: Extra inputs are not permitted"}},
         ("strict",), "strict"),
        ({"error": {"message": "messages: roles must alternate"}}, ("strict", "temperature"), None),
    ],
)
def test_rejected_field(body: dict[str, Any], candidates: tuple[str, ...], field: str | None) -> None:
    assert provider_errors.rejected_field(400, body, candidates) == field
    assert provider_errors.rejected_field(500, body, candidates) is None


def test_backoff_follows_the_sdks() -> None:
    assert [transport.backoff(n, 0.0) for n in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert transport.backoff(0, 0.999) == pytest.approx(0.375, abs=0.001)


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"Retry-After": "1.5"}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "61"}, None),
        ({"retry-after": "0"}, None),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after(headers: dict[str, str], wait: float | None) -> None:
    assert transport.retry_after(headers) == wait


def test_retry_after_http_date() -> None:
    now = time.time()
    got = transport.retry_after({"retry-after": formatdate(now + 30, usegmt=True)}, now=now)
    assert got is not None and 28 <= got <= 31


@pytest.mark.parametrize(
    ("status", "headers", "retry"),
    [(429, {}, True), (529, {}, True), (503, {}, True), (500, {}, True), (408, {}, True), (400, {}, False),
     (401, {}, False), (404, {}, False), (422, {}, False), (400, {"x-should-retry": "true"}, True),
     (503, {"x-should-retry": "false"}, False)],
)
def test_should_retry(status: int, headers: dict[str, str], retry: bool) -> None:
    assert transport.should_retry(status, headers) is retry


def test_body_delta_keeps_only_what_is_new() -> None:
    first = {"model": "m", "tools": [1], "messages": [1, 2]}
    second = {"model": "m", "tools": [1], "messages": [1, 2, 3, 4]}
    assert body_delta(None, first, "messages") == first
    assert body_delta(first, second, "messages") == {"messages_from": 2, "messages": [3, 4]}
    third = {"model": "m", "messages": [1, 2, 3, 4]}
    assert body_delta(second, third, "messages") == {"messages_from": 4, "messages": [], "removed": ["tools"]}


def test_missing_outputs() -> None:
    assert missing_outputs(["report.md", "*.csv"], ["out/report.md", "notes.md"]) == ["*.csv"]
    assert missing_outputs(["report.md"], []) == ["report.md"]


@pytest.mark.parametrize(("spec", "ok"), [("openai/gpt-4.1-mini", True), ("anthropic/claude-x", True),
                                          ("openai-responses/o3", True), ("azure/dep", True),
                                          ("ollama/x", False), ("gpt", False)])
def test_split_model(spec: str, ok: bool) -> None:
    if ok:
        assert wire.split_model(spec)[1] == spec.split("/", 1)[1]
    else:
        with pytest.raises(ValueError):
            wire.split_model(spec)


def test_arguments_repair() -> None:
    assert wire.arguments_json('{"a": 1}') == '{"a": 1}'
    for bad in ('{"a": ', "[1]", '"s"', "", None, 3):
        assert json.loads(wire.arguments_json(bad)) == {}
