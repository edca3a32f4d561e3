"""A ``Running`` over ``subprocess.Popen`` in its own session (process group).

Shared by backends that start the jail as a direct child. Must not import the
runner.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO


class PopenJail:
    """A child started with ``start_new_session=True`` so its group can be killed whole."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        stdout: IO[bytes] | int,
        stderr: IO[bytes] | int,
        pass_fds: Sequence[int] = (),
    ) -> None:
        self._proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self, grace: float = 2.0) -> None:
        for sig, wait_for in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self._proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            if self.wait(wait_for) is not None:
                # The leader is gone; make sure nothing else in its group lingers.
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                return
