"""What the host offers a jail, read once: the system folders, the ``/etc``
entries a process needs (and the jail's copy of them), and whether other
uids can reach a path.

Shared by the backends, so that none imports another. Standard library
only, with ``stockade.sandbox.policy``.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from stockade.sandbox.policy import SYSTEM_DIRS, Policy

#: /etc entries a process commonly needs: the loader, users and groups for
#: ``id``/``whoami``, name service config, time zone, TLS roots, locale, the
#: Debian alternatives symlinks that ``/usr/bin`` points into.
ETC_FILES: tuple[str, ...] = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf",
    "hosts", "host.conf", "gai.conf", "localtime", "timezone", "ssl/certs", "ssl/openssl.cnf",
    "ca-certificates", "ca-certificates.conf", "pki/tls/certs", "pki/ca-trust", "alternatives",
    "os-release", "debian_version",
    "lsb-release", "mime.types", "protocols", "services", "locale.alias", "locale.conf",
    "inputrc", "terminfo", "magic", "magic.mime", "bash.bashrc", "profile", "shells",
    "python3", "python3.11", "python3.12", "gitconfig",
)  # fmt: skip


@dataclass(frozen=True)
class HostLayout:
    """What the host offers; scanned once so ``bwrap_argv`` can stay pure."""

    symlinks: Mapping[str, str] = field(default_factory=dict)
    dirs: tuple[str, ...] = ()
    etc: tuple[str, ...] = ()
    prlimit: str | None = None
    python: str | None = None
    resolv_conf: str | None = None
    #: A host directory holding copies of ``etc`` (see ``build_etc``), bound
    #: once as the jail's /etc: one mount instead of one per file (~0.2 ms each).
    etc_dir: str | None = None


def scan_host() -> HostLayout:
    links: dict[str, str] = {}
    dirs: list[str] = []
    for p in SYSTEM_DIRS:
        if os.path.islink(p):
            links[p] = os.readlink(p)
        elif os.path.isdir(p):
            dirs.append(p)
    etc = tuple(f"/etc/{n}" for n in ETC_FILES if os.path.lexists(f"/etc/{n}"))
    resolv = os.path.realpath("/etc/resolv.conf") if os.path.exists("/etc/resolv.conf") else None
    python = next((p for p in ("/usr/bin/python3", "/bin/python3") if os.path.exists(p)), None)
    prlimit = next((p for p in ("/usr/bin/prlimit", "/bin/prlimit") if os.path.exists(p)), None)
    return HostLayout(links, tuple(dirs), etc, prlimit, python, resolv)


#: The rlimit behind each limit of ``policy.Resources``.
_RLIMITS = (("memory_bytes", resource.RLIMIT_AS), ("cpu_seconds", resource.RLIMIT_CPU),
            ("processes", resource.RLIMIT_NPROC), ("file_size_bytes", resource.RLIMIT_FSIZE))


def hard_limit(which: int) -> int | None:
    """This process's hard limit ``which`` (an ``RLIMIT_*``); None: unlimited."""
    hard = resource.getrlimit(which)[1]
    return None if hard == resource.RLIM_INFINITY else hard


def within_hard_limits(policy: Policy) -> Policy:
    """``policy`` with no limit above this process's hard limit.

    A jail inherits the engine's hard limits, and an unprivileged process
    cannot raise one: ``processes: 200000`` on a host that allows 96,362
    would fail the launch (``prlimit`` and ``setrlimit`` say EPERM) while
    asking for nothing the host does not enforce already. Read at each
    launch, on the machine that launches (a Dask worker's limits are its own).
    """
    r = policy.resources
    lowered: dict[str, int] = {}
    for name, which in _RLIMITS:
        value, hard = getattr(r, name), hard_limit(which)
        if value is not None and hard is not None and value > hard:
            lowered[name] = hard
    return replace(policy, resources=replace(r, **lowered)) if lowered else policy


#: Never copied into a jail's /etc, even below an allowed directory.
ETC_NEVER = ("shadow", "gshadow", "private", "sudoers", "ssh")


