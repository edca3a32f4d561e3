"""What the engine tells the person watching: the ``Reporter`` protocol.

The CLI implements it twice (a live table on a terminal, plain lines
otherwise). Items are named by their key. Must not import the engine.
"""

from __future__ import annotations

from typing import Protocol


class Reporter(Protocol):
    def step_started(self, step: str, items: int) -> None: ...

    def item_started(self, step: str, key: str) -> None: ...

    def item_retrying(self, step: str, key: str, attempt: int, delay: float, message: str) -> None:
        """Attempt ``attempt`` failed with ``message``; the next one starts in ``delay`` s."""
        ...

    def item_finished(self, step: str, key: str, status: str, attempt: int, message: str,
                      tail: str = "") -> None:
        """``tail``: the last lines of stderr of a failed item."""
        ...

    def step_finished(self, step: str, status: str, message: str) -> None: ...

    def echo(self, line: str) -> None: ...
