"""Error types shared by every layer.

Exceptions are for misuse and broken infrastructure; ordinary outcomes
(succeeded, failed, fenced, skipped) are values. The CLI translates these into
one actionable line and the exception's ``exit_code`` (2 for all of these).

This module imports nothing from the rest of the package.
"""

from __future__ import annotations

from dataclasses import dataclass


class StockadeError(Exception):
    """Base of every error the engine raises on purpose.

    Carries the exit code the command line ends with (as click's exceptions
    carry theirs): 2 for bad input and broken infrastructure alike.
    """

    exit_code: int = 2


@dataclass(frozen=True)
class Problem:
    """One problem in a user's file, printed as ``FILE:LINE:COL: message``.

    ``line`` and ``col`` count from 1; 0 means "unknown" and is printed as 1.
    """

    file: str
    line: int
    col: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{max(self.line, 1)}:{max(self.col, 1)}: {self.message}"


class UserError(StockadeError):
    """The user asked for something that cannot be done; nothing was changed.

    Carries one or more problems; ``str()`` is the lines to print.
    """

    def __init__(self, message: str | None = None, problems: list[Problem] | None = None) -> None:
        self.problems: list[Problem] = list(problems or [])
        self.message = message or "\n".join(str(p) for p in self.problems)
        super().__init__(self.message)


class InfraError(StockadeError):
    """The machine lacks something (a binary, a kernel feature, a database).

    The message names what to install or change.
    """


class StaleOutput(StockadeError):
    """An artifact produced by another run was about to be consumed."""


class TamperedArtifact(StockadeError):
    """An artifact's bytes no longer match the sha256 recorded when it was made."""
