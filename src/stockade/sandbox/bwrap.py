"""The ``bwrap`` backend: bubblewrap with an empty root and fresh namespaces.

The jail sees: the host system directories read-only (``/usr`` and the
``/bin``, ``/lib*``, ``/sbin`` symlinks or directories as on the host), a short
list of ``/etc`` files (never ``/etc/shadow``), a fresh ``/proc``, a minimal
``/dev``, the item's scratch folder as ``/tmp`` (TMPDIR), ``/home/stockade``
(HOME) and ``/dev/shm``, and the item's ``work/`` read-write **at its host path** (the same path the
landlock backend, which cannot remap, shows; tools printing absolute paths
behave the same under both). Nothing else of the host exists in it: no
``/run``, no host ``/tmp``, no host HOME, no neighbour, no ``meta/``.

Nothing writable is in memory: bubblewrap's tmpfs ``/`` and ``/dev`` (and
the tmpfs that holds ``work/``'s mount points when it lies below ``/tmp``:
``scratch_covers``) are remounted read-only, and the three writable places
are one folder on the item's disk scratch (bubblewrap 0.8 cannot size a
tmpfs, and an unsized one takes up to half the host's RAM whatever
``resources.memory`` says). Where
a memory cgroup exists, ``resources.memory`` bounds the jail's page cache
and shared memory as well (``_lifetime``).

Namespaces: user, pid, ipc, uts, cgroup, net (``--unshare-all``; ``--share-net``
only for ``network: open``), plus ``--disable-userns``, ``--die-with-parent``,
``--cap-drop ALL`` and the seccomp filter from ``seccomp.build_filter`` on
``--seccomp FD``. No ``--new-session``: every launcher already starts bwrap
in a session of its own, without a controlling terminal (what that option
protects), and bubblewrap's extra session would take the pid namespace's
init out of the process group that ``kill`` and the watchdog end where no
cgroup can be made.

Environment values never appear on a command line: bwrap inherits the jail
environment from its own process environment (it is not setuid, so nothing
strips it), and ``/proc/*/cmdline`` shows only names of paths.

Starting bwrap: with the C launcher built (``_jail``), the engine's launcher
thread vforks and execs bwrap itself (``_direct``), switching to the jail uid
first when the engine is root; otherwise, or when a source needs a bridge
mount, an exec helper starts it. ``STOCKADE_BWRAP_LAUNCHER=helper`` forces
the helper.

Resources are rlimits set by ``prlimit`` inside the jail, after the user
namespace exists. RLIMIT_NPROC is counted per (user namespace, uid) since
Linux 5.14, so inside a fresh user namespace it counts only this jail's
processes. Host root is exempt from RLIMIT_NPROC and must not be a jail's
uid anyway, so when the engine runs as root each jail runs as a uid of its
own (``_uids``: never a host account's, never shared with another running
item); the item's ``work/`` and scratch are handed to that uid before
start and back once the jail is gone. PATH lists only folders the jail can search.

Standard library only, with ``stockade.sandbox`` and ``stockade.errors``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

from stockade.errors import InfraError
from stockade.sandbox import _direct, _lifetime, _reach, _uids, seccomp
from stockade.sandbox._bwrap_argv import (
    RELAY_SCRIPT,
    bwrap_argv,
    image_limits,
    image_points,
    jail_env,
    scratch_mount_points,
)
from stockade.sandbox._host import (
    HostLayout,
    build_etc,
    reachable_by_others,
    resolved,
    scan_host,
    searchable_by_others,
    within_hard_limits,
)
from stockade.sandbox._spawner import HelperPool, HelperRunning, fileno
from stockade.sandbox._tmp import owned_tmpdir
from stockade.sandbox.base import Availability, Backend, InputSharing, Running
from stockade.sandbox.policy import Policy

if TYPE_CHECKING:
    # Imported where an image root is planned: tarfile and gzip are not on
    # the way of a run without images.
    from stockade.sandbox.image import RootOp

#: ``direct``: the engine's launcher thread starts bwrap with the C launcher;
#: ``helper``: an exec helper process starts it (no C launcher built, or forced).
Launcher = Literal["direct", "helper"]


def choose_launcher(env: Mapping[str, str]) -> Launcher:
    """``STOCKADE_BWRAP_LAUNCHER=helper`` forces the exec helper (to compare or debug)."""
    wanted = env.get("STOCKADE_BWRAP_LAUNCHER", "")
    if wanted not in ("", "direct", "helper"):
        raise InfraError(f"STOCKADE_BWRAP_LAUNCHER={wanted!r}: expected 'direct' or 'helper'")
    if wanted == "helper" or not _direct.available():
        return "helper"
    return "direct"


def _remove_points(points: Sequence[str]) -> None:
    for p in points:
        parent = os.path.dirname(p) if not os.path.isdir(p) else p
        shutil.rmtree(parent, ignore_errors=True)


def _remove_trees(paths: Sequence[str], locks: Sequence[int]) -> None:
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)
    for fd in locks:
        os.close(fd)


def _memory_tmp() -> str | None:
    """``/dev/shm`` when it is a writable directory (a tmpfs on Linux), else the default."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and not os.path.islink(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return None


