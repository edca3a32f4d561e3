"""``image:``: a root filesystem for a step, from a folder or an OCI image.

Three sources:

* a folder holding a root filesystem, used in place; its digest is its
  stat fingerprint (``toolchain.fingerprint``), so an install into it
  changes the reuse key;
* an OCI image layout (``oci-layout``, ``index.json``, ``blobs/sha256/``), as
  a folder or a tar of one;
* a ``docker save`` tarball (``manifest.json``, a config, layer tars).

An OCI or docker image is unpacked once, into ``<cache>/<hex>/`` where
``<hex>`` is the sha256 of its config (the image ID ``docker images``
shows). The config names the uncompressed sha256 of every layer
(``rootfs.diff_ids``), and each layer is checked against it, and an OCI blob
against its descriptor's digest, before its entries are written; so a cache
folder holds what its name says, and two engines (or the same image saved in
both formats) share it. Layers are applied by ``_layers`` (whiteouts, and
refusing anything unsafe) in a staging folder that is renamed into place
when complete: a crash or a concurrent engine never leaves a half tree
under the name.

``root_plan`` says how bwrap builds the jail's ``/`` from an image folder
and the paths it must mount on top (``work/``, ``/tmp``, ...).

Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import secrets
import stat
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, cast

from stockade.sandbox import _layers
from stockade.sandbox.toolchain import fingerprint, within

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Largest JSON document (index, manifest, config) read from an image.
JSON_LIMIT = 4 << 20
_INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
_HEX = re.compile(r"^[0-9a-f]{64}$")
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
         "armv7l": "arm", "i686": "386", "i386": "386", "ppc64le": "ppc64le",
         "s390x": "s390x", "riscv64": "riscv64"}

Kind = Literal["folder", "oci", "docker"]


class ImageError(Exception):
    """The image cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class Image:
    """An image ready for a jail: ``rootfs`` is the folder shown as ``/``."""

    source: str
    kind: Kind
    #: ``sha256:<hex>`` of the config (OCI, docker), ``stat-sha256:<hex>`` of a folder.
    digest: str
    rootfs: str
    #: ``PATH`` from the image's config, else the usual default.
    path: str = DEFAULT_PATH
    #: True when this call unpacked it (the first use under this root).
    unpacked: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "kind": self.kind, "digest": self.digest,
                "rootfs": self.rootfs}


def host_arch() -> str:
    machine = os.uname().machine
    return _ARCH.get(machine, machine)


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _Hashed:
    """Reads through ``inner``, hashing every byte."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.hash = hashlib.sha256()

    def read(self, n: int = -1, /) -> bytes:
        data: bytes = self.inner.read(n)
        self.hash.update(data)
        return data

    def drain(self) -> None:
        while self.read(_layers.CHUNK):
            pass

    @property
    def digest(self) -> str:
        return "sha256:" + self.hash.hexdigest()


@dataclass(frozen=True)
class _Layer:
    name: str
    diff_id: str
    blob: str | None  # the compressed blob's digest, where the format names it


class _LayerStream:
    """A layer's uncompressed tar (gzip or plain), with its digests checked by ``verify``."""

    def __init__(self, raw: IO[bytes], layer: _Layer) -> None:
        self.raw = raw
        self.layer = layer
        peek = getattr(raw, "peek", None)
        magic = peek(4)[:4] if peek is not None else b""
        if magic[:4] == b"\x28\xb5\x2f\xfd":
            raise ImageError(f"layer {layer.diff_id} is zstd-compressed, which stockade cannot "
                             "read: save the image with gzip or uncompressed layers")
        self.outer = _Hashed(raw)
        self.gz = gzip.GzipFile(fileobj=cast(IO[bytes], self.outer), mode="rb") \
            if magic[:2] == b"\x1f\x8b" else None
        self.inner = _Hashed(self.gz if self.gz is not None else self.outer)

    def read(self, n: int = -1, /) -> bytes:
        return self.inner.read(n)

    def verify(self) -> None:
        self.inner.drain()
        self.outer.drain()
        if self.inner.digest != self.layer.diff_id:
            raise _layers.LayerRefused(
                f"its content hashes to {self.inner.digest}, not to {self.layer.diff_id} as the "
                "image's config says; the image is damaged or was changed")
        if self.layer.blob is not None and self.outer.digest != self.layer.blob:
            raise _layers.LayerRefused(
                f"its blob hashes to {self.outer.digest}, not to {self.layer.blob}")

    def close(self) -> None:
        if self.gz is not None:
            self.gz.close()
        self.raw.close()


