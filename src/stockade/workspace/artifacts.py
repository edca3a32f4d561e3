"""Artifacts: files an item wrote under ``out/``, hashed, owned by one run.

An ``Artifact`` is how an output travels downstream. Consuming one checks that
it was made by the consuming run (``StaleOutput`` otherwise) and that its bytes
still hash to what was recorded (``TamperedArtifact`` otherwise). mtime is never
consulted.

Host inputs (``file()``, ``tree()``) live in ``host``: fingerprinted when the
run starts, checked again when they are copied into a jail.

``to_json_value`` writes engine objects in their ``$`` forms (``refs``) and
escapes those keys in plain data; ``payload_value`` refuses plain data that
holds one, for what a sink will publish.

Must not import the runner, the sandbox or the CLI.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade.errors import StaleOutput, TamperedArtifact, UserError
from stockade.refs import escape_key, reserved_key_in
from stockade.workspace.beneath import sha256_fd
from stockade.workspace.host import (
    HostFile,
    HostTree,
    host_file,
    host_tree,
    materialise_tree,
    write_new_file,
)
from stockade.workspace.placing import Sharing, copy_in, share_in

__all__ = [
    "Artifact", "ForgedReference", "HostFile", "HostTree", "Materialised", "Output",
    "OutputRefused", "check_input_name", "collect_outputs", "host_file", "host_tree",
    "input_bytes", "materialise", "payload_value", "sha256_file", "to_json_value",
]

def outputs_problem(out: Path, outputs: Iterable[tuple[str, str, int]]) -> str | None:
    """Why recorded outputs ``(name, sha256, size)`` of the folder ``out`` no
    longer stand (changed, gone, unreadable), or None: each hashes as recorded.
    What resume keeps and what reuse takes are checked by this one rule."""
    for name, sha256, size in outputs:
        try:
            if sha256_file(out / name) != (sha256, size):
                return f"out/{name} no longer matches the sha256 recorded when it was made"
        except FileNotFoundError:
            return f"out/{name} is gone"
        except OSError as exc:
            return f"out/{name} cannot be read ({exc.strerror or exc})"
    return None


def sha256_file(path: str | Path) -> tuple[str, int]:
    """Hash a regular file without following a symlink at ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Artifact:
    """An output of one item attempt, as seen by a consumer in ``consumer_run``."""

    run_id: str
    step: str
    item: int
    attempt: int
    name: str
    sha256: str
    size: int
    path: Path = field(compare=False)
    consumer_run: str = field(default="", compare=False)

    def read_bytes(self) -> bytes:
        if self.consumer_run and self.run_id != self.consumer_run:
            raise StaleOutput(
                f"refusing to read {self.step}/{self.item}:out/{self.name}: it was produced by run "
                f"{self.run_id}, not by this run ({self.consumer_run})"
            )
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise TamperedArtifact(f"artifact {self.describe()} is unreadable: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            raise TamperedArtifact(
                f"artifact {self.describe()} changed after it was recorded: "
                f"sha256 {digest[:12]} != recorded {self.sha256[:12]}"
            )
        return data

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8", errors="replace")

    def __str__(self) -> str:
        return self.read_text()

    def describe(self) -> str:
        return f"{self.step}/{self.item}:out/{self.name} (run {self.run_id}, attempt {self.attempt})"

    def ref(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "step": self.step, "item": self.item,
            "attempt": self.attempt, "name": self.name, "sha256": self.sha256, "size": self.size,
        }

    def __stockade_json__(self) -> dict[str, Any]:
        out: dict[str, Any] = {"$artifact": self.ref()}
        if self.size <= 1 << 20:
            data = self.read_bytes()
            with contextlib.suppress(UnicodeDecodeError):
                out["text"] = data.decode("utf-8")
        return out


# -- outputs -----------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    name: str
    sha256: str
    size: int


class OutputRefused(Exception):
    """``out/`` holds something the engine will not hand downstream."""


