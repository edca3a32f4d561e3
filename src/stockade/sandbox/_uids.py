"""Jail uids for a root engine: a dedicated range, one uid per running item.

A root engine never runs a jail as root, nor as a uid that a host account
or process has: a daemon running as ``nobody`` could read the
``/proc/PID/environ`` (secrets included) of a jail running as ``nobody``.
As systemd's ``DynamicUser`` does, every running item gets a uid of its own
(gid = uid, no supplementary groups):

* The range is ``STOCKADE_JAIL_UIDS=FIRST-LAST``, by default 60706-61183:
  between systemd's greeter (60578-60705) and DynamicUser (61184-65519)
  ranges, a block systemd's UIDS-GIDS document leaves unused. It fits in 16
  bits, so a container that maps 65536 uids maps it too.
* Engines on one machine lease uids through an ``flock`` on
  ``/run/stockade/jail-uids/<uid>``: two engines never hold the same uid. A
  uid is taken only if no account or group has it (NSS) and no process runs
  with it (``/proc``, checked once the lock is held).
* When an item's jail is gone its uid goes back to the engine's free list,
  so a later item needs neither a lock file nor a ``/proc`` scan (an engine
  holds one uid more than it ever ran items at once, and reuses the one
  idle longest); ``release_idle`` (at backend close) gives idle uids back
  to the machine.

Ownership moves with the jail: ``hand_to`` gives the item's ``work/`` and
scratch to the jail uid before it starts; ``take_back`` gives everything the
uid owns in them back to the engine once the jail is gone, so outputs are
engine-owned and a later jail with the same uid owns nothing of an earlier
item.

Engines in separate containers that share a kernel's uids but not ``/run``
cannot see each other's leases: give them disjoint ranges.

Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stockade.errors import InfraError
from stockade.sandbox import _direct
from stockade.sandbox.base import Running, jail_left_nothing

ENV = "STOCKADE_JAIL_UIDS"
DEFAULT_RANGE = (60706, 61183)
LEASE_DIR = "/run/stockade/jail-uids"
#: ``nobody`` and the 16-bit ``(uid_t) -1``: never a jail's.
RESERVED = (65534, 65535)


def parse_range(text: str) -> tuple[int, int]:
    """``FIRST-LAST`` (inclusive); ``InfraError`` naming what is wrong."""
    first_s, sep, last_s = text.strip().partition("-")
    try:
        first, last = int(first_s), int(last_s)
    except ValueError:
        first = last = -1
    if not sep or first < 1 or last < first or last >= 2**31 - 1:
        raise InfraError(
            f"{ENV}={text!r}: expected FIRST-LAST, two uids with 1 <= FIRST <= LAST < 2147483647"
        )
    for r in RESERVED:
        if first <= r <= last:
            raise InfraError(f"{ENV}={text!r} includes {r}, which is never a jail's uid")
    return first, last


def is_mapped(first: int, last: int, id_map: str) -> bool:
    """Whether ``/proc/self/uid_map`` (or gid_map) text maps every id in the range."""
    for line in id_map.splitlines():
        parts = line.split()
        if len(parts) == 3:
            inside, _, count = (int(p) for p in parts)
            if inside <= first and last < inside + count:
                return True
    return False


def ids_in_use() -> set[int]:
    """Every uid and gid (real, effective, saved, filesystem) of a running process."""
    ids: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                text = f.read()
        except OSError:
            continue  # gone meanwhile
        for line in text.splitlines():
            if line.startswith((b"Uid:", b"Gid:")):
                ids.update(int(v) for v in line.split()[1:])
    return ids


@dataclass(eq=False)
class Lease:
    """One jail's uid and gid; ``release`` once the jail is gone."""

    uid: int
    gid: int
    pool: UidPool | None = None
    _released: bool = field(default=False, repr=False)

    def release(self) -> None:
        if not self._released:
            self._released = True
            if self.pool is not None:
                self.pool.give_back(self.uid)


