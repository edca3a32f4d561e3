"""What a jail's uid can reach: bridges over root-only folders, and its PATH.

A root engine's landlock jail runs as its own uid, which cannot search a
private run folder (``mktemp -d`` makes it 0700) or ``/root``. The host's
permissions stay as they are: in the launcher's child, before the uid drops,
a private mount namespace gets a small tmpfs over the first folder the jail
cannot search, holding only the chain of folders down to each needed path,
and the original folder is bind-mounted there, at its host path
(``bridge_plan`` says what to do; ``_jail.c`` and ``_forkserver`` do it).

``jail_path`` keeps only the PATH entries that exist in the jail and that
its uid can search.

Standard library only: the exec helper imports this module.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BridgePlan:
    """Mount steps in a fresh mount namespace, in this order.

    ``tmpfs``: folders overmounted with an empty tmpfs (mode 0755);
    ``dirs``/``files``: made inside them (parents first), as mount points;
    ``binds``: host paths bound recursively onto themselves, each cloned
    (``open_tree``) before any tmpfs hides it.
    """

    tmpfs: tuple[str, ...]
    dirs: tuple[str, ...]
    files: tuple[str, ...]
    binds: tuple[str, ...]

    def to_json(self) -> dict[str, list[str]]:
        return {
            "tmpfs": list(self.tmpfs),
            "dirs": list(self.dirs),
            "files": list(self.files),
            "binds": list(self.binds),
        }


def _ancestors(path: str) -> list[str]:
    """``/a/b/c`` -> ``["/", "/a", "/a/b"]``."""
    out = ["/"]
    parts = [p for p in path.split("/") if p][:-1]
    for i in range(len(parts)):
        out.append("/" + "/".join(parts[: i + 1]))
    return out


def bridge_plan(
    paths: Sequence[tuple[str, bool]], searchable: Callable[[str], bool]
) -> BridgePlan | None:
    """The bridges that make every ``(path, is_dir)`` reachable, or ``None``.

    ``paths`` are resolved absolute paths; ``searchable(folder)`` says
    whether the jail's uid may search a host folder. A path only needs one
    if a folder above it is not searchable; only the topmost such folder is
    covered (so no two tmpfs nest), and a path below another bound one
    comes with it.
    """
    if not searchable("/"):
        raise ValueError("the jail's uid cannot search /")
    first_blocked: dict[str, str] = {}
    for path, _ in paths:
        parts = path.split("/")
        for i in range(2, len(parts)):
            folder = "/".join(parts[:i])
            if not searchable(folder):
                first_blocked[path] = folder
                break
    if not first_blocked:
        return None
    binds = sorted(first_blocked, key=lambda p: (p.count("/"), p))
    binds = [p for p in binds if not any(p.startswith(q + "/") for q in binds if q != p)]
    is_dir = dict(paths)
    dirs: dict[str, None] = {}
    files: list[str] = []
    for p in binds:
        top = first_blocked[p]
        below = p[len(top) + 1 :].split("/")
        for i in range(1, len(below)):
            dirs[top + "/" + "/".join(below[:i])] = None
        if is_dir[p]:
            dirs[p] = None
        else:
            files.append(p)
    tmpfs = tuple(sorted({first_blocked[p] for p in binds}))
    ordered = sorted(dirs, key=lambda d: (d.count("/"), d))
    return BridgePlan(tmpfs, tuple(ordered), tuple(files), tuple(binds))


@dataclass(frozen=True)
class Root:
    """A folder the jail sees: at ``jail``, holding the host's ``host``
    (resolved). ``bound``: the jail reaches it whatever the modes of the
    host folders above it (a bind mount or a bridge); otherwise every
    folder from ``/`` down must be searchable."""

    jail: str
    host: str
    bound: bool


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _longest(roots: Sequence[Root], path: str, side: str) -> Root | None:
    best: Root | None = None
    for r in roots:
        top = r.jail if side == "jail" else r.host
        if _within(path, top) and (best is None or len(top) > len(getattr(best, side))):
            best = r
    return best


def usable_dir(entry: str, roots: Sequence[Root], searchable: Callable[[str], bool]) -> bool:
    """The jail can search the folder it sees at ``entry`` (absolute)."""
    root = _longest(roots, entry, "jail")
    if root is None:
        return False
    host = os.path.realpath(root.host + entry[len(root.jail.rstrip("/")) :])
    # A symlink may lead elsewhere: to another root, or out of the jail.
    target = _longest(roots, host, "host")
    if target is None or not os.path.isdir(host):
        return False
    top = target.host if target.bound else "/"
    chain = [f for f in _ancestors(host) if _within(f, top)] + [host]
    return all(searchable(f) for f in chain)


def jail_path(value: str, roots: Sequence[Root], searchable: Callable[[str], bool]) -> str:
    """``PATH`` with only absolute entries the jail can search, each once.

    Relative and empty entries (the current folder) go too: the jail's
    current folder is its ``work/``, which its inputs fill.
    """
    kept: list[str] = []
    for entry in value.split(":"):
        if not entry.startswith("/"):
            continue
        entry = os.path.normpath(entry)
        if entry not in kept and usable_dir(entry, roots, searchable):
            kept.append(entry)
    return ":".join(kept)


class PathFilter:
    """``jail_path`` with the answer for the system folders kept: they do
    not change during a run, and resolving a PATH costs a few hundred
    microseconds (a ``realpath`` per entry). Entries inside an item's own
    roots (work/, scratch, mounts) are judged afresh every time."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, bool], str] = {}

    def __call__(
        self,
        value: str,
        system: Sequence[Root],
        item: Callable[[], Sequence[Root]],
        item_tops: Sequence[str],
        uid: int | None,
    ) -> str:
        """``item()`` builds the item's roots (resolving paths costs): only
        called when an entry lies below one of ``item_tops`` (their ``jail``)."""
        searchable = searchable_by(uid) if uid is not None else searchable_by_me
        entries = [e for e in value.split(":") if e.startswith("/")]
        if any(_within(e, top) for e in entries for top in item_tops):
            return jail_path(value, [*system, *item()], searchable)
        # A jail uid owns no system folder: any one of them gets the same answer.
        key = (value, uid is None)
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) > 64:
                self._cache.clear()
            hit = self._cache[key] = jail_path(value, system, searchable)
        return hit


def searchable_by(uid: int) -> Callable[[str], bool]:
    """Whether ``uid`` (with gid = uid and no other group, not the engine's
    own uid) may search a host folder, from its mode bits alone."""

    def check(folder: str) -> bool:
        try:
            st = os.stat(folder)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            return False
        if st.st_uid == uid:
            return bool(st.st_mode & stat.S_IXUSR)
        if st.st_gid == uid:
            return bool(st.st_mode & stat.S_IXGRP)
        return bool(st.st_mode & stat.S_IXOTH)

    return check


def searchable_by_me(folder: str) -> bool:
    """Whether this process may search a folder (an unprivileged engine,
    whose jails keep its uid)."""
    return os.path.isdir(folder) and os.access(folder, os.X_OK)
