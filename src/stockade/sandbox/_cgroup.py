"""Per-jail cgroups: where they can be made, and how to end one whole.

A jail's processes can leave its process group (bwrap's ``--new-session``
child, anything under the ``none`` backend) and outlive the engine (a
landlock item's grandchildren once the engine is SIGKILLed). A cgroup holds
every process a jail ever starts, whatever session it makes, so ending the
cgroup ends the jail:

* cgroup v2, including the controller-less ``unified`` mount of a hybrid v1
  machine: ``cgroup.kill`` (Linux 5.14), and ``cgroup.events`` says when the
  cgroup is empty;
* cgroup v1 without a usable v2 mount: the ``freezer`` hierarchy: freeze,
  SIGKILL every task (a frozen task can neither fork nor exit, so no pid is
  reused meanwhile), thaw.

Where a memory or pids controller is available (v2 in our subtree, else its
v1 hierarchy) the jail's cgroup there carries ``resources.memory`` (RAM plus
swap, tmpfs and page cache included) and ``resources.processes``.

An engine's cgroups live in one folder per hierarchy, below the engine's own
cgroup, named after the engine (pid namespace, pid, start time): a later
engine can tell that the owner is gone and sweep what it left.

Stdlib only; must not import the rest of stockade (the watchdog loads it
without the package).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import select
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: Hierarchies that can end a jail whole, best first.
KILL_KINDS = ("v2", "freezer")
#: v1 controllers used besides the kill hierarchy.
V1_CONTROLLERS = ("freezer", "memory", "pids")
PREFIX = "stockade-"
_NAME = re.compile(r"stockade-(\d+)-(\d+)-(\d+)(?:-\d+)?\Z")


@dataclass(frozen=True)
class Hierarchy:
    """One cgroup hierarchy and the engine's own cgroup in it."""

    kind: str  # "v2", or the v1 controller: "freezer", "memory", "pids"
    mount: str
    own: str  # absolute path of the engine's cgroup folder


