"""Start bwrap straight from the engine with the C launcher, no exec helper.

bwrap confines itself, so the engine only has to start it: ``_jail.spawn``
vforks (nothing of the engine is copied), switches uid when the engine is
root, sets the parent-death signal and execs. That saves the helper's round
trip (a JSON request, a Python process waking twice per item), about half a
millisecond of CPU per item on the machines we measured.

Two rules make this safe in a threaded engine:

* The parent-death signal fires when the *thread* that forked the child
  ends (prctl(2)), and a thread may end while its jail still runs. So a
  spawn runs on one long-lived launcher thread, which ends only at
  ``close`` or with the engine, unless the calling thread declared with
  ``launch_here`` that it outlives every jail it starts (the local
  executor's item threads: each waits for its jail, and the pool ends only
  after its last attempt). Those start their jails themselves, which saves
  two thread hand-offs per item (about 0.13 ms of CPU measured).
* Only ``wait`` reaps, under a lock, and kills go to the process group only
  while its leader is unreaped: an exited leader stays a zombie, which keeps
  its pid (and so the group id) from naming anyone else. The wait itself
  polls a pidfd, so no thread sleeps in ``waitpid`` holding the lock.

Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import queue
import select
import signal
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: The longest single poll() in ``DirectRunning.wait`` (seconds).
_SLICE = 3600.0
_FS_ENCODING = sys.getfilesystemencoding()
_FS_ERRORS = sys.getfilesystemencodeerrors()


def available() -> bool:
    """Whether the C launcher (``stockade.sandbox._jail``) is installed."""
    return importlib.util.find_spec("stockade.sandbox._jail") is not None


_here = threading.local()
_devnull_lock = threading.Lock()
_devnull = -1


def launch_here() -> None:
    """Declare that the calling thread outlives every process it starts (it
    waits for each one, or lives as long as the engine): spawns from it then
    run on it, not on the launcher thread (see the module doc)."""
    _here.on = True


def _stdin() -> int:
    """/dev/null for every started process's stdin (opened once; it lives as
    long as the engine)."""
    global _devnull
    with _devnull_lock:
        if _devnull < 0:
            _devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        return _devnull


@dataclass
class _Request:
    exe: bytes
    argv: list[bytes]
    env: list[bytes]
    fds: list[int]
    uid: int
    gid: int
    cwd: bytes = b"/"
    limits: list[tuple[int, int]] = field(default_factory=list)
    cgroups: list[int] = field(default_factory=list)
    cgroup_dir: int = -1
    #: Set by the launcher thread once it answered (None: started on the caller's thread).
    done: threading.Event | None = None
    pid: int = 0
    pidfd: int = -1
    error: OSError | None = None


class DirectRunning:
    """A process started by the launcher thread; the Running protocol."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self._pid = pid
        self._pidfd = pidfd
        self._lock = threading.Lock()
        self._status: int | None = None
        # Closed when the last reference goes: a thread may still be polling
        # it when another one reaps.
        weakref.finalize(self, os.close, pidfd)

    @property
    def pid(self) -> int:
        return self._pid

    def wait(self, timeout: float | None = None) -> int | None:
        if self._status is not None:
            return self._status
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            # poll() takes an int of milliseconds: wait in bounded slices, so
            # a step timeout of months does not overflow it.
            left = _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())
            if poller.poll(max(0, math.ceil(left * 1000))):
                break
            if deadline is not None and time.monotonic() >= deadline:
                return None
        with self._lock:
            if self._status is None:
                # Whatever the leader left in its session goes with it, while
                # the zombie still holds the group id.
                with contextlib.suppress(OSError):
                    os.killpg(self._pid, signal.SIGKILL)
                _, status = os.waitpid(self._pid, 0)
                self._status = os.waitstatus_to_exitcode(status)
        return self._status

    def kill(self, grace: float = 2.0) -> None:
        for sig, wait_for in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            with self._lock:
                if self._status is not None:
                    return
                with contextlib.suppress(OSError):
                    os.killpg(self._pid, sig)
            if self.wait(wait_for) is not None:
                return


class LauncherThread:
    """One thread that starts processes with ``_jail.spawn``; see the module doc."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def spawn(
        self,
        exe: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        fds: Sequence[int],
        *,
        uid: int | None = None,
        gid: int | None = None,
        cwd: str = "/",
        limits: Sequence[tuple[int, int]] = (),
        cgroups: Sequence[int] = (),
        cgroup_dir: int = -1,
    ) -> DirectRunning:
        """Start ``exe`` with stdin on /dev/null and ``fds`` on 1, 2, 3, ...

        ``uid``/``gid``: switch to them first (a root engine's jail user).
        ``limits``: (resource, value) rlimits; ``cgroups``: ``cgroup.procs``
        fds the child joins before anything else, ``cgroup_dir`` a cgroup v2
        folder to create it in instead of joining ``cgroups[0]`` (see
        ``_lifetime``).
        Raises ``OSError`` when the process cannot be created at all; a
        failure after that (the exec) is exit status 127 with the reason on
        the process's stderr.
        """
        # What os.fsencode does, without a Python call per string (bwrap's
        # command line alone is some fifty of them per item).
        req = _Request(
            os.fsencode(exe),
            [a.encode(_FS_ENCODING, _FS_ERRORS) for a in argv],
            [f"{k}={v}".encode(_FS_ENCODING, _FS_ERRORS) for k, v in env.items()],
            list(fds),
            -1 if uid is None else uid,
            -1 if gid is None else gid,
            os.fsencode(cwd),
            list(limits),
            list(cgroups),
            cgroup_dir,
        )
        req.fds.insert(0, _stdin())
        if getattr(_here, "on", False):
            _launch(req)
        else:
            with self._lock:
                # Under the lock, so a concurrent close() cannot end the thread
                # between its start and this request.
                if self._thread is None:
                    self._start_thread()
                req.done = done = threading.Event()
                self._queue.put(req)
            done.wait()
        if req.error is not None:
            raise req.error
        return DirectRunning(req.pid, req.pidfd)

    def _start_thread(self) -> None:
        # Each thread gets its own queue: a request can never reach a thread
        # that close() has already told to stop.
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, args=(self._queue,), name="stockade-launcher", daemon=True
        )
        self._thread.start()

    @staticmethod
    def _run(requests: queue.SimpleQueue[_Request | None]) -> None:
        while (req := requests.get()) is not None:
            _launch(req)
            assert req.done is not None
            req.done.set()

    def close(self) -> None:
        """End the launcher thread (its children get the parent-death signal)."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._queue.put(None)
        thread.join()


def _launch(req: _Request) -> None:
    """Start ``req``'s process on this thread; its pid and pidfd, or the error, go in ``req``."""
    from stockade.sandbox import _jail

    try:
        pid = _jail.spawn(
            req.exe, req.argv, req.env, req.cwd, req.fds, -1, b"", req.uid, req.gid,
            req.limits, None, req.cgroups, req.cgroup_dir,
        )  # fmt: skip
    except Exception as e:
        # The caller needs an answer, whatever fails. OSError: no process;
        # ValueError: a string with a NUL byte.
        req.error = e if isinstance(e, OSError) else OSError(str(e))
        return
    try:
        req.pid, req.pidfd = pid, os.pidfd_open(pid)
    except OSError as e:
        # Still unreaped, so the pid is still ours to kill and reap.
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        req.error = e
