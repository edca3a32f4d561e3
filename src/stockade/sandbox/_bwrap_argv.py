"""The bubblewrap command line for a policy: what the ``bwrap`` backend's jail contains.

Pure: no I/O, no environment values (they reach bwrap through its own
environment, never its arguments). ``tests/unit/test_sandbox_launch.py``
compares these command lines exactly; the escape suite proves what they
keep out. What the jail sees, and why, is in ``sandbox.bwrap``'s docstring.

Standard library only, with ``stockade.sandbox`` and ``stockade.errors``.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from stockade.errors import InfraError
from stockade.sandbox._host import HostLayout
from stockade.sandbox._launch import base_rlimits, proxy_env, proxy_url, rlimit_prefix
from stockade.sandbox.policy import Policy, Resources

if TYPE_CHECKING:
    from stockade.sandbox.image import RootOp

JAIL_HOME = "/home/stockade"
JAIL_TMP = "/tmp"
JAIL_SHM = "/dev/shm"
#: In-jail port of the relay to the host egress proxy (``network: proxy``).
PROXY_PORT = 3128
#: Where helper files (the relay script, the proxy socket) appear in the jail.
HELPER_DIR = "/.stockade"
#: The host side of the in-jail relay to the egress proxy.
RELAY_SCRIPT = str(Path(__file__).with_name("_relay.py"))

def jail_env(policy: Policy) -> dict[str, str]:
    """The complete environment of the jailed process (HOME/TMPDIR inside)."""
    env = dict(policy.env)
    env["HOME"] = JAIL_HOME
    env["TMPDIR"] = JAIL_TMP
    if policy.network == "proxy":
        env.update(proxy_env(proxy_url(policy, PROXY_PORT)))
    return env


def image_points(policy: Policy) -> list[str]:
    """The jail paths mounted on top of an ``image:`` root (``image.root_plan``)."""
    points = ["/proc", "/dev", JAIL_TMP, JAIL_HOME, str(policy.work_dir)]
    points += [m.target for m in policy.mounts]
    if policy.network == "open":
        points.append("/etc/resolv.conf")
    return points


def image_limits(resources: Resources, *, jail_uid: bool) -> list[tuple[int, int]]:
    """The rlimits the launcher sets on bwrap for an ``image:`` jail (an image
    has no ``prlimit`` of the host's); the jail inherits them. RLIMIT_NPROC
    only for a jail uid of its own, which has no other process on the host
    (bwrap itself and its pid-namespace init count: two more)."""
    out = base_rlimits(resources)
    if resources.processes is not None and jail_uid:
        out.append((resource.RLIMIT_NPROC, resources.processes + 2))
    return out


#: Where the item's scratch folder is bound: the jail's TMPDIR, HOME and /dev/shm.
SCRATCH_POINTS: tuple[str, ...] = (JAIL_TMP, JAIL_HOME, JAIL_SHM)


def scratch_covers(policy: Policy) -> list[str]:
    """Read-only tmpfs mounts for mount points the jail would otherwise get on disk.

    A folder shown at its host path below one of ``SCRATCH_POINTS`` (``work/``
    of a run kept under ``/tmp``, as a ``mktemp -d`` folder is; a toolchain
    mounted below ``/tmp``) needs its whole chain of parent folders as mount
    points, and bubblewrap would create them in the item's scratch on disk:
    seven ``mkdir`` per item for a run in ``/tmp/x/.stockade``, and as many
    removals after it. A tmpfs over the chain's first folder holds them in
    memory instead; it is remounted read-only once the mounts below it exist,
    so the jail can never store anything there. The scratch keeps one empty
    folder per cover (``scratch_mount_points``). Pure.
    """
    mounted = [m.target for m in policy.mounts]
    covers: list[str] = []
    for target in [*mounted, str(policy.work_dir)]:
        for point in SCRATCH_POINTS:
            rest = target[len(point) + 1:] if target.startswith(point + "/") else ""
            if "/" not in rest:
                continue  # not below the point, or a mount point of its own right there
            cover = f"{point}/{rest.split('/', 1)[0]}"
            # A mount at the cover or above it would have the tmpfs under
            # it (and be remounted read-only): leave that chain as it was.
            if cover not in covers and not any(
                cover == m or cover.startswith(m + "/") for m in mounted
            ):
                covers.append(cover)
    return covers


def scratch_mount_points(policy: Policy) -> frozenset[str]:
    """Names of the empty folders a jail of ``policy`` leaves in its scratch
    folder: the mount points of ``scratch_covers``, which the jail cannot
    enter (the tmpfs hides them) and which stay for the scratch's next loan."""
    return frozenset(c.rsplit("/", 1)[1] for c in scratch_covers(policy))


def bwrap_argv(
    policy: Policy,
    layout: HostLayout,
    *,
    seccomp_fd: int,
    relay_script: str | None = None,
    sources: Mapping[str, str] | None = None,
    bwrap: str = "bwrap",
    memory_tmp: bool = False,
    root_ops: Sequence[RootOp] = (),
) -> list[str]:
    """The bubblewrap command line for ``policy``. Pure: no I/O, no environment values.

    ``sources`` replaces host source paths the jail's uid cannot reach with
    bridge paths (see ``BwrapBackend.start``); destinations never change.
    ``memory_tmp``: the old, unbounded tmpfs ``/tmp`` and HOME and a writable
    tmpfs root and ``/dev`` (tests' positive controls only). ``root_ops``:
    how ``policy.image_root`` becomes the jail's ``/`` (``image.root_plan``
    of ``image_points``), instead of the host's system folders and ``/etc``;
    its resources are then the launcher's rlimits (``image_limits``).
    """
    remap = sources or {}
    work = str(policy.work_dir)
    covers = [] if memory_tmp else scratch_covers(policy)

    def bind(src: str, dest: str, writable: bool) -> list[str]:
        return ["--bind" if writable else "--ro-bind", remap.get(src, src), dest]

    argv = [bwrap, "--unshare-all", "--unshare-user"]
    if policy.network == "open":
        argv.append("--share-net")
    argv += [
        "--disable-userns",
        "--die-with-parent",
        "--cap-drop", "ALL",
        "--hostname", "stockade",
    ]  # fmt: skip
    if policy.image_root is not None:
        if policy.network == "proxy":
            raise InfraError("network: proxy cannot be used with image: (the relay to the "
                             "proxy runs the host's python3, which an image does not have)")
        if not root_ops:
            raise InfraError("image: needs the plan of the jail's root (image.root_plan)")
        top = str(policy.image_root)
        top = remap.get(top, top)
        for op in root_ops:
            if op.op == "bind":
                argv += ["--ro-bind", f"{top}/{op.source}", op.dest]
            elif op.op == "symlink":
                argv += ["--symlink", op.source, op.dest]
            else:
                argv += ["--dir", op.dest]
        if policy.network == "open" and layout.etc_dir is not None and layout.resolv_conf:
            argv += bind(f"{layout.etc_dir}/resolv.conf", "/etc/resolv.conf", False)
    else:
        for d in layout.dirs:
            argv += ["--ro-bind", d, d]
        for link, target in sorted(layout.symlinks.items()):
            argv += ["--symlink", target, link]
        if layout.etc_dir is not None:
            argv += bind(layout.etc_dir, "/etc", False)
        else:
            for e in layout.etc:
                argv += ["--ro-bind", e, e]
            if policy.network == "open" and layout.resolv_conf:
                argv += ["--ro-bind", layout.resolv_conf, "/etc/resolv.conf"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if memory_tmp:
        argv += ["--tmpfs", JAIL_TMP, "--tmpfs", JAIL_HOME]
    else:
        # One folder for all three: a folder more per item is an inode more
        # on disk, and the jail cannot tell them apart anyway.
        for dest in SCRATCH_POINTS:
            argv += bind(str(policy.scratch_dir), dest, True)
        for cover in covers:
            argv += ["--tmpfs", cover]
    for m in policy.mounts:
        argv += bind(str(m.source), m.target, m.writable)
    if policy.network == "proxy":
        if policy.proxy_socket is None or relay_script is None or layout.python is None:
            raise InfraError("network: proxy needs a proxy socket and /usr/bin/python3 on the host")
        argv += bind(relay_script, f"{HELPER_DIR}/relay.py", False)
        argv += bind(str(policy.proxy_socket), f"{HELPER_DIR}/proxy.sock", False)
    argv += bind(work, work, True)
    # Over their placeholders in work/, so the jail can read but never change them.
    for m in policy.shared_inputs:
        argv += bind(str(m.source), m.target, False)
    if not memory_tmp:
        # Last, once every mount point exists: bubblewrap's own tmpfs root
        # and /dev would otherwise take whatever the jail writes into them.
        for cover in covers:
            argv += ["--remount-ro", cover]
        argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    argv += ["--chdir", work, "--seccomp", str(seccomp_fd), "--"]
    if policy.image_root is None:
        argv += rlimit_prefix(policy.resources, layout.prlimit)
    if policy.network == "proxy":
        assert layout.python is not None
        argv += [
            layout.python, "-I", "-S", f"{HELPER_DIR}/relay.py",
            f"{HELPER_DIR}/proxy.sock", str(PROXY_PORT), "--",
        ]  # fmt: skip
    argv += list(policy.argv)
    return argv
