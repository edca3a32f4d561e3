"""stockade: a workflow engine for shell and AI-agent steps.

Isolation, provenance and write intent are facts of the system: every step item
runs in a fresh directory under an OS sandbox, every output names the run, step,
item, attempt and sha256 that made it, and agent writes go only where the
operator asked.

The public surface is small: the ``stockade`` command line (``stockade.cli``),
and the error types below. Everything else is a private core.

Must not import the runner or the CLI.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing alone takes ~20 ms
if TYPE_CHECKING:
    from stockade.errors import (
        InfraError,
        StaleOutput,
        StockadeError,
        TamperedArtifact,
        UserError,
    )

__version__ = "0.1.0"

# The command line takes Ctrl-C from here on, not once its own module loads.
from stockade import _pending  # noqa: E402

_pending.install_for_command_line()


def __getattr__(name: str) -> object:
    # Lazy: ``stockade`` is imported first by every command, before the command
    # line can take over Ctrl-C; the less it runs, the smaller that window.
    if name in __all__ and name != "__version__":
        from stockade import errors

        return getattr(errors, name)
    raise AttributeError(name)

__all__ = [
    "InfraError",
    "StaleOutput",
    "StockadeError",
    "TamperedArtifact",
    "UserError",
    "__version__",
]
