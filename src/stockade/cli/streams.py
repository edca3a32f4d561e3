"""Standard output and error that outlive their reader, for ``run`` and ``resume``.

``stockade run wf.yaml | head``, a log collector that dies, a terminal that
hung up: a write then fails (``BrokenPipeError``, or ``EIO`` on the tty).
For a command that only reads (``runs``, ``show``) that ends the command,
and rightly. For a run it must not: the progress is a view, the store holds
the truth, and a run killed by its view is lost work shown as "crashed".
``outlive_readers`` swaps ``sys.stdout`` and ``sys.stderr`` for streams
that, once their reader is gone, point their descriptor at ``/dev/null``
and go on, so the run finishes, records its outcome and exits with its own
status.

Imports nothing of stockade.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any


class Outliving:
    """A text stream whose writes succeed after the reader went away (they go nowhere)."""

    def __init__(self, inner: IO[str]) -> None:
        self._inner = inner
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._inner.write(text)
            except OSError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._inner.flush()
            except OSError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self.gone = True
        # What is still buffered, and Python's own flush at exit, then land in
        # /dev/null instead of raising again (or printing "Exception ignored").
        try:
            null = os.open(os.devnull, os.O_WRONLY)
        except OSError:
            return
        try:
            os.dup2(null, self._inner.fileno())
        except (OSError, ValueError):
            pass
        finally:
            os.close(null)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def outlive_readers() -> None:
    """From here on, this process's stdout and stderr survive a reader that goes away."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, Outliving):
            setattr(sys, name, Outliving(stream))
