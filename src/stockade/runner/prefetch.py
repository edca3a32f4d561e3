"""Items' folders made ahead of their turn, on a helper thread.

An attempt's folders (the item's, ``meta/``, ``work/`` and ``work/out/``) are
new inodes; on an aged ext4 disk, finding a free inode was a large part of an
item's time on its job slot (13% of a bwrap item thread's wall time, by
profile). Made here, a few items ahead of the scheduler, while the item
threads wait for their jails, the folders cost the slot one rename (``ItemDir.premake``, ``ItemDir.begin_attempt``).

Since step folders are spread (``workspace.spread``), new folders under them
are cheap, and this thread's hand-offs cost the engine more CPU than they
saved the slots (0.92x the engine's CPU under ``--sandbox none`` and 0.86x
under bwrap without it, 1,000 items, paired rounds). So the engine queues a
step here only where its folder refused the flag (``RunDir.make_step``):
tmpfs (tried), XFS and btrfs (by their kernel code).

The engine queues a step's items in the order they will start (``add``),
claims each as it starts it (``claim``: never made while its attempt begins),
drops the queue on an interrupt (``clear``) and closes at the end, which
removes any made ``.next`` no attempt took. Any error here only means the
item makes its folders itself.

Must not import the engine, the executors or the CLI.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from stockade.workspace.layout import RunDir

Key = tuple[str, int]


class FolderPrefetch:
    """Keeps the folders of up to ``ahead`` queued items made before their turn."""

    def __init__(self, run: RunDir, ahead: int) -> None:
        self._run = run
        self._ahead = max(1, ahead)
        self._cond = threading.Condition()
        self._queue: deque[Key] = deque()
        self._queued: set[Key] = set()
        #: Made and not claimed yet: their ``.next`` is the window.
        self._made: set[Key] = set()
        self._busy: Key | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, step: str, indexes: Iterable[int]) -> None:
        with self._cond:
            if self._closed:
                return
            for i in indexes:
                key = (step, i)
                if key not in self._queued:
                    self._queued.add(key)
                    self._queue.append(key)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="folders", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def claim(self, step: str, index: int) -> None:
        """The item's first attempt begins now: not made from here on, and the
        one being made is finished first."""
        key = (step, index)
        with self._cond:
            self._queued.discard(key)
            while self._busy == key:
                self._cond.wait()
            self._made.discard(key)
            self._cond.notify_all()

    def settled(self) -> bool:
        """Nothing to do until the engine claims or adds more: the window is
        full, or nothing is queued (tests wait for this, not for time)."""
        with self._cond:
            queued = any(k in self._queued for k in self._queue)
            return self._busy is None and (not queued or len(self._made) >= self._ahead)

    def clear(self) -> None:
        """Make nothing more (an interrupted run starts no more items)."""
        with self._cond:
            self._queue.clear()
            self._queued.clear()
            self._cond.notify_all()

    def close(self) -> None:
        """Stop, and remove every ``.next`` made for an item that never began."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._queued.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._cond:
            left, self._made = self._made, set()
        for step, index in left:
            self._run.item(step, index).drop_ready()

    def _next(self) -> Key | None:
        with self._cond:
            while True:
                if self._closed:
                    return None
                while self._queue and self._queue[0] not in self._queued:
                    self._queue.popleft()  # claimed or cleared before its turn here
                if self._queue and len(self._made) < self._ahead:
                    key = self._queue.popleft()
                    self._queued.discard(key)
                    self._busy = key
                    return key
                self._cond.wait()

    def _loop(self) -> None:
        while (key := self._next()) is not None:
            made = False
            try:
                self._run.item(*key).premake()
                made = True
            except OSError:
                pass  # the attempt makes its folders itself
            finally:
                with self._cond:
                    self._busy = None
                    if made:
                        self._made.add(key)
                    self._cond.notify_all()
