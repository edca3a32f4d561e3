"""The ``run:`` kind: a shell command in the item's jail.

Must not import the engine, the executors or the CLI.
"""

from __future__ import annotations

from typing import ClassVar

from stockade.expr import compile_template, render
from stockade.runner.attempt import Attempt, Outcome
from stockade.runner.kinds.process import (
    finish,
    in_jail,
    network_mode,
    prepare,
    resources_of,
    run_jail,
)
from stockade.runner.reuse import key_for
from stockade.sandbox.policy import Policy
from stockade.workspace.artifacts import Materialised


class Shell:
    name: ClassVar[str] = "run"
    inline: ClassVar[bool] = False

    def run(self, attempt: Attempt) -> Outcome:
        return in_jail(attempt, lambda inputs: self._body(attempt, inputs))

    def action(self, attempt: Attempt) -> str:
        assert attempt.step.run is not None
        with attempt.located("run"):
            return str(render(compile_template(attempt.step.run), attempt.context,
                              functions=attempt.run.functions, shell=True))

    def _body(self, attempt: Attempt, inputs: list[Materialised]) -> Outcome:
        started = attempt.clock()
        world = prepare(attempt, inputs)
        step = attempt.step
        command = self.action(attempt)
        policy = Policy(
            argv=("/bin/sh", "-c", command),
            work_dir=attempt.dirs.work,
            scratch_dir=attempt.dirs.scratch,
            env=world.env,
            network=network_mode(step),
            resources=resources_of(step),
        )
        code, timed_out = run_jail(attempt, world.backend, policy, world.masker, inputs=inputs)
        outcome = finish(attempt, started, code, timed_out, inputs)
        outcome.command = world.masker.text(command)
        outcome.reuse_key = key_for(attempt, [(m.name, m.sha256) for m in inputs], world.env,
                                    command)
        return outcome
