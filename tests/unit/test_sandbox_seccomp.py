"""The seccomp program, decoded and run through a small classic-BPF interpreter.

The interpreter is written here from the BPF semantics, independently of the
generator, so a wrong jump offset or syscall number shows up as a wrong verdict.
"""

from __future__ import annotations

import errno
import struct

import pytest

from stockade.sandbox import seccomp

KILL = 0x80000000
ALLOW = 0x7FFF0000
EPERM = 0x00050000 | errno.EPERM
EACCES = 0x00050000 | errno.EACCES
ENOSYS = 0x00050000 | errno.ENOSYS
EPROTONOSUPPORT = 0x00050000 | errno.EPROTONOSUPPORT
EOPNOTSUPP = 0x00050000 | errno.EOPNOTSUPP
ENOPROTOOPT = 0x00050000 | errno.ENOPROTOOPT
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def run_bpf(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    args = tuple(args) + (0,) * (6 - len(args))
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args)
    insns = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    a, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld w abs
            a = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code == 0x54:  # and k
            a &= k
            pc += 1
        elif code == 0x15:  # jeq
            pc += 1 + (jt if a == k else jf)
        elif code == 0x35:  # jge
            pc += 1 + (jt if a >= k else jf)
        elif code == 0x45:  # jset
            pc += 1 + (jt if a & k else jf)
        elif code == 0x06:  # ret
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


ARCHES = ["x86_64", "aarch64"]


DENIED_PAIRS = [
    (arch, name) for arch in ARCHES for name in seccomp.DENIED if name in seccomp.SYSCALLS[arch]
]


@pytest.mark.parametrize(("arch", "name"), DENIED_PAIRS)
def test_denied_syscalls_get_eperm(arch: str, name: str) -> None:
    prog = seccomp.build_filter(arch)
    assert run_bpf(prog, seccomp.SYSCALLS[arch][name], ARCH[arch]) == EPERM


def test_only_x86_only_calls_are_missing_on_aarch64() -> None:
    missing = {n for n in seccomp.DENIED if n not in seccomp.SYSCALLS["aarch64"]}
    assert missing == {"iopl", "ioperm", "uselib"}
    assert all(n in seccomp.SYSCALLS["x86_64"] for n in seccomp.DENIED)


# Syscall numbers from the kernel's tables, written out independently.
KNOWN = [
    ("x86_64", "unshare", 272), ("x86_64", "setns", 308), ("x86_64", "mount", 165),
    ("x86_64", "ptrace", 101), ("x86_64", "process_vm_readv", 310), ("x86_64", "keyctl", 250),
    ("x86_64", "bpf", 321), ("x86_64", "perf_event_open", 298), ("x86_64", "userfaultfd", 323),
    ("x86_64", "open_by_handle_at", 304), ("x86_64", "kexec_load", 246),
    ("x86_64", "finit_module", 313), ("x86_64", "pivot_root", 155), ("x86_64", "umount2", 166),
    ("aarch64", "unshare", 97), ("aarch64", "setns", 268), ("aarch64", "mount", 40),
    ("aarch64", "ptrace", 117), ("aarch64", "process_vm_writev", 271),
    ("aarch64", "keyctl", 219), ("aarch64", "bpf", 280), ("aarch64", "userfaultfd", 282),
    ("aarch64", "perf_event_open", 241), ("aarch64", "open_by_handle_at", 265),
]  # fmt: skip


@pytest.mark.parametrize(("arch", "name", "nr"), KNOWN)
def test_syscall_numbers_match_the_kernel(arch: str, name: str, nr: int) -> None:
    assert run_bpf(seccomp.build_filter(arch), nr, ARCH[arch]) == EPERM


