"""Ctrl-C that may have been swallowed: counted, so the command still acts on it.

Python raises an interrupt's exception wherever the main thread is; inside
an import's clean-up (a weakref callback of the module lock) it is printed
as "Exception ignored" and dropped, and the run went on as if no Ctrl-C had
come. The command line's handlers count each interrupt here before raising;
``runner.session`` replays the count into the engine when it takes over the
signals, and ``cli.main`` exits 130 if one came while it was importing.

Must not import anything of stockade (the package imports it first).
"""

from __future__ import annotations

import os
import signal
import sys

count = 0


def record() -> None:
    global count
    count += 1


def quiet_interrupt(signum: int, frame: object) -> None:
    """SIGINT while the command line is still importing: counted, then an
    exit 130 without a traceback."""
    record()
    raise SystemExit(130)


def install_for_command_line() -> None:
    """Under ``python -m stockade.cli.main`` (``sys.argv[0]`` is "-m" while
    the package loads) or the ``stockade`` script, SIGINT is
    ``quiet_interrupt`` until ``cli.main`` takes over; any other importer
    keeps its own handler."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 == "-m" or os.path.basename(argv0) == "stockade":
        try:  # noqa: SIM105 - contextlib would cost every importer its import
            signal.signal(signal.SIGINT, quiet_interrupt)
        except ValueError:  # not the main thread: its caller owns the signals
            pass


def take() -> int:
    """The interrupts counted so far (and the count back to zero)."""
    global count
    n, count = count, 0
    return n
