"""The engine's lock on its run: how a crashed run is told from a running one.

While an engine executes a run it holds an ``flock`` on ``<run>/engine.lock``
(which also names its pid and host). The kernel drops the lock when the
process dies however it dies, so a run the store calls ``running`` whose lock
is free was left by a dead engine: ``crashed``, resumable. The same lock
keeps two engines from resuming one run at once.

Must not import the runner, the sandbox or the CLI.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from stockade.errors import UserError

LOCK_NAME = "engine.lock"


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str


class RunLock:
    """Held for the life of an engine on one run."""

    def __init__(self, run_path: Path) -> None:
        self.path = run_path / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        # A few tries: ``is_held`` takes the lock shared for an instant to look.
        for pause in (0.01, 0.05, 0.1, 0.25, 0.5, 0):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if pause:
                    time.sleep(pause)
        else:
            os.close(fd)
            holder = read_holder(self.path.parent)
            who = f" (pid {holder.pid} on {holder.host})" if holder else ""
            raise UserError(f"run {self.path.parent.name} is being executed by another "
                            f"engine{who}; wait for it or `stockade cancel` it") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": os.uname().nodename}).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def is_held(run_path: Path) -> bool:
    """Whether a live engine holds the run (False when there is no lock file)."""
    try:
        fd = os.open(run_path / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def read_holder(run_path: Path) -> Holder | None:
    try:
        data = json.loads((run_path / LOCK_NAME).read_text())
        return Holder(int(data["pid"]), str(data["host"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
