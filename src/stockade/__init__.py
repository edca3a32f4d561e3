"""stockade: a workflow engine for shell and AI-agent steps.

Isolation, provenance and write intent are facts of the system: every step item
runs in a fresh directory under an OS sandbox, every output names the run, step,
item, attempt and sha256 that made it, and agent writes go only where the
operator asked.

The public surface is small: the ``stockade`` command line (``stockade.cli``),
and the error types below. Everything else is a private core.

Must not import the runner or the CLI.
"""

from stockade.errors import InfraError, StaleOutput, StockadeError, TamperedArtifact, UserError

__version__ = "0.1.0"

__all__ = [
    "InfraError",
    "StaleOutput",
    "StockadeError",
    "TamperedArtifact",
    "UserError",
    "__version__",
]
