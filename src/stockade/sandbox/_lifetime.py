"""How a jail ends: every process of it, when it is killed, when its main
process exits, and when the engine dies.

One ``Lifetime`` per engine process (``get()``) picks the mechanism once:

* ``cgroup2`` / ``cgroup1``: each jail gets its own cgroup (``_cgroup``);
  the C launcher creates the jail's first process in it (clone3 with
  CLONE_INTO_CGROUP, v2), or the launcher's child joins it before exec, so
  everything the jail starts is in it whatever session it makes.
  ``Running.kill`` kills the cgroup and returns once it is empty; the end of
  the main process kills the rest too (a background thread waits for it
  and removes the cgroup); the watchdog (``_watchdog``) kills the engine's
  whole cgroup folder when the engine dies. Memory and pids controllers,
  where present, bound the jail as a whole. A cgroup made without limits
  is lent to the next jail once it is empty (``_cgroup.reusable``) instead
  of being removed: making and removing one costs a few syscalls and, when
  its main process leaves nothing behind, a hand-off to the reaper thread
  per item. A cgroup with limits is never lent (memory charged to it, page
  cache and tmpfs, stays charged after its processes end), nor one the
  engine had to kill: on the Linux 6.18 of our CI a process created into a
  cgroup by CLONE_INTO_CGROUP after a ``cgroup.kill`` of that cgroup was
  SIGKILLed at birth.
* ``pgroup`` (no cgroup can be made: an unprivileged engine without a
  delegated cgroup, a container with a read-only cgroupfs): each jail's
  process group is registered with the watchdog. landlock jails cannot leave
  theirs (seccomp refuses setsid/setpgid); bwrap's pid namespace dies with
  its init, which is in the group.

``STOCKADE_JAIL_LIFETIME`` (``cgroup2``, ``cgroup1``, ``pgroup``) forces a
mechanism, to compare or to test the fallbacks; ``doctor`` and the run
manifest say which one is in use and what it does not cover.

Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from stockade.errors import InfraError
from stockade.sandbox import _cgroup
from stockade.sandbox._watchdog import Watchdog
from stockade.sandbox.base import Running

_R = TypeVar("_R", bound=Running)

Mode = Literal["cgroup2", "cgroup1", "pgroup", "off"]
MODES: tuple[str, ...] = ("cgroup2", "cgroup1", "pgroup")
#: How long a jail whose main process ended may take to empty its cgroup by
#: itself before the rest is killed. bwrap exits a moment before its pid
#: namespace is gone (under 2 ms on the development VM, in 4 of 10 jails);
#: a process a landlock or ``none`` jail left running costs this wait once.
SETTLE = 0.1
#: How long ending a jail may wait for its last process (a task stuck in
#: uninterruptible sleep on a hung filesystem cannot die sooner).
END_TIMEOUT = 10.0


def _pgroup_alive(pgid: int) -> bool:
    """A live (not zombie) process is in group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Members may be zombies nobody has reaped yet: look at their state.
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True  # no /proc (macOS): a zombie counts until it is reaped
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