CASES = [
    # (arch, syscall name or number, args, expected)
    ("x86_64", 0, (), ALLOW),  # read
    ("x86_64", 59, (), ALLOW),  # execve
    ("x86_64", "clone", (0x01200011,), ALLOW),  # fork-like clone
    ("x86_64", "clone", (0x10000000 | 0x11,), EPERM),  # CLONE_NEWUSER
    ("x86_64", "clone", (0x00020000,), EPERM),  # CLONE_NEWNS
    ("x86_64", "clone", (0x40000000,), EPERM),  # CLONE_NEWNET
    ("x86_64", "clone", (0x00000080,), EPERM),  # CLONE_NEWTIME
    ("x86_64", "clone3", (), ENOSYS),
    ("x86_64", "ioctl", (1, 0x5412), EPERM),  # TIOCSTI
    ("x86_64", "ioctl", (1, 0x541C), EPERM),  # TIOCLINUX
    ("x86_64", "ioctl", (1, 0x5401), ALLOW),  # TCGETS
    ("x86_64", "ioctl", (1, 0xFFFFFFFF00005412), EPERM),  # high bits ignored by the kernel
    ("x86_64", 0x40000000 | 0, (), KILL),  # x32 ABI
    ("aarch64", "clone", (0x10000000,), EPERM),
    ("aarch64", "clone", (0x11,), ALLOW),
    ("aarch64", "clone3", (), ENOSYS),
    ("aarch64", "ioctl", (0, 0x5412), EPERM),
    ("aarch64", 63, (), ALLOW),  # read
    ("x86_64", "socket", (2, 1), ALLOW),  # default: the jail has its own netns
    ("x86_64", "socket", (40, 1), EACCES),  # but vsock is not namespaced
    ("x86_64", "setsid", (), ALLOW),
]


@pytest.mark.parametrize(("arch", "call", "args", "expected"), CASES)
def test_verdicts(arch: str, call: str | int, args: tuple[int, ...], expected: int) -> None:
    nr = seccomp.SYSCALLS[arch][call] if isinstance(call, str) else call
    assert run_bpf(seccomp.build_filter(arch), nr, ARCH[arch], args) == expected


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("foreign", [0x40000003, 0xC000003E, 0xC00000B7, 0])  # i386, ...
def test_foreign_arch_is_killed(arch: str, foreign: int) -> None:
    if foreign == ARCH[arch]:
        return
    assert run_bpf(seccomp.build_filter(arch), 0, foreign) == KILL


SOCKETS = [
    # (options, family, type, expected)
    (seccomp.FilterOptions(sockets="none"), 2, 1, EACCES),
    (seccomp.FilterOptions(sockets="none"), 10, 2, EACCES),
    (seccomp.FilterOptions(sockets="none"), 1, 1, EACCES),
    (seccomp.FilterOptions(sockets="none"), 16, 3, EACCES),  # netlink: an allowlist
    (seccomp.FilterOptions(sockets="none"), 40, 1, EACCES),  # vsock
    (seccomp.FilterOptions(sockets="tcp"), 40, 1, EACCES),
    (seccomp.FilterOptions(sockets="all"), 40, 1, EACCES),  # vsock ignores netns
    (seccomp.FilterOptions(sockets="all"), 16, 3, ALLOW),
    (seccomp.FilterOptions(sockets="tcp"), 2, 1, ALLOW),
    (seccomp.FilterOptions(sockets="tcp"), 2, 1 | 0x80000 | 0x800, ALLOW),  # CLOEXEC|NONBLOCK
    (seccomp.FilterOptions(sockets="tcp"), 10, 1, ALLOW),
    (seccomp.FilterOptions(sockets="tcp"), 2, 2, EACCES),  # UDP
    (seccomp.FilterOptions(sockets="tcp"), 10, 3, EACCES),  # raw
    (seccomp.FilterOptions(sockets="tcp"), 2, 5, EACCES),  # SOCK_SEQPACKET
    (seccomp.FilterOptions(sockets="tcp"), 2, 1 | 0x40, EACCES),  # unknown type bits
    (seccomp.FilterOptions(sockets="tcp"), 17, 3, EACCES),  # AF_PACKET
    (seccomp.FilterOptions(sockets="tcp"), 16, 3, EACCES),  # AF_NETLINK
    (seccomp.FilterOptions(sockets="tcp"), 1, 1, EACCES),
    (seccomp.FilterOptions(sockets="all"), 1, 1, ALLOW),
]


