"""The host broker on its own against a real loopback model server: limits, stop
reasons, the outputs reminder, retries and their waits, fallbacks, budget, usage,
delta transcripts, masking, and the host-side write check."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from modelserver import Call, ModelServer, Seen, Turn, calls, say

from stockade.agent import guard, wire
from stockade.agent.broker import Broker, BrokerConfig, BrokerServer, Recorder
from stockade.agent.endpoints import StepEndpoint
from stockade.agent.gate import snapshot


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(tmp: Path, env: dict[str, str], *, max_turns: int = 5, timeout: float | None = None,
         clock: Clock | None = None, provider: str = "openai", approve: str = "auto",
         tools: tuple[str, ...] = ("create_file", "apply_patch"), model: str = "m",
         outputs: tuple[str, ...] = (), budget: int | None = None, request_timeout: float = 600,
         settings: wire.Settings | None = None, endpoint: StepEndpoint | None = None,
         sleeps: list[float] | None = None) -> tuple[Broker, list[str]]:
    work, meta = tmp / "work", tmp / "meta"
    work.mkdir(exist_ok=True)
    meta.mkdir(exist_ok=True)
    (work / "a.py").write_text("x = 1\n")
    (work / "out").mkdir(exist_ok=True)
    echoed: list[str] = []
    cfg = BrokerConfig(provider=provider, model=model, prompt="fix a.py", tools=tools, writes=("**",),
                       max_turns=max_turns, approve=approve, interactive=False, timeout=timeout, work_dir=work,
                       request_timeout=request_timeout, settings=settings or wire.Settings(),
                       endpoint=endpoint, budget_tokens=budget, outputs=outputs)
    b = Broker(cfg, host_env=env, recorder=Recorder(meta, [v for k, v in env.items() if k.endswith("_KEY")]),
               snapshot=snapshot(work), echo=echoed.append, ask=lambda p: False, clock=clock or Clock(),
               sleep=(sleeps.append if sleeps is not None else time.sleep))
    return b, echoed


def transcript(tmp: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp / "meta" / "transcript.jsonl").read_text().splitlines()]


def calls_of(tmp: Path) -> list[dict[str, Any]]:
    return [r for r in transcript(tmp) if r["event"] == "model_call"]


def results(*ids: str) -> dict[str, Any]:
    return {"results": [{"id": i, "name": "read_file", "content": "ok", "is_error": False} for i in ids]}


def test_max_turns_is_enforced_on_the_host(tmp_path: Path) -> None:
    with ModelServer([say("a")] * 10) as srv:
        b, _ = make(tmp_path, srv.env("openai"), max_turns=2)
        answers = [b.handle("/model", {}) for _ in range(3)]
    assert [a["ok"] for a in answers] == [True, True, False]
    assert "max_turns (2)" in answers[2]["error"]
    assert len(srv.seen) == 2
    assert transcript(tmp_path)[-1]["event"] == "refused"


def test_timeout_is_enforced_on_the_host(tmp_path: Path) -> None:
    clock = Clock()
    with ModelServer([say("a")] * 10) as srv:
        b, _ = make(tmp_path, srv.env("openai"), timeout=30, clock=clock)
        assert b.handle("/model", {})["ok"]
        clock.now += 31
        late = b.handle("/model", {})
    assert not late["ok"] and "timeout (30s)" in late["error"]
    assert len(srv.seen) == 1


@pytest.mark.parametrize("provider", ["openai", "anthropic", "openai-responses", "azure"])
def test_transcript_masks_the_key_and_records_usage_request_id_and_headers(tmp_path: Path, provider: str) -> None:
    def echo_key(seen: Seen, n: int) -> Turn:
        # A hostile or buggy server that echoes the key back must not get it into meta/ or the jail.
        return Turn(text="your key is " + srv.key, headers={"x-echo": srv.key})

    with ModelServer(echo_key) as srv:
        b, _ = make(tmp_path, srv.env(provider), provider=provider)
        answer = b.handle("/model", {})
    assert answer["ok"] and srv.key not in json.dumps(answer) and "***" in answer["text"]
    raw = (tmp_path / "meta" / "transcript.jsonl").read_text()
    assert srv.key not in raw and "***" in raw
    started, rec = [r for r in transcript(tmp_path) if r["event"] in ("call_started", "model_call")]
    assert started == {"time": started["time"], "event": "call_started", "n": 1, "try": 1,
                       "url": rec["url"], "request_timeout": 600}
    assert rec["usage"]["input_tokens"] > 0 and rec["usage"]["output_tokens"] > 0
    assert rec["latency_ms"] > 0 and rec["response"]["status"] == 200
    assert rec["response"]["request_id"].startswith("req_")
    assert rec["response"]["headers"]["x-echo"] == "***"
    hdrs = rec["request"]["headers"]
    assert hdrs.get("authorization", hdrs.get("x-api-key", hdrs.get("api-key"))) == "***"
    assert b.state.usage["model_calls"] == 1


def test_a_dummy_key_does_not_break_the_json_lines(tmp_path: Path) -> None:
    """Local servers take any key; ``null`` must not be "masked" into the JSON syntax."""
    with ModelServer([calls(Call("create_file", {"path": "out/x", "content": "null true"})), say("done")],
                     key="null") as srv:
        b, _ = make(tmp_path, srv.env("openai"))
        assert b.handle("/model", {})["ok"]
        assert b.handle("/model", results("call_0_0"))["ok"]
    lines = (tmp_path / "meta" / "transcript.jsonl").read_text().splitlines()
    assert all(isinstance(json.loads(line), dict) for line in lines)
    assert '"content": "null true"' in "\n".join(lines).replace('\\"', '"')


def test_transcript_grows_with_the_delta_only(tmp_path: Path) -> None:
    big = "x" * 100_000
    with ModelServer([calls(Call("read_file", {"path": "a", "offset": None, "limit": None}))] * 8 + [say("done")]) as srv:
        b, _ = make(tmp_path, srv.env("openai"), max_turns=10)
        b.handle("/model", {})
        for n in range(8):
            b.handle("/model", {"results": [{"id": f"call_{n}_0", "name": "read_file", "content": big,
                                             "is_error": False}]})
    size = (tmp_path / "meta" / "transcript.jsonl").stat().st_size
    # 8 tool results of 100 kB each: recorded once each, not again with every later call.
    assert 800_000 < size < 1_000_000, size
    # (the positive control: the provider did get the whole conversation every time)
    assert sum(len(json.dumps(s.body)) for s in srv.seen) > 3_000_000


@pytest.mark.parametrize(
    ("provider", "turn", "needle"),
    [
        ("openai", Turn(text="half a rep", stop="length"), "output limit"),
        ("openai", Turn(calls=(Call("create_file", '{"path": "out/r.md", "content": "abc'),), stop="length"),
         "a tool call was cut off"),
        ("openai", Turn(refusal="I can't help with that"), "refused (stop reason stop): I can't help with that"),
        ("openai", Turn(text="", stop="content_filter"), "content filter"),
        ("openai", Turn(text=""), "empty reply"),
        ("anthropic", Turn(calls=(Call("create_file", {"path": "out/r.md"}),), stop="max_tokens"),
         "a tool call was cut off"),
        ("anthropic", Turn(refusal="No."), "refused"),
        ("anthropic", Turn(text="", stop="model_context_window_exceeded"), "context window"),
        ("anthropic", Turn(text=" \n"), "empty reply"),
        ("openai-responses", Turn(text="partial", stop="max_output_tokens"), "output limit"),
        ("openai-responses", Turn(refusal="no"), "refused"),
        ("openai-responses", Turn(text="", stop="content_filter"), "content filter"),
    ],
)
def test_stop_reasons_fail_at_once_and_are_not_retried(tmp_path: Path, provider: str, turn: Turn,
                                                        needle: str) -> None:
    with ModelServer([turn] * 6) as srv:
        b, _ = make(tmp_path, srv.env(provider), provider=provider, max_turns=6)
        answer = b.handle("/model", {})
        again = b.handle("/model", {})
    assert not answer["ok"] and needle in answer["error"], answer
    assert again == answer
    assert len(srv.seen) == 1
    assert b.state.retryable is False


def test_text_without_declared_outputs_gets_one_reminder_then_fails(tmp_path: Path) -> None:
    with ModelServer([say("Here is the report: ..."), say("Done, the report is above.")] * 3) as srv:
        b, _ = make(tmp_path, srv.env("anthropic"), provider="anthropic", outputs=("report.md",))
        answer = b.handle("/model", {})
    assert not answer["ok"]
    assert "never called a tool but never wrote the declared outputs out/report.md, also after a reminder" \
        in answer["error"]
    assert len(srv.seen) == 2
    assert "You answered without writing out/report.md" in srv.seen[1].user_texts()[-1]
    assert "must produce these files under out/: out/report.md" in srv.seen[0].body["system"]
    assert b.state.retryable is False


def test_a_reminder_that_works(tmp_path: Path) -> None:
    script = [say("The report says X."), calls(Call("create_file", {"path": "out/report.md", "content": "X"})),
              say("written")]
    with ModelServer(script) as srv:
        b, _ = make(tmp_path, srv.env("openai"), outputs=("report.md",))
        first = b.handle("/model", {})
        assert first["ok"] and first["tool_calls"][0]["name"] == "create_file"
        assert b.handle("/write/intent", {"tool": "create_file", "path": "out/report.md"})["ok"]
        (tmp_path / "work" / "out" / "report.md").write_text("X")
        import hashlib

        b.handle("/write/done", {"tool": "create_file", "path": "out/report.md",
                                 "sha256": hashlib.sha256(b"X").hexdigest()})
        last = b.handle("/model", results("call_1_0"))
    assert last == {"ok": True, "text": "written", "tool_calls": []}
    assert [r["event"] for r in transcript(tmp_path)].count("reminder") == 1


def test_rate_limits_wait_as_the_server_asks_then_as_the_sdks_do(tmp_path: Path) -> None:
    flaky = iter([Turn(status=429, headers={"retry-after": "2"}), Turn(status=529),
                  Turn(status=503, headers={"retry-after-ms": "1500"}), say("ok")])
    sleeps: list[float] = []
    with ModelServer(lambda seen, n: next(flaky)) as srv:
        b, _ = make(tmp_path, srv.env("anthropic"), provider="anthropic", sleeps=sleeps)
        answer = b.handle("/model", {})
    assert answer == {"ok": True, "text": "ok", "tool_calls": []}
    assert sleeps[0] == 2.0 and 0.75 <= sleeps[1] <= 1.0 and sleeps[2] == 1.5
    recs = calls_of(tmp_path)
    assert [r["try"] for r in recs] == [1, 2, 3, 4]
    assert [r["response"]["status"] for r in recs] == [429, 529, 503, 200]
    assert [r.get("retry_in") for r in recs] == [2.0, round(sleeps[1], 3), 1.5, None]
    assert recs[1]["request"] == {"same_as_try": 1}
    assert b.state.usage["model_calls"] == 1


def test_rate_limit_retries_run_out(tmp_path: Path) -> None:
    sleeps: list[float] = []
    with ModelServer(lambda seen, n: Turn(status=429)) as srv:
        b, _ = make(tmp_path, srv.env("openai"), sleeps=sleeps)
        answer = b.handle("/model", {})
    assert len(srv.seen) == 5 and len(sleeps) == 4
    assert "HTTP 429" in answer["error"] and "(after 5 tries)" in answer["error"]
    assert b.state.retryable is True  # a later attempt of the item may get through


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_request_errors_are_final(tmp_path: Path, status: int) -> None:
    with ModelServer(lambda seen, n: Turn(status=status)) as srv:
        b, _ = make(tmp_path, srv.env("openai"), sleeps=[])
        answer = b.handle("/model", {})
    assert len(srv.seen) == 1
    assert f"HTTP {status} (invalid_request_error): scripted HTTP {status}" in answer["error"]
    assert b.state.retryable is False


def test_wrong_key_is_not_retried_and_not_recorded(tmp_path: Path) -> None:
    with ModelServer([say("a")]) as srv:
        env = srv.env("openai") | {"OPENAI_API_KEY": "sk-wrong-key-123456"}
        b, _ = make(tmp_path, env)
        answer = b.handle("/model", {})
    assert not answer["ok"] and "HTTP 401" in answer["error"] and "OPENAI_API_KEY" in answer["error"]
    assert len(srv.seen) == 1
    assert "sk-wrong-key-123456" not in (tmp_path / "meta" / "transcript.jsonl").read_text()


def test_an_http_200_with_an_error_body_says_so(tmp_path: Path) -> None:
    body = {"error": {"message": "upstream model is loading", "type": "server_error", "code": "503"}}
    with ModelServer([Turn(body=body)]) as srv:
        b, _ = make(tmp_path, srv.env("openai"))
        answer = b.handle("/model", {})
    assert answer["error"].startswith("the model provider answered HTTP 200 with an error instead of a reply "
                                      "(server_error, code 503): upstream model is loading")


def test_a_stalled_server_ends_at_request_timeout(tmp_path: Path) -> None:
    with ModelServer([Turn(text="late", delay=120)]) as srv:
        b, _ = make(tmp_path, srv.env("openai"), request_timeout=0.5, sleeps=[])
        t0 = time.monotonic()
        answer = b.handle("/model", {})
        took = time.monotonic() - t0
    assert "no answer within request_timeout 0.5s (tried 2 times)" in answer["error"]
    assert b.state.retryable is False
    assert took < 60  # generous: two tries of 0.5 s each on a loaded machine
    events = [r["event"] for r in transcript(tmp_path)]
    assert events == ["call_started", "model_call", "call_started", "model_call", "failed"]


def test_unreachable_provider_is_an_error_not_a_crash(tmp_path: Path) -> None:
    b, _ = make(tmp_path, {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "k" * 8}, sleeps=[])
    answer = b.handle("/model", {})
    assert not answer["ok"] and "failed: ConnectError" in answer["error"]
    assert len(calls_of(tmp_path)) == 3  # three tries, each recorded


@pytest.mark.parametrize(
    ("provider", "model", "rejects", "dropped"),
    [
        ("openai", "gpt-4.1", {"parallel_tool_calls"}, "parallel_tool_calls"),  # a LiteLLM proxy
        ("openai-responses", "gpt-4.1", {"parallel_tool_calls"}, "parallel_tool_calls"),
        ("anthropic", "claude-sonnet-4-5", {"strict"}, "strict"),
    ],
)
def test_a_rejected_optional_field_is_dropped_once_and_recorded(tmp_path: Path, provider: str, model: str,
                                                                rejects: set[str], dropped: str) -> None:
    with ModelServer([say("a"), say("b")], rejects=frozenset(rejects)) as srv:
        b, _ = make(tmp_path, srv.env(provider), provider=provider, model=model)
        assert b.handle("/model", {})["ok"]
    assert len(srv.seen) == 2 and srv.errors == []
    assert b.state.fallbacks == [dropped]
    recs = calls_of(tmp_path)
    assert "rejected " + dropped in recs[0]["fallback"]


def test_o_series_requests_carry_neither_parallel_tool_calls_nor_temperature(tmp_path: Path) -> None:
    with ModelServer([say("ok")], rejects=frozenset({"parallel_tool_calls", "temperature"})) as srv:
        b, _ = make(tmp_path, srv.env("openai"), model="o3-mini",
                    settings=wire.Settings(temperature=0.2, max_tokens=100))
        assert b.handle("/model", {})["ok"]
    (seen,) = srv.seen
    assert "parallel_tool_calls" not in seen.body and "temperature" not in seen.body
    assert seen.body["max_completion_tokens"] == 100
    notes = next(r for r in transcript(tmp_path) if r["event"] == "adjusted")["notes"]
    assert any("temperature not sent" in n for n in notes)


def test_budget_stops_the_item(tmp_path: Path) -> None:
    with ModelServer([calls(Call("read_file", {"path": "a"}))] * 10) as srv:
        b, _ = make(tmp_path, srv.env("openai"), budget=200, tools=("read_file",), max_turns=10)
        first = b.handle("/model", {})
        second = b.handle("/model", results("call_0_0"))
    assert first["ok"] and not second["ok"]
    assert "token budget exceeded: 222 tokens spent over 2 model call(s), budget 200" in second["error"]
    assert len(srv.seen) == 2 and b.state.retryable is False


def test_results_must_answer_the_calls(tmp_path: Path) -> None:
    with ModelServer([calls(Call("read_file", {"path": "a"}))] * 3) as srv:
        b, _ = make(tmp_path, srv.env("openai"), tools=("read_file",))
        b.handle("/model", {})
        answer = b.handle("/model", results("forged"))
    assert not answer["ok"] and "bad request from the jail" in answer["error"]
    assert len(srv.seen) == 1


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


@pytest.mark.parametrize("path", ["out/x/", "out/x/.", "out/"])
def test_a_target_naming_a_folder_is_refused(tmp_path: Path, path: str) -> None:
    b, echoed = make(tmp_path, {})
    answer = b.handle("/write/intent", {"tool": "create_file", "path": path})
    assert not answer["ok"] and "names a folder" in answer["error"] and echoed == []
    assert not (tmp_path / "work" / "out" / "x").exists()


def test_an_os_error_on_a_target_is_a_tool_error_and_the_line_stays_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the real socket, with the jail's own client: a name the file system
    cannot take once made ``is_file`` raise ENAMETOOLONG and the broker hang up."""
    from stockade.agent.jail import BrokerClient

    b, echoed = make(tmp_path, {})
    here, there = socket.socketpair()
    server = BrokerServer(b, here)
    server.start()
    client = BrokerClient(there)
    answers = []
    try:
        for path in ("out/" + "a" * 300, "out/" + "/".join(["d" * 99] * 42) + "/f.md"):
            answers.append(client.post("/write/intent", {"tool": "create_file", "path": path}))
        # Under the length check, any OSError from the file system is the net.
        monkeypatch.setattr(guard, "check_length", lambda root, rel: None)
        answers.append(client.post("/write/intent", {"tool": "create_file", "path": "out/" + "b" * 300}))
        answers.append(client.post("/write/intent", {"tool": "create_file", "path": "out/fine.md"}))
    finally:
        there.close()
        server.stop()
    assert [a["ok"] for a in answers] == [False, False, False, True]
    assert all("file name too long" in a["error"] for a in answers[:3]), answers
    assert "cannot use this path: file name too long" in answers[2]["error"]
    assert echoed == ["WRITE TARGET: out/fine.md"]
    events = [json.loads(line)["event"] for line in (tmp_path / "meta" / "writes.jsonl").read_text().splitlines()]
    assert events == ["rejected", "rejected", "rejected", "intent"]


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
    assert any("differs from the one reported" in p for p in b.desk.problems)
    assert any("without an approved intent" in p for p in b.desk.problems)


