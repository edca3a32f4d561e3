"""Apply image layers to a folder: whiteouts handled, nothing unsafe written.

An OCI or docker image is a list of layer tarballs applied in order. A
layer may delete what lower layers made: ``D/.wh.NAME`` removes ``D/NAME``,
``D/.wh..wh..opq`` empties ``D``; both apply to lower layers only, so each
layer is read twice: once for its whiteouts (removed first), once for its
entries.

The engine may run as root, and an image is data from elsewhere, so nothing
in a layer is trusted: every path is split into components and each folder
is opened with ``O_NOFOLLOW`` from a descriptor of the folder being built
(never through a symlink a layer planted), and these are refused, failing
the whole image: absolute names, ``..``, an entry below a symlink or a file,
a hard link to a name outside the tree or not yet there, a relative symlink
that climbs above the root, devices, fifos and anything else that is not a
file, folder or link. Ownership is not kept (the jail never runs as the
image's root): every entry belongs to the engine, files are readable by all
and executable by all where their owner could execute them, nothing is
writable by group or others, and set-id bits are dropped.

Standard library only. Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable
from typing import IO, Protocol, cast

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
CHUNK = 1 << 20


class LayerRefused(Exception):
    """A layer holds something the engine will not unpack; the message says what."""


def clean_name(name: str, what: str = "entry") -> list[str]:
    """The components of a layer entry's name; ``LayerRefused`` if unsafe."""
    if "\0" in name:
        raise LayerRefused(f"{what} {name!r} contains a NUL byte")
    if name.startswith("/"):
        raise LayerRefused(f"{what} {name!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise LayerRefused(f"{what} {name!r} contains '..'")
    return parts


def symlink_escapes(parts: list[str], target: str) -> bool:
    """A relative symlink at ``parts`` whose target climbs above the root."""
    if target.startswith("/"):
        return False  # resolved inside the jail's own root
    depth = len(parts) - 1
    for p in target.split("/"):
        if p == "..":
            depth -= 1
            if depth < 0:
                return True
        elif p not in ("", "."):
            depth += 1
    return False


def file_mode(mode: int) -> int:
    """Readable by all; executable by all where the owner could; owner-writable only."""
    bits = (mode & 0o500) | 0o400
    return bits | (bits >> 3) | (bits >> 6) | 0o200


def _kind(member: tarfile.TarInfo) -> str:
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a fifo"
    return f"of tar type {member.type!r}"


class Tree:
    """The root folder an image is unpacked into, as a descriptor."""

    def __init__(self, root: str) -> None:
        self.fd = os.open(root, DIR_FLAGS)
        #: Folders made so far, by relative path (their final mode is set by ``finish``).
        self.folders: set[str] = set()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _folder(self, parts: list[str], name: str, *, create: bool) -> int | None:
        """A new descriptor of the folder ``parts``; None if missing and not ``create``."""
        cur = os.dup(self.fd)
        try:
            for i, p in enumerate(parts):
                try:
                    nxt = os.open(p, DIR_FLAGS, dir_fd=cur)
                except FileNotFoundError:
                    if not create:
                        os.close(cur)
                        return None
                    os.mkdir(p, 0o755, dir_fd=cur)
                    self.folders.add("/".join(parts[: i + 1]))
                    nxt = os.open(p, DIR_FLAGS, dir_fd=cur)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        shown = "/".join(parts[: i + 1])
                        raise LayerRefused(
                            f"entry {name!r} lies below {shown!r}, which is not a folder "
                            "(a symlink or a file); refused") from None
                    raise
                os.close(cur)
                cur = nxt
        except BaseException:
            os.close(cur)
            raise
        return cur

    def remove(self, parent: int, name: str) -> None:
        """Remove ``name`` in ``parent`` (a folder with everything in it), never following links."""
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=parent)
        else:
            os.unlink(name, dir_fd=parent)

    def whiteouts(self, layer: tarfile.TarFile) -> None:
        """Pass one: remove what the layer's whiteouts hide in lower layers."""
        for member in layer:
            parts = clean_name(member.name)
            if not parts or not parts[-1].startswith(WHITEOUT):
                continue
            parent = self._folder(parts[:-1], member.name, create=False)
            if parent is None:
                continue
            try:
                base = parts[-1]
                if base == OPAQUE:
                    for entry in os.listdir(parent):
                        self.remove(parent, entry)
                elif not base.startswith(WHITEOUT + WHITEOUT):  # aufs metadata otherwise
                    hidden = base[len(WHITEOUT):]
                    if hidden in ("", ".", ".."):
                        raise LayerRefused(f"whiteout {member.name!r} names no entry")
                    self.remove(parent, hidden)
            finally:
                os.close(parent)

    def entries(self, layer: tarfile.TarFile) -> None:
        """Pass two: write the layer's entries."""
        for member in layer:
            parts = clean_name(member.name)
            if not parts:
                continue  # the root itself
            if parts[-1].startswith(WHITEOUT):
                continue
            self._entry(layer, member, parts)

    def _entry(self, layer: tarfile.TarFile, member: tarfile.TarInfo, parts: list[str]) -> None:
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise LayerRefused(f"entry {member.name!r} is {_kind(member)}; refused")
        if member.issym() and symlink_escapes(parts, member.linkname):
            raise LayerRefused(f"symlink {member.name!r} -> {member.linkname!r} leads above the "
                               "image's root; refused")
        parent = self._folder(parts[:-1], member.name, create=True)
        assert parent is not None
        base = parts[-1]
        rel = "/".join(parts)
        try:
            try:
                st: os.stat_result | None = os.stat(base, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if member.isdir():
                if st is None or not stat.S_ISDIR(st.st_mode):
                    self.remove(parent, base)
                    os.mkdir(base, 0o755, dir_fd=parent)
                self.folders.add(rel)
                return
            if st is not None:
                self.remove(parent, base)
            if member.isreg():
                self._file(layer, member, parent, base)
            elif member.issym():
                os.symlink(member.linkname, base, dir_fd=parent)
            else:
                self._hardlink(member, parent, base)
        finally:
            os.close(parent)

    def _file(self, layer: tarfile.TarFile, member: tarfile.TarInfo, parent: int,
              base: str) -> None:
        src = layer.extractfile(member)
        if src is None:
            raise LayerRefused(f"entry {member.name!r} has no data")
        fd = os.open(base, CREATE_FLAGS, 0o600, dir_fd=parent)
        try:
            while chunk := src.read(CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
            os.fchmod(fd, file_mode(member.mode))
        finally:
            os.close(fd)

    def _hardlink(self, member: tarfile.TarInfo, parent: int, base: str) -> None:
        target = clean_name(member.linkname, "hard link target")
        if not target:
            raise LayerRefused(f"hard link {member.name!r} names the root")
        tparent = self._folder(target[:-1], member.linkname, create=False)
        if tparent is None:
            raise LayerRefused(f"hard link {member.name!r} -> {member.linkname!r}: no such "
                               "entry in the image (yet); refused")
        try:
            try:
                tst = os.stat(target[-1], dir_fd=tparent, follow_symlinks=False)
            except FileNotFoundError:
                raise LayerRefused(f"hard link {member.name!r} -> {member.linkname!r}: no such "
                                   "entry in the image (yet); refused") from None
            if stat.S_ISDIR(tst.st_mode):
                raise LayerRefused(f"hard link {member.name!r} -> {member.linkname!r} names a "
                                   "folder; refused")
            os.link(target[-1], base, src_dir_fd=tparent, dst_dir_fd=parent,
                    follow_symlinks=False)
        finally:
            os.close(tparent)

    def finish(self) -> None:
        """Give every folder its final mode: 0755 (the jail reads, never writes)."""
        for rel in sorted(self.folders):
            try:
                fd = self._folder(rel.split("/"), rel, create=False)
            except LayerRefused:
                continue  # replaced by a file or a link in a later layer
            if fd is not None:
                os.fchmod(fd, 0o755)
                os.close(fd)
        os.fchmod(self.fd, 0o755)


class LayerStream(Protocol):
    """A layer's uncompressed tar stream; ``verify`` (after a full read of
    the tar) reads the rest and checks the digests, raising ``LayerRefused``."""

    def read(self, n: int = -1, /) -> bytes: ...

    def close(self) -> None: ...

    def verify(self) -> None: ...


def apply_layer(tree: Tree, open_layer: Callable[[], LayerStream], label: str) -> None:
    """Apply one layer to ``tree``: its whiteouts, then (once the first read
    verified the layer's digests) its entries. ``open_layer`` gives the
    stream from the start each time; ``LayerRefused`` names the layer."""
    try:
        for first, step in ((True, tree.whiteouts), (False, tree.entries)):
            stream = open_layer()
            try:
                with tarfile.open(fileobj=cast(IO[bytes], stream), mode="r|") as layer:
                    step(layer)
                if first:
                    stream.verify()
            finally:
                stream.close()
    except LayerRefused as exc:
        raise LayerRefused(f"{label}: {exc}") from None
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise
        raise LayerRefused(f"{label}: not a readable tar stream: {exc}") from None


def resolve_in(root: str, path: str, hops: int = 40) -> str | None:
    """Where ``path`` (absolute, as the jail names it) leads inside ``root``,
    following symlinks as the jail would (an absolute target starts again at
    ``root``; ``..`` stops at it); the host path, or None if it is missing."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    while parts:
        p = parts.pop(0)
        if p == "..":
            if done:
                done.pop()
            continue
        host = os.path.join(root, *done, p)
        try:
            st = os.lstat(host)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            hops -= 1
            if hops < 0:
                return None
            target = os.readlink(host)
            if target.startswith("/"):
                done = []
            parts = [q for q in target.split("/") if q not in ("", ".")] + parts
            continue
        done.append(p)
    return os.path.join(root, *done) if done else root


def remove_tree(path: str) -> None:
    """Remove an unpacked tree whatever modes its folders ended with."""
    with contextlib.suppress(FileNotFoundError):
        for dirpath, dirnames, _ in os.walk(path):
            for d in dirnames:
                with contextlib.suppress(OSError):
                    full = os.path.join(dirpath, d)
                    if not os.path.islink(full):
                        os.chmod(full, 0o755)
        shutil.rmtree(path, ignore_errors=True)


__all__ = [
    "LayerRefused", "LayerStream", "Tree", "apply_layer", "clean_name", "file_mode", "remove_tree",
    "resolve_in", "symlink_escapes",
]
