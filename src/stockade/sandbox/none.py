"""The ``none`` backend: working directory and a built environment, nothing more.

It is never enforced. The engine announces that at run start, records it in
the manifest and on every output's provenance, and refuses to use it when a
workflow requires a sandbox.

Must not import runner, workspace, store or cli.
"""

from __future__ import annotations

from typing import IO

from stockade.sandbox._popen import PopenJail
from stockade.sandbox.base import Availability, Backend, Running
from stockade.sandbox.policy import Policy


class NoneBackend(Backend):
    name = "none"

    def availability(self) -> Availability:
        return Availability(True)

    def limitations(self) -> tuple[str, ...]:
        return (
            "no filesystem isolation: the step can read and write anything the engine's user can",
            "no network isolation",
            "no process isolation: other processes and /proc are visible",
            "no seccomp filter",
        )

    def start(self, policy: Policy, *, stdout: IO[bytes] | int, stderr: IO[bytes] | int) -> Running:
        policy.scratch_dir.mkdir(parents=True, exist_ok=True)
        env = dict(policy.env)
        env["HOME"] = str(policy.scratch_dir)
        env["TMPDIR"] = str(policy.scratch_dir)
        return PopenJail(
            policy.argv, cwd=policy.work_dir, env=env, stdout=stdout, stderr=stderr,
            fds=policy.pass_fds,
        )  # fmt: skip