class _Source:
    """Files of an image by name: in a folder, or members of a tar."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tar: tarfile.TarFile | None = None
        self.members: dict[str, tarfile.TarInfo] = {}
        if not os.path.isdir(path):
            try:
                self.tar = tarfile.open(path, "r:*")  # noqa: SIM115 - closed by close()
            except (tarfile.TarError, OSError) as exc:
                raise ImageError(f"{path} is neither a folder nor a tar archive: {exc}") from None
            try:
                for m in self.tar.getmembers():
                    self.members.setdefault("/".join(_layers.clean_name(m.name, "entry")), m)
            except _layers.LayerRefused as exc:
                self.tar.close()
                raise ImageError(f"{path}: {exc}") from None

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()

    def has(self, name: str) -> bool:
        if self.tar is not None:
            return name in self.members
        return os.path.isfile(os.path.join(self.path, name))

    def open(self, name: str) -> IO[bytes]:
        try:
            parts = _layers.clean_name(name, "file")
        except _layers.LayerRefused as exc:
            raise ImageError(f"{self.path}: {exc}") from None
        if not parts:
            raise ImageError(f"{self.path}: an empty file name in the image's manifest")
        if self.tar is not None:
            member = self.members.get("/".join(parts))
            f = self.tar.extractfile(member) if member is not None else None
            if f is None:
                raise ImageError(f"{self.path}: {name} is missing from the archive")
            return f
        try:
            # A name of the image, below its folder, through no symlink.
            cur = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                for p in parts[:-1]:
                    nxt = os.open(p, _layers.DIR_FLAGS, dir_fd=cur)
                    os.close(cur)
                    cur = nxt
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur)
            finally:
                os.close(cur)
        except OSError as exc:
            raise ImageError(f"{self.path}: cannot open {name}: {exc.strerror}") from None
        return os.fdopen(fd, "rb")

    def json(self, name: str, digest: str | None = None) -> tuple[Any, str]:
        with self.open(name) as f:
            data = f.read(JSON_LIMIT + 1)
        if len(data) > JSON_LIMIT:
            raise ImageError(f"{self.path}: {name} is larger than {JSON_LIMIT} bytes")
        got = _sha256(data)
        if digest is not None and got != digest:
            raise ImageError(f"{self.path}: {name} hashes to {got}, not {digest}")
        try:
            return json.loads(data), got
        except ValueError as exc:
            raise ImageError(f"{self.path}: {name} is not JSON: {exc}") from None


def _blob(digest: Any) -> str:
    alg, _, hexpart = str(digest).partition(":")
    if alg != "sha256" or not _HEX.match(hexpart):
        raise ImageError(f"unsupported or malformed digest {digest!r} (sha256 only)")
    return f"blobs/sha256/{hexpart}"


def _oci_manifest(src: _Source) -> tuple[dict[str, Any], list[str]]:
    """The image manifest for this machine's platform, and the digests seen on the way."""
    index, _ = src.json("index.json")
    want = host_arch()
    found: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def walk(descs: Any, depth: int) -> None:
        if depth > 4 or not isinstance(descs, list):
            return
        for d in descs:
            if not isinstance(d, dict):
                continue
            if d.get("mediaType") in _INDEX_TYPES:
                sub, _ = src.json(_blob(d.get("digest")), str(d.get("digest")))
                walk(sub.get("manifests"), depth + 1)
            else:
                found.append((d, d.get("platform") or {}))

    walk(index.get("manifests"), 0)
    fits = [d for d, p in found if not p or (p.get("os") == "linux"
                                             and p.get("architecture") == want)]
    if not fits:
        have = ", ".join(f"{p.get('os')}/{p.get('architecture')}" for _, p in found) or "none"
        raise ImageError(f"{src.path} has no image for linux/{want} (it has: {have})")
    desc = fits[0]
    manifest, _ = src.json(_blob(desc.get("digest")), str(desc.get("digest")))
    return manifest, [str(desc.get("digest"))]


