"""Toolchain mounts: what a host folder needs to work in a jail, and its fingerprint.

A step's ``mounts:`` show host folders (a venv, a conda env, a pyenv build,
``/opt/tool``) read-only at their host paths. Two things decide whether
that is enough and whether an earlier item may be reused:

* ``fingerprint``: the stat metadata of every entry below the folder (type,
  mode, size, mtime, ctime, inode, a symlink's target), never the contents.
  Any install into it (a new, removed or rewritten file) changes it; 50,000
  entries take a few tenths of a second.
* ``outside``: what the folder uses outside itself. A venv runs the
  interpreter named by ``home`` in its ``pyvenv.cfg`` and that interpreter's
  standard library, which may sit in a pyenv build under ``/root``: that
  prefix is an implied mount (read-only, fingerprinted like the rest). A
  symlink in its ``bin/`` whose target lies outside every folder the jail
  sees is reported, so the run can say what to add instead of failing with
  exit 127 inside the jail.

Nothing here follows a symlink except ``os.path.realpath`` of a link's
target, to name where it leads. Standard library only.

Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def within(path: str, top: str) -> bool:
    """``path`` is ``top`` or below it (both absolute and normalised)."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def _entry_line(rel: str, st: os.stat_result, link: str) -> bytes:
    return (
        f"{rel}\0{st.st_mode:o}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0"
        f"{st.st_ino}\0{link}\n"
    ).encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Fingerprint:
    """``digest`` (``stat-sha256:<hex>``) and how many entries it covers."""

    digest: str
    entries: int


def fingerprint(path: str) -> Fingerprint:
    """The stat metadata of ``path`` and everything below it, hashed.

    Entries are visited in name order folder by folder, so the digest does
    not depend on the order a directory lists them in. A folder the engine
    cannot read counts as one entry marked unreadable.
    """
    h = hashlib.sha256()
    st = os.lstat(path)
    link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else ""
    h.update(_entry_line(".", st, link))
    count = 1
    if not stat.S_ISDIR(st.st_mode):
        return Fingerprint(f"stat-sha256:{h.hexdigest()}", count)
    stack = [""]
    while stack:
        rel = stack.pop()
        folder = os.path.join(path, rel) if rel else path
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            h.update(f"{rel}\0!{exc.errno}\n".encode("utf-8", "surrogateescape"))
            continue
        lines = []
        subfolders = []
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            try:
                est = entry.stat(follow_symlinks=False)
                target = os.readlink(entry.path) if stat.S_ISLNK(est.st_mode) else ""
            except OSError:
                lines.append(f"{name}\0!gone\n".encode("utf-8", "surrogateescape"))
                continue
            lines.append(_entry_line(name, est, target))
            if stat.S_ISDIR(est.st_mode):
                subfolders.append(name)
        count += len(lines)
        h.update(b"".join(lines))
        # Reversed onto the stack: popped in name order.
        stack.extend(reversed(subfolders))
    return Fingerprint(f"stat-sha256:{h.hexdigest()}", count)


def venv_base(path: str) -> str | None:
    """The install prefix of a venv's base interpreter (``home`` in its
    ``pyvenv.cfg``, one folder up from its ``bin``), resolved; None if
    ``path`` is not a venv or names none."""
    try:
        with open(os.path.join(path, "pyvenv.cfg"), encoding="utf-8", errors="replace") as f:
            text = f.read(64 * 1024)
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "home" and value.strip().startswith("/"):
            home = os.path.realpath(value.strip())
            prefix = os.path.dirname(home) if os.path.basename(home) == "bin" else home
            return prefix if os.path.isdir(prefix) else None
    return None


@dataclass(frozen=True)
class OutsideLink:
    """A symlink in a mount's ``bin/`` that leads out of everything the jail sees."""

    link: str
    target: str


def bin_links_outside(path: str, visible: Sequence[str]) -> list[OutsideLink]:
    """Symlinks in ``path/bin`` whose (existing) targets lie outside every
    folder in ``visible`` (resolved absolute paths); dangling ones are the
    host's problem as much as the jail's and are left out."""
    folder = os.path.join(path, "bin")
    try:
        with os.scandir(folder) as it:
            links = sorted(e.path for e in it if e.is_symlink())
    except OSError:
        return []
    out = []
    for link in links:
        target = os.path.realpath(link)
        if not os.path.exists(target):
            continue
        if not any(within(target, top) for top in visible):
            out.append(OutsideLink(link, target))
    return out


def needs_of(paths: Iterable[str], visible: Sequence[str]
             ) -> tuple[list[tuple[str, str]], list[OutsideLink]]:
    """What the resolved mount ``paths`` need besides themselves: the base
    prefixes of venvs among them that are not visible already, each with the
    venv that needs it (implied mounts), and the ``bin/`` symlinks that
    would still lead nowhere."""
    paths = list(paths)
    implied: list[tuple[str, str]] = []
    for p in paths:
        base = venv_base(p)
        seen = [*visible, *paths, *(i for i, _ in implied)]
        if base is not None and not any(within(base, top) for top in seen):
            implied.append((base, p))
    everything = [*visible, *paths, *(i for i, _ in implied)]
    missing = [o for p in paths for o in bin_links_outside(p, everything)]
    return implied, missing
