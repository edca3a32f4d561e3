"""The escape suite: every enforced backend, real processes in real jails.

Each attempt must fail, and the canary must be absent from everything the
jail printed. ``test_control_*`` runs the same attempts under ``none`` and
expects them to succeed: that proves the canaries are reachable, so a pass
here means the sandbox stopped the attempt, not that the test was blind.
"""

from __future__ import annotations

import os
import pty
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox.conftest import World, host_daemon_socket

pytestmark = pytest.mark.sandbox

#: (name, shell script) run with cwd = the item's work/. ``{...}`` fields are
#: filled from the world. Every one tries to print a canary.
READS: list[tuple[str, str]] = [
    ("neighbour_absolute", "cat {neighbour}/work/notes.md"),
    ("neighbour_relative", "cat ../../1/work/notes.md"),
    ("other_step_relative", "cat ../../../gather/0/work/out/x"),
    ("neighbour_glob", "cat ../../../*/*/work/* ../../../*/*/work/out/*"),
    ("own_meta_relative", "cat ../meta/attempt-1.json"),
    ("own_meta_absolute", "cat {meta}/attempt-1.json"),
    ("workflow_folder", "cat {workflow}/analysis_notes.md"),
    ("host_tmp_by_path", "cat {host_tmp}"),
    ("host_home_by_path", "cat {home_file}"),
    ("proc_1_root", "cat /proc/1/root{host_tmp}"),
    ("proc_any_root", "for p in /proc/[0-9]*; do cat $p/root{host_tmp}; done"),
    ("proc_self_root", "cat /proc/self/root{host_tmp}"),
    ("proc_any_cwd", "for p in /proc/[0-9]*; do cat $p/cwd/../meta/attempt-1.json; done"),
    ("proc_environ", "cat /proc/[0-9]*/environ"),
    ("own_env", "env; set"),
    ("etc_shadow", "cat /etc/shadow /etc/gshadow"),
    ("list_host_tmp", "ls -la /tmp /var/tmp /dev/shm"),
    ("list_home", "ls -la {home} ~ /root /home"),
    ("find_canary", "grep -rs {canary} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr"),
]


def fmt(w: World, script: str) -> str:
    return script.format(
        neighbour=w.neighbour,
        meta=w.meta,
        workflow=w.workflow,
        host_tmp=w.host_tmp,
        home_file=w.home_file,
        home=w.home_file.parent,
        canary=w.canary,
    )


def no_canary(w: World, text: str, *, names: bool = False) -> None:
    """The canary content (and with ``names``, the canary file names) is absent."""
    assert w.canary not in text
    if names:
        assert w.host_tmp.name not in text
        assert w.home_file.name not in text


def as_jail(w: World) -> dict[str, Any]:
    """``Popen`` arguments for a host process with the jail's uid and gid
    (ptrace and /proc access compare both)."""
    if w.jail_uid is None:
        return {"user": 65534, "group": 65534, "extra_groups": []} if os.geteuid() == 0 else {}
    return {"user": w.jail_uid, "group": w.jail_uid, "extra_groups": []}


