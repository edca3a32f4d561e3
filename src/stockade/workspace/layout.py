"""The directory layout of a run (DESIGN.md, "Directory layout").

::

    <root>/runs/<run_id>/manifest.json
    <root>/runs/<run_id>/<step>/<item>/work/        the attempt's whole writable world
    <root>/runs/<run_id>/<step>/<item>/work/out/    what it hands downstream
    <root>/runs/<run_id>/<step>/<item>/meta/        engine-owned (0700), never mounted
        <n>.out                  attempt n's stdout
        <n>.err                  attempt n's stderr (only when it wrote any)
        <n>/                     attempt n's other records, made only when needed:
                                 agent transcripts, network.jsonl, a retired work/
    <root>/runs/<run_id>/.scratch/<step>/<item>/    HOME/TMPDIR (bwrap: also /tmp, /dev/shm)

An attempt's provenance and the item's completion are records in the run
store, not files: a first attempt creates four folders and one file (the
item, ``work/``, ``out/``, ``meta/``, ``<n>.out``). Every attempt gets a
freshly created ``work/``: the previous attempt's tree is moved to
``meta/<n>/work`` first, so a retry never sees it.

Must not import the runner, the sandbox or the CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from stockade.errors import UserError


def atomic_write(path: Path, data: bytes) -> None:
    """Write through a temp file and rename, so readers see old or new, never half."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def write_json(path: Path, value: Any) -> None:
    atomic_write(path, (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode())


def write_record(path: Path, value: Any) -> None:
    """Write a per-attempt record in place, without the temp file and rename.

    For records whose readers treat an unreadable file as "not done"
    (completion, provenance): a torn write after a crash only makes resume
    run the item again, so the extra metadata operations buy nothing.
    One line, not indented: ``json`` encodes that in C, several times faster
    per item (``stockade show`` and ``why`` print them readably).
    """
    path.write_text(json.dumps(value, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class RunDir:
    root: Path
    run_id: str

    @cached_property
    def path(self) -> Path:
        return self.root / "runs" / self.run_id

    @property
    def manifest(self) -> Path:
        return self.path / "manifest.json"

    def create(self) -> None:
        """Create the run directory; an existing one is refused, never reused."""
        (self.root / "runs").mkdir(parents=True, exist_ok=True)
        try:
            self.path.mkdir()
        except FileExistsError:
            raise UserError(
                f"run id {self.run_id!r} is taken: {self.path} exists; run ids are never reused"
            ) from None

    def item(self, step: str, index: int) -> ItemDir:
        # Built from strings: joining Paths part by part is measurable per item.
        base = str(self.path)
        return ItemDir(Path(f"{base}/{step}/{index}"), Path(f"{base}/.scratch/{step}/{index}"))


@dataclass(frozen=True)
class ItemDir:
    """An item's folders. Paths are computed once per object (cached_property):
    the engine asks for them many times per item."""

    path: Path
    scratch: Path

    @cached_property
    def work(self) -> Path:
        return self.path / "work"

    @cached_property
    def out(self) -> Path:
        return self.work / "out"

    @cached_property
    def meta(self) -> Path:
        return self.path / "meta"

    def stdout(self, n: int) -> Path:
        return Path(f"{self.meta}/{n}.out")

    def stderr(self, n: int) -> Path:
        return Path(f"{self.meta}/{n}.err")

    def attempt_dir(self, n: int) -> Path:
        """Attempt ``n``'s folder of further records (not created here)."""
        return Path(f"{self.meta}/{n}")

    def attempt_numbers(self) -> list[int]:
        """Attempts with anything on disk, in order."""
        try:
            names = os.listdir(self.meta)
        except FileNotFoundError:
            return []
        found = {int(stem) for stem in (n.partition(".")[0] for n in names) if stem.isdigit()}
        return sorted(found)

    def last_attempt(self) -> int:
        """The highest attempt number on disk (0 if none)."""
        numbers = self.attempt_numbers()
        return numbers[-1] if numbers else 0

    def begin_attempt(self, n: int | None = None) -> int:
        """Start attempt ``n`` (default: the next on disk): retire the old ``work/``,
        create a fresh one.

        Returns the attempt number (from 1). The retired tree lands in the
        previous attempt's meta folder, outside every jail. The scratch folder
        (HOME/TMPDIR; bwrap's /tmp and /dev/shm too) is left to the backend
        to create, so backends that do not need it pay nothing.
        """
        work = str(self.work)
        previous = self.last_attempt() if n is None else n - 1
        n = previous + 1
        if os.path.lexists(work):
            if previous:
                dest = self.attempt_dir(previous) / "work"
                if dest.exists():
                    shutil.rmtree(dest)
                self.attempt_dir(previous).mkdir(parents=True, exist_ok=True)
                os.replace(work, dest)
            else:
                shutil.rmtree(work)
        if previous == 0:
            # Top-down, so no mkdir fails on a missing parent first (the
            # step's folder exists after its first item).
            os.makedirs(self.path, exist_ok=True)
            # meta/ is the engine's alone (prompts, transcripts, logs): no
            # other local user, jail uids included, may list or read it.
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.meta, 0o700)
        os.mkdir(work)
        os.mkdir(os.path.join(work, "out"))
        self._clear_scratch()
        return n

    def end_attempt(self) -> None:
        self._clear_scratch()

    def _clear_scratch(self) -> None:
        scratch = str(self.scratch)
        try:
            os.rmdir(scratch)
        except FileNotFoundError:
            pass
        except OSError:
            shutil.rmtree(scratch, ignore_errors=True)
