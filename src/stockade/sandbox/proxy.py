"""The egress proxy: HTTP CONNECT and plain-HTTP forwarding to allowlisted hosts.

It runs on the host (threads in the engine process) and listens on a unix
socket that backends expose in the jail (bwrap through an in-jail relay on
127.0.0.1; landlock through an engine relay on 127.0.0.1 of the jail's own
network namespace, or of the host where none can be made, whose port is the
only one the jail may connect to). Every allowed and refused connection is one JSON
line in ``log_path``.

Only its own item may use it: every request must carry the proxy's random
per-item credential (``Proxy-Authorization: Basic``, which HTTP clients send
for a proxy URL ``http://stockade:TOKEN@host:port``); anything else gets 407
before a byte goes upstream. The credential is never logged.

Patterns: ``host`` (ports 80 and 443), ``host:port``, ``*.example.org`` and
``*.example.org:443`` (any subdomain, not the apex). Host names compare
case-insensitively; IP literals only match themselves.

A name is resolved once; the request is refused when any of its addresses is
internal (loopback, private, link-local, CGNAT, multicast, reserved, ...,
also as an IPv4-mapped IPv6 address) unless an allowlist entry names that
very address, and the connection goes to an address that was checked (no
second lookup a rebinding DNS server could answer differently).

Must not import runner, workspace or store.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import ipaddress
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stockade.errors import UserError
from stockade.sandbox._relay import _pump  # one byte pump for the proxy and the jail relay

DEFAULT_PORTS = (80, 443)
_MAX_HEADER = 64 * 1024
#: The user name in the proxy URL; the password is the per-item token.
PROXY_USER = "stockade"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
#: (family, sockaddr) pairs, as ``getaddrinfo`` gives them.
Resolved = list[tuple[int, Any]]
_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


@dataclass(frozen=True)
class Rule:
    host: str  # lower case; "*.suffix" for a wildcard
    port: int | None  # None: DEFAULT_PORTS

    def matches(self, host: str, port: int) -> bool:
        host = host.lower().rstrip(".")
        if self.port is None:
            if port not in DEFAULT_PORTS:
                return False
        elif port != self.port:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host


def parse_rule(pattern: str) -> Rule:
    text = pattern.strip().lower()
    host, port = text, None
    if text.startswith("["):  # [v6]:port
        end = text.find("]")
        host, rest = text[1:end], text[end + 1 :]
        if rest.startswith(":"):
            port = _port(pattern, rest[1:])
    elif text.count(":") == 1:
        host, p = text.split(":")
        port = _port(pattern, p)
    if not host or "/" in host or " " in host or ("*" in host and not host.startswith("*.")):
        raise UserError(f"bad network pattern {pattern!r}: use host, host:port or *.domain[:port]")
    return Rule(host, port)


def _port(pattern: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise UserError(f"bad port in network pattern {pattern!r}")
    return int(text)


def is_allowed(rules: Sequence[Rule], host: str, port: int) -> bool:
    return any(r.matches(host, port) for r in rules)


def _literal(host: str) -> IPAddress | None:
    try:
        return _unwrap(ipaddress.ip_address(host))
    except ValueError:
        return None


def _unwrap(addr: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 form carries (mapped, NAT64), else ``addr``."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
        if addr in _NAT64:
            return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return addr


def internal_kind(address: str) -> str | None:
    """Why ``address`` is not a public internet address, or None when it is."""
    addr = _unwrap(ipaddress.ip_address(address.split("%", 1)[0]))
    checks = (
        ("unspecified", addr.is_unspecified),
        ("loopback", addr.is_loopback),
        ("link-local", addr.is_link_local),
        ("multicast", addr.is_multicast),
        ("shared (CGNAT)", isinstance(addr, ipaddress.IPv4Address) and addr in _CGNAT),
        ("reserved", addr.is_reserved),
        ("private", addr.is_private),
        ("site-local", isinstance(addr, ipaddress.IPv6Address) and addr.is_site_local),
        ("not global", not addr.is_global),
    )
    return next((kind for kind, hit in checks if hit), None)


def refused_address(rules: Sequence[Rule], port: int, addresses: Sequence[str]) -> str | None:
    """The reason to refuse a request whose host resolved to ``addresses``, or None.

    An internal address passes only when an allowlist entry names it as an
    IP literal (for this port): allowing ``localhost:8000`` does not allow
    127.0.0.1, nor does a public name that resolves to a private address.
    """
    named = {(lit, r.port) for r in rules if (lit := _literal(r.host)) is not None}
    for address in addresses:
        kind = internal_kind(address)
        if kind is None:
            continue
        addr = _unwrap(ipaddress.ip_address(address.split("%", 1)[0]))
        if any(lit == addr and (p == port or (p is None and port in DEFAULT_PORTS))
               for lit, p in named):  # fmt: skip
            continue
        return f"resolves to {kind} address {address}"
    return None


def getaddrinfo_stream(host: str, port: int) -> Resolved:
    """Every (family, sockaddr) ``host`` resolves to for a TCP connection."""
    return [(i[0], i[4]) for i in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


def credential_headers(token: str) -> tuple[str, str]:
    """The token and the ``Basic`` credential a client sends for it (to mask both)."""
    basic = base64.b64encode(f"{PROXY_USER}:{token}".encode()).decode()
    return token, basic


def _authorized(lines: Sequence[str], expected: bytes) -> bool | None:
    """True for the right credential, False for a wrong one, None for none."""
    seen: bool | None = None
    for line in lines:
        name, _, value = line.partition(":")
        if name.strip().lower() != "proxy-authorization":
            continue
        seen = seen or False
        scheme, _, cred = value.strip().partition(" ")
        if scheme.lower() != "basic":
            continue
        try:
            decoded = base64.b64decode(cred.strip(), validate=True)
        except (ValueError, binascii.Error):
            continue
        if hmac.compare_digest(decoded, expected):
            seen = True
    return seen


def _split_hostport(text: str, default_port: int) -> tuple[str, int]:
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[1:end], text[end + 1 :]
        return host, int(rest[1:]) if rest.startswith(":") else default_port
    if ":" in text:
        host, port = text.rsplit(":", 1)
        return host, int(port)
    return text, default_port


class EgressProxy:
    """A filtering forward proxy on a unix socket. ``start`` once, ``close`` once."""

    def __init__(
        self,
        allow: Sequence[str],
        log_path: Path,
        socket_dir: Path,
        *,
        clock: Callable[[], float] = time.time,
        connect_timeout: float = 10.0,
        resolve: Callable[[str, int], Resolved] = getaddrinfo_stream,
        mask: Callable[[str], str] = lambda s: s,
    ) -> None:
        self.rules = tuple(parse_rule(p) for p in allow)
        #: Applied to every string logged (a step may put a secret in a URL or host name).
        self._mask = mask
        self.log_path = log_path
        self.socket_path = socket_dir / "egress.sock"
        #: The per-item credential (the password of the proxy URL).
        self.token = secrets.token_hex(16)
        self._expected = f"{PROXY_USER}:{self.token}".encode()
        self._clock = clock
        self._timeout = connect_timeout
        self._resolve = resolve
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._log_lock = threading.Lock()
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()

    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # sun_path holds 107 bytes; a deep run tree is longer. Binding through
        # an fd of the directory keeps the name short and the file in place.
        dfd = os.open(self.socket_path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            listener.bind(f"/proc/self/fd/{dfd}/{self.socket_path.name}")
        finally:
            os.close(dfd)
        # Jails may run as another uid (bwrap as nobody when the engine is
        # root). Whoever else reaches the socket lacks the credential.
        self.socket_path.chmod(0o666)
        listener.listen(128)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept_loop, name="egress-proxy", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        for c in list(self._conns):
            with contextlib.suppress(OSError):
                c.close()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def __enter__(self) -> EgressProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _log(self, **record: object) -> None:
        record = {"time": self._clock(),
                  **{k: self._mask(v) if isinstance(v, str) else v for k, v in record.items()}}
        line = json.dumps(record, sort_keys=True) + "\n"
        with self._log_lock, open(self.log_path, "a", encoding="utf-8") as f:
            f.write(line)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        self._conns.add(client)
        try:
            self._serve(client)
        except (OSError, ValueError):
            pass
        finally:
            self._conns.discard(client)
            with contextlib.suppress(OSError):
                client.close()

    def _serve(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                return
            head += chunk
            if len(head) > _MAX_HEADER:
                client.sendall(b"HTTP/1.1 431 Request Header Fields Too Large\r\n\r\n")
                return
        header, _, body = head.partition(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        auth = _authorized(lines[1:], self._expected)
        if auth is not True:
            reason = "proxy credential missing" if auth is None else "proxy credential wrong"
            self._log(method=method, target=target, allowed=False, reason=reason)
            client.sendall(
                b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                b'Proxy-Authenticate: Basic realm="stockade"\r\n'
                b"Connection: close\r\nContent-Length: 0\r\n\r\n"
            )
            return
        if method.upper() == "CONNECT":
            host, port = _split_hostport(target, 443)
            rest = b""
        else:
            if not target.lower().startswith("http://"):
                self._log(method=method, target=target, allowed=False, reason="not a proxy request")
                client.sendall(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
                return
            hostpart, slash, path = target[7:].partition("/")
            host, port = _split_hostport(hostpart, 80)
            kept = [ln for ln in lines[1:] if not ln.lower().startswith(("proxy-", "connection:"))]
            request = f"{method} {slash}{path} {version}\r\n" + "".join(f"{ln}\r\n" for ln in kept)
            rest = request.encode("latin-1") + b"Connection: close\r\n\r\n" + body
        if not is_allowed(self.rules, host, port):
            self._log(method=method, host=host, port=port, allowed=False, reason="not in allowlist")
            client.sendall(
                b"HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
            )
            return
        try:
            resolved = self._resolve(host, port)
        except (OSError, UnicodeError) as e:
            self._log(method=method, host=host, port=port, allowed=False, reason=f"resolve: {e}")
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n")
            return
        refusal = refused_address(self.rules, port, [str(sa[0]) for _, sa in resolved])
        if refusal is not None or not resolved:
            self._log(method=method, host=host, port=port, allowed=False,
                      reason=refusal or "resolves to no address")  # fmt: skip
            client.sendall(
                b"HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
            )
            return
        try:
            upstream, address = self._connect(resolved)
        except OSError as e:
            self._log(method=method, host=host, port=port, allowed=True, reason=f"connect: {e}")
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n")
            return
        upstream.settimeout(None)
        self._log(method=method, host=host, port=port, address=address, allowed=True,
                  reason="allowlisted")  # fmt: skip
        self._conns.add(upstream)
        try:
            if method.upper() == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                if body:
                    upstream.sendall(body)
            else:
                upstream.sendall(rest)
            t = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            t.start()
            _pump(client, upstream)
            t.join()
        finally:
            self._conns.discard(upstream)
            upstream.close()

    def _connect(self, resolved: Resolved) -> tuple[socket.socket, str]:
        """Connect to the first of the checked addresses that answers."""
        error: OSError = OSError("no address")
        for family, sockaddr in resolved:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.settimeout(self._timeout)
                sock.connect(sockaddr)
            except OSError as e:
                sock.close()
                error = e
                continue
            return sock, str(sockaddr[0])
        raise error
