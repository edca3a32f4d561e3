"""The ``keep:`` kind: a decision fixed in the workflow file, evaluated without a process.

Its result is the boolean the rule rendered; the step's view hands on the
kept elements themselves (``runner.views``). Inline: it runs on the engine's
thread, has no attempt folder and takes no job slot.

Must not import the engine, the executors or the CLI.
"""

from __future__ import annotations

from typing import ClassVar

from stockade.errors import UserError
from stockade.expr import compile_template, render
from stockade.runner.attempt import ITEM_ERRORS, Attempt, Outcome, error_message, refused
from stockade.runner.status import AttemptStatus


class Keep:
    name: ClassVar[str] = "keep"
    inline: ClassVar[bool] = True

    def action(self, attempt: Attempt) -> None:
        """Never reused: no action to key."""

    def run(self, attempt: Attempt) -> Outcome:
        rule = attempt.step.keep
        assert isinstance(rule, str)
        now = attempt.clock()
        try:
            with attempt.located("keep"):
                decision = render(compile_template(rule), attempt.context,
                                  functions=attempt.run.functions)
                if not isinstance(decision, bool):
                    raise UserError(
                        f"keep: must render true or false, got {type(decision).__name__}")
        except ITEM_ERRORS as exc:
            out = refused(attempt.number, now, attempt.run.masker.text(error_message(exc)))
            out.ended_at = now
            return out
        return Outcome(AttemptStatus.SUCCEEDED, attempt.number, result=decision,
                       message="kept" if decision else "dropped", started_at=now, ended_at=now)
