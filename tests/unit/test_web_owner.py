"""``web.owner``: reading the uid of a loopback client's socket from /proc/net/tcp{,6}."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from stockade.web.owner import (
    SCOPE_KEY,
    OwnerGuard,
    decode_address,
    diag_request,
    netlink_uid,
    peer_uid,
    uid_in_diag_reply,
    uid_in_table,
)

HEAD = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode")
HEAD6 = ("  sl  local_address                         remote_address                        st "
         "tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode")


def row(local: str, remote: str, uid: int, st: str = "01", inode: int = 4242) -> str:
    return (f"   7: {local} {remote} {st} 00000000:00000000 00:00000000 00000000 {uid:>5} "
            f"       0 {inode} 1 0000000000000000 20 4 30 10 -1")


LO = "0100007F"  # 127.0.0.1, each 32-bit word as a little-endian host prints it
CLIENT = ("127.0.0.1", 0xA2B4)
SERVER = ("127.0.0.1", 0x1F90)
C, S = f"{LO}:A2B4", f"{LO}:1F90"
LO6 = "00000000000000000000000001000000"  # ::1
MAPPED = "0000000000000000FFFF00000100007F"  # ::ffff:127.0.0.1


@pytest.mark.parametrize(("lines", "client", "server", "uid"), [
    # The client's end: local = client, remote = server.
    ([HEAD, row(C, S, 65534)], CLIENT, SERVER, 65534),
    # The server's own end (the other direction) says nothing about the client.
    ([HEAD, row(S, C, 0)], CLIENT, SERVER, None),
    ([HEAD, row(S, C, 0), row(C, S, 1000), row(f"{LO}:1F90", "00000000:0000", 0, "0A")],
     CLIENT, SERVER, 1000),
    # Another port, another server port, another address: not this connection.
    ([HEAD, row(f"{LO}:A2B5", S, 0)], CLIENT, SERVER, None),
    ([HEAD, row(C, f"{LO}:1F91", 0)], CLIENT, SERVER, None),
    ([HEAD, row("0100000A:A2B4", S, 0)], CLIENT, SERVER, None),
    # TIME_WAIT rows print uid 0 whoever owned them: a reused port must not pass as root.
    ([HEAD, row(C, S, 0, "06", 0), row(C, S, 65534)], CLIENT, SERVER, 65534),
    ([HEAD, row(C, S, 0, "06", 0)], CLIENT, SERVER, None),
    # A socket already closed by its process (inode 0) belongs to nobody we can name.
    ([HEAD, row(C, S, 0, "04", 0)], CLIENT, SERVER, None),
    # A half-closed client still owns its socket.
    ([HEAD, row(C, S, 1000, "05")], CLIENT, SERVER, 1000),
    # Two live rows that disagree: fail closed.
    ([HEAD, row(C, S, 0), row(C, S, 65534)], CLIENT, SERVER, None),
    # Lines that are no rows.
    ([HEAD, "", "garbage", "   1: zz:zz 0100007F:1F90 01 0 0 0 0 0 0", "  2: 01:01"],
     CLIENT, SERVER, None),
    ([], CLIENT, SERVER, None),
    # /proc/net/tcp6: ::1, and a dual-stack socket's IPv4-mapped 127.0.0.1.
    ([HEAD6, row(f"{LO6}:A2B4", f"{LO6}:1F90", 1000)], ("::1", 0xA2B4), ("::1", 0x1F90), 1000),
    ([HEAD6, row(f"{MAPPED}:A2B4", f"{MAPPED}:1F90", 1000)], CLIENT, SERVER, 1000),
    ([HEAD6, row(f"{MAPPED}:A2B4", f"{MAPPED}:1F90", 1000)], ("::ffff:127.0.0.1", 0xA2B4),
     SERVER, 1000),
    # A client address that is no address at all.
    ([HEAD, row(C, S, 0)], ("testclient", 0xA2B4), SERVER, None),
])
def test_uid_of_the_clients_row(lines: list[str], client: tuple[str, int],
                                server: tuple[str, int], uid: int | None) -> None:
    assert uid_in_table(lines, client, server, byteorder="little") == uid


def test_addresses_are_read_in_host_byte_order() -> None:
    assert decode_address("0100007F:1F90", "little") == (ipaddress.ip_address("127.0.0.1"), 8080)
    assert decode_address("7F000001:1F90", "big") == (ipaddress.ip_address("127.0.0.1"), 8080)
    assert decode_address(f"{LO6}:0050", "little") == (ipaddress.ip_address("::1"), 80)
    assert decode_address(f"{MAPPED}:0050", "little")[0] == ipaddress.ip_address("127.0.0.1")
    for bad in ("0100007F", "01007F:1F90", "nothex00:1F90"):
        with pytest.raises(ValueError):
            decode_address(bad, "little")


def reply(uid: int, state: int = 1, inode: int = 4242, client: tuple[str, int] = CLIENT,
          server: tuple[str, int] = SERVER, seq: int = 1, kind: int = 20) -> bytes:
    """A sock_diag answer as the kernel writes it (inet_diag_msg after nlmsghdr)."""
    family = socket.AF_INET6 if ":" in client[0] else socket.AF_INET
    sockid = struct.pack("!HH", client[1], server[1]) \
        + socket.inet_pton(family, client[0]).ljust(16, b"\0") \
        + socket.inet_pton(family, server[0]).ljust(16, b"\0") + struct.pack("=III", 0, 1, 2)
    msg = struct.pack("=BBBB48sIIIII", family, state, 0, 0, sockid, 0, 0, 0, uid, inode)
    return struct.pack("=IHHII", 16 + len(msg), kind, 0, seq, 0) + msg


ERROR = struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", -2) + bytes(16)


@pytest.mark.parametrize(("data", "uid"), [
    (reply(65534), 65534),
    (reply(0), 0),
    (reply(1000, state=5), 1000),  # FIN_WAIT2: still its process's
    (reply(0, state=6, inode=0), None),  # TIME_WAIT: uid 0 whoever owned it
    (reply(0, state=4, inode=0), None),  # closed by its process
    (reply(0, state=10), None),  # a listener, not a connection
    (reply(1000, client=("127.0.0.1", 0xA2B5)), None),  # about another socket
    (reply(1000, server=("127.0.0.2", 0x1F90)), None),
    (reply(1000, seq=7), None),  # an answer to another question
    (reply(1000, kind=3), None),
    (reply(1000)[:40], None),
    (ERROR, None),  # ENOENT: no such socket
    (b"", None),
])
def test_uid_of_a_sock_diag_answer(data: bytes, uid: int | None) -> None:
    assert uid_in_diag_reply(data, CLIENT, SERVER) == uid


def test_a_dual_stack_answer_names_the_ipv4_client() -> None:
    data = reply(1000, client=("::ffff:127.0.0.1", CLIENT[1]), server=("::ffff:127.0.0.1", 8080))
    assert uid_in_diag_reply(data, CLIENT, SERVER) == 1000


def test_the_sock_diag_request_names_the_clients_end() -> None:
    req = diag_request(CLIENT, SERVER)
    assert req is not None and len(req) == 16 + 56
    length, kind, flags = struct.unpack_from("=IHH", req)
    assert (length, kind, flags) == (72, 20, 1)
    assert struct.unpack_from("!HH", req, 24) == (CLIENT[1], SERVER[1])
    assert req[28:32] == socket.inet_aton(CLIENT[0]) and req[44:48] == socket.inet_aton(SERVER[0])
    assert diag_request(("testclient", 1), SERVER) is None


def connected() -> tuple[socket.socket, socket.socket, socket.socket]:
    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(1)
    cli = socket.create_connection(lsn.getsockname())
    srv, _ = lsn.accept()
    return lsn, cli, srv


def test_the_real_table_names_this_processs_own_connection() -> None:
    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("needs Linux's /proc/net/tcp")
    lsn, cli, srv = connected()
    try:
        client, server = srv.getpeername(), srv.getsockname()
        # Both ways of asking agree, on a socket that exists.
        assert netlink_uid(client, server) == os.geteuid()
        assert peer_uid(client, server, netlink=False) == os.geteuid()
        assert peer_uid(client, server) == os.geteuid()
        assert netlink_uid(("127.0.0.1", 1), server) is None
    finally:
        for s in (cli, srv, lsn):
            s.close()
    # No /proc (another OS, a sandbox without it): nothing can be told.
    assert peer_uid(CLIENT, SERVER, proc_net="/nonexistent/proc/net") is None
    assert peer_uid(None, SERVER) is None


def call(guard: OwnerGuard, scope: dict[str, Any]) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    # In a thread of its own: a browser test's session may hold this thread's loop.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, guard({"type": "http", "headers": [], **scope}, receive,
                                       send)).result()
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body


async def ok_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_guard_fails_closed_and_admits_its_own_user() -> None:
    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("needs Linux's /proc/net/tcp")
    guard = OwnerGuard(ok_app)
    # No such connection in the table (here: the port of no socket): refused.
    status, body = call(guard, {"client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)})
    assert status == 403 and b"cannot be told" in body and body.count(b"\n") == 1
    status, body = call(guard, {"client": None, "server": None})
    assert status == 403
    # A real connection of this process, checked per request (no uid read at connect).
    lsn, cli, srv = connected()
    try:
        assert call(guard, {"client": srv.getpeername(), "server": srv.getsockname()}) \
            == (200, b"ok")
    finally:
        for s in (cli, srv, lsn):
            s.close()
    # The uid read when the connection was made decides, another user's or unknown.
    assert call(guard, {SCOPE_KEY: os.geteuid()}) == (200, b"ok")
    status, body = call(guard, {SCOPE_KEY: os.geteuid() + 1})
    assert status == 403 and f"serves only uid {os.geteuid()}".encode() in body
    assert f"from uid {os.geteuid() + 1}".encode() in body
    assert call(guard, {SCOPE_KEY: None})[0] == 403

