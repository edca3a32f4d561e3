"""Egress allowlist patterns, internal addresses, and the proxy's credential."""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stockade.errors import UserError
from stockade.sandbox.proxy import (
    EgressProxy,
    credential_headers,
    internal_kind,
    is_allowed,
    parse_rule,
    refused_address,
)
from tests.loopback_http import serve

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


KINDS = [
    ("127.0.0.1", "loopback"),
    ("127.8.9.1", "loopback"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "link-local"),  # cloud metadata
    ("100.64.0.1", "shared (CGNAT)"),
    ("100.127.255.254", "shared (CGNAT)"),
    ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"),
    ("::1", "loopback"),
    ("::", "unspecified"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),
    ("fc00::1", "private"),
    ("fd12:3456::1", "private"),
    ("fec0::1", "site-local"),
    ("ff02::1", "multicast"),
    ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
    ("::ffff:10.0.0.1", "private"),
    ("::ffff:169.254.169.254", "link-local"),
    ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
    ("64:ff9b::7f00:1", "loopback"),
    ("8.8.8.8", None),
    ("93.184.216.34", None),
    ("100.128.0.1", None),  # just past CGNAT
    ("2606:4700:4700::1111", None),
    ("::ffff:8.8.8.8", None),
]


@pytest.mark.parametrize(("address", "kind"), KINDS)
def test_internal_kinds(address: str, kind: str | None) -> None:
    assert internal_kind(address) == kind


REFUSALS = [
    # (allowlist, port, resolved addresses, refused)
    (["localhost:8000"], 8000, ["127.0.0.1"], True),
    (["localhost:8000", "127.0.0.1:8000"], 8000, ["127.0.0.1"], False),
    (["localhost:8000", "127.0.0.1:8000"], 8000, ["127.0.0.1", "::1"], True),
    (["localhost:8000", "127.0.0.1:8000", "[::1]:8000"], 8000, ["::1", "127.0.0.1"], False),
    (["127.0.0.1:9000"], 8000, ["127.0.0.1"], True),  # named for another port
    (["127.0.0.1"], 443, ["127.0.0.1"], False),  # default ports
    (["127.0.0.1"], 8000, ["127.0.0.1"], True),
    (["127.0.0.1:8000"], 8000, ["::ffff:127.0.0.1"], False),  # the mapped form of it
    (["127.0.0.1:8000"], 8000, ["127.0.0.2"], True),
    (["api.example.com"], 443, ["93.184.216.34"], False),
    (["api.example.com"], 443, ["93.184.216.34", "10.0.0.1"], True),  # one private answer
    (["*.example.org"], 443, ["169.254.169.254"], True),
    (["*.example.org"], 443, ["::ffff:192.168.0.1"], True),
    (["10.0.0.0:80"], 80, ["10.0.0.1"], True),  # a literal names one address only
]


@pytest.mark.parametrize(("allow", "port", "addresses", "refused"), REFUSALS)
def test_internal_addresses_need_a_literal_entry(
    allow: list[str], port: int, addresses: list[str], refused: bool
) -> None:
    reason = refused_address([parse_rule(p) for p in allow], port, addresses)
    assert (reason is not None) is refused
    if refused:
        assert reason is not None and "resolves to" in reason


# The proxy itself, on a real unix socket, with a real upstream server on
# loopback and a resolver the test controls.


@pytest.fixture
def upstream() -> Iterator[tuple[int, list[str]]]:
    """The proxy's upstream: ``(port, each request's headers)``."""
    with serve(b"upstream-content") as served:
        yield served.port, served.headers


