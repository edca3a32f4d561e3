"""Agent steps against scripted providers through the real command line.

Each test writes a workflow, runs ``stockade run`` in a subprocess (the
sandbox backend a user gets by default) against a scripted loopback server
speaking one provider's wire format (``tests/modelserver.py``, every request
body checked against the official SDK request types) and reads the result
back with ``stockade show --json``: stop reasons fail the item with their
reason in at most two calls, a text-only answer without the declared outputs
fails, rate limits are waited out inside one attempt, request errors are
not retried, a stalled server ends at ``request_timeout``, ``params`` reach
the body, o-series requests carry neither ``parallel_tool_calls`` nor
``temperature``, thinking blocks are replayed, two endpoints get their own
keys, a token budget stops the item, usage is totalled, and the Responses
API and Azure deployments run a tool loop that writes a file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from modelserver import Call, ModelServer, Seen, Turn, calls, say

RUN = "cli-run"


class Cli:
    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        self.home = tmp / "home"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("STOCKADE_") and not k.endswith(("_API_KEY", "_BASE_URL", "_ENDPOINT"))}
        self.env["STOCKADE_HOME"] = str(self.home)
        if "STOCKADE_SANDBOX" in os.environ:
            self.env["STOCKADE_SANDBOX"] = os.environ["STOCKADE_SANDBOX"]

    def write(self, text: str) -> Path:
        p = self.dir / "wf.yaml"
        p.write_text(textwrap.dedent(text))
        return p

    def stockade(self, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stockade.cli.main", *args], cwd=self.dir,
                              env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def run(self, text: str, env: dict[str, str], timeout: float = 180) -> tuple[int, dict[str, Any]]:
        wf = self.write(text)
        r = self.stockade("run", str(wf), "--run-id", RUN, "--json", env=env, timeout=timeout)
        assert r.returncode in (0, 1), r.stderr
        return r.returncode, json.loads(r.stdout)

    def show(self, target: str | None = None) -> dict[str, Any]:
        r = self.stockade("show", RUN, *([target] if target else []), "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)  # type: ignore[no-any-return]

    def item(self, step: str = "ask") -> dict[str, Any]:
        return self.show(f"{step}/0")

    def transcript(self, step: str = "ask", attempt: int = 1) -> list[dict[str, Any]]:
        path = self.home / "runs" / RUN / step / "0" / "meta" / str(attempt) / "transcript.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    d = tmp_path / "a project"  # a path with a space
    d.mkdir()
    return Cli(d)


def agent_step(model: str, *, extra: str = "", step: str = "", prompt: str = "Write out/report.md.",
               tools: str = "[read_file, create_file]") -> str:
    return f"""
        name: providers
        steps:
          - id: ask
            retries: 2
            retry_delay: 0
            {step}
            agent:
              model: {model}
              prompt: {prompt}
              tools: {tools}
              {extra}
    """


STOPS = [
    ("openai", Turn(text="The report is", stop="length"), "stopped at its output limit"),
    ("openai", Turn(calls=(Call("create_file", '{"path": "out/report.md", "content": "# Rep'),), stop="length"),
     "a tool call was cut off"),
    ("openai", Turn(refusal="I can't help with that."), "the model refused"),
    ("openai", Turn(text="", stop="content_filter"), "content filter"),
    ("openai", Turn(text=""), "empty reply"),
    ("anthropic", Turn(calls=(Call("create_file", {"path": "out/report.md"}),), stop="max_tokens"),
     "a tool call was cut off"),
    ("anthropic", Turn(refusal="I won't write that."), "the model refused"),
    ("anthropic", Turn(text="", stop="model_context_window_exceeded"), "context window"),
    ("openai-responses", Turn(text="partial", stop="max_output_tokens"), "stopped at its output limit"),
]


@pytest.mark.parametrize(("provider", "turn", "reason"), STOPS,
                         ids=[f"{p}-{r.split()[-1]}-{i}" for i, (p, _t, r) in enumerate(STOPS)])
def test_stop_reasons_fail_the_item_with_the_reason(cli: Cli, provider: str, turn: Turn, reason: str) -> None:
    with ModelServer([turn] * 10, validate=True) as srv:
        code, out = cli.run(agent_step(f"{provider}/scripted"), srv.env(provider))
    assert code == 1 and out["status"] == "failed"
    item = cli.item()
    assert item["item"]["status"] == "failed" and reason in item["item"]["message"], item["item"]["message"]
    assert len(srv.seen) <= 2 and len(item["attempts"]) == 1  # not retried: it would end the same way
    assert srv.errors == []


def test_text_without_the_declared_outputs_fails(cli: Cli) -> None:
    script = [say("# Report\nSales grew."), say("As I said: sales grew.")] * 5
    with ModelServer(script, validate=True) as srv:
        code, _ = cli.run(agent_step("openai/small-model", step="outputs: [report.md]"), srv.env("openai"))
    assert code == 1
    msg = cli.item()["item"]["message"]
    assert "the model answered with text and never called a tool but never wrote the declared outputs " \
           "out/report.md, also after a reminder" in msg
    assert len(srv.seen) == 2 and srv.errors == []
    assert "You answered without writing out/report.md" in srv.seen[1].user_texts()[-1]


def test_a_429_with_retry_after_is_waited_out_in_one_attempt(cli: Cli) -> None:
    times: list[float] = []

    def script(seen: Seen, n: int) -> Turn:
        times.append(time.monotonic())
        return Turn(status=429, headers={"retry-after": "2"}) if len(times) == 1 else say("ok")

    with ModelServer(script, validate=True) as srv:
        code, out = cli.run(agent_step("openai/m"), srv.env("openai"))
    assert code == 0, out
    assert len(times) == 2 and times[1] - times[0] >= 1.8
    item = cli.item()
    assert item["item"]["status"] == "succeeded" and len(item["attempts"]) == 1
    assert [r["response"]["status"] for r in cli.transcript() if r["event"] == "model_call"] == [429, 200]
    assert srv.errors == []


def test_a_401_is_not_retried(cli: Cli) -> None:
    with ModelServer([say("hi")]) as srv:
        env = srv.env("openai") | {"OPENAI_API_KEY": "sk-not-the-right-key-000"}
        code, _ = cli.run(agent_step("openai/m"), env)
    assert code == 1
    item = cli.item()
    assert len(srv.seen) == 1 and len(item["attempts"]) == 1
    msg = item["item"]["message"]
    assert "HTTP 401 (invalid_request_error): invalid api key" in msg and "OPENAI_API_KEY" in msg
    assert "sk-not-the-right-key-000" not in json.dumps(item)


def test_a_stalled_server_fails_at_request_timeout(cli: Cli) -> None:
    with ModelServer([Turn(text="never", delay=600)]) as srv:
        t0 = time.monotonic()
        code, _ = cli.run(agent_step("openai/m", extra="request_timeout: 2"), srv.env("openai"))
        took = time.monotonic() - t0
    assert code == 1
    item = cli.item()
    assert len(item["attempts"]) == 1  # tried twice inside the call; retries: 2 do not start over
    msg = item["item"]["message"]
    assert "no answer within request_timeout 2s (tried 2 times)" in msg, msg
    events = [r["event"] for r in cli.transcript()]
    assert events[:2] == ["call_started", "model_call"] and "failed" in events
    print(f"stalled server: the item failed {took:.1f}s after the run started")
    assert took < 60  # two tries of 2 s; generous for a loaded machine (measured: see the report)


def test_params_reach_the_body(cli: Cli) -> None:
    extra = "params: {max_tokens: 321, temperature: 0.25, reasoning_effort: low, tool_choice: auto}"
    with ModelServer([say("ok")], validate=True) as srv:
        code, _ = cli.run(agent_step("openai/gpt-4.1-mini", extra=extra), srv.env("openai"))
    assert code == 0
    body = srv.seen[0].body
    assert (body["max_tokens"], body["temperature"], body["reasoning_effort"], body["tool_choice"]) == \
        (321, 0.25, "low", "auto")
    assert body["parallel_tool_calls"] is False and srv.errors == []


def test_o_series_requests_carry_neither_parallel_tool_calls_nor_temperature(cli: Cli) -> None:
    extra = "params: {max_tokens: 1000, temperature: 0.3}"
    with ModelServer([say("ok")], validate=True, rejects=frozenset({"parallel_tool_calls", "temperature"})) as srv:
        code, _ = cli.run(agent_step("openai/o3-mini", extra=extra), srv.env("openai"))
    assert code == 0
    (seen,) = srv.seen
    assert "parallel_tool_calls" not in seen.body and "temperature" not in seen.body
    assert seen.body["max_completion_tokens"] == 1000


def test_thinking_blocks_are_replayed(cli: Cli) -> None:
    script = [
        Turn(thinking=("I should read the data first.",), redacted=("EncryptedBlob==",),
             calls=(Call("read_file", {"path": "data.txt", "offset": None, "limit": None}),)),
        Turn(thinking=("Now write it.",), calls=(Call("create_file", {"path": "out/report.md", "content": "42\n"}),)),
        say("Wrote out/report.md."),
    ]
    wf = agent_step("anthropic/claude-sonnet-4-5", step="inputs: {data.txt: '42'}",
                    extra="params: {max_tokens: 4000, thinking: {type: enabled, budget_tokens: 2048}}")
    with ModelServer(script, validate=True) as srv:
        code, _ = cli.run(wf, srv.env("anthropic"))
    assert code == 0, cli.item()["item"]["message"]
    assert srv.errors == []
    second = srv.seen[1].body["messages"][1]["content"]
    assert [b["type"] for b in second] == ["thinking", "redacted_thinking", "tool_use"]
    assert second[0]["signature"].startswith("sig-0-0") and second[1]["data"] == "EncryptedBlob=="
    assert srv.seen[0].body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert "strict" in srv.seen[0].body["tools"][0] and "anthropic-beta" not in srv.seen[0].headers
    assert (cli.home / "runs" / RUN / "ask" / "0" / "work" / "out" / "report.md").read_text() == "42\n"


def test_two_endpoints_with_two_keys_and_no_key_in_the_run_tree(cli: Cli) -> None:
    key_a, key_b = "sk-team-a-" + os.urandom(8).hex(), "sk-team-b-" + os.urandom(8).hex()
    with ModelServer([say("from A")], key=key_a, validate=True) as a, \
            ModelServer([say("from B")], key=key_b, validate=True) as b:
        wf = f"""
            name: two
            steps:
              - id: one
                agent:
                  model: openai/m
                  prompt: hi
                  endpoint: {{base_url: "{a.openai_base}", api_key_env: KEY_A}}
              - id: two
                agent:
                  model: anthropic/claude-haiku-4-5
                  prompt: hi
                  endpoint: {{base_url: "{b.anthropic_base}", api_key_env: KEY_B}}
        """
        code, out = cli.run(wf, {"KEY_A": key_a, "KEY_B": key_b, "OPENAI_API_KEY": "sk-default-must-not-travel"})
    assert code == 0, out
    assert [s.headers["authorization"] for s in a.seen] == [f"Bearer {key_a}"]
    assert [s.headers["x-api-key"] for s in b.seen] == [key_b]
    assert a.errors == [] and b.errors == []
    assert cli.show("one/0")["item"]["result"] == "from A" and cli.show("two/0")["item"]["result"] == "from B"
    leaked = [p for p in cli.home.rglob("*") if p.is_file()
              and any(k.encode() in p.read_bytes() for k in (key_a, key_b, "sk-default-must-not-travel"))]
    assert leaked == []


def test_a_token_budget_stops_the_item(cli: Cli) -> None:
    loop = [calls(Call("read_file", {"path": "data.txt", "offset": None, "limit": None}))] * 20
    with ModelServer(loop, validate=True) as srv:
        code, _ = cli.run(agent_step("openai/m", step="inputs: {data.txt: x}", extra="budget: {tokens: 300}"),
                          srv.env("openai"))
    assert code == 1
    item = cli.item()
    assert "token budget exceeded" in item["item"]["message"] and len(srv.seen) == 3
    assert len(item["attempts"]) == 1


def test_usage_totals_in_show_and_run_json(cli: Cli) -> None:
    wf = """
        name: usage
        steps:
          - id: ask
            for_each: [a, b]
            agent:
              model: openai-responses/gpt-4.1
              prompt: "Say {{ item }}."
    """
    with ModelServer(lambda seen, n: say("ok"), validate=True) as srv:
        code, out = cli.run(wf, srv.env("openai-responses"))
    assert code == 0
    one = {"input_tokens": 300, "output_tokens": 30, "cached_tokens": 100, "reasoning_tokens": 5, "model_calls": 1}
    two = {k: 2 * v for k, v in one.items()}
    assert out["usage"] == two
    shown = cli.show()
    assert shown["usage"] == two
    (step,) = shown["steps"]
    assert step["usage"] == two and [i["usage"] for i in step["items"]] == [one, one]
    assert cli.show("ask/a")["item"]["usage"] == one
    text = cli.stockade("show", RUN).stdout
    assert "tokens: 600 in (200 cached), 60 out (10 reasoning), 2 model calls" in text


@pytest.mark.parametrize("provider", ["openai-responses", "azure"])
def test_a_tool_loop_writes_a_file(cli: Cli, provider: str) -> None:
    script = [
        calls(Call("read_file", {"path": "data.txt", "offset": None, "limit": None}), text="Reading."),
        Turn(thinking=("sum it",), calls=(Call("create_file", {"path": "out/report.md", "content": "total 42\n"}),)),
        say("Wrote out/report.md."),
    ]
    with ModelServer(script, validate=True) as srv:
        code, _ = cli.run(agent_step(f"{provider}/my-deployment", step="outputs: [report.md]\n            inputs: {data.txt: '40 2'}"),
                          srv.env(provider))
    assert code == 0, cli.item()["item"]["message"]
    assert srv.errors == []
    assert (cli.home / "runs" / RUN / "ask" / "0" / "work" / "out" / "report.md").read_text() == "total 42\n"
    assert cli.item()["item"]["result"] == "Wrote out/report.md."
    if provider == "azure":
        assert srv.seen[0].path == "/openai/deployments/my-deployment/chat/completions"
        assert srv.seen[0].query == {"api-version": "2024-10-21"} and "authorization" not in srv.seen[0].headers
    else:
        assert srv.seen[0].path == "/v1/responses"
        # the model's own output items (reasoning and function calls, with their ids) are replayed
        replayed = srv.seen[2].body["input"]
        assert {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "sum it"}]} in replayed
        assert any(i.get("id") == "fc_1_0" for i in replayed)


def test_malformed_tool_arguments_are_replayed_as_valid_json(cli: Cli) -> None:
    """Ollama and older vLLM reject a request whose history holds arguments that are not JSON."""
    script = [calls(Call("read_file", '{"path": "data.txt", "offset": nul')), say("done")]
    with ModelServer(script, validate=True) as srv:
        code, _ = cli.run(agent_step("openai/qwen2.5", step="inputs: {data.txt: x}"), srv.env("openai"))
    assert code == 0 and srv.errors == []
    assert srv.seen[1].tool_results()[0].startswith("error: arguments are not valid JSON")
    assert srv.seen[1].body["messages"][2]["tool_calls"][0]["function"]["arguments"] == "{}"


def test_a_call_in_flight_is_visible_in_the_transcript(cli: Cli) -> None:
    """While a call waits on the provider, its call-started record is the transcript's
    last line: a step timeout or a cancel that ends it there leaves it visible."""
    arrived = threading.Event()

    def script(seen: Seen, n: int) -> Turn:
        arrived.set()
        return Turn(text="late", delay=600)

    with ModelServer(script) as srv:
        wf = cli.write(agent_step("openai/m"))
        proc = subprocess.Popen([sys.executable, "-m", "stockade.cli.main", "run", str(wf), "--run-id", RUN],
                                cwd=cli.dir, env={**cli.env, **srv.env("openai")}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            assert arrived.wait(120)
            path = cli.home / "runs" / RUN / "ask" / "0" / "meta" / "1" / "transcript.jsonl"
            deadline = time.monotonic() + 60
            while not path.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            records = [json.loads(line) for line in path.read_text().splitlines()]
            assert records[-1]["event"] == "call_started" and records[-1]["n"] == 1
            assert records[-1]["request_timeout"] == 600
        finally:
            proc.terminate()  # the engine turns SIGTERM into an interrupt
            proc.wait(120)


def test_preflight_names_what_each_provider_and_endpoint_needs(cli: Cli) -> None:
    wf = cli.write("""
        name: pre
        steps:
          - id: team
            agent:
              model: openai/m
              prompt: hi
              endpoint: {base_url: "http://127.0.0.1:9/v1", api_key_env: TEAM_KEY}
          - id: az
            agent:
              model: azure/my-deployment
              prompt: hi
          - id: local
            agent:
              model: openai/m
              prompt: hi
              endpoint: {base_url: "http://127.0.0.1:9/v1"}
    """)
    r = cli.stockade("run", str(wf))
    assert r.returncode == 2, r.stderr
    assert f"{wf}:8:66: endpoint.api_key_env names TEAM_KEY, which is not set" in r.stderr
    assert f"{wf}:11:14: azure/my-deployment needs the Azure resource URL: set AZURE_OPENAI_ENDPOINT" in r.stderr
    assert f"{wf}:11:14: azure/my-deployment needs AZURE_OPENAI_API_KEY" in r.stderr
    assert "local" not in r.stderr  # a step's own server may need no key
    assert not (cli.home / "runs").exists() or not any((cli.home / "runs").iterdir())
    ok = cli.stockade("validate", str(wf))  # validate checks no environment
    assert ok.returncode == 0, ok.stderr


def test_item_usage_sums_its_attempts(cli: Cli) -> None:
    """A first attempt that runs out of turns, a second that answers: the item pays for both."""
    count = iter(range(100))

    def script(seen: Seen, n: int) -> Turn:
        if next(count) < 2:
            return calls(Call("read_file", {"path": "data.txt", "offset": None, "limit": None}))
        return say("done")

    with ModelServer(script, validate=True) as srv:
        code, out = cli.run(agent_step("openai/m", step="inputs: {data.txt: x}", extra="max_turns: 2"),
                            srv.env("openai"))
    assert code == 0, out
    item = cli.item()
    assert len(item["attempts"]) == 2 and "max_turns (2)" in item["attempts"][0]["message"]
    assert item["item"]["usage"] == {"input_tokens": 301, "output_tokens": 31, "cached_tokens": 0,
                                     "reasoning_tokens": 0, "model_calls": 3}
    assert out["usage"] == item["item"]["usage"]
