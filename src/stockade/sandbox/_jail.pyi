"""Types of the optional C launcher (``_jail.c``)."""

from collections.abc import Sequence

def spawn(
    exe: bytes,
    argv: Sequence[bytes],
    env: Sequence[bytes],
    cwd: bytes,
    fds: Sequence[int],
    ruleset_fd: int,
    seccomp: bytes,
    uid: int,
    gid: int,
    keep_root: bool,
    limits: Sequence[tuple[int, int]],
    cgroups: Sequence[int] = (),
    cgroup_dir: int = -1,
    /,
) -> int: ...