@pytest.mark.parametrize(("opts", "family", "kind", "expected"), SOCKETS)
def test_socket_policies(
    opts: seccomp.FilterOptions, family: int, kind: int, expected: int
) -> None:
    prog = seccomp.build_filter("x86_64", opts)
    assert run_bpf(prog, 41, ARCH["x86_64"], (family, kind)) == expected


TCP = seccomp.FilterOptions(sockets="tcp", no_pidns=True)
PROTOCOLS = [
    # (family, type, protocol, expected): numbers from the kernel headers.
    (2, 1, 0, ALLOW),
    (2, 1, 6, ALLOW),  # IPPROTO_TCP
    (10, 1 | 0x80000, 6, ALLOW),
    (2, 1, 262, EPROTONOSUPPORT),  # IPPROTO_MPTCP connects past Landlock's TCP rules
    (10, 1, 262, EPROTONOSUPPORT),
    (2, 1, 132, EPROTONOSUPPORT),  # IPPROTO_SCTP
    (2, 1, 0xFFFFFFFF, EPROTONOSUPPORT),
    (2, 1, 6 | 0x100, EPROTONOSUPPORT),
    (2, 2, 17, EACCES),  # UDP
    (2, 3, 6, EACCES),  # raw with a TCP protocol number
    (2, 5, 132, EACCES),  # SCTP seqpacket
]


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize(("family", "kind", "proto", "expected"), PROTOCOLS)
def test_tcp_mode_allows_plain_tcp_only(
    arch: str, family: int, kind: int, proto: int, expected: int
) -> None:
    prog = seccomp.build_filter(arch, TCP)
    nr = seccomp.SYSCALLS[arch]["socket"]
    assert run_bpf(prog, nr, ARCH[arch], (family, kind, proto)) == expected


MSG_FASTOPEN = 0x20000000
# (arch, syscall number written out independently, flags argument index)
SENDS = [
    ("x86_64", 44, 3), ("x86_64", 46, 2), ("x86_64", 307, 3),  # sendto, sendmsg, sendmmsg
    ("aarch64", 206, 3), ("aarch64", 211, 2), ("aarch64", 269, 3),
]  # fmt: skip


@pytest.mark.parametrize(("arch", "nr", "flags_at"), SENDS)
def test_tcp_mode_refuses_fast_open_on_every_send_call(arch: str, nr: int, flags_at: int) -> None:
    prog = seccomp.build_filter(arch, TCP)

    def verdict(flags: int) -> int:
        args = [3, 0x1000, 5, 0, 0, 0]
        args[flags_at] = flags
        return run_bpf(prog, nr, ARCH[arch], tuple(args))

    assert verdict(MSG_FASTOPEN) == EOPNOTSUPP
    assert verdict(MSG_FASTOPEN | 0x4000 | 0x40) == EOPNOTSUPP  # with NOSIGNAL, DONTWAIT
    assert verdict(0) == ALLOW
    assert verdict(0x4000 | 0x40 | 0x8000) == ALLOW  # NOSIGNAL, DONTWAIT, MORE
    # Other arguments do not matter: a length that looks like the flag.
    other = 1 if flags_at != 1 else 2
    args = [0] * 6
    args[other] = MSG_FASTOPEN
    assert run_bpf(prog, nr, ARCH[arch], tuple(args)) == ALLOW
    # Without Landlock's TCP rules (own network namespace, or open) nothing changes.
    assert run_bpf(seccomp.build_filter(arch), nr, ARCH[arch], (3, 0, 0, MSG_FASTOPEN)) == ALLOW


SOCKOPTS = [
    # (level, option, expected)
    (6, 30, ENOPROTOOPT),  # IPPROTO_TCP, TCP_FASTOPEN_CONNECT
    (6, 23, ENOPROTOOPT),  # TCP_FASTOPEN
    (6, 34, ENOPROTOOPT),  # TCP_FASTOPEN_NO_COOKIE
    (6, 1, ALLOW),  # TCP_NODELAY
    (6, 9, ALLOW),  # TCP_DEFER_ACCEPT
    (1, 30, ALLOW),  # SOL_SOCKET with the same number (SO_PASSSEC)
    (1, 9, ALLOW),  # SO_KEEPALIVE
    (0, 23, ALLOW),  # IPPROTO_IP
]


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize(("level", "option", "expected"), SOCKOPTS)
def test_tcp_mode_refuses_fast_open_options(
    arch: str, level: int, option: int, expected: int
) -> None:
    nr = {"x86_64": 54, "aarch64": 208}[arch]  # setsockopt
    prog = seccomp.build_filter(arch, TCP)
    assert run_bpf(prog, nr, ARCH[arch], (3, level, option, 0x1000, 4)) == expected
    assert run_bpf(seccomp.build_filter(arch), nr, ARCH[arch], (3, level, option)) == ALLOW


