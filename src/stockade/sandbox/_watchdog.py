"""The watchdog: a small process that ends every jail of an engine that died.

A thread cannot do this (it dies with the engine's SIGKILL) and a
parent-death signal reaches only a jail's first process, not what it forked.
So each engine starts one watchdog, in its own session (a Ctrl-C to the
engine's process group does not reach it), holding the read end of a pipe
whose only write end the engine holds. When the engine's end closes, however
the engine ended, the watchdog

* kills the engine's cgroup folder whole (every jail's cgroup is below it)
  and waits until it is empty, then removes the folders; or, without
  cgroups,
* SIGKILLs every process group the engine registered (``+PGID`` / ``-PGID``
  lines on the pipe).

The engine runs as root or as its user; jails run as another uid, in
another pid namespace (bwrap) or under Landlock's signal scope, so they
cannot signal the watchdog. Under ``none`` nothing stops them.

Stdlib only, plus ``_cgroup``: it is loaded without the ``stockade`` package
(see ``Watchdog``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from stockade.sandbox import _cgroup


def _end_all(kill: Sequence[str] | None, folders: Sequence[Sequence[str]], groups: set[int]) -> None:
    for pgid in groups:
        if pgid > 1:  # never our own group (0) or init's
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)
    if kill is not None:
        _cgroup.end(kill[0], kill[1], timeout=10.0)
    _cgroup.remove(f for _, f in folders)


def main(argv: Sequence[str]) -> None:
    """``argv[0]``: JSON ``{"kill": [kind, folder] | null, "folders": [[kind, folder], ...]}``."""
    spec = json.loads(argv[0])
    os.chdir("/")
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    # Stopped by an administrator: clean up as if the engine had died.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    groups: set[int] = set()
    try:
        for line in sys.stdin.buffer:
            with contextlib.suppress(ValueError):
                if line[:1] == b"+":
                    groups.add(int(line[1:]))
                elif line[:1] == b"-":
                    groups.discard(int(line[1:]))
    finally:
        _end_all(spec["kill"], spec["folders"], groups)


class Watchdog:
    """The engine's side: start once, register process groups, never stop.

    The pipe closes when the engine ends (exit, crash or SIGKILL) and not
    before: the engine holds its only write end, close-on-exec.
    """

    def __init__(
        self, kill: tuple[str, str] | None, folders: Sequence[tuple[str, str]]
    ) -> None:
        here = Path(__file__).resolve().parent
        # Load only this module and _cgroup: stand-in package objects keep
        # ``stockade/__init__`` and the sandbox package out of the watchdog.
        code = (
            "import sys, types\n"
            f"for name, path in (('stockade', {str(here.parent)!r}), "
            f"('stockade.sandbox', {str(here)!r})):\n"
            "    m = types.ModuleType(name); m.__path__ = [path]; sys.modules[name] = m\n"
            "from stockade.sandbox._watchdog import main\n"
            "main(sys.argv[1:])\n"
        )
        spec = json.dumps({"kill": list(kill) if kill else None, "folders": [list(f) for f in folders]})
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", code, spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            close_fds=True,
            start_new_session=True,
        )
        assert self._proc.stdin is not None
        self._pipe = self._proc.stdin
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def add(self, pgid: int) -> None:
        self._send(b"+%d\n" % pgid)

    def remove(self, pgid: int) -> None:
        self._send(b"-%d\n" % pgid)

    def close(self, timeout: float = 30.0) -> None:
        """Close our end and wait for the watchdog to finish ending things."""
        with self._lock:
            self._pipe.close()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _send(self, line: bytes) -> None:
        # One short write per line (atomic on a pipe); a dead watchdog is
        # reported by ``alive``, not here.
        with self._lock, contextlib.suppress(OSError, ValueError):
            os.write(self._pipe.fileno(), line)


if __name__ == "__main__":
    main(sys.argv[1:])
