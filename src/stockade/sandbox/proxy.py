"""The egress proxy: HTTP CONNECT and plain-HTTP forwarding to allowlisted hosts.

It runs on the host (threads in the engine process) and listens on a unix
socket that backends expose in the jail (bwrap through an in-jail relay on
127.0.0.1; landlock through a host loopback relay whose port is the only one
the jail may connect to). Every allowed and refused connection is one JSON
line in ``log_path``.

Patterns: ``host`` (ports 80 and 443), ``host:port``, ``*.example.org`` and
``*.example.org:443`` (any subdomain, not the apex). Host names compare
case-insensitively; IP literals only match themselves.

Must not import runner, workspace or store.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from stockade.errors import UserError
from stockade.sandbox._relay import _pump  # one byte pump for the proxy and the jail relay

DEFAULT_PORTS = (80, 443)
_MAX_HEADER = 64 * 1024


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
    ) -> None:
        self.rules = tuple(parse_rule(p) for p in allow)
        self.log_path = log_path
        self.socket_path = socket_dir / "egress.sock"
        self._clock = clock
        self._timeout = connect_timeout
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
        # Jails may run as another uid (bwrap as nobody when the engine is root).
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
        record = {"time": self._clock(), **record}
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
            upstream = socket.create_connection((host, port), timeout=self._timeout)
        except OSError as e:
            self._log(method=method, host=host, port=port, allowed=True, reason=f"connect: {e}")
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n")
            return
        upstream.settimeout(None)
        self._log(method=method, host=host, port=port, allowed=True, reason="allowlisted")
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

