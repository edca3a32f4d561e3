"""Temporary folders a killed engine does not leave behind for long.

A backend's host-side folders (bwrap's /etc snapshot in /dev/shm, its bridge
points in /tmp) are removed by ``close()`` or at exit, but an engine killed
with SIGKILL runs neither. Each folder therefore holds an ``flock`` on its
``.owner`` file for as long as the process that made it lives (the kernel
drops the lock with the process, whatever its pid namespace), and every new
folder first sweeps away the ones whose lock nobody holds.

Stdlib only; must not import the rest of stockade.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import tempfile

OWNER = ".owner"


def owned_tmpdir(prefix: str, parent: str | None = None) -> tuple[str, int]:
    """Make a folder under ``parent`` (the temp dir by default), mode 0755.

    Returns its path and the fd holding its lock: close that fd after
    removing the folder. Stale folders with the same prefix go first.
    """
    parent = parent or tempfile.gettempdir()
    # The host name is part of the name: on a temp dir shared over the
    # network a lock taken on another machine may not be visible here, so a
    # sweep only ever judges this machine's folders.
    prefix = f"{prefix}{socket.gethostname()}-"
    sweep(parent, prefix)
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    os.chmod(path, 0o755)
    # Locked under a temporary name, then renamed: a sweeper that finds
    # ``.owner`` always finds it locked.
    pending = os.path.join(path, OWNER + ".new")
    fd = os.open(pending, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(pending, os.path.join(path, OWNER))
    return path, fd


def sweep(parent: str, prefix: str) -> int:
    """Remove ``parent/prefix*`` folders whose owner is gone; returns how many.

    Folders without an ``.owner`` file (being made right now, or left by an
    older stockade) are left alone.
    """
    removed = 0
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return 0
    for name in names:
        path = os.path.join(parent, name)
        try:
            fd = os.open(os.path.join(path, OWNER), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # its owner is alive
        with contextlib.suppress(OSError):
            shutil.rmtree(path)
            removed += 1
        os.close(fd)
    return removed