def _unescape(path: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def find_hierarchies(mountinfo: str, proc_cgroup: str) -> dict[str, Hierarchy]:
    """The v2 hierarchy and the v1 freezer, memory and pids ones, with the
    engine's cgroup in each. Pure: parses ``/proc/self/mountinfo`` and
    ``/proc/self/cgroup``."""
    paths: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and not controllers:
            paths["v2"] = path
        for c in controllers.split(","):
            if c in V1_CONTROLLERS:
                paths[c] = path
    found: dict[str, Hierarchy] = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        root, mount = _unescape(fields[3]), _unescape(fields[4])
        fstype, options = rfields[0], rfields[2].split(",")
        if fstype == "cgroup2":
            kinds = ["v2"]
        elif fstype == "cgroup":
            kinds = [o for o in options if o in V1_CONTROLLERS]
        else:
            continue
        for kind in kinds:
            own = paths.get(kind)
            if kind in found or own is None:
                continue
            path = own
            if root == "/":
                rel = path
            elif path == root or path.startswith(root.rstrip("/") + "/"):
                rel = path[len(root.rstrip("/")):] or "/"
            else:
                continue  # our cgroup is not visible through this mount
            found[kind] = Hierarchy(kind, mount, os.path.normpath(mount + "/" + rel.lstrip("/")))
    return found


def engine_name(pidns: int, pid: int, start: int, serial: int = 0) -> str:
    """The folder name of an engine's cgroups (``serial``: a second set in
    the same process, as tests make)."""
    return f"{PREFIX}{pidns}-{pid}-{start}" + (f"-{serial}" if serial else "")


def process_start(pid: int) -> int | None:
    """A process's start time (clock ticks after boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    # Unbuffered: a text file object costs five more system calls (fstat
    # twice, ioctl, lseek twice) per read, and the engine reads a jail's
    # cgroup.events after every item.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


@dataclass
class Tree:
    """This engine's folders: ``kill`` ends jails, ``memory``/``pids`` limit them.

    Each is a (kind, folder) pair; ``memory`` and ``pids`` may be the kill
    folder itself (v2 with the controller enabled in our subtree).
    """

    kill: tuple[str, str]
    memory: tuple[str, str] | None = None
    pids: tuple[str, str] | None = None

    def folders(self) -> list[tuple[str, str]]:
        """Every distinct folder, the kill one first."""
        out = [self.kill]
        for f in (self.memory, self.pids):
            if f is not None and f not in out:
                out.append(f)
        return out


def _mkdir(path: str) -> None:
    os.mkdir(path, 0o755)


def make_tree(hs: Mapping[str, Hierarchy], name: str, kill_kind: str | None = None) -> Tree:
    """Make this engine's folders; ``kill_kind`` forces v2 or freezer.

    Raises ``OSError`` naming why no kill hierarchy could be used.
    """
    kinds = [kill_kind] if kill_kind else list(KILL_KINDS)
    errors: list[str] = []
    tree: Tree | None = None
    for kind in kinds:
        h = hs.get(kind)
        if h is None:
            errors.append(f"no cgroup {'v2' if kind == 'v2' else 'v1 freezer'} hierarchy")
            continue
        folder = os.path.join(h.own, name)
        try:
            _mkdir(folder)
        except OSError as e:
            errors.append(f"cannot create {folder}: {e.strerror}")
            continue
        probe = "cgroup.kill" if kind == "v2" else "freezer.state"
        if not os.path.exists(os.path.join(folder, probe)):
            with contextlib.suppress(OSError):
                os.rmdir(folder)
            errors.append(f"{folder} has no {probe} (Linux >= 5.14 needed for cgroup.kill)")
            continue
        tree = Tree((kind, folder))
        break
    if tree is None:
        raise OSError(0, "; ".join(errors))
    if tree.kill[0] == "v2":
        # Controllers our subtree may use: what the engine's cgroup enables.
        folder = tree.kill[1]
        with contextlib.suppress(OSError):
            available = _read(os.path.join(folder, "cgroup.controllers")).split()
            for c in ("memory", "pids"):
                if c in available:
                    with contextlib.suppress(OSError):
                        _write(os.path.join(folder, "cgroup.subtree_control"), f"+{c}")
            enabled = _read(os.path.join(folder, "cgroup.subtree_control")).split()
            if "memory" in enabled:
                tree.memory = tree.kill
            if "pids" in enabled:
                tree.pids = tree.kill
    for c in ("memory", "pids"):
        if getattr(tree, c) is not None or c not in hs:
            continue
        folder = os.path.join(hs[c].own, name)
        try:
            _mkdir(folder)
        except FileExistsError:
            pass
        except OSError:
            continue
        setattr(tree, c, (c, folder))
    return tree


@dataclass
class Leaf:
    """One jail's cgroup in each hierarchy it uses, and the fds that join them."""

    kill: tuple[str, str]
    dirs: list[str] = field(default_factory=list)
    #: ``cgroup.procs`` of each, the kill hierarchy's first.
    fds: list[int] = field(default_factory=list)
    #: The v2 kill cgroup's folder, to start the jail in (CLONE_INTO_CGROUP).
    dir_fd: int = -1
    memory: bool = False
    pids: bool = False

    def close_fds(self) -> None:
        fds, self.fds = self.fds, []
        if self.dir_fd >= 0:
            fds.append(self.dir_fd)
            self.dir_fd = -1
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def make_leaf(
    tree: Tree, name: str, *, memory_bytes: int | None = None, processes: int | None = None
) -> Leaf:
    """The jail's cgroups, limits set, ``cgroup.procs`` open for the launcher.

    Limits are set before any process joins. Raises ``OSError`` (and leaves
    nothing behind) if the kill cgroup cannot be made.
    """
    wanted: list[tuple[str, str]] = [tree.kill]
    if memory_bytes is not None and tree.memory is not None and tree.memory not in wanted:
        wanted.append(tree.memory)
    if processes is not None and tree.pids is not None and tree.pids not in wanted:
        wanted.append(tree.pids)
    leaf = Leaf((tree.kill[0], os.path.join(tree.kill[1], name)))
    try:
        for kind, folder in wanted:
            path = os.path.join(folder, name)
            _mkdir(path)
            leaf.dirs.append(path)
            if memory_bytes is not None and (kind, folder) == tree.memory:
                _limit_memory(kind, path, memory_bytes)
                leaf.memory = True
            if processes is not None and (kind, folder) == tree.pids:
                _write(os.path.join(path, "pids.max"), str(processes))
                leaf.pids = True
            leaf.fds.append(os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
            if kind == "v2" and (kind, folder) == tree.kill:
                leaf.dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        leaf.close_fds()
        for path in reversed(leaf.dirs):
            with contextlib.suppress(OSError):
                os.rmdir(path)
        raise
    return leaf


def _limit_memory(kind: str, path: str, limit: int) -> None:
    # RAM and swap together: a tmpfs the jail fills must not spill into swap
    # instead (the swap files exist only with swap accounting).
    if kind == "v2":
        _write(os.path.join(path, "memory.max"), str(limit))
        with contextlib.suppress(FileNotFoundError):
            _write(os.path.join(path, "memory.swap.max"), "0")
    else:
        _write(os.path.join(path, "memory.limit_in_bytes"), str(limit))
        with contextlib.suppress(FileNotFoundError):
            _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(limit))


def _subtree(folder: str) -> list[str]:
    """``folder`` and every cgroup below it, deepest first."""
    out: list[str] = []
    for dirpath, _dirs, _files in os.walk(folder, topdown=False):
        out.append(dirpath)
    return out


def _procs(folder: str) -> list[int]:
    try:
        return [int(p) for p in _read(os.path.join(folder, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


def populated(kind: str, folder: str) -> bool:
    """Whether any process is left in ``folder`` or below it."""
    if kind == "v2":
        try:
            return "populated 1" in _read(os.path.join(folder, "cgroup.events"))
        except OSError:
            return False
    return any(_procs(d) for d in _subtree(folder))


def empties(kind: str, folder: str, within: float) -> bool:
    """Whether ``folder`` is empty, or empties by itself within ``within`` seconds.

    A jail's cgroup often still lists its last process for a moment after
    the engine reaped the main one (the kernel tears a pid and mount
    namespace down after the exit status is out): waiting that moment out
    spares a kill, and lets the cgroup and the scratch folder be lent again.
    v1 is only looked at once.
    """
    if kind != "v2":
        return not populated(kind, folder)
    return _wait_empty_v2(folder, within, kill=False)


def kill(kind: str, folder: str) -> None:
    """SIGKILL every process in ``folder`` and below it."""
    if kind == "v2":
        with contextlib.suppress(FileNotFoundError):
            _write(os.path.join(folder, "cgroup.kill"), "1")
        return
    state = os.path.join(folder, "freezer.state")
    try:
        _write(state, "FROZEN")
    except FileNotFoundError:
        return
    # A task in uninterruptible sleep delays freezing; kill what is frozen
    # by then anyway (the caller retries until the cgroup is empty).
    deadline = time.monotonic() + 1.0
    try:
        while _read(state).strip() != "FROZEN" and time.monotonic() < deadline:
            time.sleep(0.002)
        for d in _subtree(folder):
            for pid in _procs(d):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        _write(state, "THAWED")
    except FileNotFoundError:
        return  # removed meanwhile (the watchdog ends an engine's folders whole)


def end(kind: str, folder: str, timeout: float = 10.0) -> bool:
    """Kill everything in ``folder`` and wait until it is empty; False on timeout."""
    if kind == "v2":
        return _end_v2(folder, timeout)
    if not populated(kind, folder):
        return True
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        kill(kind, folder)  # again each round: a task not yet frozen may have forked
        if not populated(kind, folder):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, pause))
        pause = min(pause * 2, 0.05)


def _end_v2(folder: str, timeout: float) -> bool:
    return _wait_empty_v2(folder, timeout, kill=True)


#: The kernel's least interval between two notifications of one cgroup file.
NOTIFY_INTERVAL = 0.02
#: How ``_wait_empty_v2`` waits between reads of ``cgroup.events``: sleeps
#: from ``FIRST_PAUSE``, doubling, up to ``SHORT_PAUSE_CAP`` while a
#: notification may be held back; then the notification, or ``LONG_PAUSE``.
FIRST_PAUSE = 0.00025
SHORT_PAUSE_CAP = 0.004
LONG_PAUSE = 0.05


def _wait_empty_v2(folder: str, timeout: float, *, kill: bool) -> bool:
    """Whether ``folder`` is empty within ``timeout`` (``cgroup.kill`` first if
    ``kill`` and anything is in it), waiting on ``cgroup.events``."""
    try:
        events = os.open(os.path.join(folder, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        # Read through the polled fd: poll() reports a change since this
        # fd's last read (reading through another fd would leave it ready).
        def is_populated() -> bool:
            return b"populated 1" in os.pread(events, 4096, 0)

        if not is_populated():
            return True
        if kill:
            _write(os.path.join(folder, "cgroup.kill"), "1")
        now = time.monotonic()
        deadline = now + timeout
        late = now + NOTIFY_INTERVAL
        pause = FIRST_PAUSE
        poller: select.poll | None = None
        while is_populated():
            now = time.monotonic()
            if now >= deadline:
                return False
            if now < late:
                # The kernel sends at most one notification per cgroup file
                # every 20 ms (CGROUP_FILE_NOTIFY_MIN_INTV): a jail that
                # started less than 20 ms ago, or a lent cgroup whose last
                # jail ended then, would be reported empty up to 20 ms late.
                # A jail's namespaces take about a millisecond to go: read
                # again after short pauses.
                time.sleep(min(deadline - now, pause))
                pause = min(pause * 2, SHORT_PAUSE_CAP)
                continue
            if poller is None:
                poller = select.poll()
                poller.register(events, select.POLLPRI)
            # The slice bounds a missed notification.
            poller.poll(math.ceil(min(deadline - now, LONG_PAUSE) * 1000))
        return True
    finally:
        os.close(events)


def reusable(kind: str, folder: str) -> bool:
    """Whether an ended jail's cgroup can hold the next jail as it is: no process
    in it, no cgroup below it, not frozen. (Its settings are the engine's to
    write; only a ``none`` jail, which runs as the engine's user, could change
    them, and it can change anything of the engine's.)"""
    try:
        # A cgroup folder's link count is 2 plus its sub-cgroups (kernfs).
        if os.stat(folder).st_nlink != 2:
            return False
        if kind == "v2":
            events = _read(os.path.join(folder, "cgroup.events"))
            return "populated 0" in events and "frozen 1" not in events
        return not _procs(folder) and _read(os.path.join(folder, "freezer.state")).strip() == "THAWED"
    except OSError:
        return False


def remove(folders: Iterable[str]) -> bool:
    """rmdir each folder and everything below it (cgroups must be empty)."""
    ok = True
    for folder in folders:
        for d in _subtree(folder):
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError:
                ok = False
    return ok


def sweep(hs: Mapping[str, Hierarchy], pidns: int) -> int:
    """End and remove the folders of engines of this pid namespace that are
    gone (their watchdog died with them). Returns how many were swept."""
    stale: dict[str, list[tuple[str, str]]] = {}
    for kind, h in hs.items():
        try:
            names = os.listdir(h.own)
        except OSError:
            continue
        for name in names:
            m = _NAME.match(name)
            if m is None or int(m.group(1)) != pidns:
                continue
            if process_start(int(m.group(2))) == int(m.group(3)):
                continue  # its engine is alive
            stale.setdefault(name, []).append((kind, os.path.join(h.own, name)))
    for folders in stale.values():
        # Kill through the kill hierarchies first: every jail process is in one.
        for kind, folder in sorted(folders, key=lambda f: f[0] not in KILL_KINDS):
            if kind in KILL_KINDS:
                end(kind, folder, timeout=5.0)
        remove(f for _, f in folders)
    return len(stale)
