"""How a file input enters ``work/``: in constant memory, checked by sha256.

Every way reads the source through a descriptor opened without following a
link and checks the bytes the jail will see against the recorded sha256
(``TamperedArtifact`` otherwise; nothing is left behind in ``work/``):

* ``copy``: a streamed copy, hashed as it is written (1 MiB at a time,
  whatever the size); a reflink first where the filesystem has them (btrfs,
  XFS): a copy-on-write clone costs no disk, and the clone is what is hashed.
* ``link`` (a jail that runs as another uid than the engine, which owns the
  file): a reflink, else a hard link to the artifact once it is made
  engine-owned and read-only (no jail can change what other items read),
  else a copy.
* ``bind`` (bwrap): an empty, read-only placeholder at the input's name; the
  backend binds the artifact over it read-only (``Policy.shared_inputs``).

Only artifacts of at least ``SHARE_MIN`` bytes are shared: below that a copy
costs less than a mount or a link.

Pure file-system code: imports nothing of stockade but ``stockade.errors`` and
``stockade.workspace.beneath``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stockade.errors import TamperedArtifact, UserError
from stockade.workspace.beneath import (
    DIR_FLAGS,
    Refused,
    copy_fd,
    create_file,
    make_folders,
    parts_of,
    sha256_fd,
)

Sharing = Literal["bind", "link", "copy"]
#: Smaller artifacts are always copied.
SHARE_MIN = 1 << 20
#: ioctl(FICLONE): a copy-on-write clone on btrfs, XFS and others.
FICLONE = 0x40049409
_NO_CLONE = (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.EBADF,
             errno.ENOSYS, errno.EPERM)


@dataclass(frozen=True)
class Placed:
    """How an input got into ``work/``: ``copy``, ``reflink``, ``hardlink`` or
    ``bind`` (then ``bind_source`` is the file to bind over the placeholder);
    ``inode`` (device, inode) of a hard link, which the step may move into
    ``out/``."""

    how: str
    sha256: str
    size: int
    bind_source: Path | None = None
    inode: tuple[int, int] | None = None


def clone_fd(src: int, dst: int) -> bool:
    """Make ``dst`` a copy-on-write clone of ``src``; False where the filesystem cannot."""
    try:
        fcntl.ioctl(dst, FICLONE, src)
    except OSError as exc:
        if exc.errno in _NO_CLONE:
            return False
        raise
    return True


def _new_file(work: Path, name: str, mode: int = 0o644) -> int:
    work_fd = os.open(work, DIR_FLAGS)
    try:
        return create_file(work_fd, name, mode)
    except Refused as r:
        raise UserError(f"input {name!r}: {r.why}") from None
    finally:
        os.close(work_fd)


def _remove(work: Path, name: str) -> None:
    """Remove ``work/name`` (a file this module made), never through a link."""
    parts = parts_of(name)
    work_fd = os.open(work, DIR_FLAGS)
    try:
        parent = make_folders(work_fd, parts[:-1], name)
    except Refused:
        return
    finally:
        os.close(work_fd)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(parts[-1], dir_fd=parent)
    finally:
        os.close(parent)


def _check(work: Path, name: str, got: str, want: str, what: str) -> None:
    """``what`` says what changed ("artifact X changed after it was recorded")."""
    if got != want:
        _remove(work, name)
        raise TamperedArtifact(f"{what} (sha256 {got[:12]} != recorded {want[:12]}); not "
                               "copied into the jail")


def copy_in(src: int, work: Path, name: str, want: str, what: str) -> Placed:
    """Reflink or stream ``src`` (read from its start) to the new ``work/name``."""
    placed = _clone_in(src, work, name, want, what, or_copy=True)
    assert placed is not None
    return placed


def _clone_in(src: int, work: Path, name: str, want: str, what: str, *,
              or_copy: bool) -> Placed | None:
    """``src`` as the new ``work/name``: a reflink, else (``or_copy``) a copy
    streamed from its start, else nothing (None, no file left); checked
    against ``want`` by what was written."""
    dst = _new_file(work, name)
    how = ""
    try:
        if clone_fd(src, dst):
            got, size = sha256_fd(dst)  # the clone's bytes are what the jail reads
            how = "reflink"
        elif or_copy:
            os.lseek(src, 0, os.SEEK_SET)
            got, size = copy_fd(src, dst)
            how = "copy"
    finally:
        os.close(dst)
    if not how:
        _remove(work, name)
        return None
    _check(work, name, got, want, what)
    return Placed(how, got, size)


def _link(src: int, work: Path, name: str) -> tuple[int, int] | None:
    """Hard-link the file ``src`` at ``work/name``; its (device, inode), or None
    where the filesystem refuses (then the caller copies)."""
    parts = parts_of(name)
    work_fd = os.open(work, DIR_FLAGS)
    try:
        parent = make_folders(work_fd, parts[:-1], name)
    except Refused as r:
        raise UserError(f"input {name!r}: {r.why}") from None
    finally:
        os.close(work_fd)
    try:
        # The inode that was hashed, not whatever its name points at now.
        os.link(f"/proc/self/fd/{src}", parts[-1], dst_dir_fd=parent, follow_symlinks=True)
    except FileExistsError:
        raise UserError(f"input {name!r}: {name} already exists") from None
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.ENOENT):
            return None
        raise
    finally:
        os.close(parent)
    st = os.fstat(src)
    return st.st_dev, st.st_ino


def share_in(src: int, work: Path, name: str, want: str, what: str, sharing: Sharing,
             source: Path) -> Placed:
    """Place the artifact open at ``src`` (its file is ``source``) as ``sharing`` allows."""
    st = os.fstat(src)
    if not stat.S_ISREG(st.st_mode):
        raise TamperedArtifact(f"{what}: it is no longer a regular file")
    if sharing == "copy" or st.st_size < SHARE_MIN:
        return copy_in(src, work, name, want, what)
    if sharing == "link":
        placed = _clone_in(src, work, name, want, what, or_copy=False)
        if placed is not None:
            return placed
    # Read-only for everyone but the engine, and the engine's (a root engine
    # takes back what a jail made): no jail can change what it shares.
    me = os.geteuid()
    if st.st_uid != me:
        if me != 0:
            return copy_in(src, work, name, want, what)
        os.fchown(src, me, -1)
    os.fchmod(src, (stat.S_IMODE(st.st_mode) | 0o444) & ~0o7222)
    got, size = sha256_fd(src)
    if got != want:
        raise TamperedArtifact(f"{what} (sha256 {got[:12]} != recorded {want[:12]}); not "
                               "shared with the jail")
    if sharing == "bind":
        # A placeholder the bind covers; a jail can neither write through it nor rename it.
        os.close(_new_file(work, name, 0o444))
        return Placed("bind", got, size, bind_source=source)
    inode = _link(src, work, name)
    if inode is None:
        return copy_in(src, work, name, want, what)
    return Placed("hardlink", got, size, inode=inode)


__all__ = ["SHARE_MIN", "Placed", "Sharing", "clone_fd", "copy_in", "share_in"]
