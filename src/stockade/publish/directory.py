"""The directory sink: one JSON file per key, written atomically, fenced in the store.

A file is written as temp file -> fsync -> rename -> fsync of the directory,
all under an exclusive ``flock`` on ``.stockade.lock`` in the directory, so the
fence check and the rename cannot interleave with another writer's. The fence
(the high-water token per lease) is advanced in the store *before* the rename:
a crash between the two leaves a mark that is merely up to date, never one a
stale writer could slip under. Temp files left by a crashed writer are swept
when the next writer takes the lock. A failed fsync fails the write.

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from stockade.publish.sink import Sink, Write, WriteResult, fenced_message
from stockade.store.base import Store

LOCK_NAME = ".stockade.lock"
TMP_MARK = ".tmp-"


def file_name(key: str) -> str:
    """A key as a file name: safe characters kept, everything else percent-escaped."""
    name = quote(key, safe="-_.@+=,")
    if name.startswith("."):
        name = "%2E" + name[1:]
    return name + ".json"


def _why(exc: OSError, target: Path) -> str:
    """An OS error of a write to ``target`` in words that say what to change."""
    if exc.errno == errno.ENAMETOOLONG:
        return (f"the key makes a file name of {len(os.fsencode(target.name))} bytes, more than "
                "the filesystem takes (usually 255); use a shorter key")
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        folder = target.parent
        blocking = next((p for p in (folder, *folder.parents)
                         if p.exists() and not p.is_dir()), folder)
        return f"{blocking} is a file where a folder is needed"
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


class DirectorySink(Sink):
    def __init__(
        self, directory: Path, store: Store, *, fsync: Callable[[int], None] = os.fsync,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(directory)
        self.store = store
        self.name = f"file://{self.directory}"
        self._fsync = fsync
        self._clock = clock

    def scope(self, lease: str) -> str:
        return f"{self.name}#{lease}"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.sweep()
            yield
        finally:
            os.close(fd)

    def sweep(self) -> list[Path]:
        """Remove temp files a crashed writer left; only call with the lock held."""
        gone = []
        for p in self.directory.glob(f".*{TMP_MARK}*"):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                gone.append(p)
        return gone

    def _read(self, target: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(target.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _sync_path(self, path: Path, flags: int) -> None:
        fd = os.open(path, flags)
        try:
            self._fsync(fd)
        finally:
            os.close(fd)

    def write(self, w: Write) -> WriteResult:
        target = self.directory / file_name(w.key)
        try:
            with self._locked():
                old = self._read(target)
                if old and old.get("idempotency_key") == w.idempotency_key:
                    # Landed before; make sure it is durable before saying so.
                    self._sync_path(target, os.O_RDONLY)
                    self._sync_path(self.directory, os.O_RDONLY | os.O_DIRECTORY)
                    return WriteResult("already", int(old.get("fencing_token", w.token)),
                                       message="already applied")
                if old and isinstance(old.get("fencing_token"), int) and w.token < old["fencing_token"]:
                    winner, who = int(old["fencing_token"]), str(old.get("run_id", ""))
                    return WriteResult("fenced", w.token, winner, who,
                                       fenced_message(w.token, winner, who, self.name))
                check = self.store.advance_fence(self.scope(w.lease), w.token, w.run_id)
                if not check.accepted:
                    return WriteResult(
                        "fenced", w.token, check.high_water, check.holder,
                        fenced_message(w.token, check.high_water, check.holder, self.name),
                    )
                self._replace(target, w)
        except OSError as exc:
            return WriteResult("failed", w.token,
                               message=f"directory sink {self.directory}: {_why(exc, target)}")
        return WriteResult("applied", w.token, message="applied")

    def _replace(self, target: Path, w: Write) -> None:
        body = json.dumps(
            {"key": w.key, "payload": w.payload, "run_id": w.run_id, "fencing_token": w.token,
             "lease": w.lease, "idempotency_key": w.idempotency_key,
             "published_at": self._clock()},
            sort_keys=True, ensure_ascii=False, indent=2,
        ).encode("utf-8") + b"\n"
        # Not named after the target: a key near the file-name limit would
        # make the temporary name the one too long.
        tmp = self.directory / f".stockade{TMP_MARK}{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                view = memoryview(body)
                while view:
                    view = view[os.write(fd, view):]
                self._fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        self._sync_path(self.directory, os.O_RDONLY | os.O_DIRECTORY)

    def lookup(self, idempotency_key: str, key: str) -> WriteResult | None:
        target = self.directory / file_name(key)
        data = self._read(target)
        if not data or data.get("idempotency_key") != idempotency_key:
            return None
        try:
            self._sync_path(target, os.O_RDONLY)
            self._sync_path(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return None  # not provably durable: let write() redo it and report the error
        return WriteResult("already", int(data.get("fencing_token", 0)), message="already applied")