@pytest.fixture(autouse=True)
def _canary_env(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[None]:
    """The engine's environment holds a secret, and so does a host process
    started with it (``/proc/PID/environ`` shows the environment a process
    started with; it runs as the jail's uid, ``World.jail_uid``, so only the
    sandbox protects it)."""
    w = request.getfixturevalue("world") if "world" in request.fixturenames else None
    if w is None and "none_world" in request.fixturenames:
        w = request.getfixturevalue("none_world")
    if w is None:
        yield
        return
    monkeypatch.setenv("STOCKADE_TEST_SECRET", w.canary)
    victim = subprocess.Popen(
        ["sleep", "60"], env={"STOCKADE_TEST_SECRET": w.canary}, **as_jail(w)
    )
    yield
    victim.kill()
    victim.wait()


@pytest.mark.parametrize(("name", "script"), READS, ids=[n for n, _ in READS])
def test_read_attempt_fails(world: World, name: str, script: str) -> None:
    r = world.run(fmt(world, script), timeout=60)
    no_canary(world, r.both, names=name.startswith("list_"))
    if name == "etc_shadow":
        assert "root:" not in r.out


@pytest.mark.parametrize(
    ("name", "script"),
    [(n, s) for n, s in READS if n in ("neighbour_relative", "own_meta_relative", "host_tmp_by_path",
                                         "workflow_folder", "proc_environ", "list_host_tmp")],
)  # fmt: skip
def test_control_reads_succeed_without_sandbox(none_world: World, name: str, script: str) -> None:
    r = none_world.run(fmt(none_world, script))
    assert none_world.canary in r.both or none_world.host_tmp.name in r.both


WRITES: list[tuple[str, str]] = [
    ("host_tmp", "{tmp}"),
    ("runs_folder", "{runs}"),
    ("run_dir", "{runs}/r1"),
    ("own_meta", "{meta}"),
    ("neighbour_work", "{neighbour}/work"),
    ("workflow_folder", "{workflow}"),
    ("home", "{home}"),
    ("dev_shm", "/dev/shm"),
]


@pytest.mark.parametrize(("name", "target"), WRITES, ids=[n for n, _ in WRITES])
def test_write_outside_work_fails(world: World, name: str, target: str) -> None:
    tag = f"escape-{name}-{os.getpid()}"
    directory = target.format(
        tmp="/tmp",
        runs=world.runs,
        meta=world.meta,
        neighbour=world.neighbour,
        workflow=world.workflow,
        home=world.home_file.parent,
    )
    r = world.run(
        'echo x > "$1/$2"; touch "$1/$2.t"; mkdir "$1/$2.d"; ln -s /etc/passwd "$1/$2.l"; '
        'cp /etc/hostname "$1/$2.c"; echo done',
        directory,
        tag,
    )
    assert "done" in r.out
    leftovers = [p for p in Path(directory).glob(f"{tag}*")] if Path(directory).exists() else []
    for p in leftovers:
        p.unlink() if not p.is_dir() else p.rmdir()
    assert leftovers == []


def test_work_is_writable_and_cwd(world: World) -> None:
    r = world.run("pwd; cat input.txt; echo made > out/result.txt; mkdir -p out/d; echo ok")
    assert r.status == 0, r.err
    assert str(world.work) in r.out and "my own input" in r.out
    assert (world.work / "out" / "result.txt").read_text() == "made\n"


def test_home_and_tmpdir_are_inside_and_writable(world: World) -> None:
    r = world.run(
        'echo h > "$HOME/h" && echo t > "$TMPDIR/t" && echo "$HOME $TMPDIR" && ls -A "$HOME"'
    )
    assert r.status == 0, r.err
    home, tmpdir = r.out.split()[0], r.out.split()[1]
    host_home = world.home_file.parent
    assert Path(home) != host_home
    assert not (host_home / "h").exists()
    # bwrap: a private tmpfs at /tmp; landlock: the item's scratch directory.
    assert (
        tmpdir == "/tmp"
        if world.backend.name == "bwrap"
        else tmpdir.startswith(str(world.base / "scratch"))
    )


def test_environment_is_only_the_policy(world: World) -> None:
    r = world.run("env", env={"STEP_VAR": "visible"})
    names = {line.split("=", 1)[0] for line in r.out.splitlines() if "=" in line}
    assert "STEP_VAR" in names
    assert "STOCKADE_TEST_SECRET" not in names
    no_canary(world, r.both)


def test_env_values_never_on_a_command_line(world: World) -> None:
    secret = f"sekrit-{world.canary}"
    done = threading.Event()
    found: list[str] = []

    def scan() -> None:
        while not done.is_set():
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        data = Path(f"/proc/{pid}/cmdline").read_bytes()
                    except OSError:
                        continue
                    if secret.encode() in data:
                        found.append(pid)
            time.sleep(0.01)

    t = threading.Thread(target=scan)
    t.start()
    try:
        r = world.run('sleep 0.5; test -n "$API_KEY" && echo has-key', env={"API_KEY": secret})
    finally:
        done.set()
        t.join()
    assert "has-key" in r.out
    assert found == []


def test_inherited_fd_is_closed(world: World) -> None:
    fd = os.open(world.host_tmp, os.O_RDONLY)
    os.set_inheritable(fd, True)
    try:
        r = world.run(
            'for n in 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 "$1"; do '
            "cat /proc/self/fd/$n; cat <&$n; done 2>/dev/null; ls -l /proc/self/fd",
            str(fd),
        )
    finally:
        os.close(fd)
    no_canary(world, r.both)



def serve_canary(srv: socket.socket, canary: str) -> tuple[threading.Thread, list[bool]]:
    """Accept one connection on a host listener and hand it the canary."""
    accepted: list[bool] = []

    def accept() -> None:
        try:
            conn, _ = srv.accept()
            accepted.append(True)
            conn.sendall(canary.encode())
            conn.close()
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    return t, accepted

def test_tcp_to_host_loopback_fails(world: World) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(3)
    port = srv.getsockname()[1]
    t, accepted = serve_canary(srv, world.canary)
    r = world.py(
        "import socket,sys\n"
        "for host in ('127.0.0.1', 'localhost'):\n"
        "    try:\n"
        "        s = socket.create_connection((host, int(sys.argv[1])), timeout=2)\n"
        "        print(s.recv(100).decode())\n"
        "    except OSError as e:\n"
        "        print('blocked', e)\n",
        str(port),
    )
    srv.shutdown(socket.SHUT_RDWR)
    t.join()
    srv.close()
    assert accepted == []
    assert "blocked" in r.out
    no_canary(world, r.both)


def test_udp_and_raw_sockets_fail(world: World) -> None:
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    srv.settimeout(0.3)
    port = srv.getsockname()[1]
    r = world.py(
        "import socket,sys\n"
        "try:\n"
        "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "    s.sendto(b'leak', ('127.0.0.1', int(sys.argv[1])))\n"
        "    print('sent')\n"
        "except OSError as e:\n"
        "    print('blocked', e)\n",
        str(port),
    )
    try:
        data = srv.recv(100)
    except OSError:
        data = b""
    srv.close()
    assert data == b""
    assert "blocked" in r.out or "sent" in r.out  # bwrap: own netns; the datagram goes nowhere


def test_abstract_unix_socket_on_host_fails(world: World) -> None:
    name = f"\0stockade-{world.canary}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(name)
    srv.listen(1)
    srv.settimeout(2)
    t, accepted = serve_canary(srv, world.canary)
    r = world.py(
        "import socket,sys\n"
        "try:\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    s.connect('\\0' + sys.argv[1])\n"
        "    print(s.recv(100).decode())\n"
        "except OSError as e:\n"
        "    print('blocked', e)\n",
        name[1:],
    )
    srv.shutdown(socket.SHUT_RDWR)
    t.join()
    srv.close()
    assert accepted == []
    assert "blocked" in r.out
    no_canary(world, r.both)


def test_tiocsti_on_a_real_pty_fails(world: World) -> None:
    master, slave = pty.openpty()
    try:
        policy = world.policy(
            [
                "/usr/bin/python3", "-I", "-S", "-c",
                "import fcntl, termios, sys\n"
                "for fd in (0, 1, 2):\n"
                "    try:\n"
                "        for ch in b'id\\n': fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))\n"
                "        print('injected', fd, file=sys.stderr)\n"
                "    except OSError as e:\n"
                "        print('blocked', fd, e, file=sys.stderr)\n",
            ]
        )  # fmt: skip
        err_path = world.meta / "stderr"
        with open(err_path, "wb") as err:
            running = world.backend.start(policy, stdout=slave, stderr=err)
            assert running.wait(30) is not None
        err_text = err_path.read_text()
        assert "injected" not in err_text
        assert "blocked 1" in err_text
        # Nothing was pushed into the terminal's input queue.
        os.set_blocking(slave, False)
        try:
            pending = os.read(slave, 100)
        except BlockingIOError:
            pending = b""
        assert b"id" not in pending
    finally:
        os.close(master)
        os.close(slave)


def test_ptrace_and_process_vm_fail(world: World) -> None:
    victim = subprocess.Popen(["sleep", "30"], **as_jail(world))
    try:
        r = world.py(
            "import ctypes, os, subprocess, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "child = subprocess.Popen(['sleep', '5'])\n"
            "for pid in (child.pid, int(sys.argv[1])):\n"
            "    rc = libc.ptrace(16, pid, 0, 0)\n"
            "    print('attach', pid, rc, ctypes.get_errno())\n"
            "    try:\n"
            "        print(open(f'/proc/{pid}/mem', 'rb').read(1))\n"
            "    except OSError as e:\n"
            "        print('mem blocked', e)\n"
            "rc = libc.syscall(310, child.pid, 0, 0, 0, 0, 0)\n"
            "print('vm_readv', rc, ctypes.get_errno())\n"
            "child.kill()\n",
            str(victim.pid),
        )
    finally:
        victim.kill()
        victim.wait()
    attaches = [ln.split() for ln in r.out.splitlines() if ln.startswith("attach")]
    assert len(attaches) == 2, r.both
    assert all(a[2] == "-1" for a in attaches), r.out
    assert "vm_readv -1" in r.out


def test_signal_to_host_process_fails(world: World) -> None:
    victim = subprocess.Popen(["sleep", "30"], **as_jail(world))
    try:
        world.run(f"kill -9 {victim.pid}; kill -STOP {victim.pid}")
        time.sleep(0.1)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize(
    "script",
    [
        "unshare -U id",
        "unshare -m id",
        "unshare -n id",
        "unshare -p -f id",
        "unshare -r id",
        "mkdir -p m && mount -t tmpfs none m && echo mounted",
        "mkdir -p m2 && mount --bind /etc m2 && echo mounted",
        "mount -o remount,rw /usr && echo remounted",
        "chroot / id",
    ],
)
def test_namespaces_and_mounts_fail(world: World, script: str) -> None:
    # Attempts target only the jail's own work/: if a sandbox ever failed
    # open, the test must not damage the host running it.
    r = world.run(f"{script}; echo rc=$?")
    assert "rc=0" not in r.out, r.both
    assert "mounted" not in r.out


def test_no_new_privs_is_set(world: World) -> None:
    # With no_new_privs, execve ignores every setuid/setgid bit and file capability.
    r = world.run("grep NoNewPrivs /proc/self/status; /usr/bin/su -c id root </dev/null; echo end")
    assert "NoNewPrivs:\t1" in r.out, r.both
    assert "uid=0(root)" not in r.out


def test_setuid_binary_gains_nothing(world: World) -> None:
    if os.geteuid() != 0:
        return  # only root can plant a setuid-root binary; no_new_privs is checked above
    bindir = world.base / "suid"
    bindir.mkdir()
    bindir.chmod(0o755)
    suid = bindir / "id"
    suid.write_bytes(Path("/usr/bin/id").read_bytes())
    suid.chmod(0o4755)
    from stockade.sandbox import ExtraMount

    r = world.run(
        f"{suid} -u; /usr/bin/su -c id root </dev/null; mkdir -p m; /usr/bin/mount -t tmpfs x m; echo end",
        mounts=(ExtraMount(bindir, str(bindir)),),
    )
    assert "end" in r.out
    uids = [ln for ln in r.out.splitlines() if ln.strip().isdigit()]
    assert uids and all(u != "0" for u in uids), r.both


def test_links_to_host_files_do_not_copy_them(world: World) -> None:
    r = world.run(
        f"ln /etc/passwd out/hard; ln {world.host_tmp} out/hard2; ln -s {world.host_tmp} out/soft; "
        "cat out/soft; cat out/hard2; echo end"
    )
    assert "end" in r.out
    no_canary(world, r.out)
    out = world.work / "out"
    host_ino = {os.stat("/etc/passwd").st_ino, os.stat(world.host_tmp).st_ino}
    for p in out.iterdir():
        st = os.lstat(p)
        # Either no link was made, or it is a symlink (the collector refuses
        # those): never a second name of a host inode.
        assert p.is_symlink() or st.st_ino not in host_ino, p


def test_timeout_kills_the_whole_jail(world: World) -> None:
    marker = f"{os.getpid() % 1000}.{time.monotonic_ns() % 100000}"
    policy = world.policy(
        ["/bin/sh", "-c", f"sleep {marker} & (setsid sleep {marker} &) ; sleep {marker}; wait"]
    )
    with open(world.meta / "stdout", "wb") as out:
        running = world.backend.start(policy, stdout=out, stderr=out)
        assert running.wait(0.5) is None
        assert running.pid > 1 and Path(f"/proc/{running.pid}").exists()
        running.kill(0.2)
        assert running.wait(5) is not None
    time.sleep(0.2)
    alive = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    alive.append(pid)
            except OSError:
                pass
    assert alive == []


def test_exit_status_is_reported(world: World) -> None:
    assert world.run("exit 7").status == 7
    # bwrap's init reports a signal death as 128+N, like a shell.
    assert world.run("kill -9 $$").status in (-9, 128 + 9)


def test_vsock_to_the_hypervisor_fails(world: World) -> None:
    # vsock is not network-namespaced: only seccomp keeps a jail off the
    # host side of a VM (CID 2).
    r = world.py(
        "import socket\n"
        "try:\n"
        "    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n"
        "    s.settimeout(2)\n"
        "    s.connect((2, 2024))\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print('blocked', e.errno)\n"
    )
    assert "connected" not in r.out
    assert "blocked 13" in r.out, r.both  # EACCES from seccomp, before any connect


def test_private_keys_under_etc_are_not_in_the_jail(world: World) -> None:
    r = world.run(
        "ls -la /etc/ssl /etc/ssl/private; cat /etc/ssl/private/*; ls /etc/ssl/certs | head -3"
    )
    assert "PRIVATE KEY" not in r.out
    assert "ssl-cert-snakeoil.key" not in r.out


def test_host_sysv_shared_memory_is_unreachable(world: World) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    shmid = libc.shmget(0, 4096, 0o1666)  # IPC_PRIVATE | IPC_CREAT, world-readable
    assert shmid >= 0
    addr = libc.shmat(shmid, None, 0)
    ctypes.memmove(addr, world.canary.encode(), len(world.canary))
    try:
        r = world.py(
            "import ctypes, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.shmat.restype = ctypes.c_void_p\n"
            "a = libc.shmat(int(sys.argv[1]), None, 0o10000)\n"  # SHM_RDONLY
            "if a in (None, ctypes.c_void_p(-1).value):\n"
            "    print('blocked', ctypes.get_errno())\n"
            "else:\n"
            "    print(ctypes.string_at(a, 40))\n",
            str(shmid),
        )
    finally:
        libc.shmdt(ctypes.c_void_p(addr))
        libc.shmctl(shmid, 0, None)  # IPC_RMID
    assert "blocked" in r.out, r.both
    assert world.canary not in r.both


def test_pathname_unix_socket_on_host_fails(world: World) -> None:
    # Like a container daemon's socket: world-writable, outside the item.
    path = world.base / "daemon.sock"
    srv = host_daemon_socket(path)
    r = world.py(
        "import socket, sys\n"
        "try:\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    s.connect(sys.argv[1])\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print('blocked', e.errno)\n",
        str(path),
    )
    try:
        conn, _ = srv.accept()
        conn.close()
        reached = True
    except OSError:
        reached = False
    srv.close()
    assert not reached and "connected" not in r.out, r.both
    assert "blocked" in r.out