def _read_image(src: _Source) -> tuple[Kind, str, dict[str, Any], list[_Layer]]:
    """kind, config digest, config, layers (in order)."""
    if src.has("manifest.json"):
        entries, _ = src.json("manifest.json")
        if not isinstance(entries, list) or len(entries) != 1 or not isinstance(entries[0], dict):
            n = len(entries) if isinstance(entries, list) else 0
            raise ImageError(f"{src.path} holds {n} images; save exactly one "
                             "(docker save IMAGE -o FILE)")
        entry = entries[0]
        config, digest = src.json(str(entry.get("Config", "")))
        names = entry.get("Layers")
        kind: Kind = "docker"
        blobs: list[str | None] = []
        for n in names if isinstance(names, list) else []:
            m = re.match(r"^blobs/sha256/([0-9a-f]{64})$", str(n))
            blobs.append(f"sha256:{m.group(1)}" if m else None)
        layer_names = [str(n) for n in names] if isinstance(names, list) else []
    elif src.has("index.json") and src.has("oci-layout"):
        manifest, _ = _oci_manifest(src)
        cdesc = manifest.get("config") or {}
        config, digest = src.json(_blob(cdesc.get("digest")), str(cdesc.get("digest")))
        descs = manifest.get("layers")
        descs = descs if isinstance(descs, list) else []
        kind = "oci"
        layer_names = [_blob(d.get("digest")) for d in descs]
        blobs = [str(d.get("digest")) for d in descs]
    else:
        raise ImageError(f"{src.path} is not an image: expected a root filesystem folder, an "
                         "OCI layout (oci-layout, index.json) or a docker save tarball "
                         "(manifest.json)")
    if not isinstance(config, dict):
        raise ImageError(f"{src.path}: the image config is not a JSON object")
    arch = config.get("architecture")
    if arch and arch != host_arch():
        raise ImageError(f"{src.path} is built for {config.get('os')}/{arch}; this machine "
                         f"runs linux/{host_arch()}")
    diff_ids = (config.get("rootfs") or {}).get("diff_ids")
    if not isinstance(diff_ids, list) or len(diff_ids) != len(layer_names):
        raise ImageError(f"{src.path}: the config names {len(diff_ids or [])} layers, the "
                         f"manifest {len(layer_names)}")
    for d in diff_ids:
        _blob(d)  # sha256 only
    layers = [_Layer(n, str(d), b) for n, d, b in zip(layer_names, diff_ids, blobs, strict=True)]
    return kind, digest, config, layers


def _config_path(config: dict[str, Any]) -> str:
    env = (config.get("config") or {}).get("Env") or []
    for item in env if isinstance(env, list) else []:
        if isinstance(item, str) and item.startswith("PATH="):
            return item[5:]
    return DEFAULT_PATH


def _unpack(src: _Source, layers: Sequence[_Layer], cache: Path, hexdigest: str,
            progress: Callable[[str], None] | None) -> bool:
    """Unpack into ``cache/<hex>`` unless it is there; True if this call did it."""
    final = cache / hexdigest
    if final.is_dir():
        return False
    cache.mkdir(parents=True, exist_ok=True)
    staging = cache / f".tmp-{hexdigest[:16]}-{secrets.token_hex(6)}"
    staging.mkdir(mode=0o755)
    try:
        with _layers.Tree(str(staging)) as tree:
            for i, layer in enumerate(layers):
                if progress is not None:
                    progress(f"layer {i + 1}/{len(layers)} {layer.diff_id[:19]}")

                def open_layer(layer: _Layer = layer) -> _LayerStream:
                    return _LayerStream(src.open(layer.name), layer)

                try:
                    _layers.apply_layer(tree, open_layer, f"layer {i + 1} ({layer.diff_id[:19]})")
                except _layers.LayerRefused as exc:
                    raise ImageError(f"{src.path}: {exc}") from None
            tree.finish()
        try:
            os.rename(staging, final)
        except OSError:
            if not final.is_dir():
                raise
            _layers.remove_tree(str(staging))  # another engine was first
            return False
        return True
    except BaseException:
        _layers.remove_tree(str(staging))
        raise