def build_etc(layout: HostLayout, dest: Path, source_root: str = "/etc") -> HostLayout:
    """Copy the allowed /etc entries into ``dest`` (symlinks kept as symlinks).

    The copy is a snapshot taken once per engine process; the resolver file
    is included (bwrap shows it only with ``network: open`` in effect, as the
    jail has no other network). Folders become 0755 and files 0644, whoever
    owned them: the jail's uid must read them. Only contents, modes and link
    targets are copied (no times or xattrs): a copy per entry would be
    hundreds of system calls more for ``ssl/certs`` alone, on the way to
    every run's first item. ``source_root`` is for tests.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    _folder(str(dest), exist_ok=True)
    for src in layout.etc:
        rel = os.path.relpath(src, source_root)
        # The folders on the way to a nested entry (ssl/ for ssl/certs).
        for parent in reversed(Path(rel).parents[:-1]):
            _folder(str(dest / parent), exist_ok=True)
        _copy_entry(src, str(dest / rel), os.lstat(src).st_mode)
    if layout.resolv_conf and os.path.isfile(layout.resolv_conf):
        _copy_file(layout.resolv_conf, str(dest / "resolv.conf"))
    return replace(layout, etc_dir=str(dest))


def _folder(path: str, *, exist_ok: bool = False) -> None:
    """A folder of the copy, 0755 whatever the umask (and never wider on the way)."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        if not exist_ok:
            raise
    os.chmod(path, 0o755)


def _copy_entry(src: str, target: str, mode: int) -> None:
    """One entry of the jail's /etc: a symlink as a symlink, a folder
    without its ``ETC_NEVER`` entries, a file the engine can read; anything
    else (a socket, a fifo, an unreadable file) is left out."""
    if stat.S_ISLNK(mode):
        os.symlink(os.readlink(src), target)
    elif stat.S_ISDIR(mode):
        _folder(target)
        with os.scandir(src) as entries:
            for e in entries:
                if e.name not in ETC_NEVER:
                    _copy_entry(e.path, os.path.join(target, e.name),
                                e.stat(follow_symlinks=False).st_mode)
    elif stat.S_ISREG(mode) and os.access(src, os.R_OK):
        _copy_file(src, target)


def _copy_file(src: str, target: str) -> None:
    """A file of the copy, created 0644 (never writable by others, not even
    for a moment under a permissive umask) and set to 0644 after."""
    with open(src, "rb") as fsrc:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        with open(fd, "wb") as fdst:
            shutil.copyfileobj(fsrc, fdst)
    os.chmod(target, 0o644)


@functools.lru_cache(maxsize=256)
def searchable_by_others(directory: str) -> bool:
    """Every directory from / down to ``directory`` has o+x.

    Cached: items of a run share these ancestors, and a permission change
    between items can only make a jail fail to start, never widen it.
    """
    parent = os.path.dirname(directory)
    if parent != directory and not searchable_by_others(parent):
        return False
    try:
        return bool(os.stat(directory).st_mode & stat.S_IXOTH)
    except OSError:
        return False


@functools.lru_cache(maxsize=64)
def _realpath_dir(directory: str) -> str:
    """``realpath`` of a directory many items share (a step's folder)."""
    return os.path.realpath(directory)


def resolve(path: str) -> str:
    """``realpath(path)``, with the part above the last two names cached.

    The last two names (an item's folder and its ``work/``) are new for every
    item; when neither is a symlink the cached prefix is exact.
    """
    head, last = os.path.split(path)
    top, middle = os.path.split(head)
    if not last or not middle:
        return os.path.realpath(path)
    for p in (head, path):
        if stat.S_ISLNK(os.lstat(p).st_mode):
            return os.path.realpath(path)
    return os.path.join(_realpath_dir(top), middle, last)


def resolved(path: str | Path) -> str:
    """``_resolve``, or ``realpath`` for a path that is missing (the launcher reports it)."""
    try:
        return resolve(os.fspath(path))
    except OSError:
        return os.path.realpath(path)


def reachable_by_others(path: str | Path) -> bool:
    """Other users can search every directory down to ``path`` and use ``path`` itself."""
    try:
        resolved = resolve(os.path.abspath(path))
        if not searchable_by_others(os.path.dirname(os.path.dirname(resolved))):
            return False
        if not os.stat(os.path.dirname(resolved)).st_mode & stat.S_IXOTH:
            return False
        mode = os.stat(resolved).st_mode
    except OSError:
        return False
    if stat.S_ISDIR(mode):
        return bool(mode & stat.S_IXOTH and mode & stat.S_IROTH)
    if stat.S_ISSOCK(mode):
        return bool(mode & stat.S_IWOTH)
    return bool(mode & stat.S_IROTH)
