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
    limits: Sequence[tuple[int, int]],
    bridge: tuple[Sequence[bytes], Sequence[bytes], Sequence[bytes], Sequence[bytes]] | None = None,
    cgroups: Sequence[int] = (),
    cgroup_dir: int = -1,
    netns: int = -1,
    /,
) -> int: ...
def kill_uid(uid: int, /) -> None: ...