class JailGroup:
    """What one jail is ended by: its cgroups, or its process group."""

    def __init__(self, lifetime: Lifetime, leaf: _cgroup.Leaf | None,
                 lendable: bool = False) -> None:
        self._lifetime = lifetime
        self._leaf = leaf
        #: Made without limits: lent to the next jail once this one has ended.
        self._lendable = lendable and leaf is not None
        self._pgid: int | None = None
        self._lock = threading.Lock()
        self._signalled = False
        #: Its cgroup was found empty once the main process had ended.
        self._found_empty = False
        self._queued = False
        self._gone = False

    @property
    def join_fds(self) -> tuple[int, ...]:
        """``cgroup.procs`` fds the launcher's child writes ``0`` to before exec."""
        return tuple(self._leaf.fds) if self._leaf is not None else ()

    @property
    def cgroup(self) -> str | None:
        """The folder of the cgroup that ends the jail (None: a process group)."""
        return self._leaf.kill[1] if self._leaf is not None else None

    @property
    def join_dir(self) -> int:
        """A cgroup v2 folder fd to start the jail in (CLONE_INTO_CGROUP),
        whose ``cgroup.procs`` is ``join_fds[0]``; -1 if none."""
        return self._leaf.dir_fd if self._leaf is not None else -1

    @property
    def contained(self) -> bool:
        """A cgroup holds every process of the jail: ending it ends them all,
        whatever uid or session they have."""
        return self._leaf is not None

    @property
    def left_nothing(self) -> bool:
        """Once the main process ended, nothing of the jail was left running
        (its cgroup was empty): no process of it can still touch a file."""
        return self._found_empty

    @property
    def pids_limited(self) -> bool:
        return self._leaf is not None and self._leaf.pids

    def adopt(self, running: Running) -> Running:
        """The jail started: close the join fds, register, wrap ``running``."""
        if self._lifetime.mode == "off":
            return running
        if self._leaf is not None:
            if not self._lendable:
                self._leaf.close_fds()
        elif self._lifetime.mode == "pgroup":
            pid = running.pid
            # Only a group whose leader is not reaped yet: a reaped leader's
            # number may name someone else's group once its own is empty.
            # (0: an exec helper could not start it.)
            if pid > 1 and running.wait(0) is None:
                self._pgid = pid
                self._lifetime.watchdog_add(pid)
        return GroupRunning(running, self)

    def discard(self) -> None:
        """The jail did not start: remove what ``open`` made."""
        if self._leaf is not None:
            if not self._lendable:
                self._leaf.close_fds()
            self.end()

    def end(self, *, wait: bool = True) -> None:
        """SIGKILL what is left of the jail.

        ``wait``: return once it is gone (bounded by ``END_TIMEOUT``) and its
        cgroups are removed; otherwise a background thread does that part.
        Idempotent and thread-safe: a waiting caller waits for the others.
        """
        with self._lock:
            busy = True
            if not self._signalled:
                self._signalled = True
                busy = self._signal()
                self._found_empty = self._leaf is not None and not busy
                # Killed: never lent (see the module doc).
                self._lendable = self._lendable and not busy
            if self._gone:
                return
            if wait or not busy:
                # (Nothing was left running: nothing to wait for, no hand-off.)
                self._finish_locked(empty=not busy)
            elif self._leaf is None:
                # A process group was SIGKILLed as its leader was reaped; no
                # cgroup to remove, so nothing to wait for (only kill() waits:
                # finding zombies means reading all of /proc).
                self._gone = True
                if self._pgid is not None:
                    self._lifetime.watchdog_remove(self._pgid)
            elif not self._queued:
                self._queued = True
                _reaper.put(self)

    def finish(self) -> None:
        with self._lock:
            if not self._gone:
                self._finish_locked()

    def _signal(self) -> bool:
        """SIGKILL what is left in the cgroup; whether anything was (True
        without a cgroup: a process group is not known to be empty)."""
        # A process group was SIGKILLed by the launcher's side already, while
        # its leader was unreaped (the only moment its id surely is ours).
        if self._leaf is None:
            return True
        kind, folder = self._leaf.kill
        if _cgroup.empties(kind, folder, SETTLE):
            return False
        _cgroup.kill(kind, folder)
        return True

    def _finish_locked(self, *, empty: bool = False) -> None:
        """End the group; ``empty``: its cgroup was just found empty (nothing can
        enter it since), so there is nothing to kill or wait for."""
        self._gone = True
        if self._leaf is not None:
            leaf = self._leaf
            if empty or _cgroup.end(leaf.kill[0], leaf.kill[1], END_TIMEOUT):
                if not (self._lendable and self._lifetime.lend(leaf)):
                    leaf.close_fds()
                    _cgroup.remove(leaf.dirs)
            else:
                leaf.close_fds()  # the folder is left to the watchdog (or the next sweep)
        elif self._pgid is not None:
            # Only looks: the id stays the group's while a member lives, but
            # not a moment longer, so no signal goes to it from here.
            deadline = time.monotonic() + END_TIMEOUT
            while _pgroup_alive(self._pgid) and time.monotonic() < deadline:
                time.sleep(0.005)
            self._lifetime.watchdog_remove(self._pgid)