def test_nothing_is_accepted_after_finish(tmp_path: Path) -> None:
    """The verdict is recorded once: a second /finish (a forged one) and any
    later request are refused, and none spends the key or writes."""
    with ModelServer([say("a")] * 5) as srv:
        b, echoed = make(tmp_path, srv.env("openai"))
        assert b.handle("/finish", {"ok": True, "result": "REFUTED", "message": "", "turns": 1}) == {"ok": True}
        later = [
            b.handle("/finish", {"ok": True, "result": "HOLDS forged", "message": "", "turns": 1}),
            b.handle("/model", {}),
            b.handle("/write/intent", {"tool": "create_file", "path": "new.md"}),
            b.handle("/write/done", {"tool": "create_file", "path": "new.md", "sha256": "0"}),
        ]
    assert later == [{"ok": False, "error": "the agent already finished"}] * 4
    assert b.state.finished is not None and b.state.finished["result"] == "REFUTED"
    assert srv.seen == [] and echoed == [] and b.desk.problems == []
    assert [r["event"] for r in transcript(tmp_path)] == ["finish"]
    assert not (tmp_path / "meta" / "writes.jsonl").exists()


def test_only_real_secrets_are_masked_and_only_in_values() -> None:
    from stockade.agent.record import SecretMask

    m = SecretMask(["null", "unused", "sk-real-key-0123456789"], declared=["hunter"])
    rec = {"null": None, "text": "null unused sk-real-key-0123456789 hunter", "sk-real-key-0123456789": [True]}
    assert m.value(rec) == {"null": None, "text": "null unused *** ***", "***": [True]}
    assert json.loads(json.dumps(m.value(rec))) == m.value(rec)
