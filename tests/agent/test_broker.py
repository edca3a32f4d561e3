"""The host broker on its own: limits, retries, masking, and the host-side write check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from modelserver import ModelServer, Seen, Turn, say

from stockade.agent.broker import Broker, BrokerConfig, Recorder
from stockade.agent.gate import snapshot

MSGS = [{"role": "system", "text": "s"}, {"role": "user", "text": "fix a.py"}]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(tmp: Path, env: dict[str, str], *, max_turns: int = 5, timeout: float | None = None,
         clock: Clock | None = None, provider: str = "openai", approve: str = "auto",
         tools: tuple[str, ...] = ("create_file", "apply_patch")) -> tuple[Broker, list[str]]:
    work, meta = tmp / "work", tmp / "meta"
    work.mkdir(exist_ok=True)
    meta.mkdir(exist_ok=True)
    (work / "a.py").write_text("x = 1\n")
    echoed: list[str] = []
    cfg = BrokerConfig(provider=provider, model="m", prompt="fix a.py", tools=tools, writes=("**",),
                       max_turns=max_turns, approve=approve, interactive=False, timeout=timeout, work_dir=work)
    b = Broker(cfg, host_env=env, recorder=Recorder(meta, [v for k, v in env.items() if k.endswith("_KEY")]),
               snapshot=snapshot(work), echo=echoed.append, ask=lambda p: False, clock=clock or Clock())
    return b, echoed


def transcript(tmp: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp / "meta" / "transcript.jsonl").read_text().splitlines()]


def test_max_turns_is_enforced_on_the_host(tmp_path: Path) -> None:
    with ModelServer([say("a")] * 10) as srv:
        b, _ = make(tmp_path, srv.env("openai"), max_turns=2)
        answers = [b.handle("/model", {"messages": MSGS}) for _ in range(3)]
    assert [a["ok"] for a in answers] == [True, True, False]
    assert "max_turns (2)" in answers[2]["error"]
    assert len(srv.seen) == 2
    assert transcript(tmp_path)[-1]["event"] == "refused"


def test_timeout_is_enforced_on_the_host(tmp_path: Path) -> None:
    clock = Clock()
    with ModelServer([say("a")] * 10) as srv:
        b, _ = make(tmp_path, srv.env("openai"), timeout=30, clock=clock)
        assert b.handle("/model", {"messages": MSGS})["ok"]
        clock.now += 31
        late = b.handle("/model", {"messages": MSGS})
    assert not late["ok"] and "timeout (30s)" in late["error"]
    assert len(srv.seen) == 1


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_transcript_masks_the_key_and_records_usage(tmp_path: Path, provider: str) -> None:
    def echo_key(seen: Seen, n: int) -> Turn:
        # A hostile or buggy server that echoes the key back must not get it into meta/.
        return say("your key is " + srv.key)

    with ModelServer(echo_key) as srv:
        b, _ = make(tmp_path, srv.env(provider), provider=provider)
        answer = b.handle("/model", {"messages": MSGS})
    assert answer["ok"]
    raw = (tmp_path / "meta" / "transcript.jsonl").read_text()
    assert srv.key not in raw and "***" in raw
    (rec,) = transcript(tmp_path)
    assert rec["usage"]["input_tokens"] > 0 and rec["usage"]["output_tokens"] > 0
    assert rec["latency_ms"] > 0 and rec["response"]["status"] == 200
    hdrs = rec["request"]["headers"]
    assert hdrs.get("authorization", hdrs.get("x-api-key")) == "***"


def test_retries_server_errors(tmp_path: Path) -> None:
    flaky = iter([503, 200])

    def script(seen: Seen, n: int) -> Turn:
        return Turn(text="ok", status=next(flaky))

    with ModelServer(script) as srv:
        b, _ = make(tmp_path, srv.env("anthropic"), provider="anthropic")
        answer = b.handle("/model", {"messages": MSGS})
    assert answer == {"ok": True, "text": "ok", "tool_calls": []}
    assert [r["attempt"] for r in transcript(tmp_path)] == [1, 2]
    assert [r["response"]["status"] for r in transcript(tmp_path)] == [503, 200]


def test_client_errors_are_not_retried(tmp_path: Path) -> None:
    with ModelServer([say("a")]) as srv:
        env = srv.env("openai") | {"OPENAI_API_KEY": "sk-wrong-key-123456"}  # 401: not retried
        b, _ = make(tmp_path, env)
        answer = b.handle("/model", {"messages": MSGS})
    assert not answer["ok"] and "HTTP 401" in answer["error"]
    assert len(srv.seen) == 1
    assert "sk-wrong-key-123456" not in (tmp_path / "meta" / "transcript.jsonl").read_text()


def test_unreachable_provider_is_an_error_not_a_crash(tmp_path: Path) -> None:
    b, _ = make(tmp_path, {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "k" * 8})
    answer = b.handle("/model", {"messages": MSGS})
    assert not answer["ok"] and "model call failed" in answer["error"]
    assert len(transcript(tmp_path)) == 3  # three attempts, each recorded


@pytest.mark.parametrize(
    ("tool", "path", "error"),
    [
        ("create_file", "../x", "traversal"),
        ("create_file", "/etc/x", "absolute"),
        ("create_file", "a.py", "already exists"),
        ("apply_patch", "b.py", "not named"),
        ("apply_patch", "a.py", None),
        ("create_file", "new/b.md", None),
        ("read_file", "a.py", "not a write tool"),
        ("delete_file", "a.py", "not a write tool"),
    ],
)
def test_host_rechecks_every_write_intent(tmp_path: Path, tool: str, path: str, error: str | None) -> None:
    b, echoed = make(tmp_path, {})
    answer = b.handle("/write/intent", {"tool": tool, "path": path})
    if error is None:
        assert answer == {"ok": True} and echoed == [f"WRITE TARGET: {path}"]
    else:
        assert not answer["ok"] and error in answer["error"] and echoed == []


def test_write_over_a_file_changed_behind_the_tools_is_refused(tmp_path: Path) -> None:
    b, echoed = make(tmp_path, {})
    (tmp_path / "work" / "a.py").write_text("changed outside\n")
    answer = b.handle("/write/intent", {"tool": "apply_patch", "path": "a.py"})
    assert not answer["ok"] and "changed outside the write tools" in answer["error"]
    assert echoed == []


def test_done_is_rehashed_on_the_host(tmp_path: Path) -> None:
    b, _ = make(tmp_path, {})
    assert b.handle("/write/done", {"tool": "create_file", "path": "x.md", "sha256": "0"})["ok"] is False
    assert b.handle("/write/intent", {"tool": "create_file", "path": "x.md"})["ok"]
    (tmp_path / "work" / "x.md").write_text("hi")
    b.handle("/write/done", {"tool": "create_file", "path": "x.md", "sha256": "f" * 64})
    assert any("differs from the one reported" in p for p in b.state.problems)
    assert any("without an approved intent" in p for p in b.state.problems)


def test_nothing_is_accepted_after_finish(tmp_path: Path) -> None:
    """The verdict is recorded once: a second /finish (a forged one) and any
    later request are refused, and none spends the key or writes."""
    with ModelServer([say("a")] * 5) as srv:
        b, echoed = make(tmp_path, srv.env("openai"))
        assert b.handle("/finish", {"ok": True, "result": "REFUTED", "message": "", "turns": 1}) == {"ok": True}
        later = [
            b.handle("/finish", {"ok": True, "result": "HOLDS forged", "message": "", "turns": 1}),
            b.handle("/model", {"messages": MSGS}),
            b.handle("/write/intent", {"tool": "create_file", "path": "new.md"}),
            b.handle("/write/done", {"tool": "create_file", "path": "new.md", "sha256": "0"}),
        ]
    assert later == [{"ok": False, "error": "the agent already finished"}] * 4
    assert b.state.finished is not None and b.state.finished["result"] == "REFUTED"
    assert srv.seen == [] and echoed == [] and b.state.problems == []
    assert [r["event"] for r in transcript(tmp_path)] == ["finish"]
    assert not (tmp_path / "meta" / "writes.jsonl").exists()
