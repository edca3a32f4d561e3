"""Landlock through ctypes: ABI detection and applying a ruleset to this thread.

Only the exec helper's forked child calls ``restrict_self`` (a ruleset binds
the calling thread only before ABI 8, and the helper is single-threaded).
Standard library only: the exec helper imports this module.
"""

from __future__ import annotations

import ctypes
import functools
import os
import stat
from collections.abc import Sequence

SYS_CREATE_RULESET = 444  # the same on x86_64 and aarch64 (unified numbering)
SYS_ADD_RULE = 445
SYS_RESTRICT_SELF = 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
RULE_NET_PORT = 2

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ_ONLY = EXECUTE | READ_FILE | READ_DIR


def fs_rights(abi: int) -> int:
    """Every filesystem right this ABI knows (all are handled, i.e. denied unless granted)."""
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _NetPort(ctypes.Structure):
    _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi_version() -> int:
    """The kernel's Landlock ABI, or 0 when Landlock is missing or disabled."""
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    v = int(libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), CREATE_RULESET_VERSION))
    return v if v > 0 else 0


def _attr_size(abi: int) -> int:
    if abi >= 6:
        return 24
    if abi >= 4:
        return 16
    return 8


def build_ruleset(
    abi: int,
    *,
    read_only: Sequence[str],
    read_write: Sequence[str],
    write_fds: Sequence[int] = (),
    handle_net: bool,
    connect_ports: Sequence[int] = (),
    scoped: bool,
    fd_cache: dict[str, _PathBeneath | None] | None = None,
) -> int:
    """Build a ruleset; return its fd for ``enforce`` (open paths before dropping privileges).

    Paths that do not exist are skipped. A rule on a file gets only file
    rights. ``write_fds`` are open regular files (the item's stdout/stderr
    captures) that ``/dev/stdout`` may reopen for writing. ``fd_cache`` keeps
    the read-only rules (an ``O_PATH`` fd each, held open) across calls: the
    system paths are the same for every item.
    """
    libc = _libc()
    all_fs = fs_rights(abi)
    attr = _RulesetAttr(all_fs, 0, 0)
    if handle_net and abi >= 4:
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
    if scoped and abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    fd = int(
        libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(_attr_size(abi)), 0)
    )
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:

        def add(rule: _PathBeneath) -> None:
            if libc.syscall(SYS_ADD_RULE, fd, RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                raise OSError(ctypes.get_errno(), "landlock_add_rule")

        def make(path: str, rights: int, keep: bool) -> _PathBeneath | None:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                return None
            try:
                is_dir = stat.S_ISDIR(os.fstat(pfd).st_mode)
            except OSError:
                os.close(pfd)
                return None
            rule = _PathBeneath(rights if is_dir else rights & FILE_RIGHTS & all_fs, pfd)
            if not keep:
                add(rule)
                os.close(pfd)
                return None
            return rule

        for path in read_only:
            if fd_cache is None:
                make(path, READ_ONLY, keep=False)
                continue
            if path not in fd_cache:
                fd_cache[path] = make(path, READ_ONLY, keep=True)
            cached = fd_cache[path]
            if cached is not None:
                add(cached)
        for path in read_write:
            make(path, all_fs, keep=False)
        for wfd in write_fds:
            add(_PathBeneath(WRITE_FILE, wfd))
        if attr.handled_access_net:
            for port in connect_ports:
                net = _NetPort(NET_CONNECT_TCP, port)
                if libc.syscall(SYS_ADD_RULE, fd, RULE_NET_PORT, ctypes.byref(net), 0) != 0:
                    raise OSError(ctypes.get_errno(), "landlock_add_rule(net)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def enforce(ruleset_fd: int, libc: ctypes.CDLL | None = None) -> None:
    """Set no_new_privs and restrict the calling thread with the ruleset; closes it."""
    if libc is None:
        libc = _libc()
    try:
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(SYS_RESTRICT_SELF, ruleset_fd, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset_fd)
