"""The engine's side of the exec helpers (``_forkserver``): spawn and wait.

Used by the landlock backend (the helper confines and execs the item) and by
the bwrap backend when the C launcher is not built or a source needs a bridge
mount (the helper switches uid and execs bwrap; otherwise ``_direct`` starts
bwrap itself): forking a small single-threaded helper is several times
cheaper than forking the engine, and the helper reports exit statuses
without polling.

Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any


class _Job:
    def __init__(self, client: ForkServerClient) -> None:
        self.client = client
        self.id = 0
        self.started = threading.Event()
        self.exited = threading.Event()
        self.pid = 0
        self.error = ""
        self.status: int | None = None


class ForkServerClient:
    """The engine's side of the fork server: start once, spawn many, close once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._next_id = 0
        self._pending: dict[int, _Job] = {}

    def _ensure(self) -> socket.socket:
        with self._lock:
            if self._sock is not None:
                return self._sock
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            here = Path(__file__).resolve().parent
            # Load only the helper's three stdlib-only modules: stand-in
            # package objects keep ``stockade/__init__`` and the sandbox
            # package (threads, proxy, ...) out of the helper.
            code = (
                "import sys, types\n"
                f"for name, path in (('stockade', {str(here.parent)!r}), "
                f"('stockade.sandbox', {str(here)!r})):\n"
                "    m = types.ModuleType(name); m.__path__ = [path]; sys.modules[name] = m\n"
                "from stockade.sandbox._forkserver import main\n"
                "main(int(sys.argv[1]))\n"
            )
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", code, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env={"PATH": "/usr/bin:/bin"},
                stdin=subprocess.DEVNULL,
                close_fds=True,
                # Its own session: a Ctrl-C to the engine's process group must
                # not reach the helper (it dies with the engine instead).
                start_new_session=True,
            )
            theirs.close()
            self._sock = mine
            self._reader = threading.Thread(
                target=self._read, name="stockade-exec-helper", daemon=True
            )
            self._reader.start()
            return mine

    def _read(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                with self._lock:
                    jobs = list(self._pending.values())
                    self._pending.clear()
                    dead = self._sock is sock
                    if dead:
                        # The helper died: the next spawn starts a new one
                        # instead of failing on a dead socket.
                        self._sock = None
                        self._reap_later(self._proc)
                        self._proc = None
                if dead:
                    with self._send_lock:
                        sock.close()
                for lost in jobs:
                    lost.error = lost.error or "the exec helper exited"
                    lost.started.set()
                    if lost.status is None:
                        lost.status = -signal.SIGKILL
                    lost.exited.set()
                return
            msg = json.loads(data)
            with self._lock:
                job = self._pending.get(msg["id"])
                if job is None:
                    continue
                if msg["type"] == "started":
                    job.pid = msg["pid"]
                    job.started.set()
                    continue
                del self._pending[msg["id"]]
                if msg["type"] == "exited":
                    job.pid = msg["pid"]
                    job.status = msg["status"]
                else:
                    job.error = msg["error"]
                    job.status = 127
            job.started.set()
            job.exited.set()

    @staticmethod
    def _reap_later(proc: subprocess.Popen[bytes] | None) -> None:
        if proc is not None:
            threading.Thread(target=proc.wait, daemon=True).start()

    def spawn(self, request: Mapping[str, Any], fds: Sequence[int]) -> _Job:
        sock = self._ensure()
        job = _Job(self)
        with self._lock:
            self._next_id += 1
            rid = self._next_id
            job.id = rid
            self._pending[rid] = job
        payload = json.dumps({**request, "id": rid}).encode()
        with self._send_lock:
            socket.send_fds(sock, [payload], list(fds))
        # No reply to wait for: the item sets itself up while the caller goes
        # on; ``pid`` asks the helper, ``kill`` goes through it by job id.
        return job

    def _tell(self, msg: dict[str, Any]) -> None:
        with self._lock:
            sock = self._sock
        if sock is None:
            return
        with self._send_lock, contextlib.suppress(OSError):
            sock.send(json.dumps(msg).encode())

    def signal(self, job: _Job, sig: int) -> None:
        """Signal a job's process group, through the helper.

        The helper reaps its children itself, so only it knows for sure that
        a pid still names this jail and not a process that reused it.
        """
        self._tell({"type": "kill", "id": job.id, "sig": int(sig)})

    def ask_pid(self, job: _Job) -> None:
        self._tell({"type": "pid", "id": job.id})

    def close(self) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
            proc, self._proc = self._proc, None
        if sock is not None:
            # shutdown, not only close: the reader thread blocked in recv()
            # holds the file open, so close() alone would not reach the helper.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if proc is not None:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def fileno(stream: IO[bytes] | int) -> int:
    return stream if isinstance(stream, int) else stream.fileno()


class HelperRunning:
    """A jail started by a helper: ``wait`` needs no polling, ``kill`` hits its group."""

    def __init__(
        self,
        job: _Job,
        on_exit: list[Callable[[], None]] | None = None,
    ) -> None:
        self._job = job
        self._on_exit = on_exit if on_exit is not None else []

    @property
    def pid(self) -> int:
        if not self._job.started.is_set():
            self._job.client.ask_pid(self._job)
            self._job.started.wait()
        return self._job.pid

    @property
    def error(self) -> str:
        """Why the helper could not start the jail (empty if it did)."""
        return self._job.error

    def wait(self, timeout: float | None = None) -> int | None:
        if not self._job.exited.wait(timeout):
            return None
        while self._on_exit:
            self._on_exit.pop()()
        return self._job.status

    def kill(self, grace: float = 2.0) -> None:
        for sig, wait_for in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            if self._job.exited.is_set():
                return
            self._job.client.signal(self._job, sig)
            if self.wait(wait_for) is not None:
                return


class HelperPool:
    """One helper per CPU (at most 4), used round robin: a helper does about a
    millisecond of serial work per item, so with several jobs one helper
    would become the bottleneck. Helpers start on first use."""

    def __init__(self, size: int | None = None) -> None:
        n = size or min(os.cpu_count() or 1, 4)
        self._clients = [ForkServerClient() for _ in range(n)]
        self._next = itertools.count()

    def spawn(self, request: Mapping[str, Any], fds: Sequence[int]) -> _Job:
        client = self._clients[next(self._next) % len(self._clients)]
        return client.spawn(request, fds)

    def close(self) -> None:
        for client in self._clients:
            client.close()
