"""The directory layout of a run (DESIGN.md, "Directory layout").

::

    <root>/runs/<run_id>/manifest.json
    <root>/runs/<run_id>/<step>/                    FS_TOPDIR_FL where the filesystem takes it
                                                    (``spread``): its items are unrelated trees
    <root>/runs/<run_id>/<step>/<item>/work/        the attempt's whole writable world
    <root>/runs/<run_id>/<step>/<item>/work/out/    what it hands downstream
    <root>/runs/<run_id>/<step>/<item>/meta/        engine-owned (0700), never mounted
        <n>.out                  attempt n's stdout
        <n>.err                  attempt n's stderr (only when it wrote any)
        <n>/                     attempt n's other records, made only when needed:
                                 agent transcripts, network.jsonl, a retired work/
    <root>/runs/<run_id>/.scratch/<k>/    an attempt's HOME/TMPDIR (bwrap: also /tmp,
                                          /dev/shm); lent for the attempt (``ScratchPool``)

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
import stat
import threading
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from stockade.errors import InfraError, UserError
from stockade.workspace.spread import is_spread, make_spread_folder


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


class ScratchPool:
    """The run's scratch folders (``.scratch/<k>``), lent to one attempt at a time.

    Why a pool: a scratch folder made and removed per item cost two inode
    operations per item, and on ext4 without a journal each removed inode
    is skipped by the allocator for a while, so every later ``mkdir`` of the
    run scanned past the scratch folders removed before it (a fifth of the
    engine's kernel time on a 2,000-item ``--sandbox none`` run, measured
    against the pool in paired runs).

    Only a folder that no sandbox stood around (``give(..., keep=True)``:
    the ``none`` backend, ``isolate: false``), or whose jail was seen wholly
    gone (``ItemDir.jail_gone``: its cgroup found empty when its main
    process ended, nothing left in it to kill), may be lent again as it is, and only if it comes
    back empty with the owner, group and mode of ``.scratch`` itself
    (backends make both alike). Otherwise a jail's last processes die a
    moment after its main one (SIGKILLed, then reaped off the item's path),
    and a system call one of them had begun may still create a file: kept
    for the next attempt, the folder would carry it across. So that folder
    is removed, and only its name is lent again: bwrap binds the folder and
    landlock grants it by its inode, so a jail still dying reaches the
    removed folder, never the new one.

    A name whose folder cannot be removed (its jail left a folder it may not
    read) is never lent again; a name is also cleared before its first loan
    in this process, since a crashed engine of the same run may have left
    anything there. There are only as many names as attempts ran at once.
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self._free: list[Path] = []
        self._made = 0
        self._made_like: tuple[int, int, int] | None = None
        self._lock = threading.Lock()

    def take(self) -> Path:
        """A scratch path for one attempt: an empty folder, or nothing yet (the backend makes it)."""
        while True:
            with self._lock:
                if self._free:
                    return self._free.pop()
                k = self._made
                self._made += 1
            path = Path(f"{self.base}/{k}")
            if _removed(path):
                return path

    def give(self, path: Path, *, keep: bool, mount_points: frozenset[str] = frozenset()) -> None:
        """Take back what ``take`` lent, once the attempt's jail has ended.

        ``keep``: the jail made no isolation promise, or is wholly gone, so
        an empty folder may be lent again as it is; otherwise the folder is
        removed. ``mount_points``: names of empty folders the jail's own
        mounts left in it, which the jail could not enter
        (``Backend.scratch_mount_points``); the folder counts as empty with
        them, if each is an empty folder as made."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            pass
        else:
            kept = keep and stat.S_ISDIR(st.st_mode) and self._as_made(st) \
                and self._empty(path, mount_points)
            if not kept and not _removed(path):
                return  # retired: what is left there never reaches another attempt
        with self._lock:
            self._free.append(path)

    def _empty(self, path: Path, mount_points: frozenset[str]) -> bool:
        names = os.listdir(path)
        if not names:
            return True
        if not mount_points.issuperset(names):
            return False
        for name in names:
            st = os.lstat(f"{path}/{name}")
            if not (stat.S_ISDIR(st.st_mode) and self._as_made(st)) or os.listdir(f"{path}/{name}"):
                return False
        return True

    def _as_made(self, st: os.stat_result) -> bool:
        """Owner, group and mode as the folder it was made in has them: a jail that
        owned its scratch may have opened it to others, and that must not outlive it."""
        if self._made_like is None:
            base = os.lstat(self.base)
            self._made_like = (base.st_uid, base.st_gid, stat.S_IMODE(base.st_mode))
        return (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == self._made_like


def _removed(path: Path) -> bool:
    """Remove whatever is at ``path``, never through a link; whether nothing is left."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except NotADirectoryError:
        os.unlink(path)
    except OSError:
        if os.path.islink(path):
            os.unlink(path)
        else:
            shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


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
        runs = self.root / "runs"
        try:
            runs.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            why = "a file is in the way" if runs.is_file() else exc.strerror or str(exc)
            raise InfraError(f"cannot make {runs}, where runs go: {why}; choose another root "
                             "(--root, $STOCKADE_HOME)") from None
        try:
            self.path.mkdir()
        except FileExistsError:
            raise UserError(
                f"run id {self.run_id!r} is taken: {self.path} exists; run ids are never reused"
            ) from None

    @cached_property
    def scratch(self) -> ScratchPool:
        return ScratchPool(self.path / ".scratch")

    def make_step(self, step: str) -> bool:
        """Make the step's folder, asking the filesystem to spread its item
        folders (``spread``), unless it exists; whether they are spread:
        whether the folder has the flag now, made here or before."""
        path = f"{self.path}/{step}"
        make_spread_folder(path)
        return is_spread(path)

    def item(self, step: str, index: int) -> ItemDir:
        # Built from a string: joining Paths part by part is measurable per item.
        return ItemDir(Path(f"{self.path}/{step}/{index}"), self.scratch)


@dataclass
class ItemDir:
    """An item's folders. Paths are computed once per object (cached_property):
    the engine asks for them many times per item."""

    path: Path
    #: Where the attempt's scratch folder is borrowed from (None: an item
    #: that never runs a jail).
    pool: ScratchPool | None = field(default=None, repr=False)
    _lent: Path | None = field(default=None, init=False, repr=False)
    #: Set once the jail that used the lent scratch folder was seen wholly
    #: gone (``jail_gone``), to the names of its own mount points left in
    #: it: the folder may be lent again as it is.
    _gone: frozenset[str] | None = field(default=None, init=False, repr=False)

    @property
    def scratch(self) -> Path:
        """The current attempt's scratch folder (HOME/TMPDIR), borrowed on first use
        and returned by ``end_attempt``; the backend creates it if it does not exist."""
        if self._lent is None:
            if self.pool is None:
                raise RuntimeError(f"{self.path}: no scratch folder outside a run")
            self._lent = self.pool.take()
        return self._lent

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
        """Attempts with anything on disk, in order.

        An attempt's captures are made on its first byte, so the latest one
        may have left none: its ``work/`` says it began. Each attempt's
        ``work/`` moves to ``meta/<n>/work`` as the next begins, so the one in
        place is the attempt after the last one moved. (``meta/`` is made with
        the first attempt; an item reused from another run has none.)
        """
        try:
            names = os.listdir(self.meta)
        except FileNotFoundError:
            return []
        found = {int(stem) for stem in (n.partition(".")[0] for n in names) if stem.isdigit()}
        if os.path.lexists(self.work):
            moved = [n for n in found if os.path.isdir(f"{self.meta}/{n}/work")]
            found.add(max(moved, default=0) + 1)
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
        (HOME/TMPDIR; bwrap's /tmp and /dev/shm too) is borrowed from the
        run's pool when first asked for, and created by the backend.
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
            # A first attempt takes the folders ``premake`` made ahead of its
            # turn, if they are there: a rename, no new inode on its path.
            with contextlib.suppress(FileNotFoundError):
                os.rename(self.ready, work)
                return n
            self._make_item()
        os.mkdir(work)
        os.mkdir(os.path.join(work, "out"))
        return n

    @cached_property
    def ready(self) -> str:
        """``<item>/.next``: a first attempt's ``work/`` made ahead of its turn."""
        return f"{self.path}/.next"

    def make_folder(self) -> None:
        """Make the item's folder (and its step's, the first time)."""
        try:
            os.mkdir(self.path)
        except FileExistsError:
            pass
        except FileNotFoundError:
            # The step's first item: its folder holds unrelated trees, so ext4
            # is asked to spread them (``spread``).
            make_spread_folder(os.path.dirname(self.path))
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.path)

    def _make_item(self) -> None:
        self.make_folder()
        # meta/ is the engine's alone (prompts, transcripts, logs): no other
        # local user, jail uids included, may list or read it.
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.meta, 0o700)

    def premake(self) -> None:
        """Make the item's folders and its first ``work/`` (as ``.next``, with
        ``out/``) before its turn, so that ``begin_attempt`` only renames it.

        Only for an item whose first attempt has not begun; the caller makes
        sure the two never run at once (``runner.prefetch``). ``.next`` is
        complete once it exists: it is made as ``.next.tmp`` and renamed.
        """
        self._make_item()
        if os.path.lexists(self.ready) or os.path.lexists(self.work):
            return
        tmp = f"{self.ready}.tmp"
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(tmp)
        os.mkdir(tmp)
        os.mkdir(f"{tmp}/out")
        os.rename(tmp, self.ready)

    def drop_ready(self) -> None:
        """Remove a ``.next`` no attempt took (the item never ran)."""
        shutil.rmtree(self.ready, ignore_errors=True)

    def jail_gone(self, mount_points: frozenset[str] = frozenset()) -> None:
        """The attempt's jail ended and the backend saw every process of it
        gone (``sandbox.jail_left_nothing``): nothing can still
        write to its scratch folder, so ``end_attempt`` may keep the folder.
        ``mount_points``: see ``ScratchPool.give``."""
        self._gone = mount_points

    def end_attempt(self, *, keep_scratch: bool = False) -> None:
        """Return the attempt's scratch folder (its jail has ended); ``keep_scratch``:
        the jail was not an enforced sandbox, so an empty folder may be lent again
        as it is (``ScratchPool``), as it may after ``jail_gone``."""
        lent, self._lent = self._lent, None
        gone, self._gone = self._gone, None
        if lent is not None and self.pool is not None:
            self.pool.give(lent, keep=keep_scratch or gone is not None,
                           mount_points=gone or frozenset())
