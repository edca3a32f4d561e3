"""The model gateway: signed requests only, the engine's URL and key only, bounded calls."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from modelserver import ModelServer, say

from stockade.agent import endpoints
from stockade.runner.gateway import PLACEHOLDER, Gateway, GatewayClient, worker_env


@pytest.fixture
def server() -> ModelServer:
    with ModelServer([say("hi")] * 10, key="sk-gw-0123456789abcdef") as srv:
        yield srv


def _body() -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}]}).encode()


def test_the_worker_holds_a_placeholder_and_the_engine_adds_the_key(server: ModelServer) -> None:
    env = server.env("openai")
    wenv = worker_env("openai", "m", None, env)
    assert wenv == {"OPENAI_BASE_URL": env["OPENAI_BASE_URL"], "OPENAI_API_KEY": PLACEHOLDER}
    gw = Gateway()
    try:
        gid, token = gw.grant("openai", "m", None, env, max_calls=2, echo=print, ask=None)
        target = endpoints.resolve("openai", "m", None, wenv).url
        client = GatewayClient(gw.url, gid, token)
        with client.http() as http:
            r = http.post(target, content=_body(),
                          headers=endpoints.headers("openai", PLACEHOLDER))
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hi"
            assert server.seen[-1].headers["authorization"] == "Bearer sk-gw-0123456789abcdef"
            r = http.post(target, content=_body(), headers={})
            assert r.status_code == 200
            # A third call is over the grant's limit.
            with pytest.raises(httpx.ConnectError, match="used up its model calls"):
                http.post(target, content=_body(), headers={})
        assert len(server.seen) == 2
    finally:
        gw.close()


def test_unsigned_replayed_misdirected_and_revoked_calls_are_refused(server: ModelServer) -> None:
    env = server.env("openai")
    gw = Gateway()
    try:
        gid, token = gw.grant("openai", "m", None, env, max_calls=10, echo=print, ask=None)
        url = endpoints.resolve("openai", "m", None, env).url
        good = GatewayClient(gw.url, gid, token)
        status, _, _ = good.send("/model", _body(), {"x-stockade-url": url})
        assert status == "200"  # positive control: the signed call goes through
        wrong = GatewayClient(gw.url, gid, "0" * 64)
        with pytest.raises(httpx.RemoteProtocolError, match="403"):
            wrong.send("/model", _body(), {"x-stockade-url": url})
        # Replaying sequence number 1 (already used) with a valid signature is refused.
        replay = GatewayClient(gw.url, gid, token)
        with pytest.raises(httpx.RemoteProtocolError, match="403"):
            replay.send("/model", _body(), {"x-stockade-url": url})
        # The key goes only to the URL the engine resolved.
        status, _, headers = good.send("/model", _body(),
                                       {"x-stockade-url": "http://127.0.0.1:9/steal"})
        assert status == "0" and "may call" in headers["x-stockade-error"]
        gw.revoke(gid)
        with pytest.raises(httpx.RemoteProtocolError, match="403"):
            good.send("/model", _body(), {"x-stockade-url": url})
        assert len(server.seen) == 1
    finally:
        gw.close()


def test_a_base_urls_credentials_stay_on_the_engine(server: ModelServer) -> None:
    """The worker got the base URL variable whole, password and query values
    included; it now gets it as records show it, and the engine, which
    compares that form, posts to the real URL."""
    env = server.env("anthropic")
    env["ANTHROPIC_BASE_URL"] = f"http://alice:pw-secret@127.0.0.1:{server.port}?token=tok-secret"
    wenv = worker_env("anthropic", "m", None, env)
    assert "secret" not in json.dumps(wenv), wenv
    assert wenv["ANTHROPIC_BASE_URL"] == f"http://***@127.0.0.1:{server.port}?token=***"
    gw = Gateway()
    try:
        gid, token = gw.grant("anthropic", "m", None, env, max_calls=3, echo=print, ask=None)
        target = endpoints.resolve("anthropic", "m", None, wenv).url
        body = json.dumps({"model": "m", "max_tokens": 16,
                           "messages": [{"role": "user", "content": "hello"}]}).encode()
        with GatewayClient(gw.url, gid, token).http() as http:
            r = http.post(target, content=body, headers=endpoints.headers("anthropic", PLACEHOLDER))
        assert r.status_code == 200, r.text
        seen = server.seen[-1]
        assert (seen.path, seen.query) == ("/v1/messages", {"token": "tok-secret"})
        assert seen.headers["x-api-key"] == server.key
    finally:
        gw.close()
