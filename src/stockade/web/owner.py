"""The web UI serves only the user who started it: the owner of each client socket.

Binding 127.0.0.1 keeps other machines out, not other users of this one: any
local account could read every run's logs and files through the server (whose
user may read them when theirs may not) and, with the token its pages carry,
act as that user. A loopback TCP connection does not carry its peer's
credentials (``SO_PEERCRED`` is for Unix sockets), but Linux knows the uid
that owns each end: the client's end is the socket whose local address is
the request's client address and whose remote address is the server's. It is
asked for that one socket over netlink (``sock_diag``, a hash lookup: some
20 µs) and, where netlink cannot answer, found in ``/proc/net/tcp`` and
``/proc/net/tcp6`` (which the kernel writes out whole: 6 to 12 ms a read on a
host with a few thousand sockets).

The check runs once per connection (``checked_protocol`` wraps uvicorn's
protocol: keep-alive requests cost nothing more) and, for a request that
arrives any other way, once per request in ``OwnerGuard``. A uid that cannot be
read (no /proc, no row) is refused: this fails closed. Must not import the rest
of stockade.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import pwd
import socket
import struct
import sys
from collections.abc import Iterable
from typing import Any, Literal

from starlette.types import ASGIApp, Receive, Scope, Send

#: Where ``checked_protocol`` leaves the uid it read for its connection (None: unknown).
SCOPE_KEY = "stockade.peer_uid"
#: /proc/net/tcp states in which a socket still belongs to a process. TIME_WAIT (06)
#: rows print uid 0 whoever owned the socket, and a row whose inode is 0 has no
#: socket left to own: both are skipped, or a reused port could pass as root's.
LIVE_STATES = frozenset({"01", "02", "03", "04", "05", "08", "09", "0B"})

Address = tuple[str, int]


def decode_address(text: str, byteorder: Literal["little", "big"] = sys.byteorder
                   ) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``0100007F:1F90`` -> (127.0.0.1, 8080): each 32-bit word is in host byte order."""
    host, _, port = text.partition(":")
    raw = bytes.fromhex(host)
    if len(raw) not in (4, 16) or not port:
        raise ValueError(f"not an address: {text!r}")
    if byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(raw)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        # A dual-stack client's socket lists 127.0.0.1 as ::ffff:127.0.0.1.
        return addr.ipv4_mapped, int(port, 16)
    return addr, int(port, 16)


def _same(addr: tuple[Any, int], want: Address) -> bool:
    try:
        wanted = ipaddress.ip_address(want[0])
    except ValueError:
        return False
    if isinstance(wanted, ipaddress.IPv6Address) and wanted.ipv4_mapped is not None:
        wanted = wanted.ipv4_mapped
    return addr[0] == wanted and addr[1] == int(want[1])


def uid_in_table(lines: Iterable[str], client: Address, server: Address,
                 byteorder: Literal["little", "big"] = sys.byteorder) -> int | None:
    """The uid owning the client's end of ``client`` -> ``server`` in /proc/net/tcp{,6} text.

    None when no live row matches, or when two rows disagree (fail closed).
    """
    found: set[int] = set()
    for line in lines:
        f = line.split()
        if len(f) < 10 or not f[0].endswith(":") or not f[0][:-1].isdigit():
            continue  # the header, or a line this parser does not know
        if f[3] not in LIVE_STATES or f[9] == "0":
            continue
        try:
            local, remote = decode_address(f[1], byteorder), decode_address(f[2], byteorder)
            uid = int(f[7])
        except ValueError:
            continue
        if _same(local, client) and _same(remote, server):
            found.add(uid)
    return found.pop() if len(found) == 1 else None


# -- netlink sock_diag: the one socket, looked up by its four addresses ---------------

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
#: ``/proc/net/tcp``'s states as the numbers netlink gives.
_LIVE = frozenset(int(s, 16) for s in LIVE_STATES)
_HEADER = struct.Struct("=IHHII")
#: inet_diag_msg after the header: family, state, timer, retrans, the 48-byte
#: socket id, expires, rqueue, wqueue, uid, inode.
_MSG = struct.Struct("=BBBB48sIIIII")


def diag_request(client: Address, server: Address, seq: int = 1) -> bytes | None:
    """A sock_diag request for the TCP socket whose local end is ``client`` and remote
    ``server`` (None for an address that is not an IP address)."""
    family = socket.AF_INET6 if ":" in client[0] else socket.AF_INET
    try:
        src = socket.inet_pton(family, client[0]).ljust(16, b"\0")
        dst = socket.inet_pton(family, server[0]).ljust(16, b"\0")
        ports = struct.pack("!HH", int(client[1]), int(server[1]))
    except (OSError, ValueError, struct.error):
        return None
    # All states, any interface, no cookie (0xffffffff twice).
    body = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF) + ports + src + dst \
        + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)
    return _HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, seq, 0) \
        + body


