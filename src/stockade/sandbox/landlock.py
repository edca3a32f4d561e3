"""The ``landlock`` backend: Landlock + seccomp + rlimits, no namespaces.

For machines where bwrap is missing or blocked (unprivileged containers,
Ubuntu 24.04's AppArmor rule on user namespaces). Nothing to install; Linux
5.13 or newer. The jail sees the host's paths, but may only read and execute
the system directories and the same ``/etc`` files as bwrap, read ``/proc``
(Landlock's ptrace rule hides other processes' environ, memory, fds and
root), and read and write its ``work/`` (cwd) and a private scratch directory
(HOME and TMPDIR). TCP bind/connect are denied (ABI >= 4) except a connect to
the egress relay's port with ``network: proxy``; seccomp refuses INET sockets
entirely with ``network: none``, and with ``proxy`` everything Landlock's TCP
hooks do not see (UDP, raw, MPTCP, SCTP, TCP Fast Open, ``listen``), and
AF_UNIX sockets unless the network is open (an agent's broker is an
inherited, already connected socket: nothing to connect to); abstract unix
sockets and signals are scoped to the jail (ABI >= 6). Landlock's TCP rules
name ports, not addresses, so a root engine gives each ``network: proxy``
jail a network namespace of its own with only ``lo`` and the relay in it
(``_netns``); an engine that cannot make one says so (``limitations``,
``network_gaps``). ``setsid``/``setpgid`` are refused so the
whole jail stays in one process group that a timeout can kill; where a
cgroup can be made, the jail's cgroup ends it whole (``_lifetime``), and
``resources.processes`` is also its pids controller's limit.

Identity: an unprivileged engine's jail keeps its uid. A root engine's jail
never runs as uid 0 nor as a host account: it gets a uid of its own
(``_uids``); folders above its paths that only root can search are bridged
in a private mount namespace (``_reach``), so the host's permissions stay.
PATH lists only folders the jail can search.

Launch: ``landlock_request`` (pure) turns a policy into the request the
single-threaded fork server (``_forkserver``) executes.

Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, Literal

from stockade.errors import InfraError
from stockade.sandbox import _direct, _landlock, _lifetime, _netns, _reach, _uids, seccomp
from stockade.sandbox._host import (
    HostLayout,
    resolved,
    scan_host,
    searchable_by_others,
    within_hard_limits,
)
from stockade.sandbox._launch import base_rlimits, proxy_env, proxy_url
from stockade.sandbox._spawner import HelperPool, HelperRunning, fileno
from stockade.sandbox.base import Availability, Backend, InputSharing, Running
from stockade.sandbox.policy import NetworkMode, Policy

#: Device files a jail may read and write; random sources it may read.
DEV_RW: tuple[str, ...] = ("/dev/null", "/dev/zero", "/dev/full")
DEV_RO: tuple[str, ...] = ("/dev/urandom", "/dev/random")
MIN_ABI = 1

Launcher = Literal["native", "python"]
#: Why ``image:`` cannot run here; the runner says it at run start, located.
IMAGE_REFUSED = ("the landlock backend cannot give a step another root filesystem (it has no "
                 "mount namespace): image: needs the bwrap backend (apt-get install bubblewrap, "
                 "or --sandbox bwrap)")


def landlock_request(
    policy: Policy,
    *,
    abi: int,
    layout: HostLayout,
    uid: int | None = None,
    gid: int | None = None,
    relay_port: int | None = None,
    launcher: Launcher = "native",
    bridge: _reach.BridgePlan | None = None,
    path: str | None = None,
    pids_limited: bool = False,
) -> dict[str, Any]:
    """The fork server request for ``policy``. Pure: no I/O.

    ``bridge``: mounts that make root-only folders above the jail's paths
    passable (see ``_reach``); ``path``: the jail's PATH, when the backend
    filtered it (``LandlockBackend.jail_path``).
    """
    if policy.image_root is not None:
        raise InfraError(IMAGE_REFUSED)
    if policy.shared_inputs:
        raise InfraError("landlock cannot bind shared inputs (no mount namespace); its jails "
                         "get hard links or copies")
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
    if path is not None:
        env["PATH"] = path
    if policy.network == "proxy":
        if abi < 4:
            # Without Landlock's TCP rules a plain TCP socket reaches any host.
            raise InfraError(
                f"network: proxy under landlock needs Landlock ABI >= 4 (Linux 6.7), this "
                f"kernel has ABI {abi}: use bwrap, or network: none or open"
            )
        if relay_port is None:
            raise InfraError("network: proxy needs the egress proxy (policy.proxy_socket)")
        env.update(proxy_env(proxy_url(policy, relay_port)))
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
        seccomp.FilterOptions(sockets=sockets, no_pidns=True),
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
        "limits": base_rlimits(r),
        # RLIMIT_NPROC counts every process of the uid on the host (no user
        # namespace): the helper adds the step's share to the count at the
        # launch; not needed where the jail's pids cgroup holds the limit.
        "nproc": None if pids_limited else r.processes,
        "seccomp": program.hex(),
        # System paths never change during a run: the helper may keep them open.
        "cache_read_only": not policy.mounts,
        "uid": uid,
        "gid": gid,
        "bridge": bridge.to_json() if bridge is not None else None,
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
    """Engine side for landlock ``network: proxy``: 127.0.0.1:PORT -> the proxy socket.

    ``listener``: one made in the jail's own network namespace
    (``_netns.create``); without it the relay listens on the host's loopback,
    where every local user can connect to the port. Either way the proxy
    behind it answers only requests that carry the item's credential
    (``EgressProxy.token``).
    """

    def __init__(self, target: Path, listener: socket.socket | None = None) -> None:
        # Connect through an fd opened now: the socket may sit in a directory
        # the jail can write, and a name swapped for a symlink must not
        # redirect the engine to another socket.
        self._target_fd = os.open(target, os.O_PATH | os.O_CLOEXEC)
        self._target = f"/proc/self/fd/{self._target_fd}"
        self._listener = listener or socket.create_server(("127.0.0.1", 0))
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


class LandlockBackend(Backend):
    name = "landlock"

    def __init__(self, launcher: Launcher | None = None) -> None:
        self._abi: int | None = None
        self._layout: HostLayout | None = None
        self._helpers = HelperPool()
        self._launcher = launcher
        self._ids = _uids.JailIds()
        self._path_filter = _reach.PathFilter()
        #: Test-only: False runs ``network: proxy`` on the host's network
        #: stack even where a namespace of its own could be made (the
        #: positive control of the escape tests).
        self.private_network = True

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

    def _netns_gap(self) -> str | None:
        """Why ``network: proxy`` jails share the host's network stack here, or None."""
        if self.abi < 4:
            return None  # network: proxy is refused outright
        return _netns.unavailable()

    def limitations(self) -> tuple[str, ...]:
        gap = self._netns_gap()
        shared = (
            "network: none and open share the host's network stack (none: seccomp refuses "
            "every socket)"
        )
        if self.abi >= 4 and gap is None:
            shared += (
                "; network: proxy items get a network namespace of their own with only lo "
                "and the relay"
            )
        lims = [
            "no mount namespace: host paths are visible by name; reads are limited to system "
            "directories, a few /etc files, /proc, work/ and a private scratch directory",
            "no pid namespace: other processes and their command lines are listed in /proc, "
            "the engine's (its --var values) and other items' rendered commands among them "
            "(their environment, memory, fds and root are not readable)",
            shared,
        ]
        if gap is not None:
            lims.append(
                f"network: proxy runs on the host's network stack ({gap}), where Landlock's "
                "TCP rules name ports, not addresses: a step can open TCP to any address on "
                "the relay's port number (a server of its own listening there bypasses the "
                "allowlist); a root engine with CAP_SYS_ADMIN gives each such item a network "
                "namespace of its own, and bwrap always does"
            )
        lims += [
            "RLIMIT_NPROC counts every process of the jail's uid on the host: an unprivileged "
            "engine's jails share its uid (the limit is set to the current count plus the "
            "step's share); a root engine gives each running item a uid of its own",
            "/dev/stdout and /dev/stderr can be reopened only when they are files",
            *(() if os.geteuid() == 0 else (
                "Landlock does not govern a file's metadata: an unprivileged engine's jails "
                "run as its uid and can chmod, chown within it, touch and setxattr any path "
                "that uid owns (its home, the run store) though they cannot read or write "
                "it; a root engine gives each item a uid of its own, and bwrap mounts them "
                "read-only or not at all",)),
            "no other root filesystem: a step with image: is refused when the run starts",
        ]
        if self.abi < 4:
            lims.append(
                f"Landlock ABI {self.abi} < 4: no TCP rules, so network: proxy is refused "
                "(network: none still refuses every INET socket in seccomp)"
            )
        if self.abi < 6:
            lims.append(
                f"Landlock ABI {self.abi} < 6: signals to other processes of the same uid "
                "are not scoped"
            )
        return tuple(lims)

    def network_gaps(self, network: NetworkMode) -> tuple[str, ...]:
        gap = self._netns_gap() if network == "proxy" else None
        if gap is None:
            return ()
        return (
            "network: the allowlist binds only clients that use the proxy: landlock runs "
            f"this step on the host's network stack ({gap}), where it can open TCP to any "
            "address on the relay's port number; a root engine with CAP_SYS_ADMIN, or "
            "bwrap, enforces it",
        )

    def _uses_netns(self, policy: Policy) -> bool:
        return (
            policy.network == "proxy" and self.private_network and self.abi >= 4
            and self._netns_gap() is None
        )  # fmt: skip

    def jail_path(self, policy: Policy, uid: int | None) -> str | None:
        """The jail's PATH: the policy's entries that exist in the jail (the
        system folders, work/, scratch, mounts) and that its uid can search."""
        value = policy.env.get("PATH")
        if value is None:
            return None
        layout = self._layout or scan_host()
        system = [_reach.Root(d, d, False) for d in (*layout.dirs, *layout.symlinks)]

        def item() -> list[_reach.Root]:
            # Bound: folders above them are bridged when the jail cannot search them.
            own = (policy.work_dir, policy.scratch_dir)
            roots = [_reach.Root(str(p), resolved(p), True) for p in own]
            return roots + [
                _reach.Root(m.target, os.path.realpath(m.source), True) for m in policy.mounts
            ]

        tops = [str(policy.work_dir), str(policy.scratch_dir), *(m.target for m in policy.mounts)]
        return self._path_filter(value, system, item, tops, uid)

    def start(self, policy: Policy, *, stdout: IO[bytes] | int, stderr: IO[bytes] | int) -> Running:
        if self._layout is None:
            self._layout = scan_host()
        policy = within_hard_limits(policy)
        policy.scratch_dir.mkdir(parents=True, exist_ok=True)
        # A root engine's jail runs as a uid of its own (never 0, never a
        # host account's): its work/ and scratch are handed to it now and
        # back once it is gone.
        lease = self._ids.acquire()
        if lease is None:
            return self._start_jail(policy, stdout, stderr, None, None)[0]
        owned = (policy.work_dir, policy.scratch_dir)
        try:
            for p in owned:
                _uids.hand_to(p, lease.uid, lease.gid)
            policy, bridge = self._bridge(policy)
            running, helper = self._start_jail(policy, stdout, stderr, lease, bridge)
        except BaseException:
            try:
                _uids.give_back(owned, lease)
            finally:
                lease.release()
            raise
        # The helper kills the jail's process group (which it cannot leave)
        # when its first process ends, and the jail's cgroup (where there is
        # one) ends the rest before the uid is swept; only a helper that
        # died leaves processes behind.
        return _uids.LeasedRunning(running, lease, owned, sweep=lambda: bool(helper.error))

    def _start_jail(
        self, policy: Policy, stdout: IO[bytes] | int, stderr: IO[bytes] | int,
        lease: _uids.Lease | None, bridge: _reach.BridgePlan | None,
    ) -> tuple[Running, HelperRunning]:
        """Start the jail in a cgroup of its own (``_lifetime``): the whole
        jail, and the helper's launch, as a ``Running``."""
        r = policy.resources
        return _lifetime.get().start(
            lambda g: self._start(policy, stdout, stderr, lease, bridge, g.join_fds, g.join_dir,
                                  g.pids_limited),
            memory_bytes=r.memory_bytes, processes=r.processes)

    def _start(
        self, policy: Policy, stdout: IO[bytes] | int, stderr: IO[bytes] | int,
        lease: _uids.Lease | None, bridge: _reach.BridgePlan | None,
        cgroups: Sequence[int], cgroup_dir: int, pids_limited: bool,
    ) -> HelperRunning:  # fmt: skip
        assert self._layout is not None
        uid = None if lease is None else lease.uid
        on_exit: list[Any] = []
        relay_port = None
        net: _netns.PrivateNet | None = None
        if policy.network == "proxy":
            if policy.proxy_socket is None:
                raise InfraError("network: proxy needs policy.proxy_socket")
            if self._uses_netns(policy):
                # The jail's own network namespace: only lo, the relay on it.
                try:
                    net = _netns.create()
                except OSError as e:
                    raise InfraError(
                        f"network: proxy: cannot create the item's network namespace: "
                        f"{e.strerror or e}"
                    ) from e
            try:
                relay = LoopbackRelay(policy.proxy_socket, net.listener if net else None)
            except BaseException:
                if net is not None:
                    net.listener.close()
                    net.close()
                raise
            on_exit.append(relay.close)
            relay_port = relay.port
        try:  # a refused request must not leave the relay listening
            request = landlock_request(
                policy,
                abi=self.abi,
                layout=self._layout,
                uid=uid,
                gid=None if lease is None else lease.gid,
                relay_port=relay_port,
                launcher=self.launcher,
                bridge=bridge,
                path=self.jail_path(policy, uid),
                pids_limited=pids_limited,
            )
            request["cgroups"] = len(cgroups)
            request["cgroup_dir"] = cgroup_dir >= 0
            request["netns"] = net is not None
            # The helper places the policy's fds at 3, 4, ... in the jail; it
            # takes the cgroup fds (and the cgroup v2 folder, and the network
            # namespace) off the end.
            fds = (
                fileno(stdout), fileno(stderr), *policy.pass_fds, *cgroups,
                *([cgroup_dir] if cgroup_dir >= 0 else []), *([net.fd] if net else []),
            )  # fmt: skip
            job = self._helpers.spawn(request, fds)
        except BaseException:
            for hook in on_exit:
                hook()
            raise
        finally:
            if net is not None:
                net.close()  # the helper holds its own copy now
        return HelperRunning(job, on_exit)

    def _bridge(self, policy: Policy) -> tuple[Policy, _reach.BridgePlan | None]:
        """Bridges for the folders above work/, scratch and mounts that the
        jail's uid cannot search (a private run folder, /root/...).

        With bridges, work/ and scratch are named by their resolved paths: a
        symlink on the way may sit in a folder the bridge hides.
        """
        work, scratch = resolved(policy.work_dir), resolved(policy.scratch_dir)
        paths = [(work, True), (scratch, True)]
        paths += [
            (os.path.realpath(m.source), m.source.is_dir())
            for m in policy.mounts
            if m.source.exists()
        ]
        # The common case in a few cached lookups: every folder above is open.
        if all(searchable_by_others(os.path.dirname(p)) for p, _ in paths):
            return policy, None
        plan = _reach.bridge_plan(paths, searchable_by_others)
        if plan is None or (work, scratch) == (str(policy.work_dir), str(policy.scratch_dir)):
            return policy, plan
        return replace(policy, work_dir=Path(work), scratch_dir=Path(scratch)), plan

    def input_sharing(self) -> InputSharing:
        # A root engine's jail runs as a uid of its own, which cannot write
        # or chmod an engine-owned read-only file; otherwise it is the owner.
        return "link" if os.geteuid() == 0 else "copy"

    def close(self) -> None:
        self._helpers.close()
        _uids.release_idle()
