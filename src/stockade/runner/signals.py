"""SIGINT, SIGTERM and SIGHUP during a run: a count and a call into the
engine, never an exception.

Raising ``KeyboardInterrupt`` wherever the main thread happens to be could
leave a lock held; the engine instead turns the call into an ``Interrupt``
event on its own loop (``runner.engine``). SIGHUP (the terminal went away)
interrupts the same way, so the run ends recorded as interrupted rather than
killed mid-write; under ``nohup`` (SIGHUP ignored) it stays ignored. Must not
import the engine or the CLI.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from stockade import _pending


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP set a flag and call the engine, instead of raising anywhere."""

    def __init__(self) -> None:
        # A Ctrl-C whose KeyboardInterrupt Python dropped (``stockade._pending``)
        # still interrupts: replayed into the engine when it attaches.
        self.count = _pending.take()
        self.target: Callable[[], None] | None = None

    def __call__(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.target is not None:
            self.target()

    def attach(self, target: Callable[[], None]) -> None:
        self.target = target
        for _ in range(self.count):
            target()


@contextmanager
def signals_to(handler: Interrupts) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP go to ``handler`` for the block (on the main
    thread, the only one Python delivers signals to; elsewhere nothing
    changes). SIGHUP ignored when the block begins (``nohup``) stays so."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for s, was in previous.items():
        if s is not signal.SIGHUP or was is not signal.SIG_IGN:
            signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
