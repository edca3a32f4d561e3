"""Images the tests build themselves: a busybox root filesystem, layer tars,
OCI layouts and ``docker save`` tarballs written with ``tarfile``.

busybox comes from Debian's ``busybox-static`` package (``apt-get download``
then ``dpkg-deb -x``, once per machine, kept under the pytest cache), or
from the host when it has a static busybox already. Nothing is pulled from
an image registry.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stockade.sandbox.image import host_arch

CACHE = Path(os.environ.get("STOCKADE_TEST_CACHE", Path(tempfile.gettempdir()) / "stockade-test-cache"))


def _static(path: Path) -> bool:
    """An ELF executable without a program interpreter (runs in any root)."""
    try:
        out = subprocess.run(["file", "-L", str(path)], capture_output=True, text=True,
                             check=False).stdout
    except OSError:
        return False
    return "statically linked" in out


def busybox() -> Path:
    """A static busybox binary; ``RuntimeError`` says what to install if there is none."""
    for p in (Path("/bin/busybox"), Path("/usr/bin/busybox")):
        if p.exists() and _static(p):
            return p
    target = CACHE / "busybox-static" / "bin" / "busybox"
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=CACHE))
    try:
        # apt runs its download as _apt: give it a folder it may write.
        work.chmod(0o777)
        got = subprocess.run(["apt-get", "download", "busybox-static"], cwd=work,
                             capture_output=True, text=True, check=False)
        debs = list(work.glob("busybox-static_*.deb"))
        if not debs:
            raise RuntimeError("no static busybox: apt-get install busybox-static, or let "
                               f"`apt-get download busybox-static` work ({got.stderr.strip()})")
        unpacked = work / "x"
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], check=True)
        dest = CACHE / "busybox-static"
        if not dest.exists():
            os.rename(unpacked, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def busybox_rootfs(dest: Path, applets: Sequence[str] = ()) -> Path:
    """A root filesystem folder: ``/bin/busybox``, ``/bin/sh`` and applet links."""
    bb = busybox()
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(bb, dest / "bin" / "busybox")
    names = list(applets) or subprocess.run([str(bb), "--list"], capture_output=True, text=True,
                                            check=True).stdout.split()
    for name in ["sh", *names]:
        link = dest / "bin" / name
        if name != "busybox" and not link.exists():
            link.symlink_to("busybox")
    for d in ("etc", "tmp", "usr/bin"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    (dest / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    return dest


# -- layers ---------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One tar entry of a layer: ``kind`` file, dir, symlink, hardlink, fifo, chr."""

    name: str
    kind: str = "file"
    data: bytes = b""
    link: str = ""
    mode: int = 0o644


def layer(entries: Sequence[Entry]) -> bytes:
    """An uncompressed layer tar holding ``entries`` in this order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.mode = e.mode
            info.mtime = 1_700_000_000
            if e.kind == "file":
                info.size = len(e.data)
                t.addfile(info, io.BytesIO(e.data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                         "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE,
                         "chr": tarfile.CHRTYPE}[e.kind]
            info.linkname = e.link
            t.addfile(info)
    return buf.getvalue()


def tree_layer(root: Path) -> bytes:
    """A layer tar of a folder (as ``docker build`` would diff it)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for path in sorted(root.rglob("*")):
            t.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return buf.getvalue()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _config(layers: Sequence[bytes], path: str | None) -> bytes:
    env = [f"PATH={path}"] if path else []
    return json.dumps({
        "architecture": host_arch(), "os": "linux",
        "config": {"Env": env},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{_sha(x)}" for x in layers]},
    }).encode()


def oci_layout(dest: Path, layers: Sequence[bytes], *, compress: bool = True,
               path: str | None = None, platforms: Sequence[str] = ()) -> str:
    """Write an OCI image layout folder; returns the config digest (the image's id)."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def blob(data: bytes) -> str:
        h = _sha(data)
        (blobs / h).write_bytes(data)
        return f"sha256:{h}"

    config = _config(layers, path)
    descs = []
    for x in layers:
        data = gzip.compress(x, mtime=0) if compress else x
        media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compress else "")
        descs.append({"mediaType": media, "digest": blob(data), "size": len(data)})
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": blob(config), "size": len(config)},
        "layers": descs,
    }).encode()
    mdesc = {"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": blob(manifest), "size": len(manifest)}
    manifests = []
    for p in platforms:
        # Other platforms' entries first: the engine must pick its own.
        os_, arch = p.split("/")
        manifests.append({**mdesc, "digest": blob(manifest + b" "), "platform":
                          {"os": os_, "architecture": arch}})
    manifests.append({**mdesc, **({"platform": {"os": "linux", "architecture": host_arch()}}
                                  if platforms else {})})
    (dest / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))
    (dest / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return f"sha256:{_sha(config)}"


def docker_save(dest: Path, layers: Sequence[bytes], *, path: str | None = None) -> str:
    """Write a ``docker save`` tarball (the classic layout); returns the image id."""
    config = _config(layers, path)
    cid = _sha(config)
    with tarfile.open(dest, "w") as t:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))

        names = []
        for i, x in enumerate(layers):
            lid = _sha(f"{cid}{i}".encode())
            add(f"{lid}/layer.tar", x)
            add(f"{lid}/VERSION", b"1.0")
            names.append(f"{lid}/layer.tar")
        add(f"{cid}.json", config)
        add("manifest.json", json.dumps([{"Config": f"{cid}.json", "RepoTags": ["t:latest"],
                                          "Layers": names}]).encode())
    return f"sha256:{cid}"
