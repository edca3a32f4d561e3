"""A seccomp BPF program generated in pure Python, and a way to install it.

The filter is the same for every backend that can apply one (bwrap passes it
with ``--seccomp FD``; the landlock exec helper installs it itself before
``execve``). It checks the audit architecture first (a 32-bit or x32 syscall
on x86_64 is killed), then returns ``EPERM`` for the calls a jailed step never
needs and that widen its reach: namespaces, mounts, ptrace and
``process_vm_*``, keyrings, bpf, perf, userfaultfd, module loading, kexec,
``open_by_handle_at`` and the ``TIOCSTI``/``TIOCLINUX`` ioctls. ``clone3``
returns ``ENOSYS`` so libc falls back to ``clone``, whose flags can be checked.

Where Landlock's TCP rules are the only network boundary (``sockets="tcp"``,
landlock with ``network: proxy``), the filter also closes the paths past
Landlock's connect and bind hooks: sockets other than plain TCP (MPTCP, SCTP,
raw, UDP), TCP Fast Open (``MSG_FASTOPEN`` on every send call, the
``TCP_FASTOPEN*`` options), and ``listen``/``accept`` (an unbound socket's
``listen`` binds an ephemeral port without the bind hook).

``build_filter`` is a pure function (bytes out) so unit tests can decode it.
Standard library only: the landlock exec helper imports this module.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000

# Classic BPF opcodes used here.
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JSET_K = 0x45
AND_K = 0x54
RET_K = 0x06

# Offsets in struct seccomp_data (little-endian: the low 32 bits of an argument first).
OFF_NR = 0
OFF_ARCH = 4


def arg_lo(index: int) -> int:
    return 16 + 8 * index


CLONE_NEW_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
    | 0x00000080  # CLONE_NEWTIME
)
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
AF_VSOCK = 40
SOCK_STREAM = 1
SOCK_NONBLOCK = 0o4000
SOCK_CLOEXEC = 0o2000000
IPPROTO_TCP = 6
MSG_FASTOPEN = 0x20000000
#: TCP_FASTOPEN, TCP_FASTOPEN_CONNECT, TCP_FASTOPEN_NO_COOKIE.
TCP_FASTOPEN_OPTIONS = (23, 30, 34)

#: Syscalls refused with EPERM on every backend, by name.
DENIED: tuple[str, ...] = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "keyctl", "add_key", "request_key",
    "bpf", "perf_event_open", "userfaultfd", "fanotify_init",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "open_by_handle_at", "name_to_handle_at",
    "swapon", "swapoff", "reboot", "acct", "syslog", "quotactl", "vhangup", "lookup_dcookie",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "sethostname", "setdomainname", "iopl", "ioperm", "uselib",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)  # fmt: skip

#: Extra calls refused where the jail has no pid namespace (landlock): a step
#: that starts its own session or group would escape the timeout's killpg.
DENIED_WITHOUT_PIDNS: tuple[str, ...] = ("setsid", "setpgid")
#: Also refused there: System V IPC and POSIX message queues, which live in
#: the host's IPC namespace (ids are guessable; Landlock does not cover them).
DENIED_HOST_IPC: tuple[str, ...] = (
    "shmget", "shmat", "shmctl", "semget", "semop", "semctl", "semtimedop",
    "msgget", "msgsnd", "msgrcv", "msgctl",
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
)  # fmt: skip
#: Also refused there: identity changes. A jail holds no capability, so
#: these could only shuffle its own ids; refused so that a launcher mistake
#: that left a privileged id behind fails closed.
DENIED_IDENTITY: tuple[str, ...] = (
    "setuid", "setreuid", "setresuid", "setfsuid",
    "setgid", "setregid", "setresgid", "setfsgid", "setgroups",
)  # fmt: skip
#: Also refused where Landlock filters TCP (``sockets="tcp"``): ``listen`` on
#: an unbound socket picks a port without Landlock's bind hook, and nothing
#: the policy allows needs to accept a connection.
DENIED_TCP_SERVER: tuple[str, ...] = ("listen", "accept", "accept4")

SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "unshare": 272, "setns": 308, "clone": 56, "clone3": 435, "mount": 165,
        "umount2": 166, "pivot_root": 155, "chroot": 161, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428,
        "mount_setattr": 442, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "kcmp": 312, "keyctl": 250, "add_key": 248,
        "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "fanotify_init": 300, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "swapon": 167, "swapoff": 168,
        "reboot": 169, "acct": 163, "syslog": 103, "quotactl": 179, "vhangup": 153,
        "lookup_dcookie": 212, "settimeofday": 164, "clock_settime": 227,
        "clock_adjtime": 305, "adjtimex": 159, "sethostname": 170, "setdomainname": 171,
        "iopl": 172, "ioperm": 173, "uselib": 134, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "ioctl": 16, "socket": 41,
        "setsid": 112, "setpgid": 109, "setuid": 105, "setreuid": 113, "setresuid": 117,
        "setfsuid": 122, "setgid": 106, "setregid": 114, "setresgid": 119, "setfsgid": 123,
        "setgroups": 116,
        "shmget": 29, "shmat": 30, "shmctl": 31, "semget": 64, "semop": 65, "semctl": 66,
        "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
        "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243,
        "mq_notify": 244, "mq_getsetattr": 245,
        "sendto": 44, "sendmsg": 46, "sendmmsg": 307, "setsockopt": 54, "listen": 50,
        "accept": 43, "accept4": 288,
    },
    "aarch64": {
        "unshare": 97, "setns": 268, "clone": 220, "clone3": 435, "mount": 40,
        "umount2": 39, "pivot_root": 41, "chroot": 51, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428,
        "mount_setattr": 442, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "kcmp": 272, "keyctl": 219, "add_key": 217,
        "request_key": 218, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "fanotify_init": 262, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "swapon": 224, "swapoff": 225,
        "reboot": 142, "acct": 89, "syslog": 116, "quotactl": 60, "vhangup": 58,
        "lookup_dcookie": 18, "settimeofday": 170, "clock_settime": 112,
        "clock_adjtime": 266, "adjtimex": 171, "sethostname": 161, "setdomainname": 162,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "ioctl": 29, "socket": 198, "setsid": 157, "setpgid": 154, "setuid": 146,
        "setreuid": 145, "setresuid": 147, "setfsuid": 151, "setgid": 144, "setregid": 143,
        "setresgid": 149, "setfsgid": 152, "setgroups": 159,
        "shmget": 194, "shmat": 196, "shmctl": 195, "semget": 190, "semop": 193, "semctl": 191,
        "semtimedop": 192, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187,
        "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183,
        "mq_notify": 184, "mq_getsetattr": 185,
        "sendto": 206, "sendmsg": 211, "sendmmsg": 269, "setsockopt": 208, "listen": 201,
        "accept": 202, "accept4": 242,
    },
}  # fmt: skip

AUDIT_ARCH: dict[str, int] = {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}


def native_arch() -> str:
    machine = os.uname().machine.lower()
    if machine in ("x86_64", "amd64"):
        return "x86_64"
    if machine in ("aarch64", "arm64"):
        return "aarch64"
    raise OSError(f"no seccomp syscall table for architecture {machine!r}")


@dataclass(frozen=True)
class FilterOptions:
    """What varies between backends.

    ``sockets``: ``"all"`` allows every family but AF_VSOCK (the jail has
    its own empty network namespace, or the network is open); ``"tcp"``
    allows only AF_INET/AF_INET6 stream sockets (landlock limits their
    ports); ``"none"`` allows no socket family at all. ``socketpair`` and
    inherited sockets (an agent's broker connection) are unaffected.
    """

    sockets: str = "all"
    no_pidns: bool = False


def _ins(code: int, jt: int, jf: int, k: int) -> tuple[int, int, int, int]:
    return (code, jt, jf, k & 0xFFFFFFFF)


def _errno(value: int) -> int:
    return RET_ERRNO | (value & 0xFFFF)


def _socket_block(opts: FilterOptions) -> list[tuple[int, int, int, int]]:
    """Checks on socket()'s family (and type); every path ends in a return.

    ``AF_VSOCK`` is refused in every mode: vsock is not network-namespaced,
    so even a jail with an empty network namespace could reach the
    hypervisor's services on a VM. Without an open network the families are
    an allowlist: TCP for the proxy, nothing else (never AF_UNIX).
    """
    deny = _ins(RET_K, 0, 0, _errno(errno.EACCES))
    allow = _ins(RET_K, 0, 0, RET_ALLOW)
    body: list[tuple[int, int, int, int]] = [_ins(LD_W_ABS, 0, 0, arg_lo(0))]
    if opts.sockets == "all":
        return [*body, _ins(JEQ_K, 0, 1, AF_VSOCK), deny, allow]
    if opts.sockets == "tcp":
        # Landlock's rules apply to TCP only: IPPROTO_MPTCP (or SCTP) with
        # SOCK_STREAM would connect past them. EPROTONOSUPPORT is what a
        # kernel without MPTCP says, so clients that try it fall back to TCP.
        body += [
            _ins(JEQ_K, 1, 0, AF_INET),
            _ins(JEQ_K, 0, 8, AF_INET6),
            _ins(LD_W_ABS, 0, 0, arg_lo(1)),
            _ins(AND_K, 0, 0, ~(SOCK_NONBLOCK | SOCK_CLOEXEC)),
            _ins(JEQ_K, 0, 5, SOCK_STREAM),
            _ins(LD_W_ABS, 0, 0, arg_lo(2)),
            _ins(JEQ_K, 1, 0, 0),
            _ins(JEQ_K, 0, 1, IPPROTO_TCP),
            allow,
            _ins(RET_K, 0, 0, _errno(errno.EPROTONOSUPPORT)),
        ]
    return [*body, deny]


def _refuse_flag(arg: int, flag: int, err: int) -> list[tuple[int, int, int, int]]:
    """Return ``err`` when ``flag`` is set in argument ``arg``, else allow."""
    return [
        _ins(LD_W_ABS, 0, 0, arg_lo(arg)),
        _ins(JSET_K, 0, 1, flag),
        _ins(RET_K, 0, 0, _errno(err)),
        _ins(RET_K, 0, 0, RET_ALLOW),
    ]


def _tcp_blocks(table: dict[str, int]) -> list[tuple[int, list[tuple[int, int, int, int]]]]:
    """TCP Fast Open sends its SYN from ``sendto``/``sendmsg``/``sendmmsg``
    (``MSG_FASTOPEN``) or from a write after a deferred connect
    (``TCP_FASTOPEN_CONNECT``) through a path Landlock's connect hook does
    not see. A send call's flags are its only way to ask for it (a
    ``msghdr``'s ``msg_flags`` are ignored on send; ``write``, ``splice``
    and ``sendfile`` carry no flags; io_uring is refused)."""
    nopt = len(TCP_FASTOPEN_OPTIONS)
    sockopt = [
        _ins(LD_W_ABS, 0, 0, arg_lo(1)),
        _ins(JEQ_K, 0, nopt + 1, IPPROTO_TCP),
        _ins(LD_W_ABS, 0, 0, arg_lo(2)),
    ]
    for i, opt in enumerate(TCP_FASTOPEN_OPTIONS):
        sockopt.append(_ins(JEQ_K, nopt - i, 0, opt))
    sockopt += [_ins(RET_K, 0, 0, RET_ALLOW), _ins(RET_K, 0, 0, _errno(errno.ENOPROTOOPT))]
    return [
        (table["sendto"], _refuse_flag(3, MSG_FASTOPEN, errno.EOPNOTSUPP)),
        (table["sendmsg"], _refuse_flag(2, MSG_FASTOPEN, errno.EOPNOTSUPP)),
        (table["sendmmsg"], _refuse_flag(3, MSG_FASTOPEN, errno.EOPNOTSUPP)),
        (table["setsockopt"], sockopt),
    ]


@functools.lru_cache(maxsize=32)
def build_filter(arch: str, opts: FilterOptions = FilterOptions()) -> bytes:
    """The filter as packed ``struct sock_filter`` entries (8 bytes each)."""
    table = SYSCALLS[arch]
    prog: list[tuple[int, int, int, int]] = [
        _ins(LD_W_ABS, 0, 0, OFF_ARCH),
        _ins(JEQ_K, 1, 0, AUDIT_ARCH[arch]),
        _ins(RET_K, 0, 0, RET_KILL_PROCESS),
        _ins(LD_W_ABS, 0, 0, OFF_NR),
    ]
    if arch == "x86_64":
        prog += [_ins(JGE_K, 0, 1, X32_SYSCALL_BIT), _ins(RET_K, 0, 0, RET_KILL_PROCESS)]
    denied = list(DENIED)
    if opts.no_pidns:
        denied += [*DENIED_WITHOUT_PIDNS, *DENIED_IDENTITY, *DENIED_HOST_IPC]
    if opts.sockets == "tcp":
        denied += DENIED_TCP_SERVER
    for name in denied:
        if name in table:
            prog += [_ins(JEQ_K, 0, 1, table[name]), _ins(RET_K, 0, 0, _errno(errno.EPERM))]
    prog += [_ins(JEQ_K, 0, 1, table["clone3"]), _ins(RET_K, 0, 0, _errno(errno.ENOSYS))]

    blocks: list[tuple[int, list[tuple[int, int, int, int]]]] = [
        (
            table["clone"],
            [
                _ins(LD_W_ABS, 0, 0, arg_lo(0)),
                _ins(JSET_K, 0, 1, CLONE_NEW_FLAGS),
                _ins(RET_K, 0, 0, _errno(errno.EPERM)),
                _ins(RET_K, 0, 0, RET_ALLOW),
            ],
        ),
        (
            table["ioctl"],
            [
                _ins(LD_W_ABS, 0, 0, arg_lo(1)),
                _ins(JEQ_K, 0, 1, TIOCSTI),
                _ins(RET_K, 0, 0, _errno(errno.EPERM)),
                _ins(JEQ_K, 0, 1, TIOCLINUX),
                _ins(RET_K, 0, 0, _errno(errno.EPERM)),
                _ins(RET_K, 0, 0, RET_ALLOW),
            ],
        ),
    ]
    blocks.append((table["socket"], _socket_block(opts)))
    if opts.sockets == "tcp":
        blocks += _tcp_blocks(table)
    for nr, body in blocks:
        prog.append(_ins(JEQ_K, 0, len(body), nr))
        prog += body
    prog.append(_ins(RET_K, 0, 0, RET_ALLOW))
    return b"".join(struct.pack("<HBBI", *ins) for ins in prog)


def decode(program: bytes) -> list[tuple[int, int, int, int]]:
    """Unpack a filter into ``(code, jt, jf, k)`` tuples."""
    return [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]


class SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


def prepare(program: bytes) -> tuple[ctypes.Array[ctypes.c_char], SockFprog]:
    """The ``sock_fprog`` for ``program`` (keep the buffer alive while it is used)."""
    buf = ctypes.create_string_buffer(program, len(program))
    return buf, SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))


def install_prepared(fprog: SockFprog, libc: ctypes.CDLL) -> None:
    """Set no_new_privs and install a prepared filter on the calling thread."""
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def install(program: bytes) -> None:
    """Set no_new_privs and install ``program`` on the calling thread (then exec)."""
    buf, fprog = prepare(program)
    install_prepared(fprog, ctypes.CDLL(None, use_errno=True))
    del buf


def syscall_numbers(arch: str, names: Sequence[str]) -> dict[str, int]:
    return {n: SYSCALLS[arch][n] for n in names if n in SYSCALLS[arch]}
