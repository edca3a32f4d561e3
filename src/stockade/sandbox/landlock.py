"""The ``landlock`` backend: Landlock + seccomp + rlimits, no namespaces.

For machines where bwrap is missing or blocked (unprivileged containers,
Ubuntu 24.04's AppArmor rule on user namespaces). Nothing to install; Linux
5.13 or newer. The jail sees the host's paths, but may only read and execute
the system directories and the same ``/etc`` files as bwrap, read ``/proc``
(Landlock's ptrace rule hides other processes' environ, memory, fds and
root), and read and write its ``work/`` (cwd) and a private scratch directory
(HOME and TMPDIR). TCP bind/connect are denied (ABI >= 4) except a connect to
the egress relay's port with ``network: proxy``; seccomp refuses INET sockets
entirely with ``network: none`` and UDP with ``proxy``, and AF_UNIX sockets
unless the policy mounts a socket; abstract unix sockets and signals are
scoped to the jail (ABI >= 6). ``setsid``/``setpgid`` are refused so the
whole jail stays in one process group that a timeout can kill; where a
cgroup can be made, the jail's cgroup ends it whole (``_lifetime``), and
``resources.processes`` is also its pids controller's limit.

Launch: ``landlock_request`` (pure) turns a policy into the request the
single-threaded fork server (``_forkserver``) executes.

Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal

from stockade.errors import InfraError
from stockade.sandbox import _direct, _landlock, _lifetime, seccomp
from stockade.sandbox._spawner import HelperPool, HelperRunning, fileno
from stockade.sandbox.base import Availability, Backend, Running
from stockade.sandbox.bwrap import (
    JAIL_GID,
    JAIL_UID,
    HostLayout,
    _chown_tree,
    proxy_env,
    reachable_by_others,
    scan_host,
)
from stockade.sandbox.policy import Policy

#: Device files a jail may read and write; random sources it may read.
DEV_RW: tuple[str, ...] = ("/dev/null", "/dev/zero", "/dev/full")
DEV_RO: tuple[str, ...] = ("/dev/urandom", "/dev/random")
MIN_ABI = 1

Launcher = Literal["native", "python"]


def landlock_request(
    policy: Policy,
    *,
    abi: int,
    layout: HostLayout,
    uid: int | None = None,
    gid: int | None = None,
    relay_port: int | None = None,
    unix_sockets: bool = False,
    launcher: Launcher = "native",
) -> dict[str, Any]:
    """The fork server request for ``policy``. Pure: no I/O."""
    for m in policy.mounts:
        if m.target != str(m.source):
            raise InfraError(
                f"landlock cannot show {m.source} at {m.target} (no mount namespace): "
                "mount it at its host path"
            )
    scratch = str(policy.scratch_dir)
    env = dict(policy.env)
    # The scratch dir itself (no subdirectories: a mkdir per item is
    # measurable on slow filesystems, and the runner made it fresh).
    env["HOME"] = scratch
    env["TMPDIR"] = scratch
    if policy.network == "proxy":
        if relay_port is None:
            raise InfraError("network: proxy needs the egress proxy (policy.proxy_socket)")
        env.update(proxy_env(f"http://127.0.0.1:{relay_port}"))
    read_only = [
        *layout.dirs,
        *layout.symlinks,
        *layout.etc,
        "/proc",
        *DEV_RO,
        *(str(m.source) for m in policy.mounts if not m.writable),
    ]
    if policy.network == "open" and layout.resolv_conf:
        read_only.append(layout.resolv_conf)
    read_write = [
        str(policy.work_dir),
        scratch,
        *DEV_RW,
        *(str(m.source) for m in policy.mounts if m.writable),
    ]
    sockets = {"none": "none", "proxy": "tcp", "open": "all"}[policy.network]
    program = seccomp.build_filter(
        seccomp.native_arch(),
        seccomp.FilterOptions(sockets=sockets, allow_unix=unix_sockets, no_pidns=True),
    )
    r = policy.resources
    return {
        "mode": "landlock",
        "launcher": launcher,
        "argv": list(policy.argv),
        "env": env,
        "cwd": str(policy.work_dir),
        "abi": abi,
        "read_only": read_only,
        "read_write": read_write,
        "handle_net": policy.network != "open",
        "connect_ports": [relay_port] if relay_port is not None else [],
        "rlimits": {
            "as": r.memory_bytes,
            "cpu": r.cpu_seconds,
            "nproc": r.processes,
            "fsize": r.file_size_bytes,
        },
        "seccomp": program.hex(),
        # System paths never change during a run: the helper may keep them open.
        "cache_read_only": not policy.mounts,
        "uid": uid,
        "gid": gid,
    }


def native_launcher() -> bool:
    """Whether the C launcher (``stockade.sandbox._jail``, built by setup.py) is installed."""
    return _direct.available()


def choose_launcher(env: Mapping[str, str]) -> Launcher:
    """``STOCKADE_LANDLOCK_LAUNCHER=python`` forces the fallback (to compare or debug)."""
    wanted = env.get("STOCKADE_LANDLOCK_LAUNCHER", "")
    if wanted not in ("", "native", "python"):
        raise InfraError(f"STOCKADE_LANDLOCK_LAUNCHER={wanted!r}: expected 'native' or 'python'")
    if wanted == "python" or not native_launcher():
        return "python"
    return "native"


class LoopbackRelay:
    """Host side for landlock ``network: proxy``: 127.0.0.1:PORT -> the proxy socket."""

    def __init__(self, target: Path) -> None:
        # Connect through an fd opened now: the socket may sit in a directory
        # the jail can write, and a name swapped for a symlink must not
        # redirect the engine to another socket.
        self._target_fd = os.open(target, os.O_PATH | os.O_CLOEXEC)
        self._target = f"/proc/self/fd/{self._target_fd}"
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from stockade.sandbox._relay import _handle

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=_handle, args=(client, self._target), daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with contextlib.suppress(OSError):
            os.close(self._target_fd)


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


class LandlockBackend(Backend):
    name = "landlock"

    def __init__(self, launcher: Launcher | None = None) -> None:
        self._abi: int | None = None
        self._layout: HostLayout | None = None
        self._helpers = HelperPool()
        self._launcher = launcher

    @property
    def launcher(self) -> Launcher:
        """``native``: the helper vforks and confines in C; ``python``: it forks itself."""
        if self._launcher is None:
            self._launcher = choose_launcher(os.environ)
        return self._launcher

    @property
    def abi(self) -> int:
        if self._abi is None:
            self._abi = _landlock.abi_version() if sys.platform.startswith("linux") else 0
        return self._abi

    def availability(self) -> Availability:
        if not sys.platform.startswith("linux"):
            return Availability(False, "Landlock needs Linux 5.13 or newer")
        if self.abi < MIN_ABI:
            return Availability(
                False,
                "Landlock is not enabled in this kernel: boot Linux >= 5.13 with lsm=...,landlock",
            )
        try:
            seccomp.native_arch()
        except OSError as e:
            return Availability(False, str(e))
        if self.launcher == "python":
            return Availability(
                True,
                f"Landlock ABI {self.abi}, Python launcher (about 1 ms slower per item; "
                "reinstall with a C compiler to build stockade.sandbox._jail)",
            )
        return Availability(True, f"Landlock ABI {self.abi}, C launcher")

    def limitations(self) -> tuple[str, ...]:
        lims = [
            "no mount namespace: host paths are visible by name; reads are limited to system "
            "directories, a few /etc files, /proc, work/ and a private scratch directory",
            "no pid namespace: other processes and their command lines are listed in /proc "
            "(their environment, memory, fds and root are not readable)",
            "no network namespace: the host's network stack is shared; TCP is filtered by "
            "Landlock and other sockets by seccomp",
            "RLIMIT_NPROC counts every process of the jail's uid on the host "
            "(the limit is set to the current count plus the step's share); when the engine "
            "runs as root and a step needs a path only root can reach, the jail keeps uid 0 "
            "without capabilities and RLIMIT_NPROC does not apply",
            "a mounted unix socket (agent broker) re-enables AF_UNIX sockets: the step can then "
            "connect to any pathname unix socket it can name",
            "/dev/stdout and /dev/stderr can be reopened only when they are files",
        ]
        if self.abi < 4:
            lims.append(f"Landlock ABI {self.abi} < 4: TCP is filtered only by seccomp")
        if self.abi < 6:
            lims.append(
                f"Landlock ABI {self.abi} < 6: signals to other processes of the same uid "
                "are not scoped"
            )
        return tuple(lims)

    def start(self, policy: Policy, *, stdout: IO[bytes] | int, stderr: IO[bytes] | int) -> Running:
        r = policy.resources
        jail = _lifetime.get().open(memory_bytes=r.memory_bytes, processes=r.processes)
        try:
            return jail.adopt(self._start(policy, stdout, stderr, jail.join_fds, jail.join_dir))
        except BaseException:
            jail.discard()
            raise

    def _start(
        self, policy: Policy, stdout: IO[bytes] | int, stderr: IO[bytes] | int,
        cgroups: Sequence[int], cgroup_dir: int,
    ) -> Running:  # fmt: skip
        if self._layout is None:
            self._layout = scan_host()
        uid = gid = None
        policy.scratch_dir.mkdir(parents=True, exist_ok=True)
        needed = [policy.work_dir, policy.scratch_dir, *(m.source for m in policy.mounts)]
        if os.geteuid() == 0 and all(reachable_by_others(p) for p in needed):
            # Host root is exempt from RLIMIT_NPROC and owns everything: run
            # as nobody. When a needed path is reachable only by root (a
            # runtime dir under /root), the helper keeps uid 0 but drops
            # every capability instead.
            uid, gid = JAIL_UID, JAIL_GID
            _chown_tree(policy.work_dir, uid, gid)
            _chown_tree(policy.scratch_dir, uid, gid)
        elif os.geteuid() == 0 and self.abi < 6:
            # euid 0 without Landlock's signal scope could signal host root's
            # processes: refuse rather than run weaker than reported.
            raise InfraError(
                "landlock: a step needs a path only root can reach, and this kernel's Landlock "
                f"(ABI {self.abi} < 6) cannot scope signals; make the run root searchable "
                "by others (chmod o+x) or use bwrap"
            )
        on_exit: list[Any] = []
        relay_port = None
        if policy.network == "proxy":
            if policy.proxy_socket is None:
                raise InfraError("network: proxy needs policy.proxy_socket")
            relay = LoopbackRelay(policy.proxy_socket)
            on_exit.append(relay.close)
            relay_port = relay.port
        request = landlock_request(
            policy,
            abi=self.abi,
            layout=self._layout,
            uid=uid,
            gid=gid,
            relay_port=relay_port,
            unix_sockets=any(_is_socket(m.source) for m in policy.mounts),
            launcher=self.launcher,
        )
        request["cgroups"] = len(cgroups)
        request["cgroup_dir"] = cgroup_dir >= 0
        fds = [fileno(stdout), fileno(stderr), *cgroups, *([cgroup_dir] if cgroup_dir >= 0 else [])]
        try:
            job = self._helpers.spawn(request, fds)
        except BaseException:
            for hook in on_exit:
                hook()
            raise
        return HelperRunning(job, on_exit)

    def close(self) -> None:
        self._helpers.close()
