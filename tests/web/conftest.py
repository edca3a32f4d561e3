"""The web UI's fixtures: ``stockade ui`` as a real process, Debian's chromium.

The browser is Debian's ``/usr/bin/chromium`` driven by Playwright (never a
browser Playwright downloads), headless, with a fresh profile per session.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import Project

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Poll ``check`` until it returns something true; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class UIProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30, **kw)

    def token(self, path: str = "/") -> str:
        m = re.search(r'<meta name="stockade-token" content="([^"]+)"', self.get(path).text)
        return m.group(1) if m else ""


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """A project in a folder with a space in its name (the UI must not care)."""
    p = Project(tmp_path / "my project")
    p.path.mkdir()
    p.root = p.path / ".stockade"
    p.env["STOCKADE_HOME"] = str(p.root)
    return p


@pytest.fixture
def start_ui(project: Project) -> Iterator[Callable[..., UIProcess]]:
    """Start ``stockade ui --port 0`` over the project's root; stopped after the test."""
    started: list[UIProcess] = []

    def start(*extra: str) -> UIProcess:
        log = project.path / f"ui-{len(started)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "stockade.cli.main", "ui", "--port", "0", *extra],
                cwd=project.path, env=project.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        m = wait_for(lambda: proc.poll() is None and re.search(
            r"http://127\.0\.0\.1:(\d+)/", log.read_text(errors="replace")),
            f"stockade ui to start (log: {log.read_text(errors='replace') if log.exists() else ''})",
            timeout=60)
        ui = UIProcess(proc, int(m.group(1)), log)
        started.append(ui)
        wait_for(lambda: _answers(ui), "stockade ui to answer")
        return ui

    yield start
    for ui in started:
        ui.proc.terminate()
        try:
            ui.proc.wait(10)
        except subprocess.TimeoutExpired:
            ui.proc.kill()
            ui.proc.wait()


def _answers(ui: UIProcess) -> bool:
    try:
        return ui.get("/").status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="session")
def browser_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium "
                    "(scripts/install-system-packages.sh does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM,
            headless=True, args=CHROMIUM_ARGS, accept_downloads=True,
            viewport={"width": 1400, "height": 1000})
        yield ctx
        ctx.close()


@pytest.fixture
def page(browser_context: Any) -> Iterator[Any]:
    """A fresh tab; a script error on any page it shows fails the test."""
    pg = browser_context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    pg.close()
    assert not errors, f"script errors on the page: {errors}"


def release(project: Project, run_id: str, step: str, index: int) -> None:
    """Let a gated item go on: the file it waits for, in its own work folder."""
    work = project.root / "runs" / run_id / step / str(index) / "work"
    wait_for(work.is_dir, f"{step}/#{index} to start")
    (work / "release").write_text("go\n")


def gates_started(project: Project, run_id: str) -> None:
    """Every item of ``GATED``'s gate step has begun its first attempt."""
    for i in range(3):
        wait_for((project.item(run_id, "gate", i) / "work").is_dir, f"gate/#{i} to start")


#: Items that print, wait for ``release`` in their work folder (first attempt
#: only, so a resumed run finishes), print again and write an output.
GATED = """\
name: gated
vars:
  colour: teal
steps:
  - id: prep
    run: echo prep > out/p.txt
  - id: gate
    needs: [prep]
    for_each: [alpha, beta, gamma]
    run: |
      echo "started $STOCKADE_ITEM_KEY"
      if [ "$STOCKADE_ATTEMPT" = 1 ]; then
        while [ ! -e release ]; do sleep 0.05; done
      fi
      echo "released $STOCKADE_ITEM_KEY"
      echo "$STOCKADE_ITEM_KEY" > out/done.txt
  - id: after
    needs: [gate]
    run: echo after > out/a.txt
"""
