"""Ctrl-C that may have been swallowed: counted, so the command still acts on it.

Python raises an interrupt's exception wherever the main thread is; inside
an import's clean-up (a weakref callback of the module lock) it is printed
as "Exception ignored" and dropped, and the run went on as if no Ctrl-C had
come. The command line's handlers count each interrupt here before raising;
``runner.session`` replays the count into the engine when it takes over the
signals, and ``cli.main`` exits 130 if one came while it was importing.

Must not import anything (it is imported first, by the command line).
"""

from __future__ import annotations

count = 0


def record() -> None:
    global count
    count += 1


def take() -> int:
    """The interrupts counted so far (and the count back to zero)."""
    global count
    n, count = count, 0
    return n