def uid_in_diag_reply(data: bytes, client: Address, server: Address,
                      seq: int = 1) -> int | None:
    """The uid in a sock_diag answer, if it is about ``client`` -> ``server`` and the
    socket still belongs to a process (the same rule as ``uid_in_table``)."""
    if len(data) < _HEADER.size + _MSG.size:
        return None  # an error (no such socket) or a short answer
    length, kind, _flags, got_seq, _pid = _HEADER.unpack_from(data)
    if kind != SOCK_DIAG_BY_FAMILY or got_seq != seq or length > len(data):
        return None
    family, state, _t, _r, sockid, _e, _rq, _wq, uid, inode = _MSG.unpack_from(data, _HEADER.size)
    if state not in _LIVE or inode == 0:
        return None
    sport, dport = struct.unpack_from("!HH", sockid)
    size = 16 if family == socket.AF_INET6 else 4
    try:
        src = ipaddress.ip_address(sockid[4:4 + size])
        dst = ipaddress.ip_address(sockid[20:20 + size])
    except ValueError:
        return None
    if not (_same((_unmapped(src), sport), client) and _same((_unmapped(dst), dport), server)):
        return None
    return int(uid)


def _unmapped(addr: ipaddress.IPv4Address | ipaddress.IPv6Address
              ) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def netlink_uid(client: Address, server: Address) -> int | None:
    """The client socket's uid as sock_diag tells it; None if netlink cannot say."""
    req = diag_request(client, server)
    if req is None:
        return None
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as s:
            s.settimeout(2.0)
            s.sendto(req, (0, 0))
            data = s.recv(8192)
    except (OSError, AttributeError):
        return None  # no netlink here (another OS, a sandbox that forbids it)
    return uid_in_diag_reply(data, client, server)


def peer_uid(client: Address | None, server: Address | None,
             proc_net: str = "/proc/net", netlink: bool = True) -> int | None:
    """The uid owning the client's socket of a TCP connection to this server, or None."""
    if not client or not server:
        return None
    if netlink:
        uid = netlink_uid(client, server)
        if uid is not None:
            return uid
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_net, name), encoding="ascii", errors="replace") as f:
                uid = uid_in_table(f, client, server)
        except OSError:
            continue
        if uid is not None:
            return uid
    return None


def user_text(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def refusal(own: int, uid: int | None) -> str:
    """The one line a refused client reads."""
    who = (f"this connection is from {user_text(uid)}" if uid is not None else
           "the user of this connection cannot be told (no matching row in /proc/net/tcp)")
    return (f"this stockade ui serves only {user_text(own)}, the user who started it; "
            f"{who}: start your own with `stockade ui`\n")


class OwnerGuard:
    """Answers 403 to every request whose client socket is not the server's own user's."""

    def __init__(self, app: ASGIApp, uid: int | None = None) -> None:
        self.app = app
        self.uid = os.geteuid() if uid is None else uid

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if SCOPE_KEY in scope:
            uid = scope[SCOPE_KEY]
        else:
            # Not through checked_protocol (another server, a websocket upgrade): per request.
            uid = peer_uid(scope.get("client"), scope.get("server"))
        if uid != self.uid:
            body = refusal(self.uid, uid).encode()
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await send({"type": "http.response.start", "status": 403,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                    (b"content-length", str(len(body)).encode()),
                                    (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


class _Tagged:
    """The app of one connection: every request on it carries the uid read at connect."""

    def __init__(self, app: ASGIApp, uid: int | None) -> None:
        self.app = app
        self.uid = uid

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[SCOPE_KEY] = self.uid
        await self.app(scope, receive, send)


def checked_protocol(base: type[asyncio.Protocol] | None = None) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, reading the peer's uid once when a connection is made."""
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        base = AutoHTTPProtocol

    class Checked(base):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            server = self.server if isinstance(self.server, tuple) and self.server[1] else None
            # Read now, while the client's socket is surely open; a later request on
            # this connection reuses it (the connection, not its port, is the key).
            # Should uvicorn stop calling ``self.app``, requests go untagged and
            # OwnerGuard checks each one: slower, never open.
            inner: ASGIApp = self.app  # type: ignore[has-type]
            self.app = _Tagged(inner, peer_uid(self.client, server))

    Checked.__name__ = Checked.__qualname__ = f"OwnerChecked{base.__name__}"
    return Checked
