"""One thread that moves jail output from pipes into ``meta/``, masked, created lazily.

A jail's stderr (and its stdout when secrets must be masked) goes to a pipe;
the hub reads every registered pipe with one ``selectors`` loop and writes to
the capture file, creating it on the first byte: an attempt that writes no
stderr leaves no file (one inode less per item on disks where inodes are
the cost). Secret values are masked across chunk boundaries. Memory stays
bounded: a full pipe makes the jail wait, never the engine buffer.

``read_capture`` reads one back (the engine's result, a worker's result).

Must not import the engine, the executors or the CLI.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import threading
from pathlib import Path

from stockade.runner.env import Masker
from stockade.workspace.beneath import write_all

CHUNK = 65536


def read_capture(path: str | os.PathLike[str], limit: int) -> bytes:
    """The first ``limit`` bytes of the capture file at ``path`` (all of it if
    shorter); as ``Capture`` writes it, never through a link at its name.

    Called for every item (its stdout capture): ``open(path).read(limit)``
    would allocate ``limit`` bytes up front (an ``mmap`` of 4 MiB and more,
    then ``munmap`` and a TLB shootdown across the engine's threads) and make
    three more system calls to set up a buffer that is read once. The first
    read asks for the size ``fstat`` gives and a byte more: when it returns
    exactly that size, that is the end. Otherwise (a file that grew, one
    whose size the kernel does not know, a short read) reads go on to the end.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        chunks: list[bytes] = []
        got = 0
        size = os.fstat(fd).st_size
        want = min(size + 1, limit)
        while got < limit:
            chunk = os.read(fd, min(want, limit - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            if got == size and len(chunk) < want:
                break
            want = CHUNK
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class Capture:
    """One pipe's destination; ``wait`` returns once the pipe reached EOF and is written."""

    def __init__(self, path: Path, masker: Masker | None) -> None:
        self.path = path
        self.masker = masker if masker else None
        self.keep = 0
        if self.masker is not None:
            self.keep = max(len(v.encode()) for v in self.masker.values) - 1
        self._pending = b""
        self._fd: int | None = None
        self._done = threading.Event()

    def _write(self, data: bytes) -> None:
        if not data:
            return
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
                               | os.O_NOFOLLOW, 0o600)
        write_all(self._fd, data)

    def feed(self, chunk: bytes) -> None:
        if self.masker is None:
            self._write(chunk)
            return
        pending = self.masker.data(self._pending + chunk)
        cut = len(pending) - self.keep
        if cut > 0:
            self._write(pending[:cut])
            pending = pending[cut:]
        self._pending = pending

    def close(self) -> None:
        try:
            if self.masker is not None:
                self._write(self.masker.data(self._pending))
                self._pending = b""
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)


class Captures:
    """The hub. ``open(path, masker)`` gives the write end for a jail and a ``Capture``."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._closed = False
        self._thread: threading.Thread | None = None

    def open(self, path: Path, masker: Masker | None = None) -> tuple[int, Capture]:
        """A pipe whose write end the caller hands to the jail (and then closes)."""
        r, w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(r, False)
        cap = Capture(path, masker)
        with self._lock:
            if self._closed:
                os.close(r)
                os.close(w)
                raise RuntimeError("captures are closed")
            # Registered from this thread: a select() under way sees the new
            # pipe (epoll and kqueue allow it), so the hub wakes once per
            # capture, at its data or EOF, not also to be told of it.
            self._sel.register(r, selectors.EVENT_READ, cap)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="captures", daemon=True)
                self._thread.start()
        return w, cap

    def _loop(self) -> None:
        buf = bytearray(CHUNK)
        while True:
            with self._lock:
                if self._closed and len(self._sel.get_map()) == 1:
                    return
            for key, _ in self._sel.select(timeout=1.0):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    continue
                cap = key.data
                fd = int(key.fd)
                try:
                    n = os.readv(fd, [buf])
                except BlockingIOError:
                    continue
                except OSError:
                    n = 0
                if n:
                    # A full disk drops output rather than stalling the jail.
                    with contextlib.suppress(OSError):
                        cap.feed(bytes(buf[:n]))
                    continue
                with self._lock:
                    self._sel.unregister(fd)
                os.close(fd)
                with contextlib.suppress(OSError):
                    cap.close()

    def close(self) -> None:
        """Stop once every open pipe reached EOF (call after every jail ended)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if thread is not None:
            thread.join(timeout=30)
        if thread is None or not thread.is_alive():
            self._sel.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
