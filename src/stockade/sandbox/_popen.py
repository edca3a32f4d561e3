"""A ``Running`` over ``subprocess.Popen`` in its own session (process group).

Shared by backends that start the jail as a direct child. Must not import the
runner.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

#: Moves inherited fds to 3, 4, ... and execs the command: subprocess keeps
#: ``pass_fds`` at their own numbers, and a ``preexec_fn`` is unsafe in a
#: threaded engine. Costs one interpreter start, only when fds are passed.
_PLACE_FDS = (
    "import fcntl,os,sys\n"
    "k=int(sys.argv[1]);src=[int(x) for x in sys.argv[2:2+k]];argv=sys.argv[2+k:]\n"
    "high=[fcntl.fcntl(f,fcntl.F_DUPFD_CLOEXEC,100) for f in src]\n"
    "for f in src:os.close(f)\n"
    "for i,f in enumerate(high):os.dup2(f,3+i)\n"
    "for f in high:os.close(f)\n"
    "os.execvp(argv[0],argv)\n"
)


def place_fds_argv(argv: Sequence[str], fds: Sequence[int]) -> list[str]:
    """``argv`` behind the shim that puts ``fds`` at 3, 4, ... (unchanged without fds)."""
    if not fds:
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", _PLACE_FDS, str(len(fds)), *map(str, fds), *argv]


class PopenJail:
    """A child started with ``start_new_session=True`` so its group can be killed whole.

    ``fds`` are open fds the child gets at 3, 4, ... (``Policy.pass_fds``).
    ``user``/``group`` switch the child to another uid before exec (the engine
    runs as root: the jail must not be host root, see ``bwrap``).
    ``on_exit`` runs once after the child has been reaped (releases helpers).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        stdout: IO[bytes] | int,
        stderr: IO[bytes] | int,
        fds: Sequence[int] = (),
        user: int | None = None,
        group: int | None = None,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        self._proc = subprocess.Popen(
            place_fds_argv(argv, fds),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(fds),
            user=user,
            group=group,
            extra_groups=[] if user is not None else None,
        )
        self._on_exit = on_exit
        self._pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(self._proc.pid)

    def __del__(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None

    @property
    def pid(self) -> int:
        pid: int = self._proc.pid
        return pid

    def wait(self, timeout: float | None = None) -> int | None:
        if timeout is not None and self._proc.returncode is None and not self._exited(timeout):
            return None
        try:
            status: int = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        if self._on_exit is not None:
            hook, self._on_exit = self._on_exit, None
            hook()
        return status

    def _exited(self, timeout: float) -> bool:
        """Block until the child exits or ``timeout`` passes, without polling.

        ``Popen.wait(timeout)`` sleeps in growing steps (up to 50 ms), which
        would add tens of ms to every short item; a pidfd wakes us at once.
        """
        if self._pidfd is None:
            return True  # let Popen.wait poll
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        return bool(poller.poll(max(timeout, 0) * 1000))

    def kill(self, grace: float = 2.0) -> None:
        if self._proc.returncode is not None:
            return  # reaped: the pid may belong to someone else now
        for sig, wait_for in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, sig)
            if self.wait(wait_for) is not None:
                # The leader is gone; a pid stays reserved while its group has
                # members, so this reaches only leftovers of this jail.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
                return
