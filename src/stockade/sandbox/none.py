"""The ``none`` backend: working directory, a built environment and the
step's resources, nothing more. Also what ``isolate: false`` steps run on.

It is never enforced. The engine announces that at run start, records it in
the manifest and on every output's provenance, and refuses to use it when a
workflow requires a sandbox.

Resources still apply: the rlimits are set in the child before exec (by the
C launcher on the engine's launcher thread, else by an exec helper's forked
child), and the jail gets its own cgroup like any other (``_lifetime``):
its memory and pids controllers carry ``resources.memory`` and
``resources.processes`` where they exist, and the jail ends whole with its
main process, ``kill`` and the engine. ``unapplied`` names what cannot be
applied here. ``STOCKADE_NONE_LAUNCHER=helper`` forces the exec helper.

Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Literal

from stockade.errors import InfraError
from stockade.sandbox import _direct, _lifetime
from stockade.sandbox._forkserver import nproc_limit
from stockade.sandbox._host import within_hard_limits
from stockade.sandbox._launch import base_rlimits, ulimit_prefix
from stockade.sandbox._popen import PopenJail
from stockade.sandbox._spawner import HelperPool, HelperRunning, fileno
from stockade.sandbox.base import Availability, Backend, Running
from stockade.sandbox.policy import Policy, Resources

Launcher = Literal["direct", "helper"]

# Shared by every instance (``isolate: false`` makes one per run) and never
# closed: the launcher thread is the parent-death anchor of the jails it
# started, so it must outlive all of them.
_launcher = _direct.LauncherThread()
_helpers: HelperPool | None = None
_helpers_lock = threading.Lock()


def _helper_pool() -> HelperPool:
    global _helpers
    with _helpers_lock:
        if _helpers is None:
            _helpers = HelperPool()
        return _helpers


def choose_launcher(env: Mapping[str, str]) -> Launcher:
    wanted = env.get("STOCKADE_NONE_LAUNCHER", "")
    if wanted not in ("", "direct", "helper"):
        raise InfraError(f"STOCKADE_NONE_LAUNCHER={wanted!r}: expected 'direct' or 'helper'")
    if wanted == "helper" or not _direct.available():
        return "helper"
    return "direct"


def rlimits(resources: Resources, *, pids_limited: bool) -> list[tuple[int, int]]:
    """The (resource, value) pairs of a ``none`` jail: never a core dump, plus
    the step's limits. RLIMIT_NPROC counts every process of the engine's uid
    (no user namespace), so it is the current count plus the step's share,
    and only where no pids cgroup holds the exact limit; root is exempt."""
    out = base_rlimits(resources)
    if resources.processes is not None and not pids_limited and os.geteuid() != 0:
        out.append((resource.RLIMIT_NPROC, nproc_limit(os.getuid(), resources.processes)))
    return out


def _resolve(argv0: str, env: Mapping[str, str]) -> str:
    if "/" in argv0:
        return argv0
    return shutil.which(argv0, path=env.get("PATH", os.defpath)) or argv0


class NoneBackend(Backend):
    name = "none"

    def __init__(self, launcher: Launcher | None = None) -> None:
        self._launcher = launcher

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None:
            self._launcher = choose_launcher(os.environ)
        return self._launcher

    def availability(self) -> Availability:
        if self.launcher == "helper":
            return Availability(True, "started through an exec helper")
        return Availability(True, "started by the C launcher")

    def limitations(self) -> tuple[str, ...]:
        return (
            "no filesystem isolation: the step can read and write anything the engine's user can",
            "no network isolation",
            "no process isolation: other processes and /proc are visible",
            "no seccomp filter",
            "resources are rlimits of each process (address space, CPU seconds, file size, no "
            "core dumps); resources.processes is a pids cgroup's limit where one exists, else "
            "RLIMIT_NPROC over every process of the engine's user, which root is exempt from",
        )

    def unapplied(self, resources: Resources) -> tuple[str, ...]:
        lifetime = _lifetime.get()
        out = []
        if resources.processes is not None and lifetime.pids_controller() is None:
            if os.geteuid() == 0:
                out.append(
                    "resources.processes is not enforced: the engine runs as root, which "
                    "RLIMIT_NPROC exempts, and no pids cgroup is available"
                )
            else:
                out.append(
                    "resources.processes counts every process of the engine's user "
                    "(no pids cgroup is available)"
                )
        if resources.memory_bytes is not None and lifetime.memory_controller() is None:
            out.append(
                "resources.memory limits each process's address space only "
                "(no memory cgroup is available)"
            )
        return tuple(out)

    def start(self, policy: Policy, *, stdout: IO[bytes] | int, stderr: IO[bytes] | int) -> Running:
        if policy.image_root is not None or policy.shared_inputs:
            # Without a jail there is no other root to show, nor a mount to share by.
            raise InfraError("the none backend runs on the host's own root: image: needs the "
                             "bwrap backend" if policy.image_root is not None else
                             "the none backend cannot bind shared inputs")
        policy = within_hard_limits(policy)
        policy.scratch_dir.mkdir(parents=True, exist_ok=True)
        env = dict(policy.env)
        env["HOME"] = str(policy.scratch_dir)
        env["TMPDIR"] = str(policy.scratch_dir)
        r = policy.resources
        running, _ = _lifetime.get().start(
            lambda g: self._start(policy, env, rlimits(r, pids_limited=g.pids_limited), stdout,
                                  stderr, g.join_fds, g.join_dir),
            memory_bytes=r.memory_bytes, processes=r.processes)
        return running

    def _start(
        self, policy: Policy, env: dict[str, str], limits: list[tuple[int, int]],
        stdout: IO[bytes] | int, stderr: IO[bytes] | int, cgroups: Sequence[int],
        cgroup_dir: int,
    ) -> Running:  # fmt: skip
        # Every launcher places the policy's fds at 3, 4, ... in the jail.
        fds = [fileno(stdout), fileno(stderr), *policy.pass_fds]
        if not sys.platform.startswith("linux"):
            # No exec helper there (it is Linux-only): a shell sets the limits.
            argv = [*ulimit_prefix(policy.resources), *policy.argv]
            return PopenJail(
                argv, cwd=policy.work_dir, env=env, stdout=stdout, stderr=stderr,
                fds=policy.pass_fds,
            )  # fmt: skip
        if self.launcher == "direct":
            try:
                return _launcher.spawn(
                    _resolve(policy.argv[0], env), policy.argv, env, fds,
                    cwd=str(policy.work_dir), limits=limits, cgroups=cgroups,
                    cgroup_dir=cgroup_dir,
                )  # fmt: skip
            except OSError as e:
                raise InfraError(f"cannot start {policy.argv[0]}: {e}") from e
        request = {
            "mode": "plain",
            "argv": list(policy.argv),
            "env": env,
            "cwd": str(policy.work_dir),
            "uid": None,
            "gid": None,
            "limits": limits,
            "cgroups": len(cgroups),
        }
        return HelperRunning(_helper_pool().spawn(request, [*fds, *cgroups]))
