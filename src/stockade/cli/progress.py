"""Progress output: a live table on a terminal, plain lines otherwise.

Implements the runner's ``Reporter`` protocol. Items are named by their key.
A failed item's line carries the last lines of its stderr and the command
that shows the rest. Must not import the runner
(it matches the ``Reporter`` protocol by shape).
"""

from __future__ import annotations

import shlex
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

from stockade._show import lines, printable
from stockade.cli.main import root_hint

GOOD = ("succeeded", "kept", "reused")


@dataclass
class _StepLine:
    items: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    retries: int = 0
    reused: int = 0
    status: str = "pending"

    @property
    def queued(self) -> int:
        return max(0, self.items - self.done - self.running)


def _fmt_status(status: str) -> str:
    return {"succeeded": "ok", "failed": "FAILED", "skipped": "skipped"}.get(status, status)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class PlainReporter:
    """One line per step start and end, per retry, and per item that did not succeed."""

    def __init__(self, out: IO[str] | None = None, quiet: bool = False) -> None:
        self.out = out or sys.stderr
        self.quiet = quiet
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.run_id = ""

    def _line(self, text: str) -> None:
        if self.quiet:
            return
        with self.lock:
            print(f"[{time.monotonic() - self.t0:7.2f}s] {text}", file=self.out, flush=True)

    def step_started(self, step: str, items: int) -> None:
        self._line(f"{step}: started ({_plural(items, 'item')})")

    def item_started(self, step: str, key: str) -> None:
        pass

    def item_retrying(self, step: str, key: str, attempt: int, delay: float, message: str) -> None:
        self._line(f"{step}/{key}: attempt {attempt} failed ({printable(message)}); "
                   f"retry in {delay:.1f}s")

    def item_finished(self, step: str, key: str, status: str, attempt: int, message: str,
                      tail: str = "") -> None:
        if status in GOOD:
            return
        self._line(f"{step}/{key}: {status} (attempt {attempt}) {printable(message)}".rstrip())
        for line in lines(tail):
            self._line(f"    | {printable(line)}")
        if tail and self.run_id:
            self._line(f"    more: stockade logs {self.run_id} {shlex.quote(f'{step}/{key}')} "
                       f"--stderr{root_hint()}")

    def step_finished(self, step: str, status: str, message: str) -> None:
        if status == "skipped":
            self._line(f"{step}: skipped" + (f" ({message})" if message else ""))
            return
        self._line(f"{step}: {_fmt_status(status)}" + (f" - {message}" if message else ""))

    def echo(self, line: str) -> None:
        self._line(line)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class LiveReporter(PlainReporter):
    """A rich live table: steps, items done/running/queued/failed/retries, elapsed."""

    def __init__(self) -> None:
        super().__init__()
        from rich.console import Console

        self.console = Console(stderr=True)
        self.steps: dict[str, _StepLine] = {}
        self.live: Any = None

    def _render(self) -> Any:
        from rich.table import Table

        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for col in ("step", "items", "done", "running", "queued", "failed", "retries", "reused",
                    "status"):
            table.add_column(col)
        with self.lock:
            rows = [(n, _StepLine(**s.__dict__)) for n, s in self.steps.items()]
        for name, s in rows:
            style = {"failed": "red", "succeeded": "green", "skipped": "yellow"}.get(s.status, "")
            table.add_row(name, str(s.items), str(s.done), str(s.running), str(s.queued),
                          str(s.failed), str(s.retries), str(s.reused),
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

    def item_started(self, step: str, key: str) -> None:
        with self.lock:
            self.steps.setdefault(step, _StepLine()).running += 1

    def item_retrying(self, step: str, key: str, attempt: int, delay: float, message: str) -> None:
        with self.lock:
            s = self.steps.setdefault(step, _StepLine())
            s.retries += 1
            if s.running:
                s.running -= 1
        self._styled(f"{step}/{key}", "yellow",
                     f": attempt {attempt} failed ({printable(message)}); retry in {delay:.1f}s")

    def item_finished(self, step: str, key: str, status: str, attempt: int, message: str,
                      tail: str = "") -> None:
        with self.lock:
            s = self.steps.setdefault(step, _StepLine())
            if status not in ("kept", "reused") and s.running and attempt > 0:
                s.running -= 1
            s.done += 1
            if status == "reused":
                s.reused += 1
            if status not in GOOD:
                s.failed += 1
        if status not in GOOD:
            self._styled(f"{step}/{key}", "red",
                         f": {status} (attempt {attempt}) {printable(message)}")
            for line in lines(tail):
                self.console.print(f"    | {printable(line)}", markup=False, highlight=False)
            if tail and self.run_id:
                self.console.print(f"    more: stockade logs {self.run_id} "
                                   f"{shlex.quote(f'{step}/{key}')} --stderr{root_hint()}",
                                   markup=False, highlight=False)

    def step_finished(self, step: str, status: str, message: str) -> None:
        with self.lock:
            s = self.steps.setdefault(step, _StepLine())
            s.status = status

    def echo(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False)

    def _styled(self, label: str, style: str, rest: str) -> None:
        """``label`` in ``style``, then ``rest``, as given: keys and messages are
        the workflow's text, and rich markup in them (``a[b]c``) is not ours."""
        from rich.text import Text

        self.console.print(Text.assemble((label, style), rest), highlight=False)
