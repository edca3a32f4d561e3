"""Moving files between the engine and a worker: by content, or through ``--artifacts``.

``pack`` turns a file into a ``Blob``: its bytes when small (or when there
is no artifacts URL), else an upload to ``<artifacts>/<prefix>/<sha256>``
through fsspec (``file:///shared``, ``s3://bucket/prefix``...), streamed,
never read whole. ``unpack`` writes a blob to a new file, never through a
link, hashing what arrived, and raises ``BlobMismatch`` when the sha256 or
the size is not what the sender said: nothing that did not verify is used.

Must not import the engine, the executors, the CLI or dask (fsspec is
imported only when an artifacts URL is used).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

from stockade.runner.jobs import INLINE_MAX, Blob, BlobMismatch, blob_of, check_rel
from stockade.workspace.beneath import DIR_FLAGS, Refused, create_file, sha256_fd

CHUNK = 1 << 20


def _fs(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError:  # pragma: no cover - installed with stockade[dask]
        raise BlobMismatch("--artifacts needs fsspec: pip install 'stockade[dask]'") from None
    if url.startswith("file://"):
        # A file URL's path is percent-encoded (``Path.as_uri()`` writes a space as %20).
        from urllib.parse import unquote

        url = "file://" + unquote(url[len("file://"):])
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path


def pack(path: Path, rel: str, artifacts: str | None, prefix: str,
         limit: int = INLINE_MAX) -> Blob:
    """A blob of the regular file ``path`` (opened without following a link)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode & 0o777
        size = os.fstat(fd).st_size
        if artifacts is None or size <= limit:
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
            return blob_of(rel, data, mode)
        digest, size = sha256_fd(fd)
        fs, base = _fs(artifacts)
        target = f"{base.rstrip('/')}/{prefix}/{digest}"
        if not (fs.exists(target) and fs.size(target) == size):
            os.lseek(fd, 0, os.SEEK_SET)
            fs.makedirs(f"{base.rstrip('/')}/{prefix}", exist_ok=True)
            with os.fdopen(os.dup(fd), "rb") as src, fs.open(target + ".part", "wb") as dst:
                while chunk := src.read(CHUNK):
                    dst.write(chunk)
            fs.mv(target + ".part", target)
        url = f"{artifacts.rstrip('/')}/{prefix}/{digest}"
        return Blob(rel, digest, size, mode, url=url)
    finally:
        os.close(fd)


def pack_bytes(rel: str, data: bytes, artifacts: str | None, prefix: str,
               limit: int = INLINE_MAX) -> Blob:
    digest = hashlib.sha256(data).hexdigest()
    if artifacts is None or len(data) <= limit:
        return Blob(rel, digest, len(data), data=data)
    fs, base = _fs(artifacts)
    target = f"{base.rstrip('/')}/{prefix}/{digest}"
    fs.makedirs(f"{base.rstrip('/')}/{prefix}", exist_ok=True)
    with fs.open(target, "wb") as dst:
        dst.write(data)
    return Blob(rel, digest, len(data), url=f"{artifacts.rstrip('/')}/{prefix}/{digest}")


def _chunks(blob: Blob) -> Any:
    if blob.data is not None:
        yield blob.data
        return
    if blob.url is None:
        raise BlobMismatch(f"{blob.path}: neither content nor a URL")
    fs, path = _fs(blob.url)
    with fs.open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def unpack(blob: Blob, folder: Path, what: str = "file") -> None:
    """Write ``folder/blob.path`` as a new file; verify its sha256 and size as it is written."""
    rel = check_rel(blob.path)
    top = os.open(folder, DIR_FLAGS)
    try:
        try:
            fd = create_file(top, rel, (blob.mode & 0o111) | 0o644)
        except Refused as r:
            raise BlobMismatch(f"{what} {rel!r}: {r.why}") from None
    finally:
        os.close(top)
    h = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in _chunks(blob):
                h.update(chunk)
                size += len(chunk)
                f.write(chunk)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(folder / rel)
        raise
    if h.hexdigest() != blob.sha256 or size != blob.size:
        with contextlib.suppress(OSError):
            os.unlink(folder / rel)
        raise BlobMismatch(f"{what} {rel!r} arrived with sha256 {h.hexdigest()[:12]} "
                           f"({size} bytes), not the {blob.sha256[:12]} ({blob.size} bytes) "
                           "that was sent; refused")


def content(blob: Blob) -> bytes:
    """A blob's bytes (for captures and records), verified."""
    data = b"".join(_chunks(blob))
    if hashlib.sha256(data).hexdigest() != blob.sha256:
        raise BlobMismatch(f"{blob.path!r} did not arrive as it was sent (sha256 differs)")
    return data


def discard(blob: Blob) -> None:
    """Remove a blob's uploaded copy once it is in the run tree (best effort)."""
    if blob.url is None:
        return
    with contextlib.suppress(Exception):
        fs, path = _fs(blob.url)
        fs.rm(path)


__all__ = ["content", "discard", "pack", "pack_bytes", "unpack"]
