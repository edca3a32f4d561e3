"""A jail's output, moved from its pipes into ``meta/`` by the thread that waits for it.

A jail's stdout and stderr go to pipes. The item's own thread reads them
while it waits for the jail (``JailOutput.wait``) and writes each to its
capture file, creating the file on the first byte: an attempt that writes
no stderr leaves no file (one inode less per item on disks where inodes are
the cost). Secret values are masked across chunk boundaries. Memory stays
bounded: a full pipe makes the jail wait, never the engine buffer.

Why not one thread for every jail's pipes (as before): each of its reads
was a hand-off of the interpreter lock between it and the item threads,
about 0.17 ms of its own CPU per item and more in the item threads' waits
(bench/RESULTS.md). The pipes are read where the wait already is.

``read_capture`` reads one back (the engine's result, a worker's result).

Must not import the engine, the executors or the CLI.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import time
from pathlib import Path

from stockade.runner.env import Masker
from stockade.sandbox.base import Running
from stockade.workspace.beneath import write_all

CHUNK = 65536
#: How long the first look at the pipes lasts before asking whether the
#: jail's main process ended; each next look lasts twice as long, up to
#: ``LAST_SLICE``. Only a jail whose main process ended while something it
#: started still holds its output open waits out a slice: in every other
#: case the pipes' end, or the jail's, ends the wait at once.
FIRST_SLICE = 0.05
LAST_SLICE = 1.0


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
    """One pipe's destination file, made on its first byte, secrets masked."""

    def __init__(self, path: Path, masker: Masker | None) -> None:
        self.path = path
        self.masker = masker if masker else None
        self.keep = 0
        if self.masker is not None:
            self.keep = max(len(v.encode()) for v in self.masker.values) - 1
        self._pending = b""
        self._fd: int | None = None

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


class JailOutput:
    """One jail's output pipes and their captures, for the thread that waits for it.

    ``open`` gives the write end to hand the jail (the caller closes its
    copy once the jail started); ``wait`` waits for the jail while reading;
    ``drain`` reads what is left; ``close`` ends it all (always call it).
    """

    def __init__(self) -> None:
        self._poller = select.poll()
        self._open: dict[int, Capture] = {}

    def open(self, path: Path, masker: Masker | None = None) -> int:
        r, w = os.pipe2(os.O_CLOEXEC)
        self._open[r] = Capture(path, masker)
        self._poller.register(r, select.POLLIN)
        return w

    def wait(self, jail: Running, timeout: float | None) -> int | None:
        """``jail.wait(timeout)``, reading the pipes meanwhile: the exit
        status, or None when ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        slice_ = FIRST_SLICE
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return jail.wait(0)
            if self.drain(slice_ if left is None else min(slice_, left)):
                # Every pipe ended: whatever the jail still runs wrote its last.
                return jail.wait(None if deadline is None else
                                 max(0.0, deadline - time.monotonic()))
            status = jail.wait(0)
            if status is not None:
                return status  # its wait ended the rest; ``drain`` reads what they left
            slice_ = min(slice_ * 2, LAST_SLICE)

    def drain(self, timeout: float) -> bool:
        """Read until every pipe ended (True) or ``timeout`` seconds passed (False)."""
        deadline = time.monotonic() + timeout
        while self._open:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for fd, _ in self._poller.poll(math.ceil(left * 1000)):
                self._read(fd)
        return True

    def _read(self, fd: int) -> None:
        cap = self._open[fd]
        try:
            # poll() said readable, and this thread is the pipe's only
            # reader: the read returns data or the end without blocking.
            chunk = os.read(fd, CHUNK)
        except OSError:
            chunk = b""
        if chunk:
            # A full disk drops output rather than stalling the jail.
            with contextlib.suppress(OSError):
                cap.feed(chunk)
            return
        self._end(fd)

    def _end(self, fd: int) -> None:
        cap = self._open.pop(fd)
        self._poller.unregister(fd)
        os.close(fd)
        with contextlib.suppress(OSError):
            cap.close()

    def close(self) -> None:
        """Stop reading: each capture keeps what came so far."""
        for fd in list(self._open):
            self._end(fd)