class UidPool:
    """The uids this engine process leased; see the module docstring."""

    def __init__(self, first: int, last: int, lease_dir: str = LEASE_DIR) -> None:
        self.first, self.last = first, last
        self._dir = lease_dir
        self._lock = threading.Lock()
        #: uid -> fd holding its lock file's flock.
        self._held: dict[int, int] = {}
        #: Held, with no jail running: handed out first.
        self._free: list[int] = []
        #: Checked once per process: no account or group has these ids.
        self._unnamed: set[int] = set()

    def acquire(self) -> Lease:
        """A uid no running jail of ours has. Idle uids are reused oldest
        first, and only when another one is idle too: the processes a
        jail's end killed have a whole item's time to be reaped (until
        then they count against the uid's RLIMIT_NPROC)."""
        with self._lock:
            if len(self._free) >= 2:
                uid = self._free.pop(0)
            else:
                try:
                    uid = self._lease_new()
                except InfraError:
                    if not self._free:
                        raise
                    uid = self._free.pop(0)
        return Lease(uid, uid, self)

    def give_back(self, uid: int) -> None:
        with self._lock:
            if uid in self._held and uid not in self._free:
                self._free.append(uid)

    def release_idle(self) -> None:
        """Give every uid no jail of ours is using back to the machine."""
        with self._lock:
            for uid in self._free:
                os.close(self._held.pop(uid))
            self._free.clear()

    def _lease_new(self) -> int:
        self._ensure_dir()
        size = self.last - self.first + 1
        start = secrets.randbelow(size)  # engines starting together rarely collide
        busy: set[int] | None = None
        for i in range(size):
            uid = self.first + (start + i) % size
            if uid in self._held or not self._has_no_name(uid):
                continue
            # Lock files are never removed: unlinking one that another engine
            # has just opened would let a third lock a new file by that name.
            fd = os.open(
                os.path.join(self._dir, str(uid)),
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # another engine's
            # Scanned once the lock is held: no engine can start a process
            # with this uid any more, so what runs with it now is foreign
            # (or a dead engine's leftover) and stays so.
            if busy is None:
                busy = ids_in_use()
            if uid in busy:
                os.close(fd)
                continue
            self._held[uid] = fd
            return uid
        raise InfraError(
            f"every jail uid in {self.first}-{self.last} is in use (by other stockade engines, "
            f"accounts or processes): set {ENV}=FIRST-LAST to a larger range no account uses"
        )

    def _has_no_name(self, uid: int) -> bool:
        if uid in self._unnamed:
            return True
        for lookup in (pwd.getpwuid, grp.getgrgid):
            try:
                lookup(uid)
            except KeyError:
                continue
            return False
        self._unnamed.add(uid)
        return True

    def _ensure_dir(self) -> None:
        try:
            os.makedirs(self._dir, mode=0o700, exist_ok=True)
            st = os.lstat(self._dir)
        except OSError as e:
            raise InfraError(f"cannot make the jail uid lease folder {self._dir}: {e}") from e
        if (
            not stat.S_ISDIR(st.st_mode)
            or st.st_uid != os.geteuid()
            or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        ):
            raise InfraError(
                f"{self._dir} must be a folder owned by uid {os.geteuid()} that only it can "
                "write (it holds the jail uid leases): remove it and run again"
            )


_pool: UidPool | None = None
_pool_lock = threading.Lock()


def jail_uids() -> UidPool:
    """The process-wide pool, from ``STOCKADE_JAIL_UIDS`` (read once)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            text = os.environ.get(ENV, "")
            first, last = parse_range(text) if text else DEFAULT_RANGE
            for name in ("uid_map", "gid_map"):
                try:
                    id_map = Path(f"/proc/self/{name}").read_text()
                except OSError:
                    continue
                if not is_mapped(first, last, id_map):
                    raise InfraError(
                        f"jail uids {first}-{last} are not all mapped in this user namespace "
                        f"(/proc/self/{name}): set {ENV}=FIRST-LAST to a mapped range no "
                        "account uses"
                    )
            _pool = UidPool(first, last)
        return _pool


def release_idle() -> None:
    """``UidPool.release_idle`` of the process-wide pool, if there is one."""
    with _pool_lock:
        pool = _pool
    if pool is not None:
        pool.release_idle()


class JailIds:
    """How a backend chooses each jail's identity.

    ``None`` for an unprivileged engine (the jail keeps its uid); a lease
    from the process-wide pool for a root engine.
    """

    def __init__(self) -> None:
        #: Test-only: every jail runs as this (uid, gid), leased from nobody
        #: (the shared ``nobody`` of old, for positive controls).
        self.pinned: tuple[int, int] | None = None

    def acquire(self) -> Lease | None:
        if os.geteuid() != 0:
            return None
        if self.pinned is not None:
            return Lease(*self.pinned)
        return jail_uids().acquire()


def hand_to(root: Path, uid: int, gid: int) -> None:
    """Give ``root`` and everything below it to ``uid``/``gid`` (never following links).

    A file with more than one name stays the engine's: it is a shared input
    (an engine-owned, read-only hard link to an artifact other items read),
    and an owner could make it writable. A missing ``root`` is left for the
    launcher to report (it cannot enter it).
    """
    try:
        os.chown(root, uid, gid, follow_symlinks=False)
    except FileNotFoundError:
        return
    stack = [os.fspath(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False) \
                        and entry.stat(follow_symlinks=False).st_nlink > 1:
                    continue
                os.chown(entry.path, uid, gid, follow_symlinks=False)


def take_back(root: Path, uid: int, gid: int, to_uid: int, to_gid: int) -> None:
    """Give what ``uid``/``gid`` owns in ``root`` to ``to_uid``/``to_gid``.

    Only entries the jail owns change owner: a name the jail linked to
    anything else keeps that owner. Run once the jail is gone, so nothing
    below ``root`` changes meanwhile.
    """
    stack = [os.fspath(root)]
    with contextlib.suppress(FileNotFoundError):
        _give(stack[0], os.lstat(stack[0]), uid, gid, to_uid, to_gid)
    while stack:
        try:
            it = os.scandir(stack.pop())
        except (FileNotFoundError, NotADirectoryError):
            continue
        with it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                _give(entry.path, st, uid, gid, to_uid, to_gid)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)


def _give(path: str, st: os.stat_result, uid: int, gid: int, to_uid: int, to_gid: int) -> None:
    if st.st_uid == uid or st.st_gid == gid:
        new_uid = to_uid if st.st_uid == uid else -1
        new_gid = to_gid if st.st_gid == gid else -1
        os.chown(path, new_uid, new_gid, follow_symlinks=False)


class LeasedRunning:
    """A jail whose uid is leased: once it is gone (``wait`` saw its status),
    its files go back to the engine and its uid back to the pool.

    ``sweep()`` says whether processes of the uid may be left (then they
    are killed first); by default always.
    """

    def __init__(
        self,
        inner: Running,
        lease: Lease,
        paths: Sequence[Path],
        sweep: Callable[[], bool] = lambda: True,
    ) -> None:
        self._inner = inner
        self._lease = lease
        self._paths = tuple(paths)
        self._sweep = sweep
        self._lock = threading.Lock()
        self._done = False

    @property
    def pid(self) -> int:
        return self._inner.pid

    @property
    def uid(self) -> int:
        return self._lease.uid

    @property
    def left_nothing(self) -> bool:
        return jail_left_nothing(self._inner)

    def wait(self, timeout: float | None = None) -> int | None:
        status = self._inner.wait(timeout)
        if status is not None:
            self._finish()
        return status

    def kill(self, grace: float = 2.0) -> None:
        self._inner.kill(grace)
        self.wait(0)

    def _finish(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            try:
                # Never for a pinned (test-only) uid: it may be shared.
                if self._lease.pool is not None and self._sweep():
                    kill_all_of(self._lease.uid)
                give_back(self._paths, self._lease)
            finally:
                self._lease.release()


def kill_all_of(uid: int) -> None:
    """SIGKILL every process of a jail uid whose jail the engine saw end.

    What the engine waited for is not always the last of a jail: bwrap
    exits once its pid-namespace init reports the command's status, a
    moment before that init ends and takes the namespace with it; a
    landlock item's grandchildren outlive a helper that died. None of them
    may still run when the uid goes to another item.
    """
    if _direct.available():
        from stockade.sandbox import _jail

        _jail.kill_uid(uid)
        return
    kill = shutil.which("kill", path="/usr/bin:/bin")
    if kill is None:
        raise InfraError("stockade needs kill(1) to end a jail's processes: apt-get install procps")
    # kill -1 reaches every process the uid may signal, never the caller.
    subprocess.run(
        [kill, "-KILL", "-1"], user=uid, group=uid, extra_groups=[], check=False,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def give_back(paths: Sequence[Path], lease: Lease) -> None:
    """``take_back`` of each path, to the engine's uid and gid."""
    for p in paths:
        take_back(p, lease.uid, lease.gid, os.geteuid(), os.getegid())
