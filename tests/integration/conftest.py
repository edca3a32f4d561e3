"""Helpers for driving the real ``stockade`` command line in subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class Project:
    """A temporary folder holding a workflow and its stockade root."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.root = path / ".stockade"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("STOCKADE_") or k == "STOCKADE_SANDBOX"}
        self.env["STOCKADE_HOME"] = str(self.root)

    def write(self, name: str, text: str) -> Path:
        p = self.path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
        return p

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "stockade.cli.main", *args]

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Result:
        p = subprocess.run(
            self.cmd(*args), cwd=self.path, env={**self.env, **(env or {})},
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
        return Result(p.returncode, p.stdout, p.stderr)

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """The command in a session of its own, started as a terminal's foreground
        job is: with SIGINT at its default. A suite run in the background
        (``cmd &`` in a script) ignores SIGINT and its children inherit that, so
        a test's Ctrl-C before stockade's own handler would never be delivered."""
        ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        if ignored:  # a caught signal is back at its default in the child after exec
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return subprocess.Popen(
                self.cmd(*args), cwd=self.path, env={**self.env, **(env or {})},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            if ignored:
                signal.signal(signal.SIGINT, signal.SIG_IGN)

    def item(self, run_id: str, step: str, item: int = 0) -> Path:
        return self.root / "runs" / run_id / step / str(item)

    def provenance(self, run_id: str, target: str) -> Any:
        """An item's provenance record, as the run store keeps it (through the CLI)."""
        r = self.run("show", run_id, target, "--json")
        assert r.code == 0, r.err
        return r.json()["provenance"]

    def succeeded(self, run_id: str, step: str) -> set[int]:
        """Items of ``step`` the store records as succeeded (read straight from SQLite)."""
        import sqlite3

        db = self.root / "stockade.db"
        if not db.exists():
            return set()
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
            try:
                rows = c.execute("SELECT item FROM items WHERE run_id=? AND step=? AND "
                                 "status='succeeded'", (run_id, step)).fetchall()
            except sqlite3.OperationalError:
                return set()
        return {int(r[0]) for r in rows}


#: Each CLI test runs under the backend a user gets by default (bwrap where it
#: works) and again under landlock, the fallback for machines without it.
#: ``STOCKADE_SANDBOX`` in the test environment pins one backend instead.
BACKENDS = ["pinned"] if "STOCKADE_SANDBOX" in os.environ else ["default", "landlock"]


@pytest.fixture(params=BACKENDS)
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Project:
    p = Project(tmp_path)
    if request.param == "landlock":
        from stockade.sandbox import get_backend

        avail = get_backend("landlock").availability()
        if not avail.available:
            pytest.skip(f"landlock is not available here: {avail.reason}")
        p.env["STOCKADE_SANDBOX"] = "landlock"
    return p


ProjectFactory = Callable[[], Project]
