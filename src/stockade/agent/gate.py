"""The name-list gate: what changed in ``work/`` against the snapshot of its inputs.

``snapshot`` hashes every file and symlink under a directory before the jail
starts; ``changed`` compares a later snapshot with it. The session fails an
item whose changed paths are not exactly the paths written through the tools.

Imports only the standard library.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    kind: str  # "file" | "link" | "other"
    mode: int
    digest: str  # sha256 of the bytes, or of the link target


Snapshot = dict[str, Entry]


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def snapshot(root: Path) -> Snapshot:
    """Every non-directory under ``root`` by work-relative POSIX path."""
    out: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = Entry("link", 0, hashlib.sha256(os.readlink(full).encode()).hexdigest())
            elif stat.S_ISREG(st.st_mode):
                out[rel] = Entry("file", stat.S_IMODE(st.st_mode), sha256_file(full))
            else:
                out[rel] = Entry("other", stat.S_IMODE(st.st_mode), "")
    return out


def changed(before: Snapshot, after: Snapshot) -> tuple[str, ...]:
    """Paths added, removed or altered (content, kind or permissions), sorted."""
    return tuple(sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p)))
