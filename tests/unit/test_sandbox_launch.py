"""Pure launch builders compared exactly: bwrap argv, landlock request, SBPL profile."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from stockade.errors import InfraError
from stockade.sandbox import ExtraMount, Policy, Resources, seccomp
from stockade.sandbox._bwrap_argv import (
    bwrap_argv,
    jail_env,
    scratch_covers,
    scratch_mount_points,
)
from stockade.sandbox._host import HostLayout
from stockade.sandbox._launch import rlimit_prefix, ulimit_prefix
from stockade.sandbox._reach import BridgePlan
from stockade.sandbox.landlock import landlock_request
from stockade.sandbox.macos import sbpl_profile, sbpl_quote
from tests.unit.test_sandbox_seccomp import ALLOW, ARCH, EACCES, run_bpf

LAYOUT = HostLayout(
    symlinks={"/bin": "usr/bin", "/lib": "usr/lib", "/lib64": "usr/lib64", "/sbin": "usr/sbin"},
    dirs=("/usr",),
    etc=("/etc/ld.so.cache", "/etc/passwd"),
    prlimit="/usr/bin/prlimit",
    python="/usr/bin/python3",
    resolv_conf="/run/resolvconf/resolv.conf",
)
WORK = Path("/runs/r1/s/0/work")
SCRATCH = Path("/runs/.scratch/r1-s-0")
SECRET = "sk-live-0123456789"


def policy(**kw: object) -> Policy:
    base: dict[str, object] = {
        "argv": ("/bin/sh", "-c", "echo hi"),
        "work_dir": WORK,
        "scratch_dir": SCRATCH,
        "env": {"PATH": "/usr/bin:/bin", "API_KEY": SECRET},
    }
    base.update(kw)
    return Policy(**base)  # type: ignore[arg-type]


HEAD = [
    "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
    "--cap-drop", "ALL", "--hostname", "stockade",
]  # fmt: skip
SYSTEM = [
    "--ro-bind", "/usr", "/usr",
    "--symlink", "usr/bin", "/bin",
    "--symlink", "usr/lib", "/lib",
    "--symlink", "usr/lib64", "/lib64",
    "--symlink", "usr/sbin", "/sbin",
    "--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache",
    "--ro-bind", "/etc/passwd", "/etc/passwd",
]  # fmt: skip
# /tmp, HOME and /dev/shm: one folder on the item's disk scratch, never a tmpfs.
FRESH = [
    "--proc", "/proc", "--dev", "/dev",
    "--bind", str(SCRATCH), "/tmp",
    "--bind", str(SCRATCH), "/home/stockade",
    "--bind", str(SCRATCH), "/dev/shm",
]  # fmt: skip
#: bubblewrap's own tmpfs root and /dev, read-only once every mount point exists.
READ_ONLY = ["--remount-ro", "/dev", "--remount-ro", "/"]
TAIL = ["--chdir", str(WORK), "--seccomp", "5", "--"]
WORKB = ["--bind", str(WORK), str(WORK), *READ_ONLY, *TAIL]

ARGV_CASES = [
    ("default", policy(), {}, [*HEAD, *SYSTEM, *FRESH, *WORKB, "/bin/sh", "-c", "echo hi"]),
    (
        "open network and a read-only mount",
        policy(
            network="open",
            mounts=(ExtraMount(Path("/opt/py"), "/opt/py"), ExtraMount(Path("/s"), "/b", True)),
        ),
        {},
        [
            *HEAD[:3], "--share-net", *HEAD[3:], *SYSTEM,
            "--ro-bind", "/run/resolvconf/resolv.conf", "/etc/resolv.conf",
            *FRESH,
            "--ro-bind", "/opt/py", "/opt/py", "--bind", "/s", "/b",
            *WORKB, "/bin/sh", "-c", "echo hi",
        ],
    ),
    (
        "resources and work bridged",
        policy(resources=Resources(memory_bytes=1 << 28, cpu_seconds=9, processes=64,
                                   file_size_bytes=1 << 20)),
        {str(WORK): "/tmp/bridge/1", str(SCRATCH): "/tmp/bridge/2"},
        [
            *HEAD, *SYSTEM, "--proc", "/proc", "--dev", "/dev",
            "--bind", "/tmp/bridge/2", "/tmp",
            "--bind", "/tmp/bridge/2", "/home/stockade",
            "--bind", "/tmp/bridge/2", "/dev/shm",
            "--bind", "/tmp/bridge/1", str(WORK), *READ_ONLY, *TAIL,
            "/usr/bin/prlimit", "--as=268435456", "--cpu=9", "--nproc=64", "--fsize=1048576",
            "--core=0", "--",
            "/bin/sh", "-c", "echo hi",
        ],
    ),
    (
        "proxy",
        policy(network="proxy", proxy_socket=Path("/run/x/egress.sock")),
        {},
        [
            *HEAD, *SYSTEM, *FRESH,
            "--ro-bind", "/src/_relay.py", "/.stockade/relay.py",
            "--ro-bind", "/run/x/egress.sock", "/.stockade/proxy.sock",
            *WORKB,
            "/usr/bin/python3", "-I", "-S", "/.stockade/relay.py", "/.stockade/proxy.sock",
            "3128", "--",
            "/bin/sh", "-c", "echo hi",
        ],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "pol", "fds", "expected"), ARGV_CASES, ids=[c[0] for c in ARGV_CASES]
)
def test_bwrap_argv_exact(name: str, pol: Policy, fds: dict[str, str], expected: list[str]) -> None:
    argv = bwrap_argv(pol, LAYOUT, seccomp_fd=5, relay_script="/src/_relay.py", sources=fds)
    assert argv == expected
    assert not any(SECRET in a for a in argv)


def test_bwrap_covers_the_mount_points_of_a_work_dir_below_tmp_with_a_read_only_tmpfs() -> None:
    # A run kept in a mktemp -d folder: bubblewrap would otherwise make
    # /tmp/run.X/runs/r1/s/0 folder by folder inside the item's scratch, on disk.
    work = "/tmp/run.X/runs/r1/s/0/work"
    argv = bwrap_argv(policy(work_dir=Path(work)), LAYOUT, seccomp_fd=5)
    assert argv == [
        *HEAD, *SYSTEM, *FRESH,
        "--tmpfs", "/tmp/run.X",
        "--bind", work, work,
        "--remount-ro", "/tmp/run.X", *READ_ONLY,
        "--chdir", work, "--seccomp", "5", "--", "/bin/sh", "-c", "echo hi",
    ]  # fmt: skip


COVER_CASES = [
    # (work, mount targets, covers, mount points left in the scratch)
    ("/runs/r1/s/0/work", (), [], set()),
    ("/tmp/a/b/work", (), ["/tmp/a"], {"a"}),
    ("/dev/shm/a/work", (), ["/dev/shm/a"], {"a"}),
    ("/home/stockade/p/work", (), ["/home/stockade/p"], {"p"}),
    # Right below /tmp: its own mount point, nothing to cover.
    ("/tmp/work", (), [], set()),
    ("/tmpx/a/work", (), [], set()),
    # A toolchain below /tmp too; one cover per first folder.
    ("/tmp/a/b/work", ("/tmp/a/tools", "/tmp/t/u"), ["/tmp/a", "/tmp/t"], {"a", "t"}),
    # A mount at the cover or above it: the tmpfs would sit under it and the
    # remount would make it read-only, so that chain is left to bubblewrap.
    ("/tmp/a/b/work", ("/tmp/a",), [], set()),
    ("/tmp/a/b/work", ("/tmp",), [], set()),
]  # fmt: skip


@pytest.mark.parametrize(("work", "targets", "covers", "points"), COVER_CASES)
def test_scratch_covers(work: str, targets: tuple[str, ...], covers: list[str],
                        points: set[str]) -> None:  # fmt: skip
    pol = policy(work_dir=Path(work), mounts=tuple(ExtraMount(Path("/src"), t) for t in targets))
    assert scratch_covers(pol) == covers
    assert scratch_mount_points(pol) == points


@pytest.mark.parametrize("forbidden", ["/etc/shadow", "/run", "/root", "/home", "/var"])
def test_bwrap_never_binds_sensitive_host_paths(forbidden: str) -> None:
    for _, pol, fds, _ in ARGV_CASES:
        argv = bwrap_argv(pol, LAYOUT, seccomp_fd=5, relay_script="/src/_relay.py", sources=fds)
        sources = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
        assert not any(s == forbidden or s.startswith(forbidden + "/") for s in sources
                       if not s.startswith("/run/resolvconf") and not s.startswith("/run/x")
                       and not s.startswith("/runs/"))  # fmt: skip


def test_bwrap_memory_tmp_is_the_old_layout() -> None:
    # The positive controls' switch: tmpfs /tmp and HOME, writable / and /dev.
    argv = bwrap_argv(policy(), LAYOUT, seccomp_fd=5, memory_tmp=True)
    fresh = ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/home/stockade"]
    assert argv == [*HEAD, *SYSTEM, *fresh, "--bind", str(WORK), str(WORK), *TAIL,
                    "/bin/sh", "-c", "echo hi"]  # fmt: skip


def test_jail_env_sets_home_tmpdir_and_proxy() -> None:
    env = jail_env(policy(network="proxy", proxy_socket=Path("/p.sock"), proxy_token="t0k"))
    assert env["HOME"] == "/home/stockade" and env["TMPDIR"] == "/tmp"
    assert env["API_KEY"] == SECRET
    for name in ("HTTP_PROXY", "https_proxy", "ALL_PROXY"):
        assert env[name] == "http://stockade:t0k@127.0.0.1:3128"


@pytest.mark.parametrize("abi", [1, 3])
def test_proxy_needs_landlock_tcp_rules(abi: int) -> None:
    pol = policy(network="proxy", proxy_socket=Path("/p.sock"), proxy_token="t0k")
    with pytest.raises(InfraError, match="ABI >= 4"):
        landlock_request(pol, abi=abi, layout=LAYOUT, relay_port=4242)
    assert landlock_request(pol, abi=4, layout=LAYOUT, relay_port=4242)["connect_ports"] == [4242]


def test_proxy_without_credential_is_refused() -> None:
    with pytest.raises(InfraError, match="credential"):
        jail_env(policy(network="proxy", proxy_socket=Path("/p.sock")))
    with pytest.raises(InfraError, match="credential"):
        landlock_request(
            policy(network="proxy", proxy_socket=Path("/p.sock")), abi=7, layout=LAYOUT,
            relay_port=4242,
        )  # fmt: skip


def test_proxy_without_socket_is_refused() -> None:
    with pytest.raises(InfraError):
        bwrap_argv(policy(network="proxy"), LAYOUT, seccomp_fd=5, relay_script="/r.py")


def test_resources_without_prlimit_name_the_package() -> None:
    with pytest.raises(InfraError, match="util-linux"):
        rlimit_prefix(Resources(processes=3), None)
    assert rlimit_prefix(Resources(), None) == []


def test_landlock_request() -> None:
    req = landlock_request(
        policy(mounts=(ExtraMount(Path("/opt/py"), "/opt/py"),), resources=Resources(processes=9)),
        abi=6,
        layout=LAYOUT,
        uid=60800,
        gid=60800,
        bridge=BridgePlan(("/runs",), ("/runs/r1",), (), ("/runs/r1",)),
        path="/usr/bin",
    )
    assert req["argv"] == ["/bin/sh", "-c", "echo hi"]
    assert req["cwd"] == str(WORK)
    assert req["env"]["HOME"] == str(SCRATCH) and req["env"]["TMPDIR"] == str(SCRATCH)
    assert req["read_write"] == [str(WORK), str(SCRATCH), "/dev/null", "/dev/zero", "/dev/full"]
    assert req["read_only"] == [
        "/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc/ld.so.cache", "/etc/passwd", "/proc",
        "/dev/urandom", "/dev/random", "/opt/py",
    ]  # fmt: skip
    assert "/etc/shadow" not in req["read_only"]
    assert req["handle_net"] is True and req["connect_ports"] == []
    assert req["limits"] == [(resource.RLIMIT_CORE, 0)] and req["nproc"] == 9
    # Where the jail's pids cgroup holds the limit, no RLIMIT_NPROC is counted.
    held = landlock_request(policy(resources=Resources(processes=9, memory_bytes=1 << 30)), abi=6,
                            layout=LAYOUT, pids_limited=True)
    assert held["nproc"] is None
    assert held["limits"] == [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_AS, 1 << 30)]
    assert (req["uid"], req["gid"]) == (60800, 60800)
    assert req["bridge"] == {
        "tmpfs": ["/runs"], "dirs": ["/runs/r1"], "files": [], "binds": ["/runs/r1"],
    }  # fmt: skip
    assert req["env"]["PATH"] == "/usr/bin"
    unfiltered = landlock_request(policy(), abi=6, layout=LAYOUT)
    assert unfiltered["env"]["PATH"] == "/usr/bin:/bin" and unfiltered["bridge"] is None


@pytest.mark.parametrize(
    ("network", "port", "handle", "ports"),
    [("none", None, True, []), ("proxy", 4242, True, [4242]), ("open", None, False, [])],
)
def test_landlock_request_network(
    network: str, port: int | None, handle: bool, ports: list[int]
) -> None:
    req = landlock_request(
        policy(network=network, proxy_socket=Path("/p.sock"), proxy_token="t0k"), abi=7,
        layout=LAYOUT, relay_port=port,
    )  # fmt: skip
    assert req["handle_net"] is handle
    assert req["connect_ports"] == ports
    if network == "proxy":
        assert req["env"]["HTTPS_PROXY"] == "http://stockade:t0k@127.0.0.1:4242"
    assert "t0k" not in " ".join(req["argv"])
    # Plain TCP, no Fast Open, no listen where Landlock's port rules are the boundary.
    sockets = {"none": "none", "proxy": "tcp", "open": "all"}[network]
    opts = seccomp.FilterOptions(sockets=sockets, no_pidns=True)
    assert req["seccomp"] == seccomp.build_filter(seccomp.native_arch(), opts).hex()


def test_sbpl_profile_content() -> None:
    prof = sbpl_profile(policy(mounts=(ExtraMount(Path("/opt/py"), "/opt/py"),)))
    lines = prof.splitlines()
    assert lines[0] == "(version 1)"
    assert lines[1] == "(deny default)"
    assert (
        f'(allow file-read* file-write* process-exec (subpath "{WORK}") (subpath "{SCRATCH}"))'
        in lines
    )
    assert '(allow file-read* process-exec (subpath "/opt/py"))' in lines
    assert "network" not in prof
    assert "/private/etc/master.passwd" not in prof
    assert SECRET not in prof
    assert "(allow signal (target same-sandbox))" in lines


@pytest.mark.parametrize(
    ("network", "expected"),
    [
        ("open", "(allow network* system-socket)"),
        ("proxy", '(allow network-outbound (remote tcp "localhost:3128"))'),
    ],
)
def test_sbpl_network(network: str, expected: str) -> None:
    assert expected in sbpl_profile(policy(network=network)).splitlines()


def test_sbpl_quotes_paths() -> None:
    assert sbpl_quote('/a "b"\\c') == '"/a \\"b\\"\\\\c"'
    prof = sbpl_profile(policy(work_dir=Path('/x/"); (allow default) ("')))
    assert "(allow default)" not in prof.replace('\\"); (allow default) (\\"', "")


def test_ulimit_prefix() -> None:
    assert ulimit_prefix(Resources()) == []
    assert ulimit_prefix(Resources(memory_bytes=2048, file_size_bytes=1024)) == [
        "/bin/sh", "-c", 'ulimit -v 2; ulimit -f 2; exec "$0" "$@"',
    ]  # fmt: skip


def test_landlock_refuses_remapped_mounts() -> None:
    with pytest.raises(InfraError, match="host path"):
        landlock_request(policy(mounts=(ExtraMount(Path("/opt/py"), "/py"),)), abi=7, layout=LAYOUT)


@pytest.mark.parametrize(
    ("network", "expected"), [("none", EACCES), ("proxy", EACCES), ("open", ALLOW)]
)
def test_landlock_never_reenables_af_unix(network: str, expected: int) -> None:
    """The agent's broker is an inherited fd: neither a mounted socket nor a
    passed fd switches socket(AF_UNIX) back on (only an open network has it)."""
    req = landlock_request(
        policy(
            network=network,
            proxy_socket=Path("/p.sock"),
            proxy_token="t" * 32,
            mounts=(ExtraMount(Path("/run/broker.sock"), "/run/broker.sock"),),
            pass_fds=(7,),
        ),
        abi=7,
        layout=LAYOUT,
        relay_port=4242 if network == "proxy" else None,
    )
    program, arch = bytes.fromhex(req["seccomp"]), seccomp.native_arch()
    socket_nr = seccomp.SYSCALLS[arch]["socket"]
    assert run_bpf(program, socket_nr, ARCH[arch], (1, 1)) == expected  # AF_UNIX, SOCK_STREAM
    assert run_bpf(program, socket_nr, ARCH[arch], (1, 2)) == expected  # AF_UNIX, SOCK_DGRAM
