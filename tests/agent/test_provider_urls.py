"""Credentials in a provider's base URL, through the real command line: a password
(``http://user:pass@host``) or a token in the query never reaches a record, the
store, the jail or the terminal, and each call's path is joined inside the URL's
path with the query kept at the end, for every provider and for ``endpoint:``.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from modelserver import ModelServer, say
from test_providers_cli import RUN, Cli, agent_step

BASE_VAR = {"openai": "OPENAI_BASE_URL", "openai-responses": "OPENAI_BASE_URL",
            "azure": "AZURE_OPENAI_ENDPOINT", "anthropic": "ANTHROPIC_BASE_URL"}
KEY_VAR = {"openai": "OPENAI_API_KEY", "openai-responses": "OPENAI_API_KEY",
           "azure": "AZURE_OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
CALL_PATH = {"openai": "/v1/chat/completions", "openai-responses": "/v1/responses",
             "azure": "/v1/openai/deployments/m/chat/completions",
             "anthropic": "/v1/messages"}
PASSWORD, TOKEN = "hunter2-pw", "s3cr3t-token-value"


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _leaks(cli: Cli, *secrets: str) -> list[str]:
    return [str(p) for p in cli.home.rglob("*") if p.is_file()
            and any(s.encode() in p.read_bytes() for s in secrets)]


@pytest.mark.parametrize("provider", list(BASE_VAR))
def test_a_failed_call_shows_the_url_without_its_credentials(cli: Cli, provider: str) -> None:
    port = _closed_port()
    base = f"http://alice:{PASSWORD}@127.0.0.1:{port}/v1?token={TOKEN}"
    env = {BASE_VAR[provider]: base, KEY_VAR[provider]: "sk-test-0123456789abcdef"}
    wf = cli.write(agent_step(f"{provider}/m").replace("retries: 2", "retries: 0"))
    r = cli.stockade("run", str(wf), "--run-id", RUN, env=env)
    assert r.returncode == 1, r.stderr
    version = "&api-version=2024-10-21" if provider == "azure" else ""
    url = f"http://***@127.0.0.1:{port}{CALL_PATH[provider]}?token=***{version}"
    message = cli.item()["item"]["message"]
    assert f"model call to {url} failed: ConnectError" in message, message
    shown = cli.stockade("show", RUN, "ask/0")
    assert url in shown.stdout
    for text in (r.stdout, r.stderr, shown.stdout, message):
        assert PASSWORD not in text and TOKEN not in text
    meta = cli.home / "runs" / RUN / "ask" / "0" / "meta"
    assert {json.loads(line)["url"] for line in (meta / "1" / "transcript.jsonl").read_text().splitlines()
            if "url" in json.loads(line)} == {url}
    assert _leaks(cli, PASSWORD, TOKEN) == []  # stockade.db, outcome.json, the jail's stderr...


@pytest.mark.parametrize("provider", list(BASE_VAR))
def test_the_query_of_a_base_url_stays_at_the_end(cli: Cli, provider: str) -> None:
    with ModelServer([say("ok")], validate=True) as srv:
        env = srv.env(provider)
        env[BASE_VAR[provider]] += f"?token={TOKEN}"
        code, _ = cli.run(agent_step(f"{provider}/m"), env)
    assert code == 0, cli.item()["item"]["message"]
    (seen,) = srv.seen
    assert seen.path == CALL_PATH[provider].removeprefix("/v1" if provider == "azure" else "")
    assert seen.query["token"] == TOKEN and srv.errors == []
    if provider == "azure":
        assert seen.query["api-version"] == "2024-10-21"
    urls = {r["url"] for r in cli.transcript() if "url" in r}
    assert len(urls) == 1 and urls.pop().endswith(f"{seen.path}?token=***"
                                                  + ("&api-version=2024-10-21" if provider == "azure" else ""))
    assert _leaks(cli, TOKEN) == []


def test_an_endpoint_base_url_in_the_workflow_is_recorded_without_its_password(cli: Cli) -> None:
    port = _closed_port()
    wf = cli.write(agent_step("openai/m", extra=f'endpoint: {{base_url: "http://bob:{PASSWORD}@127.0.0.1:{port}/v1"}}')
                   .replace("retries: 2", "retries: 0"))
    r = cli.stockade("run", str(wf), "--run-id", RUN)
    assert r.returncode == 1, r.stderr
    meta = cli.home / "runs" / RUN / "ask" / "0" / "meta" / "1"
    assert json.loads((meta / "agent.json").read_text())["endpoint"]["base_url"] == \
        f"http://***@127.0.0.1:{port}/v1"
    assert f"model call to http://***@127.0.0.1:{port}/v1/chat/completions failed" in \
        cli.item()["item"]["message"]
    assert PASSWORD not in (meta / "outcome.json").read_text() + (meta / "transcript.jsonl").read_text()
    assert _leaks(cli, PASSWORD) == []