#: Opening a folder of ``out/``: never through a symlink.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _why(exc: OSError) -> str:
    """Why an entry of ``out/`` could not be opened, for the refusal message."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
        return "changed while it was read"  # swapped, or removed, after the listing
    return exc.strerror or str(exc)


def collect_outputs(out_dir: Path, shared: Collection[tuple[int, int]] = ()) -> list[Output]:
    """Hash every regular file under ``out/``; refuse symlinks and special files.

    A hard link is refused unless it is one of ``shared`` (device, inode):
    an input the engine hard-linked into ``work/`` (engine-owned, read-only),
    which the step moved or linked into ``out/`` to hand it on unchanged.

    Nothing is followed: a symlink to a host file must never make the engine
    copy that file into the next jail. The walk goes by folder descriptors
    (``openat`` with ``O_NOFOLLOW``), so a folder swapped for a symlink while
    it runs, by a jail process still dying, is refused rather than entered;
    each file is checked again on the descriptor it is hashed from. Order: a
    folder's files by name, then its subfolders by name (as ``os.walk``
    top-down would give them).
    """
    found: list[Output] = []
    bad: list[str] = []

    def file(dir_fd: int, name: str, rel: str) -> None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=dir_fd)  # fmt: skip
        except OSError as exc:
            bad.append(f"{rel} ({_why(exc)})")
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (st.st_nlink > 1
                                                 and (st.st_dev, st.st_ino) not in shared):
                bad.append(f"{rel} (changed while it was read)")
                return
            if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                # A jail's setuid file must not become a privilege on the host.
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
            digest, size = sha256_fd(fd)
        finally:
            os.close(fd)
        found.append(Output(rel, digest, size))

    def visit(dir_fd: int, prefix: str) -> None:
        with os.scandir(dir_fd) as it:
            entries = sorted(it, key=lambda e: e.name)
        subfolders = []
        for entry in entries:
            rel = prefix + entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                bad.append(f"{rel} (symlink)")
            elif stat.S_ISDIR(st.st_mode):
                subfolders.append(entry.name)
            elif not stat.S_ISREG(st.st_mode):
                bad.append(f"{rel} (special file)")
            elif st.st_nlink > 1 and (st.st_dev, st.st_ino) not in shared:
                bad.append(f"{rel} (hard link)")
            else:
                file(dir_fd, entry.name, rel)
        for name in subfolders:
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                bad.append(f"{prefix}{name} ({_why(exc)})")
                continue
            try:
                visit(sub, prefix + name + "/")
            finally:
                os.close(sub)

    try:
        top = os.open(out_dir, _DIR_FLAGS)
    except FileNotFoundError:
        return []  # the step removed out/: it hands nothing downstream
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        # O_DIRECTORY with O_NOFOLLOW reports a symlink as ENOTDIR: ask.
        if stat.S_ISLNK(os.lstat(out_dir).st_mode):
            # Followed, out/ -> a host folder would be hashed and copied into
            # the next jail.
            raise OutputRefused("out/ itself was replaced by a symlink; refused") from exc
        raise OutputRefused("out/ itself was replaced by something that is not a folder") from exc
    try:
        visit(top, "")
    finally:
        os.close(top)
    if bad:
        raise OutputRefused("out/ may hold only regular files; refused: " + ", ".join(sorted(bad)))
    return found


# -- inputs ------------------------------------------------------------------


def check_input_name(name: str) -> str:
    norm = os.path.normpath(name)
    if not name or name.startswith("/") or norm.startswith("..") or norm in (".", "out") \
            or norm.startswith("out/"):
        raise UserError(f"input name {name!r} must be a relative path inside work/, not under out/")
    return norm


#: Exact types that are their own JSON value (a subclass may carry a hook).
_LEAVES = frozenset({str, int, float, bool, type(None)})


def to_json_value(value: Any) -> Any:
    """Turn rendered values (possibly holding artifacts) into plain JSON values.

    Engine objects write their ``$`` forms; a plain mapping's ``$artifact``,
    ``$file`` or ``$tree`` key is escaped to ``$$artifact`` (and so on), so
    data never reads as a reference.
    """
    if type(value) in _LEAVES:
        return value
    hook = getattr(value, "__stockade_json__", None)
    if hook is not None:
        return hook()
    if isinstance(value, dict):
        return {escape_key(str(k)): to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(v) for v in value]
    return value


class ForgedReference(UserError):
    """Plain data holds a key only the engine's own references may have."""


