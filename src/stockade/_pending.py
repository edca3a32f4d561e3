"""Ctrl-C that may have been swallowed: counted, so the command still acts on it.

Python raises an interrupt's exception wherever the main thread is; inside
an import's clean-up (a weakref callback of the module lock) it is printed
as "Exception ignored" and dropped, and the run went on as if no Ctrl-C had
come. The command line's handlers count each interrupt here before raising
(inside an import they only count); ``cli.main`` exits 130 for one counted
while it loaded or parsed, each command as it begins, and
``runner.session`` replays one counted later into the engine when it takes
over the signals.

The package imports it first. Imports nothing of stockade.
"""

from __future__ import annotations

# Not ``signal``: it imports ``enum``, several milliseconds during which a
# Ctrl-C still meets Python's own handler and prints a traceback (a CI run
# hit one). ``_signal`` is built in, and ``signal`` wraps its functions.
import _signal  # type: ignore[import-not-found,unused-ignore]
import os
import sys

count = 0


def record() -> None:
    global count
    count += 1


def importing() -> bool:
    """Whether a module is being imported right now (its import lock exists)."""
    return bool(getattr(sys.modules.get("_frozen_importlib"), "_module_locks", None))


def quiet_interrupt(signum: int, frame: object) -> None:
    """SIGINT while the command line loads or parses: counted, then an exit
    130 without a traceback; inside an import only counted (``cli.main``
    exits 130 for it once loaded)."""
    record()
    if not importing():
        raise SystemExit(130)


def interrupt(signum: int, frame: object) -> None:
    """SIGINT once the command line runs: counted, then KeyboardInterrupt,
    which the commands translate. Inside an import only counted: raised
    there it may be dropped or wrapped by the module being imported (a
    model library turns it into a schema error), and the run session
    replays the count into the engine instead."""
    record()
    if not importing():
        raise KeyboardInterrupt


def install_for_command_line() -> None:
    """Under ``python -m stockade.cli.main`` (``sys.argv[0]`` is "-m" while
    the package loads) or the ``stockade`` script, SIGINT is
    ``quiet_interrupt`` until a command begins; any other importer keeps its
    own handler."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 == "-m" or os.path.basename(argv0) == "stockade":
        try:  # noqa: SIM105 - contextlib would cost every importer its import
            _signal.signal(_signal.SIGINT, quiet_interrupt)
        except ValueError:  # not the main thread: its caller owns the signals
            pass


def take() -> int:
    """The interrupts counted so far (and the count back to zero)."""
    global count
    n, count = count, 0
    return n