def _shared_tmp() -> str | None:
    """A temp folder every uid can search: the default one when it is, else
    ``/tmp`` or ``/var/tmp``; None: the default all the same. A root engine's
    jails run as uids of their own, and bwrap, running as that uid, must
    reach the bridge points made here: a ``TMPDIR`` below a private folder
    (a ``mktemp -d`` one, a Dask worker's) hid them."""
    for d in (tempfile.gettempdir(), "/tmp", "/var/tmp"):
        if os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK) and searchable_by_others(d):
            return d
    return None


class BwrapBackend(Backend):
    name = "bwrap"
    mount_namespace = True

    def __init__(self, bwrap: str | None = None, launcher: Launcher | None = None) -> None:
        self._bwrap = bwrap or shutil.which("bwrap") or "/usr/bin/bwrap"
        self._launcher = launcher
        self._direct = _direct.LauncherThread()
        self._layout: HostLayout | None = None
        self._filter: bytes | None = None
        self._etc_tmp: str | None = None
        self._etc_reachable = False
        self._bridge_root: str | None = None
        self._cleanup: weakref.finalize[[Sequence[str], Sequence[int]], BwrapBackend] | None = None
        self._prepare_lock = threading.Lock()
        self._helpers = HelperPool()
        self._ids = _uids.JailIds()
        self._path_filter = _reach.PathFilter()
        self._setpriv = shutil.which("setpriv", path="/usr/bin:/bin")
        self._listings: dict[str, list[tuple[str, int, str]]] = {}

    def availability(self) -> Availability:
        if not sys.platform.startswith("linux"):
            return Availability(False, "bubblewrap needs Linux")
        if not os.path.exists(self._bwrap):
            return Availability(False, "bwrap not found: apt-get install bubblewrap")
        try:
            seccomp.native_arch()
        except OSError as e:
            return Availability(False, str(e))
        if self.launcher == "helper":
            return Availability(True, "started through an exec helper")
        return Availability(True, "started by the C launcher, no exec helper")

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None:
            self._launcher = choose_launcher(os.environ)
        return self._launcher

    def limitations(self) -> tuple[str, ...]:
        return (
            "read-only system directories (/usr, /bin, /lib*, /sbin) and a few /etc files "
            "are visible to every step",
            "work/ appears at its host path, so the run tree's location is visible",
            "a step killed by signal N is reported as exit status 128+N",
            "/tmp, HOME and /dev/shm are one folder on the item's disk scratch: bounded by "
            "resources.file_size per file and by the disk, not by resources.memory",
            "network: open shares the host network stack (recorded as reduced isolation)",
            "an image: step cannot use network: [hosts] (the relay runs the host's python3); "
            "its resources are rlimits the launcher sets on bwrap, and processes needs a pids "
            "cgroup unless the engine runs as root",
        )

    def _prepare(self) -> tuple[HostLayout, bytes]:
        with self._prepare_lock:
            return self._prepare_locked()

    def _prepare_locked(self) -> tuple[HostLayout, bytes]:
        if self._layout is None or self._filter is None:
            # In memory where possible: /etc/ssl/certs alone is hundreds of
            # symlinks, slow to create and delete on a busy disk, every run.
            self._etc_tmp, etc_lock = owned_tmpdir("stockade-etc-",
                                                   _memory_tmp() or _shared_tmp())
            self._bridge_root, bridge_lock = owned_tmpdir("stockade-bridge-", _shared_tmp())
            # Removed by close(), or at exit for a backend nobody closed (and
            # by the next run's sweep after a SIGKILL: see ``_tmp``).
            self._cleanup = weakref.finalize(
                self, _remove_trees, (self._etc_tmp, self._bridge_root), (etc_lock, bridge_lock)
            )
            self._layout = build_etc(scan_host(), Path(self._etc_tmp) / "etc")
            # Our own 0755 copy: checked once, not for every item.
            self._etc_reachable = reachable_by_others(Path(self._etc_tmp) / "etc")
            self._filter = seccomp.build_filter(seccomp.native_arch())
        return self._layout, self._filter

    def jail_path(self, policy: Policy, uid: int | None) -> str | None:
        """The jail's PATH: the policy's entries that exist in the jail (the
        system folders, mounts, work/) and that its uid can search."""
        value = policy.env.get("PATH")
        if value is None or policy.image_root is not None:
            # An image's PATH names its own folders (the runner built it).
            return value
        layout = self._layout or scan_host()
        # Every source is bound (or bridged) into bwrap's own root: only
        # the folders from the source down matter.
        system = [_reach.Root(d, d, True) for d in (*layout.dirs, *layout.symlinks)]

        def item() -> list[_reach.Root]:
            roots = [_reach.Root(m.target, os.path.realpath(m.source), True) for m in policy.mounts]
            return [*roots, _reach.Root(str(policy.work_dir), resolved(policy.work_dir), True)]

        tops = [*(m.target for m in policy.mounts), str(policy.work_dir)]
        return self._path_filter(value, system, item, tops, uid)

    def start(self, policy: Policy, *, stdout: IO[bytes] | int, stderr: IO[bytes] | int) -> Running:
        policy = within_hard_limits(policy)
        policy.scratch_dir.mkdir(parents=True, exist_ok=True)
        lease = self._ids.acquire()
        if lease is None:
            return self._start_jail(policy, stdout, stderr, None)
        # A root engine's jail runs as a uid of its own; work/ and the
        # scratch (its /tmp, HOME and /dev/shm) are its until the jail is gone.
        owned = (policy.work_dir, policy.scratch_dir)
        try:
            for p in owned:
                _uids.hand_to(p, lease.uid, lease.gid)
            running = self._start_jail(policy, stdout, stderr, lease)
        except BaseException:
            try:
                _uids.give_back(owned, lease)
            finally:
                lease.release()
            raise
        # A cgroup ends every process of the jail, whatever it became; without
        # one, the jail's pid-namespace init may outlive bwrap: kill the uid.
        return _uids.LeasedRunning(
            running, lease, owned, sweep=lambda: not getattr(running, "contained", False))

    def _start_jail(
        self, policy: Policy, stdout: IO[bytes] | int, stderr: IO[bytes] | int,
        lease: _uids.Lease | None,
    ) -> Running:  # fmt: skip
        """Start bwrap in a cgroup of its own (``_lifetime``): the whole jail
        ends with it."""
        # An image has no prlimit: its processes limit is the cgroup's (and,
        # for a jail uid, RLIMIT_NPROC; see image_limits).
        processes = policy.resources.processes if policy.image_root is not None else None
        running, _ = _lifetime.get().start(
            lambda g: self._start(policy, stdout, stderr, lease, g.join_fds, g.join_dir),
            memory_bytes=policy.resources.memory_bytes, processes=processes)
        return running

    def _start(
        self, policy: Policy, stdout: IO[bytes] | int, stderr: IO[bytes] | int,
        lease: _uids.Lease | None, cgroups: Sequence[int], cgroup_dir: int,
    ) -> Running:  # fmt: skip
        layout, program = self._prepare()
        user = None if lease is None else lease.uid
        group = None if lease is None else lease.gid
        env = jail_env(policy)
        path = self.jail_path(policy, user)
        if path is not None:
            env["PATH"] = path
        relay = RELAY_SCRIPT
        paths = [
            str(policy.work_dir), str(policy.scratch_dir), *(str(m.source) for m in policy.mounts),
            *(str(m.source) for m in policy.shared_inputs),
        ]
        root_ops: list[RootOp] = []
        limits: list[tuple[int, int]] | None = None
        if policy.image_root is not None:
            paths.append(str(policy.image_root))
            from stockade.sandbox.image import root_plan

            root_ops = root_plan(str(policy.image_root), image_points(policy), self._listing)
            limits = image_limits(policy.resources, jail_uid=user is not None)
        if layout.etc_dir is not None and not self._etc_reachable:
            paths.append(layout.etc_dir)
        if policy.network == "proxy":
            paths += [relay, str(policy.proxy_socket)]
        # bwrap runs as the jail uid and resolves its sources with that uid's
        # rights (even for --bind-fd), so a source below a directory only
        # root may search (a pytest tmp dir, /root/...) is first bind-mounted
        # onto a reachable bridge path in a private mount namespace of the
        # helper's child; bwrap then binds the bridge.
        bridges: list[tuple[str, str]] = []
        if user is not None:
            for p in dict.fromkeys(paths):
                if not reachable_by_others(p):
                    bridges.append((p, self._bridge_point(p)))
        rfd, wfd = os.pipe()
        try:
            os.write(wfd, program)  # < 1 KiB: fits the pipe buffer
            os.close(wfd)
            wfd = -1
            # The launchers place extra fds at 3, 4, ...: the policy's own
            # first, so the jail finds them at 3, ... (bwrap passes inherited
            # fds on and closes the seccomp one after reading it).
            argv = bwrap_argv(
                policy,
                layout,
                seccomp_fd=3 + len(policy.pass_fds),
                relay_script=relay,
                sources=dict(bridges),
                bwrap=self._bwrap,
                root_ops=root_ops,
            )
            fds = [fileno(stdout), fileno(stderr), *policy.pass_fds, rfd]
            if self.launcher == "direct" and not bridges:
                try:
                    return self._direct.spawn(
                        self._bwrap, argv, env, fds, uid=user, gid=group, cgroups=cgroups,
                        cgroup_dir=cgroup_dir, limits=limits or (),
                    )  # fmt: skip
                except OSError as e:
                    raise InfraError(f"cannot start bwrap: {e}") from e
            request: dict[str, object] = {
                "mode": "plain",
                "argv": argv,
                "env": env,
                "cwd": str(policy.work_dir),
                "uid": user,
                "gid": group,
                "bridges": bridges,
                "setpriv": self._setpriv,
                "cgroups": len(cgroups),
            }
            if limits is not None:
                request["limits"] = limits
            # The helper takes the cgroup fds off the end (see _forkserver).
            job = self._helpers.spawn(request, [*fds, *cgroups])
        finally:
            os.close(rfd)
            if wfd != -1:
                os.close(wfd)
        points = [b for _, b in bridges]
        return HelperRunning(job, [lambda: _remove_points(points)] if points else None)

    def input_sharing(self) -> InputSharing:
        return "bind"

    def scratch_mount_points(self, policy: Policy) -> frozenset[str]:
        return scratch_mount_points(policy)

    def _listing(self, folder: str) -> list[tuple[str, int, str]]:
        """A folder of an image, as ``root_plan`` reads it (kept until close:
        an image is not changed while jails use it)."""
        hit = self._listings.get(folder)
        if hit is None:
            if len(self._listings) > 256:
                self._listings.clear()
            from stockade.sandbox.image import listing

            hit = self._listings[folder] = listing(folder)
        return hit

    def _bridge_point(self, source: str) -> str:
        assert self._bridge_root is not None
        point = Path(tempfile.mkdtemp(dir=self._bridge_root))
        point.chmod(0o755)
        if os.path.isdir(source):
            return str(point)
        target = point / "f"
        target.touch(0o644)
        return str(target)

    def close(self) -> None:
        self._direct.close()
        self._helpers.close()
        _uids.release_idle()
        with self._prepare_lock:
            if self._cleanup is not None:
                self._cleanup()
                self._cleanup = None
            self._bridge_root = self._etc_tmp = None
            self._layout = None
            self._listings.clear()


def running_as_root() -> bool:
    return os.geteuid() == 0


__all__: Sequence[str] = (
    "BwrapBackend", "bwrap_argv", "choose_launcher", "image_limits", "image_points", "jail_env",
)
