"""Open and create paths below a folder descriptor, never through a link.

The engine may run as root, and what it copies into a jail must be what the
workflow named, not whatever a symlink planted or swapped in points at. So a
path is never handed to the kernel whole: it is split into components, each
folder is opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to the previous
one (``openat``), and the file itself with ``O_NOFOLLOW``; the descriptor is
then ``fstat``-ed to be a regular file with one name. A symlink, a fifo, a
device or a second name of another file is refused, wherever and whenever it
appears, and the bytes hashed are the bytes read from that descriptor.

Refusals are values (``Refused`` carries the path and why); ``OSError`` that is
not about what sits at the path propagates.

Pure file-system code: imports nothing of stockade.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Sequence

#: A folder on the way: never through a symlink.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The file itself: never a symlink; O_NONBLOCK so a fifo cannot hang the open
#: (the fstat that follows refuses it), O_NOCTTY so a tty cannot become ours.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20


class Refused(Exception):
    """``path`` is not something the engine reads or writes; ``why`` says what it is."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


def parts_of(rel: str) -> list[str]:
    """The components of a path the workflow wrote: relative, no ``..``.

    ``.`` and empty components are dropped (``a/./b`` is ``a/b``); the engine
    never resolves ``..`` (what it means depends on links it does not follow).
    """
    if "\0" in rel:
        raise Refused(rel, "the path contains a NUL byte")
    if rel.startswith("/"):
        raise Refused(rel, "the path is absolute")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused(rel, "the path contains '..'")
    return parts


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "of an unknown kind"


def _why_not_opened(dir_fd: int, name: str, shown: str, exc: OSError, want: str) -> str:
    """Why ``name`` in ``dir_fd`` did not open as a ``want``, for the message.

    Asked after the failed open, so it may describe a later state; it only
    explains a refusal that has already been made.
    """
    if exc.errno == errno.ENOENT:
        return f"{shown} is missing"
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.EISDIR):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return f"{shown} changed while it was opened"
        kind = _kind(st.st_mode)
        if kind == "a folder" and want == "folder":
            return f"{shown} changed while it was opened"
        return f"{shown} is {kind}, not a {want}"
    return f"{shown}: {exc.strerror or exc}"


class Walker:
    """Opens files below ``root_fd`` by relative path, never through a link.

    Keeps the folders of the last path open, so walking a sorted list opens
    each folder once and holds at most one path's depth of descriptors. A
    folder once opened is the folder read from, whatever is renamed over its
    name afterwards.
    """

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        self._stack: list[tuple[str, int]] = []

    def __enter__(self) -> Walker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for _, fd in reversed(self._stack):
            os.close(fd)
        self._stack.clear()

    def folder(self, parts: Sequence[str], rel: str) -> int:
        """The descriptor of the folder ``parts`` (borrowed: the walker closes it)."""
        keep = 0
        while keep < len(self._stack) and keep < len(parts) and self._stack[keep][0] == parts[keep]:
            keep += 1
        for _, fd in reversed(self._stack[keep:]):
            os.close(fd)
        del self._stack[keep:]
        cur = self._stack[-1][1] if self._stack else self.root_fd
        for i in range(keep, len(parts)):
            try:
                fd = os.open(parts[i], DIR_FLAGS, dir_fd=cur)
            except OSError as exc:
                shown = "/".join(parts[: i + 1])
                raise Refused(rel, _why_not_opened(cur, parts[i], shown, exc, "folder")) from None
            self._stack.append((parts[i], fd))
            cur = fd
        return cur

    def open_file(self, rel: str) -> tuple[int, os.stat_result]:
        """A descriptor of the regular file at ``rel`` (the caller closes it) and its stat."""
        parts = parts_of(rel)
        if not parts:
            raise Refused(rel, "names the folder itself, not a file")
        parent = self.folder(parts[:-1], rel)
        try:
            # Looked at before the open, so a device is never opened (opening
            # one can act: rewind a tape, claim a tty); the fstat below decides.
            seen = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        except OSError as exc:
            raise Refused(rel, _why_not_opened(parent, parts[-1], rel, exc, "regular file")) from None
        if not stat.S_ISREG(seen.st_mode):
            raise Refused(rel, f"{rel} is {_kind(seen.st_mode)}, not a regular file")
        try:
            fd = os.open(parts[-1], FILE_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise Refused(rel, _why_not_opened(parent, parts[-1], rel, exc, "regular file")) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Refused(rel, f"{rel} is {_kind(st.st_mode)}, not a regular file")
            if st.st_nlink > 1:
                # A second name of a file kept elsewhere (a root-only one, where
                # the kernel lets hard links be made to files one cannot read).
                raise Refused(rel, f"{rel} is a hard link ({st.st_nlink} names)")
        except BaseException:
            os.close(fd)
            raise
        return fd, st


def open_folder(root_fd: int, rel: str) -> int:
    """A new descriptor of the folder ``rel`` below ``root_fd`` (the caller closes it)."""
    parts = parts_of(rel)
    if not parts:
        return os.dup(root_fd)
    with Walker(root_fd) as w:
        return os.dup(w.folder(parts, rel))


def sha256_fd(fd: int) -> tuple[str, int]:
    """sha256 and size of what ``fd`` reads from its current offset to the end."""
    h = hashlib.sha256()
    size = 0
    while chunk := os.read(fd, CHUNK):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


def copy_fd(src: int, dst: int) -> tuple[str, int]:
    """Copy ``src`` to ``dst``; the sha256 and size of exactly the bytes written."""
    h = hashlib.sha256()
    size = 0
    while chunk := os.read(src, CHUNK):
        h.update(chunk)
        size += len(chunk)
        write_all(dst, chunk)
    return h.hexdigest(), size


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``, however short each write is
    (no buffered file object: it would cost an ``fstat``, ``ioctl`` and
    ``lseek`` per file)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def make_folders(root_fd: int, parts: Sequence[str], rel: str) -> int:
    """``mkdir -p`` of ``parts`` below ``root_fd``, never through a link; a new descriptor."""
    cur = os.dup(root_fd)
    try:
        for i, name in enumerate(parts):
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=cur)
            try:
                nxt = os.open(name, DIR_FLAGS, dir_fd=cur)
            except OSError as exc:
                shown = "/".join(parts[: i + 1])
                raise Refused(rel, _why_not_opened(cur, name, shown, exc, "folder")) from None
            os.close(cur)
            cur = nxt
    except BaseException:
        os.close(cur)
        raise
    return cur


def create_file(root_fd: int, rel: str, mode: int = 0o644) -> int:
    """Create the new file ``rel`` below ``root_fd`` for writing; never through a link.

    Its folders are made as needed; an existing file, or a link at any
    component, is refused rather than written through.
    """
    parts = parts_of(rel)
    if not parts:
        raise Refused(rel, "names the folder itself, not a file")
    # A name with no folders (the usual input) is opened in ``root_fd``
    # itself: ``make_folders`` would duplicate it only to close it again.
    parent = make_folders(root_fd, parts[:-1], rel) if len(parts) > 1 else root_fd
    try:
        return os.open(parts[-1], CREATE_FLAGS, mode, dir_fd=parent)
    except FileExistsError:
        raise Refused(rel, f"{rel} already exists") from None
    finally:
        if parent != root_fd:
            os.close(parent)
