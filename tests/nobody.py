"""Engines started as ``nobody`` by the tests, from a copy of the package it can read.

The checkout may sit in a folder only root can enter (a private clone made
with ``mktemp -d``, ``/root/...``), so ``nobody`` cannot import ``src/``:
``readable_package`` copies the package (the C extension included) to a
world-readable temporary folder for ``sys.path``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def need_nobody() -> None:
    """Skip (a failure under STOCKADE_STRICT_SKIPS) where an engine cannot start as nobody."""
    if not os.path.exists("/usr/bin/python3") or not shutil.which("setpriv"):
        pytest.skip("needs /usr/bin/python3 and setpriv to start an engine as nobody")


@contextmanager
def readable_package() -> Iterator[Path]:
    """A folder holding a copy of ``stockade`` that any user can import."""
    top = Path(tempfile.mkdtemp(prefix="stockade-nonroot-src-"))
    try:
        shutil.copytree(SRC / "stockade", top / "stockade",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        for folder, _dirs, files in os.walk(top):
            os.chmod(folder, 0o755)
            for f in files:
                os.chmod(os.path.join(folder, f), 0o755 if f.endswith(".so") else 0o644)
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)