class _Reaper:
    """One thread that waits out jails whose main process ended (their rest
    is already SIGKILLed) and removes their cgroups, off the item's path:
    tearing down a pid and mount namespace takes milliseconds."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[JailGroup] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, group: JailGroup) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="stockade-jail-reaper", daemon=True
                )
                self._thread.start()
        self._queue.put(group)

    def _run(self) -> None:
        while True:
            group = self._queue.get()
            # A folder gone meanwhile must not end the thread the next jails need.
            with contextlib.suppress(OSError):
                group.finish()


_reaper = _Reaper()


class GroupRunning:
    """A ``Running`` that ends the whole jail, not only its main process."""

    def __init__(self, inner: Running, group: JailGroup) -> None:
        self._inner = inner
        self._group = group

    @property
    def pid(self) -> int:
        return self._inner.pid

    @property
    def contained(self) -> bool:
        """See ``JailGroup.contained``."""
        return self._group.contained

    @property
    def left_nothing(self) -> bool:
        """See ``JailGroup.left_nothing`` (False until ``wait`` returned a status)."""
        return self._group.left_nothing

    def wait(self, timeout: float | None = None) -> int | None:
        status = self._inner.wait(timeout)
        if status is not None:
            # What the main process left behind goes with it.
            self._group.end(wait=False)
        return status

    def kill(self, grace: float = 2.0) -> None:
        self._inner.kill(grace)
        self._group.end()


class Lifetime:
    """The engine's mechanism (see the module doc), set up on first use."""

    def __init__(self, mode: str | None = None) -> None:
        self._requested = mode
        self._lock = threading.Lock()
        self._ready = False
        self.mode: Mode = "pgroup"
        self._tree: _cgroup.Tree | None = None
        self._watchdog: Watchdog | None = None
        self._why_no_cgroup = ""
        self._names = itertools.count()
        #: Ended jails' cgroups without limits, ready for the next jail.
        self._spare: list[_cgroup.Leaf] = []

    def _setup(self) -> None:
        with self._lock:
            if self._ready:
                return
            requested = self._requested
            if requested is None:
                requested = os.environ.get("STOCKADE_JAIL_LIFETIME", "") or None
            if requested is not None and requested not in (*MODES, "off"):
                raise InfraError(
                    f"STOCKADE_JAIL_LIFETIME={requested!r}: expected one of {', '.join(MODES)}"
                )
            if requested == "off":
                self.mode, self._ready = "off", True
                return
            if requested != "pgroup":
                kind = {"cgroup2": "v2", "cgroup1": "freezer"}.get(requested or "")
                try:
                    self._tree = self._make_tree(kind)
                except OSError as e:
                    self._why_no_cgroup = e.strerror or str(e)
                    if requested is not None:
                        raise InfraError(
                            f"STOCKADE_JAIL_LIFETIME={requested}: {self._why_no_cgroup}"
                        ) from None
            if self._tree is not None:
                self.mode = "cgroup2" if self._tree.kill[0] == "v2" else "cgroup1"
                self._watchdog = Watchdog(self._tree.kill, self._tree.folders())
            else:
                self.mode = "pgroup"
                self._watchdog = Watchdog(None, ())
            self._ready = True

    @staticmethod
    def _make_tree(kind: str | None) -> _cgroup.Tree:
        try:
            with open("/proc/self/mountinfo") as f:
                mountinfo = f.read()
            with open("/proc/self/cgroup") as f:
                own = f.read()
            pidns = os.stat("/proc/self/ns/pid").st_ino
        except OSError as e:
            raise OSError(e.errno, f"cannot read /proc: {e.strerror}") from None
        start = _cgroup.process_start(os.getpid())
        if start is None:
            raise OSError(0, "cannot read /proc/self/stat")
        hs = _cgroup.find_hierarchies(mountinfo, own)
        _cgroup.sweep(hs, pidns)
        name = _cgroup.engine_name(pidns, os.getpid(), start, next(_serials))
        return _cgroup.make_tree(hs, name, kind)

    def open(self, *, memory_bytes: int | None = None, processes: int | None = None) -> JailGroup:
        """What the next jail joins; its memory/processes limits where a
        controller can hold them (``JailGroup.pids_limited``: the processes one)."""
        self._setup()
        leaf = None
        plain = memory_bytes is None and processes is None
        if self._tree is not None and plain:
            with self._lock:
                if self._spare:
                    return JailGroup(self, self._spare.pop(), lendable=True)
        if self._tree is not None:
            try:
                leaf = _cgroup.make_leaf(
                    self._tree, str(next(self._names)),
                    memory_bytes=memory_bytes, processes=processes,
                )  # fmt: skip
            except OSError as e:
                raise InfraError(f"cannot create the jail's cgroup: {e}") from e
        return JailGroup(self, leaf, lendable=plain)

    def lend(self, leaf: _cgroup.Leaf) -> bool:
        """Keep an ended jail's limit-free cgroup for the next jail, if it is as
        it was made (``_cgroup.reusable``); False: the caller removes it."""
        if not _cgroup.reusable(*leaf.kill):
            return False
        with self._lock:
            if self._tree is None:  # closed meanwhile
                return False
            self._spare.append(leaf)
        return True

    def start(self, launch: Callable[[JailGroup], _R], *, memory_bytes: int | None = None,
              processes: int | None = None) -> tuple[Running, _R]:
        """Start a jail in a group of its own: ``launch(group)`` starts it
        (joining ``group.join_fds``/``join_dir``); returns the whole jail as a
        ``Running`` and what ``launch`` returned. A launch that fails leaves
        no group behind."""
        group = self.open(memory_bytes=memory_bytes, processes=processes)
        try:
            started = launch(group)
            return group.adopt(started), started
        except BaseException:
            group.discard()
            raise

    def watchdog_add(self, pgid: int) -> None:
        if self._watchdog is not None:
            self._watchdog.add(pgid)

    def watchdog_remove(self, pgid: int) -> None:
        if self._watchdog is not None:
            self._watchdog.remove(pgid)

    def close(self) -> None:
        """End the watchdog now (it ends whatever is left and removes the
        folders). Only for a ``Lifetime`` that is not the process's own:
        tests use several."""
        with self._lock:
            watchdog, self._watchdog = self._watchdog, None
            self._ready = False
            self._tree = None
            spare, self._spare = self._spare, []
        for leaf in spare:
            leaf.close_fds()
        if watchdog is not None:
            watchdog.close()

    def memory_controller(self) -> str | None:
        self._setup()
        if self._tree is None or self._tree.memory is None:
            return None
        kind, folder = self._tree.memory
        return f"cgroup {'v2' if kind == 'v2' else 'v1'} memory controller ({folder})"

    def pids_controller(self) -> str | None:
        self._setup()
        if self._tree is None or self._tree.pids is None:
            return None
        kind, folder = self._tree.pids
        return f"cgroup {'v2' if kind == 'v2' else 'v1'} pids controller ({folder})"

    def limitations(self) -> tuple[str, ...]:
        """What the mechanism in use does not cover (for doctor and the manifest)."""
        self._setup()
        lims: list[str] = []
        if self.mode == "off":
            return ("jail lifetime protection is switched off: jail processes can outlive "
                    "their engine and Running.kill",)  # fmt: skip
        if self.mode == "pgroup":
            lims += [
                f"no cgroup ({self._why_no_cgroup or 'forced by STOCKADE_JAIL_LIFETIME'}): jails "
                "are ended by process group; under the none backend a process that starts its "
                "own session is not ended with its jail or its engine",
                "an engine killed in the instant between a jail's start and its registration "
                "with the watchdog can leave that jail running (still jailed) to its end",
            ]
        if self.memory_controller() is None:
            lims.append(
                "resources.memory is RLIMIT_AS per process (no memory cgroup): the jail as a "
                "whole, and memory-backed files (memfd, SysV shared memory), are not bounded "
                "by it"
            )
        lims.append(
            "if the watchdog process is killed as well as the engine, jails end only by their "
            "parent-death signal (their children can survive)"
        )
        return tuple(lims)

    def report(self) -> dict[str, Any]:
        """What ``doctor --json`` and the run manifest record under ``lifetime``."""
        self._setup()
        detail: Mapping[str, str] = {
            "cgroup2": "each jail in a cgroup v2 of its own, ended whole by cgroup.kill",
            "cgroup1": "each jail in a cgroup v1 freezer cgroup of its own, frozen then killed",
            "pgroup": "each jail's process group, registered with the watchdog",
            "off": "switched off",
        }
        return {
            "mechanism": self.mode,
            "detail": detail[self.mode],
            "cgroup": self._tree.kill[1] if self._tree is not None else None,
            "memory": self.memory_controller(),
            "processes": self.pids_controller(),
            "watchdog": self._watchdog.pid if self._watchdog is not None else None,
            "limitations": list(self.limitations()),
        }


_current: Lifetime | None = None
_serials = itertools.count()
_current_lock = threading.Lock()


def get() -> Lifetime:
    """The engine's ``Lifetime`` (one per process)."""
    global _current
    with _current_lock:
        if _current is None:
            _current = Lifetime()
        return _current


def use(mode: str | None) -> Lifetime:
    """Replace the process's ``Lifetime`` before any jail starts; ``off``
    disables the protection (tests' positive controls only)."""
    global _current
    with _current_lock:
        _current = Lifetime(mode)
        return _current
