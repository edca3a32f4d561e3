"""Progress output: a live table on a terminal, plain lines otherwise.

Implements the runner's ``Reporter`` protocol. Must not import the runner's
internals beyond that protocol's shape.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any


@dataclass
class _StepLine:
    items: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    status: str = "pending"


def _fmt_status(status: str) -> str:
    return {"succeeded": "ok", "failed": "FAILED", "skipped": "skipped"}.get(status, status)


class PlainReporter:
    """One line per step start and end, and per item that did not succeed."""

    def __init__(self, out: IO[str] | None = None, quiet: bool = False) -> None:
        self.out = out or sys.stderr
        self.quiet = quiet
        self.lock = threading.Lock()
        self.t0 = time.monotonic()

    def _line(self, text: str) -> None:
        if self.quiet:
            return
        with self.lock:
            print(f"[{time.monotonic() - self.t0:7.2f}s] {text}", file=self.out, flush=True)

    def step_started(self, step: str, items: int) -> None:
        self._line(f"{step}: started ({items} item{'s' if items != 1 else ''})")

    def item_started(self, step: str, index: int) -> None:
        pass

    def item_finished(self, step: str, index: int, status: str, attempt: int, message: str) -> None:
        if status not in ("succeeded", "kept"):
            self._line(f"{step}/{index}: {status} (attempt {attempt}) {message}".rstrip())

    def step_finished(self, step: str, status: str, message: str) -> None:
        self._line(f"{step}: {_fmt_status(status)}" + (f" - {message}" if message else ""))

    def echo(self, line: str) -> None:
        self._line(line)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class LiveReporter(PlainReporter):
    """A rich live table: steps, items done/running/failed, elapsed."""

    def __init__(self) -> None:
        super().__init__()
        from rich.console import Console

        self.console = Console(stderr=True)
        self.steps: dict[str, _StepLine] = {}
        self.live: Any = None

    def _render(self) -> Any:
        from rich.table import Table

        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for col in ("step", "items", "done", "running", "failed", "status"):
            table.add_column(col)
        for name, s in self.steps.items():
            style = {"failed": "red", "succeeded": "green", "skipped": "yellow"}.get(s.status, "")
            table.add_row(name, str(s.items), str(s.done), str(s.running), str(s.failed),
                          f"[{style}]{_fmt_status(s.status)}[/]" if style else s.status)
        table.caption = f"elapsed {time.monotonic() - self.t0:.1f}s"
        return table

    def start(self) -> None:
        from rich.live import Live

        self.live = Live(get_renderable=self._render, console=self.console,
                         refresh_per_second=4, transient=False)
        self.live.start()

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()

    def step_started(self, step: str, items: int) -> None:
        with self.lock:
            self.steps[step] = _StepLine(items=items, status="running")

    def item_started(self, step: str, index: int) -> None:
        with self.lock:
            self.steps.setdefault(step, _StepLine()).running += 1

    def item_finished(self, step: str, index: int, status: str, attempt: int, message: str) -> None:
        with self.lock:
            s = self.steps.setdefault(step, _StepLine())
            if status != "kept" and s.running:
                s.running -= 1
            s.done += 1
            if status not in ("succeeded", "kept"):
                s.failed += 1
        if status not in ("succeeded", "kept"):
            self.console.print(f"[red]{step}/{index}[/]: {status} (attempt {attempt}) {message}",
                               markup=True, highlight=False)

    def step_finished(self, step: str, status: str, message: str) -> None:
        with self.lock:
            s = self.steps.setdefault(step, _StepLine())
            s.status = status

    def echo(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False)
