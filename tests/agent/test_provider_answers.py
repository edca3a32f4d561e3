"""Odd provider answers through the real command line and a scripted loopback server:
usage counts that are not counts, replies of the wrong shape, bodies that are not
JSON, redirects and huge error bodies. Each ends in one line a person can act on,
and the transcript stays a record, not a copy of whatever the server sent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from modelserver import ModelServer, Turn
from test_providers_cli import RUN, Cli, agent_step


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


USAGES = [
    ("openai", {"prompt_tokens": 100, "completion_tokens": -5}, "usage.completion_tokens was -5",
     {"input_tokens": 100, "output_tokens": 0}),
    ("openai", {"prompt_tokens": "12", "completion_tokens": 7}, 'usage.prompt_tokens was "12"',
     {"input_tokens": 0, "output_tokens": 7}),
    ("openai", {"prompt_tokens": 10, "completion_tokens": 2,
                "completion_tokens_details": {"reasoning_tokens": -1}},
     "usage.completion_tokens_details.reasoning_tokens was -1", {"reasoning_tokens": 0}),
    ("openai-responses", {"input_tokens": 10, "output_tokens": -3}, "usage.output_tokens was -3",
     {"input_tokens": 10, "output_tokens": 0}),
    ("anthropic", {"input_tokens": -100, "output_tokens": 1.5}, "usage.input_tokens was -100",
     {"input_tokens": 0, "output_tokens": 0}),
    ("anthropic", "lots", 'usage was "lots", not an object', {"input_tokens": 0}),
]


@pytest.mark.parametrize(("provider", "usage", "note", "counted"), USAGES,
                         ids=[f"{p}-{i}" for i, (p, *_rest) in enumerate(USAGES)])
def test_usage_that_is_not_a_count_counts_as_zero_with_a_note(
        cli: Cli, provider: str, usage: Any, note: str, counted: dict[str, int]) -> None:
    """Not an error: the reply is fine. But a negative count never gives tokens back to
    the budget, and no bad count passes unseen."""
    with ModelServer([Turn(text="ok", usage=usage)]) as srv:
        code, out = cli.run(agent_step(f"{provider}/m", extra="budget: {tokens: 1000}"), srv.env(provider))
    assert code == 0, cli.item()["item"]["message"]
    got = cli.item()["item"]["usage"]
    assert {k: got[k] for k in counted} == counted and all(v >= 0 for v in got.values())
    (call,) = [r for r in cli.transcript() if r["event"] == "model_call"]
    assert any(n.startswith(note) for n in call["usage_notes"]), call["usage_notes"]
    assert call["spent"] >= 0 and out["usage"] == got


def _fails(cli: Cli, provider: str, turns: list[Turn]) -> tuple[str, list[dict[str, Any]]]:
    with ModelServer(turns) as srv:
        code, _ = cli.run(agent_step(f"{provider}/m").replace("retries: 2", "retries: 0"),
                          srv.env(provider))
    assert code == 1
    message = str(cli.item()["item"]["message"])
    assert "\n" not in message and "Traceback" not in message
    return message, [r for r in cli.transcript() if r["event"] == "model_call"]


@pytest.mark.parametrize(("body", "says"), [
    ({"choices": [None]}, "not an OpenAI chat completion: choices[0] is missing or null, not an object"),
    ({"choices": [{"message": "hi"}]}, "choices[0].message is a string, not an object"),
    ({"choices": [{"message": {"tool_calls": [{"function": {}}]}}]},
     "choices[0].message.tool_calls[0].function is an object, not an object with a name"),
    ({"object": "chat.completion"}, "choices is missing or null, not a list"),
])
def test_a_reply_of_the_wrong_shape_says_which_part(cli: Cli, body: dict[str, Any], says: str) -> None:
    message, _ = _fails(cli, "openai", [Turn(body=body)])
    assert says in message and "NoneType" not in message and "subscriptable" not in message, message


NOT_JSON = [
    ("text/html; charset=utf-8", b"<html><body>Sign in to continue</body></html>",
     'not JSON (text/html, ', "base URL probably leads to a web page"),
    ("text/event-stream", b'data: {"choices": []}\n\ndata: [DONE]\n\n',
     "not JSON (text/event-stream", "the server is streaming"),
    ("application/json", b'{"id": "chatcmpl-1", "choices": [{"message": {"content": "par',
     "not JSON (application/json, ", "the JSON is cut off or malformed"),
]


@pytest.mark.parametrize(("ctype", "raw", "says", "hint"), NOT_JSON, ids=["html", "stream", "cut-off"])
def test_a_200_that_is_not_json_names_its_content_type(cli: Cli, ctype: str, raw: bytes, says: str,
                                                       hint: str) -> None:
    message, records = _fails(cli, "openai", [Turn(raw=raw, headers={"content-type": ctype})] * 3)
    assert message.startswith("the model provider answered HTTP 200 with a body that is not JSON"), message
    assert says in message and hint in message and f"{len(raw)} bytes, starting " in message, message
    assert "with an error instead of a reply" not in message
    assert records[-1]["response"]["status"] == 200


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_redirect_names_its_status_and_location(cli: Cli, provider: str) -> None:
    where = "https://other.example/v1/chat/completions?token=abcdef123"
    message, records = _fails(cli, provider, [Turn(status=307, raw=b"", headers={"location": where})])
    assert "HTTP 307, a redirect to https://other.example/v1/chat/completions?token=***; " in message, message
    assert "redirects are not followed" in message and "abcdef123" not in message
    assert "answered str" not in message and "not a JSON object" not in message
    assert len(records) == 1 and records[0]["response"]["headers"]["location"].endswith("token=***")


def test_a_huge_error_body_is_kept_once_and_capped(cli: Cli) -> None:
    huge = {"error": {"message": "overloaded " + "x" * (5 << 20), "type": "server_error"}}
    size = len(json.dumps(huge).encode())
    turn = Turn(status=500, body=huge, headers={"retry-after-ms": "10"})
    message, records = _fails(cli, "openai", [turn] * 10)
    assert "HTTP 500 (server_error): overloaded xxx" in message and len(message) < 1200
    assert len(records) == 5  # four retries inside the call
    for r in records:
        body = r["response"]["body"]
        assert len(body["truncated"]) == 64 << 10
        assert f"the body had {size:,} bytes (sha256 " in body["note"]
    transcript = cli.home / "runs" / RUN / "ask" / "0" / "meta" / "1" / "transcript.jsonl"
    assert transcript.stat().st_size < 1 << 20
