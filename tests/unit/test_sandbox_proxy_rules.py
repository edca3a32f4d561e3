"""Egress allowlist patterns."""

from __future__ import annotations

import pytest

from stockade.errors import UserError
from stockade.sandbox.proxy import is_allowed, parse_rule

CASES = [
    # (pattern, host, port, allowed)
    ("api.example.com", "api.example.com", 443, True),
    ("api.example.com", "api.example.com", 80, True),
    ("api.example.com", "API.Example.COM.", 443, True),
    ("api.example.com", "api.example.com", 8443, False),
    ("api.example.com", "evil-api.example.com", 443, False),
    ("api.example.com", "api.example.com.evil.org", 443, False),
    ("api.example.com:8443", "api.example.com", 8443, True),
    ("api.example.com:8443", "api.example.com", 443, False),
    ("*.example.org:443", "a.example.org", 443, True),
    ("*.example.org:443", "a.b.example.org", 443, True),
    ("*.example.org:443", "example.org", 443, False),
    ("*.example.org:443", "badexample.org", 443, False),
    ("*.example.org:443", "a.example.org", 80, False),
    ("*.example.org", "x.example.org", 80, True),
    ("localhost:8000", "localhost", 8000, True),
    ("localhost:8000", "127.0.0.1", 8000, False),
    ("127.0.0.1:9", "127.0.0.1", 9, True),
    ("[::1]:9", "::1", 9, True),
]


@pytest.mark.parametrize(("pattern", "host", "port", "allowed"), CASES)
def test_patterns(pattern: str, host: str, port: int, allowed: bool) -> None:
    assert is_allowed([parse_rule(pattern)], host, port) is allowed


@pytest.mark.parametrize(
    "bad", ["", "a.com:0", "a.com:99999", "a.com:x", "*foo.com", "a/b", "ex*.com"]
)
def test_bad_patterns_are_user_errors(bad: str) -> None:
    with pytest.raises(UserError):
        parse_rule(bad)


def test_empty_allowlist_refuses_everything() -> None:
    assert not is_allowed([], "example.com", 443)