def _ask(proxy: EgressProxy, request: str) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(proxy.socket_path))
        s.sendall(request.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data


def _auth(token: str) -> str:
    return "Proxy-Authorization: Basic " + base64.b64encode(f"stockade:{token}".encode()).decode()


def _entries(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_proxy_requires_its_credential(tmp_path: Path, upstream: tuple[int, list[str]]) -> None:
    port, seen = upstream
    log = tmp_path / "network.jsonl"
    with EgressProxy([f"127.0.0.1:{port}"], log, tmp_path) as proxy:
        get = f"GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        missing = _ask(proxy, get + "\r\n")
        wrong = _ask(proxy, get + _auth("0" * 32) + "\r\n\r\n")
        garbled = _ask(proxy, get + "Proxy-Authorization: Basic !!!\r\n\r\n")
        connect = _ask(proxy, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")
        right = _ask(proxy, get + _auth(proxy.token) + "\r\n\r\n")
        token = proxy.token
    for refused in (missing, wrong, garbled, connect):
        assert refused.startswith(b"HTTP/1.1 407 "), refused
        assert b"upstream-content" not in refused
    assert b" 200 OK" in right and right.endswith(b"upstream-content")
    # One request reached upstream, without the credential.
    assert len(seen) == 1 and "proxy-authorization" not in seen[0].lower()
    entries = _entries(log)
    assert [e["reason"] for e in entries] == [
        "proxy credential missing", "proxy credential wrong", "proxy credential wrong",
        "proxy credential missing", "allowlisted",
    ]  # fmt: skip
    text = log.read_text()
    assert token not in text and credential_headers(token)[1] not in text


def test_every_proxy_has_its_own_credential(tmp_path: Path) -> None:
    a = EgressProxy([], tmp_path / "a.jsonl", tmp_path / "a")
    b = EgressProxy([], tmp_path / "b.jsonl", tmp_path / "b")
    assert a.token != b.token and len(a.token) >= 32


def test_name_resolving_to_loopback_is_refused(
    tmp_path: Path, upstream: tuple[int, list[str]]
) -> None:
    port, seen = upstream
    log = tmp_path / "network.jsonl"
    with EgressProxy([f"localhost:{port}"], log, tmp_path) as proxy:
        answer = _ask(
            proxy, f"GET http://localhost:{port}/ HTTP/1.1\r\n{_auth(proxy.token)}\r\n\r\n"
        )
        tunnel = _ask(proxy, f"CONNECT localhost:{port} HTTP/1.1\r\n{_auth(proxy.token)}\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403 ") and tunnel.startswith(b"HTTP/1.1 403 ")
    assert seen == []
    reasons = [str(e["reason"]) for e in _entries(log)]
    assert len(reasons) == 2 and all(r.startswith("resolves to loopback") for r in reasons)


def test_a_name_is_resolved_once_and_the_checked_address_used(
    tmp_path: Path, upstream: tuple[int, list[str]]
) -> None:
    """A rebinding resolver answers the allowlisted literal first and a
    private address after: the proxy must ask once and connect to the first."""
    port, seen = upstream
    answers = [[(socket.AF_INET, ("127.0.0.1", port))], [(socket.AF_INET, ("10.0.0.1", port))]]
    asked: list[str] = []

    def resolve(host: str, p: int) -> list[tuple[int, Any]]:
        asked.append(host)
        return answers[min(len(asked) - 1, 1)]

    log = tmp_path / "network.jsonl"
    allow = [f"svc.test:{port}", f"127.0.0.1:{port}"]
    with EgressProxy(allow, log, tmp_path, resolve=resolve) as proxy:
        answer = _ask(
            proxy, f"GET http://svc.test:{port}/ HTTP/1.1\r\n{_auth(proxy.token)}\r\n\r\n"
        )
    assert answer.endswith(b"upstream-content"), answer
    assert asked == ["svc.test"] and len(seen) == 1
    (entry,) = _entries(log)
    assert entry["address"] == "127.0.0.1" and entry["allowed"] is True


def test_private_answer_among_public_ones_is_refused(tmp_path: Path) -> None:
    def resolve(host: str, p: int) -> list[tuple[int, Any]]:
        return [
            (socket.AF_INET, ("93.184.216.34", p)),
            (socket.AF_INET6, ("::ffff:10.0.0.7", p, 0, 0)),
        ]

    log = tmp_path / "network.jsonl"
    with EgressProxy(["api.example.com"], log, tmp_path, resolve=resolve) as proxy:
        answer = _ask(
            proxy, f"CONNECT api.example.com:443 HTTP/1.1\r\n{_auth(proxy.token)}\r\n\r\n"
        )
    assert answer.startswith(b"HTTP/1.1 403 ")
    (entry,) = _entries(log)
    assert entry["allowed"] is False
    assert entry["reason"] == "resolves to private address ::ffff:10.0.0.7"