def open_image(source: str, cache: Path,
               progress: Callable[[str], None] | None = None) -> Image:
    """The image at ``source`` (resolved host path), unpacked under ``cache`` if
    it is an OCI or docker image; ``ImageError`` says what is wrong."""
    try:
        st = os.stat(source)
    except OSError as exc:
        raise ImageError(f"{source}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode) and not (os.path.exists(os.path.join(source, "oci-layout"))
                                         or os.path.exists(os.path.join(source, "manifest.json"))):
        image = Image(source, "folder", fingerprint(source).digest, source)
    else:
        src = _Source(source)
        try:
            kind, digest, config, layers = _read_image(src)
            hexdigest = digest.split(":", 1)[1]
            did = _unpack(src, layers, cache, hexdigest, progress)
        finally:
            src.close()
        image = Image(source, kind, digest, str(cache / hexdigest), _config_path(config), did)
    if _layers.resolve_in(image.rootfs, "/bin/sh") is None:
        raise ImageError(f"{source} has no /bin/sh, which runs a run: step's command; add a "
                         "shell to the image (busybox: a bin/sh symlink to busybox)")
    return image


# -- the jail's root under bwrap ------------------------------------------------


@dataclass(frozen=True)
class RootOp:
    """One step of building the jail's ``/``: ``bind`` the image's ``source``
    (relative to its folder) read-only at ``dest``, make a ``symlink`` to
    ``source`` at ``dest``, or make an empty ``dir`` at ``dest``."""

    op: Literal["bind", "symlink", "dir"]
    source: str
    dest: str


def listing(folder: str) -> list[tuple[str, int, str]]:
    out = []
    with os.scandir(folder) as it:
        for e in sorted(it, key=lambda e: e.name):
            st = e.stat(follow_symlinks=False)
            out.append((e.name, st.st_mode, os.readlink(e.path) if e.is_symlink() else ""))
    return out


def root_plan(rootfs: str, points: Sequence[str],
              read: Callable[[str], list[tuple[str, int, str]]] = listing) -> list[RootOp]:
    """How to show ``rootfs`` as ``/`` with ``points`` (absolute jail paths
    that get mounts of their own) on top of it, on bwrap's empty root.

    An entry of the image with no point at or below it is bound whole (a
    symlink is made as a symlink); one on the way to a point becomes an empty
    folder whose own entries are treated the same way; one that is a point
    is left out (the mount replaces it). Only folders on the way to a point
    are listed (``read`` lists a folder of the image: name, mode, link).
    """
    ops: list[RootOp] = []
    norm = [os.path.normpath(p) for p in points]

    def walk(rel: str) -> None:
        for name, mode, link in read(os.path.join(rootfs, rel) if rel else rootfs):
            sub = f"{rel}/{name}" if rel else name
            dest = "/" + sub
            below = [p for p in norm if within(p, dest)]
            if not below:
                if stat.S_ISLNK(mode):
                    ops.append(RootOp("symlink", link, dest))
                elif stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                    ops.append(RootOp("bind", sub, dest))
            elif dest in norm:
                continue
            elif stat.S_ISDIR(mode):
                ops.append(RootOp("dir", "", dest))
                walk(sub)
            # else: a file or symlink where a mount needs a folder: the mount wins

    walk("")
    return ops


__all__ = ["DEFAULT_PATH", "Image", "ImageError", "RootOp", "host_arch", "listing",
           "open_image", "root_plan"]
