"""``Policy.pass_fds``: an open fd reaches the jail at 3 (the agent's broker line), and
nothing else does; AF_UNIX stays refused on landlock even with a socket mounted."""

from __future__ import annotations

import secrets
import socket

import pytest

from stockade.sandbox import ExtraMount
from tests.sandbox.conftest import World, host_daemon_socket

#: Answers over fd 3 and lists every other fd above 2 that is open.
FD3 = (
    "import os, socket, sys\n"
    "s = socket.socket(fileno=3)\n"
    "s.sendall(sys.argv[1][::-1].encode())\n"
    "print('got', s.recv(100).decode())\n"
    "print('names', repr(s.getsockname()), repr(s.getpeername()))\n"
    "extra = []\n"
    "for fd in range(4, 1024):\n"
    "    try:\n"
    "        os.fstat(fd)\n"
    "        extra.append(fd)\n"
    "    except OSError:\n"
    "        pass\n"
    "print('extra', extra)\n"
)


def _round_trip(world: World) -> None:
    here, there = socket.socketpair()
    token, reply = secrets.token_hex(8), secrets.token_hex(8)
    with here, there:
        here.sendall(reply.encode())  # waits in the buffer for the jail
        r = world.py(FD3, token, pass_fds=(there.fileno(),))
        here.settimeout(5)
        heard = here.recv(100).decode()
    assert r.status == 0, r.both
    assert heard == token[::-1]
    assert f"got {reply}" in r.out
    assert "names '' ''" in r.out  # an unnamed pair: nothing to find or connect to
    assert "extra []" in r.out, r.both  # no other fd (bwrap's seccomp fd is gone too)


def test_passed_fd_lands_on_3_and_nothing_else_leaks(world: World) -> None:
    _round_trip(world)


def test_passed_fd_without_a_sandbox(none_world: World) -> None:
    """The none backend places it the same way (its C launcher)."""
    _round_trip(none_world)


CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "    s.connect(sys.argv[1])\n"
    "    print('connected')\n"
    "except OSError as e:\n"
    "    print('blocked', e.errno)\n"
)


def _mounted_daemon(world: World) -> tuple[str, bool]:
    path = world.base / "daemon.sock"
    srv = host_daemon_socket(path)
    try:
        r = world.py(CONNECT, str(path), mounts=(ExtraMount(path, str(path)),))
        try:
            conn, _ = srv.accept()
            conn.close()
            reached = True
        except OSError:
            reached = False
    finally:
        srv.close()
    return r.both, reached


@pytest.mark.parametrize("backend", ["landlock", "landlock-python"], indirect=True)
def test_landlock_refuses_af_unix_even_with_a_socket_mounted(world: World) -> None:
    """A mounted socket used to switch AF_UNIX back on (for the agent's broker),
    and with it every pathname socket the step could name."""
    out, reached = _mounted_daemon(world)
    assert "blocked" in out and "connected" not in out, out
    assert not reached


def test_a_mounted_socket_is_reachable_without_a_sandbox(none_world: World) -> None:
    """The positive control: the same attempt reaches the daemon under none."""
    out, reached = _mounted_daemon(none_world)
    assert "connected" in out, out
    assert reached