def payload_value(value: Any, what: str = "payload") -> Any:
    """``to_json_value`` for what a sink publishes: plain data posing as a reference is refused.

    A ``$artifact`` (or ``$file``, ``$tree``) key in data, parsed from a step's
    output or written in vars, is not a reference and must not reach a sink
    looking like one; only ``steps.X.outputs[...]`` (and ``file()``, ``tree()``)
    are.
    """
    found = reserved_key_in(value)
    if found is not None:
        path, key = found
        raise ForgedReference(
            f"refused: {what}{path} holds the key {key!r} in data; only the engine's own "
            f"references have it (steps.X.outputs[...] for an artifact), and data parsed "
            f"from a step's output is never one. Put the output itself in the {what}, or "
            f"rename the key"
        )
    return to_json_value(value)


@dataclass(frozen=True)
class Materialised:
    name: str
    sha256: str
    size: int
    source: dict[str, Any]
    #: The artifact file a backend binds read-only over the placeholder at ``name``.
    bind_source: Path | None = None
    #: (device, inode) of an input hard-linked into ``work/``: the step may
    #: move it to ``out/``, and it is then accepted as an output.
    inode: tuple[int, int] | None = None


def _open_artifact(value: Artifact) -> int:
    try:
        return os.open(value.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise TamperedArtifact(f"artifact {value.describe()} is unreadable: {exc.strerror}") \
            from None


def materialise(work: Path, name: str, value: Any, run_id: str, *,
                sharing: Sharing = "copy") -> Materialised:
    """Write one declared input into ``work/``; the only way anything enters a jail.

    Nothing is written through a link: every folder on the way is opened with
    ``O_NOFOLLOW`` and every file is created new. Files (artifacts, ``file()``)
    are streamed, never read whole, and must hash as recorded; a large
    artifact is shared without a copy as ``sharing`` (the backend's
    ``input_sharing``) allows (``placing``).
    """
    name = check_input_name(name)
    source: dict[str, Any]
    if isinstance(value, Artifact):
        if value.run_id != run_id:
            raise StaleOutput(
                f"input {name!r}: artifact {value.describe()} was produced by run {value.run_id}, "
                f"not by this run ({run_id})"
            )
        source = {"kind": "artifact", **value.ref()}
        fd = _open_artifact(value)
        try:
            placed = share_in(fd, work, name, value.sha256,
                              f"artifact {value.describe()} changed after it was recorded",
                              sharing, value.path)
        finally:
            os.close(fd)
        if placed.how != "copy":
            source["shared"] = placed.how
        return Materialised(name, placed.sha256, placed.size, source, placed.bind_source,
                            placed.inode)
    if isinstance(value, HostFile):
        fd = value.open()
        try:
            placed = copy_in(fd, work, name, value.sha256,
                             f"host file {value.rel} changed since the run started")
        finally:
            os.close(fd)
        return Materialised(name, placed.sha256, placed.size, {"kind": "file", "path": value.rel})
    if isinstance(value, HostTree):
        materialise_tree(value, work, name)
        source = {"kind": "tree", "path": value.rel}
        if value.refused:
            source["refused"] = [{"path": p, "why": why} for p, why in value.refused]
        return Materialised(name, value.sha256, len(value.files), source)
    data, kind = input_bytes(value)
    write_new_file(work, name, data)
    return Materialised(name, hashlib.sha256(data).hexdigest(), len(data), {"kind": kind})


#: Built once: ``json.dumps`` with options makes an encoder per call.
_DATA = json.JSONEncoder(ensure_ascii=False, sort_keys=True)


def input_bytes(value: Any) -> tuple[bytes, str]:
    """What the file of a text or data input holds, and its kind (``text`` or
    ``json``). The reuse key hashes the same bytes before anything is written."""
    if isinstance(value, str):
        return value.encode("utf-8"), "text"
    return _DATA.encode(to_json_value(value)).encode("utf-8"), "json"