@pytest.mark.parametrize(
    ("arch", "nr"),
    [("x86_64", 50), ("x86_64", 43), ("x86_64", 288),  # listen, accept, accept4
     ("aarch64", 201), ("aarch64", 202), ("aarch64", 242)],
)  # fmt: skip
def test_tcp_mode_refuses_listen_and_accept(arch: str, nr: int) -> None:
    assert run_bpf(seccomp.build_filter(arch, TCP), nr, ARCH[arch], (3, 0)) == EPERM
    # The bwrap jail has its own network namespace and its in-jail relay listens.
    assert run_bpf(seccomp.build_filter(arch), nr, ARCH[arch], (3, 0)) == ALLOW
    none = seccomp.FilterOptions(sockets="none", no_pidns=True)
    assert run_bpf(seccomp.build_filter(arch, none), nr, ARCH[arch], (3, 0)) == ALLOW


@pytest.mark.parametrize("arch", ARCHES)
def test_tcp_mode_leaves_ordinary_calls_alone(arch: str) -> None:
    prog = seccomp.build_filter(arch, TCP)
    table = {"x86_64": (0, 1, 42, 45), "aarch64": (63, 64, 203, 207)}[arch]
    for nr in table:  # read, write, connect, recvfrom
        assert run_bpf(prog, nr, ARCH[arch], (3, MSG_FASTOPEN, MSG_FASTOPEN, MSG_FASTOPEN)) == ALLOW


@pytest.mark.parametrize(("no_pidns", "expected"), [(True, EPERM), (False, ALLOW)])
def test_setsid_refused_without_pid_namespace(no_pidns: bool, expected: int) -> None:
    prog = seccomp.build_filter("x86_64", seccomp.FilterOptions(no_pidns=no_pidns))
    for name in ("setsid", "setpgid"):
        assert run_bpf(prog, seccomp.SYSCALLS["x86_64"][name], ARCH["x86_64"]) == expected


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("name", seccomp.DENIED_IDENTITY + seccomp.DENIED_HOST_IPC)
def test_identity_changes_refused_without_pid_namespace(arch: str, name: str) -> None:
    nr = seccomp.SYSCALLS[arch][name]
    with_ns = seccomp.build_filter(arch)
    without = seccomp.build_filter(arch, seccomp.FilterOptions(no_pidns=True))
    assert run_bpf(with_ns, nr, ARCH[arch]) == ALLOW
    assert run_bpf(without, nr, ARCH[arch]) == EPERM


@pytest.mark.parametrize(
    ("arch", "nr"),
    [("x86_64", 30), ("x86_64", 29), ("x86_64", 240), ("x86_64", 105), ("x86_64", 112),
     ("aarch64", 196), ("aarch64", 194), ("aarch64", 180), ("aarch64", 146), ("aarch64", 157)],
)  # fmt: skip
def test_host_namespace_extras_by_kernel_number(arch: str, nr: int) -> None:
    # shmat, shmget, mq_open, setuid, setsid: numbers written out independently.
    prog = seccomp.build_filter(arch, seccomp.FilterOptions(no_pidns=True))
    assert run_bpf(prog, nr, ARCH[arch]) == EPERM


def test_program_starts_with_the_arch_check() -> None:
    insns = seccomp.decode(seccomp.build_filter("x86_64"))
    assert insns[0] == (0x20, 0, 0, 4)
    assert insns[1][0] == 0x15 and insns[1][3] == 0xC000003E
    assert insns[2] == (0x06, 0, 0, KILL)
    assert len(insns) < 4096
