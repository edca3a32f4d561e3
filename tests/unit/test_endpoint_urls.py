"""Provider URLs as a table: the call's path joined inside the base URL's path, the
query kept at the end, and the URL as it may be shown (no userinfo, no query values)."""

from __future__ import annotations

import pytest

from stockade.agent import endpoints

V = "api-version=2024-10-21"


@pytest.mark.parametrize(
    ("provider", "base", "url", "shown"),
    [
        ("openai", "http://h:1/v1", "http://h:1/v1/chat/completions", "http://h:1/v1/chat/completions"),
        ("openai", "http://h:1/v1/", "http://h:1/v1/chat/completions", "http://h:1/v1/chat/completions"),
        ("openai", "http://alice:hunter2@h:1/v1", "http://alice:hunter2@h:1/v1/chat/completions",
         "http://***@h:1/v1/chat/completions"),
        ("openai", "http://h:1/v1?token=X", "http://h:1/v1/chat/completions?token=X",
         "http://h:1/v1/chat/completions?token=***"),
        ("openai", "https://u@h/v1/?a=1&b=%2F2", "https://u@h/v1/chat/completions?a=1&b=%2F2",
         "https://***@h/v1/chat/completions?a=***&b=***"),
        ("openai-responses", "http://h:1/v1?token=X", "http://h:1/v1/responses?token=X",
         "http://h:1/v1/responses?token=***"),
        ("anthropic", "http://h:1?token=X", "http://h:1/v1/messages?token=X",
         "http://h:1/v1/messages?token=***"),
        ("anthropic", "http://a:b@h:1/v1/?k=v", "http://a:b@h:1/v1/messages?k=v",
         "http://***@h:1/v1/messages?k=***"),
        ("azure", "https://r.openai.azure.com", f"https://r.openai.azure.com/openai/deployments/m/chat/completions?{V}",
         f"https://r.openai.azure.com/openai/deployments/m/chat/completions?{V}"),
        ("azure", "https://r.openai.azure.com/openai/?token=X",
         f"https://r.openai.azure.com/openai/deployments/m/chat/completions?token=X&{V}",
         f"https://r.openai.azure.com/openai/deployments/m/chat/completions?token=***&{V}"),
        ("azure", "https://r/?api-version=2025-01-01",
         "https://r/openai/deployments/m/chat/completions?api-version=2025-01-01",
         "https://r/openai/deployments/m/chat/completions?api-version=2025-01-01"),
    ],
)
def test_url_for_and_shown(provider: str, base: str, url: str, shown: str) -> None:
    assert endpoints.url_for(provider, base, "m") == url
    assert endpoints.shown(url) == shown
    target = endpoints.resolve(provider, "m", endpoints.StepEndpoint(base_url=base), {})
    assert (target.url, target.shown) == (url, shown)


@pytest.mark.parametrize(
    ("url", "secrets"),
    [
        ("http://h/v1", []),
        ("http://alice:hunter2@h/v1", ["alice:hunter2", "hunter2"]),
        ("http://h/v1?token=a%2Fb&api-version=2024-10-21", ["a%2Fb", "a/b"]),
    ],
)
def test_url_secrets(url: str, secrets: list[str]) -> None:
    assert sorted(endpoints.url_secrets(url)) == sorted(secrets)
