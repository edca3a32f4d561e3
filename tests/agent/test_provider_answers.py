"""Odd provider answers through the real command line and a scripted loopback server:
usage counts that are not counts, replies of the wrong shape, bodies that are not
JSON, redirects and huge error bodies. Each ends in one line a person can act on,
and the transcript stays a record, not a copy of whatever the server sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from modelserver import ModelServer, Turn
from test_providers_cli import Cli, agent_step


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
