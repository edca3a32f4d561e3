"""A network namespace of its own for a landlock jail with ``network: proxy``.

Landlock's TCP rules name ports, not addresses: on the host's network stack
a jail allowed to connect to the relay's port could connect to *any*
address on that port number. A root engine closes that: each such item gets
a fresh network namespace where only ``lo`` is up and the engine's relay
listens on 127.0.0.1. ``create`` makes it on a short-lived thread (a
thread's ``unshare(CLONE_NEWNET)`` moves that thread only, and it ends
right after), binds the listener there and keeps an fd of the namespace;
the launcher's child joins it with ``setns`` before it drops privileges
(``_jail.c``, ``_forkserver._child``). The listener keeps working from any
thread: a socket belongs to the namespace it was made in.

``unavailable`` says why this engine cannot (not root, or root without
``CAP_SYS_ADMIN``, as in most containers); it tries once per process.

Standard library only; must not import the rest of stockade.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import socket
import struct
import threading
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags in a 24-byte union


@dataclass
class PrivateNet:
    """A fresh network namespace: its fd and the relay's listener in it."""

    #: An ``O_RDONLY`` fd of ``/proc/thread-self/ns/net`` (for ``setns``).
    fd: int
    #: Listening on 127.0.0.1 (any port) inside the namespace.
    listener: socket.socket

    def close(self) -> None:
        """Close the namespace fd (the listener belongs to whoever serves it)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _lo_up() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        got = fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0))
        flags = struct.unpack(_IFREQ, got)[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))
    finally:
        s.close()


def _make() -> PrivateNet:
    """On a thread that ends right after: the namespace, ``lo`` up, the listener."""
    if _libc().unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    _lo_up()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except BaseException:
        listener.close()
        raise
    return PrivateNet(fd, listener)


def create() -> PrivateNet:
    """A fresh network namespace with only ``lo`` up and a listener on
    127.0.0.1 (any port) in it. Raises ``OSError`` when the engine
    may not make one."""
    result: list[PrivateNet | BaseException] = []

    def run() -> None:
        try:
            result.append(_make())
        except BaseException as e:  # handed to the caller
            result.append(e)

    # A thread of its own: the namespace change is the thread's, and the
    # thread ends here, so no other work ever runs in the namespace.
    t = threading.Thread(target=run, name="stockade-netns", daemon=True)
    t.start()
    t.join()
    (got,) = result
    if isinstance(got, BaseException):
        raise got
    return got


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why this engine cannot give jails a network namespace, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the engine is not root"
    try:
        net = create()
    except OSError as e:
        return f"the engine cannot create a network namespace: {e.strerror or e}"
    net.listener.close()
    net.close()
    return None
