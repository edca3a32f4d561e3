"""The exec helper: a small single-threaded process that starts jails.

Starting Python costs ~60 ms and forking the engine costs more with every
thread and megabyte it holds, so the engine starts a few of these once and
sends them spawn requests (JSON over a ``SOCK_SEQPACKET`` socket, the item's
stdout/stderr and any extra fds passed by ``SCM_RIGHTS``).

* ``mode: landlock``: the helper builds the Landlock ruleset from paths it
  opens (system paths cached across items). With ``launcher: native`` the C
  extension ``_jail`` vforks and does the rest in the child; otherwise the
  helper forks and the Python child does it: join the jail's cgroups and,
  with ``netns``, its own network namespace (``_netns``), start a session,
  set rlimits, make the bridge mounts (``_reach``: a private mount
  namespace where root-only folders above the jail's paths are passable),
  drop to the jail uid, set the parent-death signal (after the uid change,
  which clears it), enforce Landlock, install seccomp, ``execve``.
* ``mode: plain`` (bwrap, which confines itself, or the ``none`` backend's
  rlimits): ``posix_spawn`` when nothing is to be done in the child, or,
  when a uid must change, the C launcher (``setpriv`` or a forked child
  without it); a forked child joins cgroups and sets rlimits; sources below
  root-only directories are bind-mounted onto bridge points in a private
  mount namespace by a forked child first.
* The last fds of a request are the jail's ``cgroup.procs`` (``cgroups``:
  how many), with ``cgroup_dir`` a cgroup v2 folder the C launcher
  creates the child in (``_lifetime``), and with ``netns`` (landlock only)
  the network namespace the child joins; joining comes before any uid change.

Helpers always run as the engine's user: a helper holds every item's
environment in its memory, so it never runs as a jail's uid.

Replies: ``exited`` (status) after reaping, ``failed`` (why), and ``started``
(pid) only when asked. Kills arrive by job id and are applied only to an
unreaped child. When an item's main process exits, the rest of its process
group is killed (as bwrap's pid namespace would be). The helper is a child
subreaper; it kills every jail and exits when the engine closes its end, and
dies with the engine (PDEATHSIG).

Standard library only, plus the stdlib-only sibling modules (and the
optional C extension ``_jail``): it is loaded without the ``stockade``
package (see ``_spawner``).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import gc
import json
import os
import resource
import select
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

from stockade.sandbox import _landlock, seccomp

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWNET = 0x40000000
MAX_MSG = 1 << 20


def _count_processes(uid: int) -> int:
    """Processes whose *real* uid is ``uid`` (what RLIMIT_NPROC counts)."""
    n = 0
    prefix = f"Uid:\t{uid}\t".encode()
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        n += line.startswith(prefix)
                        break
    return n


class Prepared:
    """What the helper computes once, before forking, so the child does little.

    Python work in a forked child is slow (copy-on-write faults on every
    object it touches), so the child only makes system calls.
    """

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long
        self.devnull = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        self._filters: dict[str, tuple[ctypes.Array[ctypes.c_char], seccomp.SockFprog]] = {}
        self._programs: dict[str, bytes] = {}

    def seccomp(self, hexprog: str) -> seccomp.SockFprog:
        if hexprog not in self._filters:
            self._filters[hexprog] = seccomp.prepare(self.program(hexprog))
        return self._filters[hexprog][1]

    def program(self, hexprog: str) -> bytes:
        if hexprog not in self._programs:
            self._programs[hexprog] = bytes.fromhex(hexprog)
        return self._programs[hexprog]


def _bridge(libc: ctypes.CDLL, bridges: list[list[str]]) -> None:
    """In a private mount namespace, bind each source onto its reachable bridge point."""
    CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x20000, 0x1000, 0x4000, 0x40000
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount(MS_PRIVATE)")
    for source, point in bridges:
        if libc.mount(source.encode(), point.encode(), None, MS_BIND | MS_REC, None) != 0:
            raise OSError(ctypes.get_errno(), f"bind {source}")


def _bridge_mounts(libc: ctypes.CDLL, plan: dict[str, list[str]]) -> None:
    """Carry out a ``_reach.BridgePlan`` (what ``bridge()`` in ``_jail.c`` does)."""
    CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x20000, 0x4000, 0x40000
    MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
    SYS_OPEN_TREE, SYS_MOVE_MOUNT, AT_FDCWD = 428, 429, -100
    OPEN_TREE_CLONE, AT_RECURSIVE, MOVE_MOUNT_F_EMPTY_PATH = 1, 0x8000, 0x4
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount(MS_PRIVATE)")
    trees = []
    for path in plan["binds"]:
        flags = OPEN_TREE_CLONE | os.O_CLOEXEC | AT_RECURSIVE
        fd = libc.syscall(
            ctypes.c_long(SYS_OPEN_TREE), ctypes.c_long(AT_FDCWD), os.fsencode(path),
            ctypes.c_long(flags),
        )  # fmt: skip
        if fd < 0:
            raise OSError(ctypes.get_errno(), f"open_tree {path}")
        trees.append(fd)
    for top in plan["tmpfs"]:
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        if libc.mount(b"tmpfs", os.fsencode(top), b"tmpfs", flags, b"mode=0755") != 0:
            raise OSError(ctypes.get_errno(), f"tmpfs on {top}")
    for d in plan["dirs"]:
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o755)
        os.chmod(d, 0o755)
    for f in plan["files"]:
        os.close(os.open(f, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    for path, fd in zip(plan["binds"], trees, strict=True):
        rc = libc.syscall(
            ctypes.c_long(SYS_MOVE_MOUNT), ctypes.c_long(fd), b"", ctypes.c_long(AT_FDCWD),
            os.fsencode(path), ctypes.c_long(MOVE_MOUNT_F_EMPTY_PATH),
        )  # fmt: skip
        if rc != 0:
            raise OSError(ctypes.get_errno(), f"move_mount {path}")
        os.close(fd)


def _rlimits(req: dict[str, Any]) -> list[tuple[int, int]]:
    """The (resource, limit) pairs the jail gets: those the engine computed
    (``_launch.base_rlimits`` and the backend's own), and for ``nproc`` an
    RLIMIT_NPROC counted here, at the launch: it counts every process of the
    uid on the host (no user namespace), so what exists now plus the step's share."""
    out = [(int(which), int(value)) for which, value in req.get("limits") or ()]
    if req.get("nproc") is not None:
        counted = req["uid"] if req["uid"] is not None else os.getuid()
        out.append((resource.RLIMIT_NPROC, nproc_limit(counted, int(req["nproc"]))))
    return out


def nproc_limit(uid: int, share: int) -> int:
    """RLIMIT_NPROC for a jail of ``uid`` that may start ``share`` processes:
    it counts every process of the uid, so the current count plus the share,
    and never above the hard limit, which no unprivileged process can raise."""
    value = _count_processes(uid) + share
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def _resolve(argv0: str, env: dict[str, str]) -> str:
    if "/" in argv0:
        return argv0
    for d in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(d or ".", argv0)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return argv0


def _child(
    req: dict[str, Any], prep: Prepared, fprog: seccomp.SockFprog | None, fds: list[int],
    ruleset: int, exe: str, parent: int, cgroups: Sequence[int] = (), netns: int = -1,
) -> None:  # fmt: skip
    """In the forked child: confine, then exec. Never returns.

    A failure is written to the item's stderr and ends the child with 127,
    as a shell reports a command it cannot run.
    """
    stage = "setup"
    libc = prep.libc
    try:
        os.setsid()
        # Python ignores these; an ignored signal stays ignored across exec.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        # fds = [stdout, stderr, *extra]; extras land on 3, 4, ... (the
        # numbers the launch was built with), the ruleset right after them.
        keep = [*fds[2:], *([ruleset] if ruleset >= 0 else [])]
        # The cgroup fds and the network namespace are used (then closed) below.
        used = [*cgroups, *([netns] if netns >= 0 else [])]
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 1024) for fd in [*fds[:2], *keep, *used]]
        os.dup2(prep.devnull, 0)
        os.dup2(high[0], 1)
        os.dup2(high[1], 2)
        for i, fd in enumerate(high[2 : 2 + len(keep)]):
            os.dup2(fd, 3 + i)
        stage = "cgroup"
        # Join the jail's cgroups (writing 0 moves the writer): everything
        # the jail starts is then in them, whatever session it makes.
        for fd in high[2 + len(keep) : 2 + len(keep) + len(cgroups)]:
            os.write(fd, b"0")
        if netns >= 0:
            # Before the fds above are closed, and before the uid change
            # (joining needs CAP_SYS_ADMIN): only lo and the engine's relay.
            stage = "network namespace"
            if libc.setns(high[-1], CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
        stage = "setup"
        os.closerange(3 + len(keep), 65536)
        ruleset_fd = 2 + len(keep) if ruleset >= 0 else -1
        stage = "rlimits"
        uid = req["uid"]
        for which, value in _rlimits(req):
            resource.setrlimit(which, (value, value))
        if req.get("bridge"):
            stage = "bridge mounts"
            _bridge_mounts(libc, req["bridge"])
        stage = "chdir"
        os.chdir(req["cwd"])
        if req.get("bridges"):
            stage = "bridge mounts"
            _bridge(libc, req["bridges"])
        if uid is not None:
            stage = "setuid"
            os.setgroups([])
            os.setgid(req["gid"])
            os.setuid(uid)
        # After the uid change: changing credentials clears the death signal.
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(127)  # the helper died before the death signal was set
        if ruleset_fd >= 0:
            stage = "landlock"
            _landlock.enforce(ruleset_fd, libc)
        if fprog is not None:
            stage = "seccomp"
            seccomp.install_prepared(fprog, libc)
        stage = "exec"
        os.execve(exe, req["argv"], req["env"])
    except BaseException as e:  # report and vanish: the child must never return
        msg = f"stockade: cannot start the jail ({stage}): {e}\n".encode(errors="replace")
        with contextlib.suppress(OSError):
            os.write(2, msg[:4000])
    os._exit(127)


def _is_regular(fd: int) -> bool:
    import stat

    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


class Server:
    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        #: Live (unreaped) children: pid -> request id.
        self.children: dict[int, int] = {}
        self.pids: dict[int, int] = {}
        #: O_PATH fds of read-only system paths, opened once for all items.
        self.path_fds: dict[str, _landlock._PathBeneath | None] = {}
        self.prep = Prepared()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def send(self, msg: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            self.ctl.send(json.dumps(msg).encode())

    def failed(self, req: dict[str, Any], fds: list[int], stage: str, error: OSError) -> None:
        """Report a jail that could not start, to the engine and on the item's
        stderr (where the C launcher reports a failed stage too)."""
        reason = error.strerror or str(error)
        if len(fds) >= 2:
            with contextlib.suppress(OSError):
                os.write(fds[1], f"stockade: cannot start the jail ({stage}): {reason}\n".encode())
        self.send({"type": "failed", "id": req["id"], "error": f"{stage}: {reason}"})

    def spawn(self, req: dict[str, Any], fds: list[int]) -> None:
        # The ruleset is built here, from paths opened with the helper's
        # rights, so the child only enforces it; the helper does not wait for
        # the child's exec, so items set up in parallel.
        # The last ``cgroups`` fds are the jail's cgroup.procs, and after them
        # with ``cgroup_dir`` the first one's folder (see ``_lifetime``),
        # with ``netns`` the jail's network namespace last.
        netns = -1
        if req.get("netns") and fds:
            fds, netns = fds[:-1], fds[-1]
        cgroup_dir = -1
        if req.get("cgroup_dir") and fds:
            fds, cgroup_dir = fds[:-1], fds[-1]
        ncg = int(req.get("cgroups", 0))
        fds, cgroups = fds[: len(fds) - ncg], fds[len(fds) - ncg :]
        if len(fds) < 2:
            self.send({"type": "failed", "id": req["id"], "error": "stdout/stderr missing"})
            return
        if req["mode"] == "plain":  # bwrap (it confines itself) or the none backend
            # posix_spawn cannot join a cgroup or set an rlimit in the child.
            direct = not cgroups and req.get("limits") is None
            if req.get("bridges"):
                self._fork(req, fds, -1, None, cgroups)
            elif req["uid"] is not None and _native():
                self._vfork(req, fds, -1, cgroups)
            elif direct and (req["uid"] is None or req.get("setpriv")):
                self._posix_spawn(req, fds)
            else:
                self._fork(req, fds, -1, None, cgroups)
            return
        try:
            ruleset = _landlock.build_ruleset(
                req["abi"],
                read_only=req["read_only"],
                read_write=req["read_write"],
                write_fds=[fd for fd in fds[:2] if _is_regular(fd)],
                handle_net=req["handle_net"],
                connect_ports=req["connect_ports"],
                scoped=True,
                fd_cache=self.path_fds if req.get("cache_read_only") else None,
            )
        except OSError as e:
            self.failed(req, fds, "landlock", e)
            return
        try:
            if req.get("launcher") == "native":
                self._vfork(req, fds, ruleset, cgroups, cgroup_dir, netns)
            else:
                fprog = self.prep.seccomp(req["seccomp"])
                self._fork(req, fds, ruleset, fprog, cgroups, netns)
        finally:
            os.close(ruleset)

    def _vfork(
        self, req: dict[str, Any], fds: list[int], ruleset: int, cgroups: Sequence[int],
        cgroup_dir: int = -1, netns: int = -1,
    ) -> None:  # fmt: skip
        """Confine and exec in C (``_jail``): no Python fork, no second exec."""
        from stockade.sandbox import _jail

        env = [os.fsencode(f"{k}={v}") for k, v in req["env"].items()]
        plan = req.get("bridge")
        bridge = None
        if plan:
            tmpfs, dirs, files, binds = (
                [os.fsencode(p) for p in plan[k]] for k in ("tmpfs", "dirs", "files", "binds")
            )
            bridge = (tmpfs, dirs, files, binds)
        try:
            pid = _jail.spawn(
                os.fsencode(_resolve(req["argv"][0], req["env"])),
                [os.fsencode(a) for a in req["argv"]],
                env,
                os.fsencode(req["cwd"] if req["mode"] == "landlock" else "/"),
                [self.prep.devnull, *fds],
                ruleset,
                self.prep.program(req["seccomp"]) if "seccomp" in req else b"",
                -1 if req["uid"] is None else req["uid"],
                -1 if req["gid"] is None else req["gid"],
                _rlimits(req),
                bridge,
                list(cgroups),
                cgroup_dir,
                netns,
            )
        except (OSError, ValueError) as e:
            self.failed(req, fds, "spawn", e if isinstance(e, OSError) else OSError(str(e)))
            return
        self.started(req["id"], pid)

    def _posix_spawn(self, req: dict[str, Any], fds: list[int]) -> None:
        """Start bwrap without forking Python (vfork speed). ``setpriv`` sets
        the jail uid when there is one to set; bwrap's ``--die-with-parent``
        ties it to this helper."""
        argv = list(req["argv"])
        if req["uid"] is not None:
            ids = [f"--reuid={req['uid']}", f"--regid={req['gid']}", "--clear-groups"]
            argv = [req["setpriv"], *ids, "--", *argv]
        # Place copies above the targets first, so no dup2 overwrites a source.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 1024) for fd in fds]
        try:
            actions = [(os.POSIX_SPAWN_DUP2, self.prep.devnull, 0)]
            actions += [(os.POSIX_SPAWN_DUP2, fd, 1 + i) for i, fd in enumerate(high)]
            for fd in fds:  # received without CLOEXEC: keep them out of bwrap
                fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
            pid = os.posix_spawn(
                argv[0],
                argv,
                req["env"],
                file_actions=actions,
                setsid=True,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGCHLD),
            )
        except OSError as e:
            self.failed(req, fds, "exec", e)
            return
        finally:
            for fd in high:
                os.close(fd)
        self.started(req["id"], pid)

    def _fork(
        self, req: dict[str, Any], fds: list[int], ruleset: int, fprog: seccomp.SockFprog | None,
        cgroups: Sequence[int] = (), netns: int = -1,
    ) -> None:  # fmt: skip
        exe = _resolve(req["argv"][0], req["env"])
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError as e:
            self.failed(req, fds, "fork", e)
            return
        if pid == 0:
            _child(req, self.prep, fprog, fds, ruleset, exe, parent, cgroups, netns)
        self.started(req["id"], pid)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                rid = self.children.pop(pid)
                self.pids.pop(rid, None)
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                code = os.waitstatus_to_exitcode(status)
                self.send({"type": "exited", "id": rid, "pid": pid, "status": code})

    def started(self, rid: int, pid: int) -> None:
        # No "started" message: the engine rarely needs the pid (it asks),
        # and one message less per item is one wake-up less on both sides.
        self.children[pid] = rid
        self.pids[rid] = pid

    def kill(self, rid: int, sig: int) -> None:
        # Only a child not yet reaped: a reaped pid may already name another
        # process (this loop is the only place that reaps).
        pid = self.pids.get(rid)
        if pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(pid, sig)

    def tell_pid(self, rid: int) -> None:
        if rid in self.pids:
            self.send({"type": "started", "id": rid, "pid": self.pids[rid]})

    def kill_all(self) -> None:
        for pid in self.children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)

    def run(self) -> None:
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        while True:
            try:
                ready, _, _ = select.select([self.ctl.fileno(), self.wake_r], [], [])
            except InterruptedError:
                continue
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake_r, 4096):
                        pass
                self.reap()
            if self.ctl.fileno() in ready:
                try:
                    data, fds, _flags, _addr = socket.recv_fds(self.ctl, MAX_MSG, 64)
                except OSError:
                    data, fds = b"", []
                if not data:
                    self.kill_all()
                    return
                try:
                    msg = json.loads(data)
                    if msg.get("type") == "kill":
                        self.kill(msg["id"], msg["sig"])
                    elif msg.get("type") == "pid":
                        self.tell_pid(msg["id"])
                    else:
                        self.spawn(msg, fds)
                finally:
                    for fd in fds:
                        os.close(fd)
                self.reap()


@functools.lru_cache(maxsize=1)
def _native() -> bool:
    """Whether the C launcher (``_jail``) is built."""
    import importlib.util

    return importlib.util.find_spec("stockade.sandbox._jail") is not None


def main(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if os.getppid() == 1:
        sys.exit(0)  # the engine died before we set the death signal
    os.set_inheritable(fd, False)
    ctl = socket.socket(fileno=fd)
    server = Server(ctl)
    # Few objects, no cycles worth collecting: keep forked children from
    # touching (and so copying) the heap for a collection.
    gc.freeze()
    gc.disable()
    server.run()


if __name__ == "__main__":
    main(int(sys.argv[1]))
