"""The ``keep:`` kind: a decision fixed in the workflow file, evaluated without a process.

Its result is the boolean the rule rendered; the step's view hands on the
kept elements themselves (``runner.views``). Inline: it runs on the engine's
thread, has no attempt folder and takes no job slot.

Must not import the engine, the executors or the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from stockade.errors import UserError
from stockade.expr import compile_template, renderer
from stockade.runner.attempt import (
    ITEM_ERRORS,
    Attempt,
    Outcome,
    RunContext,
    error_message,
    refused,
)
from stockade.runner.status import AttemptStatus
from stockade.spec.model import Step


class Keep:
    name: ClassVar[str] = "keep"
    inline: ClassVar[bool] = True

    def action(self, attempt: Attempt) -> None:
        """Never reused: no action to key."""

    def run(self, attempt: Attempt) -> Outcome:
        context = {k: v for k, v in attempt.context.items() if k != "item"}
        return self.run_all(attempt.step, context, [(attempt.value, attempt.number)],
                            attempt.run)[0]

    def run_all(self, step: Step, context: Mapping[str, Any],
                items: Sequence[tuple[Any, int]], run: RunContext) -> list[Outcome]:
        """``run`` for a batch of the step's items: the same outcomes, the same
        messages. ``context`` is what every item sees but ``item``; ``items``
        are (value, attempt number) pairs.

        The rule is compiled and its names gathered once for the batch, and
        no ``Attempt`` is made: profiled over 20,000 items after a fan-out,
        building each item's attempt and context and copying the template's
        names for each render took about a seventh of the step's time.
        """
        rule = step.keep
        assert isinstance(rule, str)

        def failed(number: int, now: float, exc: BaseException) -> Outcome:
            where = run.locate(step.id, ("keep",))
            out = refused(number, now, run.masker.text(f"{where}: {error_message(exc)}"))
            out.ended_at = now
            return out

        try:
            decide = renderer(compile_template(rule), context, "item", functions=run.functions)
        except ITEM_ERRORS as exc:
            return [failed(number, run.clock(), exc) for _, number in items]
        outs: list[Outcome] = []
        for value, number in items:
            now = run.clock()
            try:
                decision = decide(value)
                if not isinstance(decision, bool):
                    raise UserError(not_a_decision(decision))
            except ITEM_ERRORS as exc:
                outs.append(failed(number, now, exc))
                continue
            outs.append(Outcome(AttemptStatus.SUCCEEDED, number, result=decision,
                                message="kept" if decision else "dropped", started_at=now,
                                ended_at=now))
        return outs


def not_a_decision(value: Any) -> str:
    """Why a ``keep:`` value that is not a bool cannot decide, showing it."""
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    if isinstance(value, str):
        # A step's result is its stdout, text: the usual slip.
        return (f"keep: must render true or false, got the text {shown}; compare it "
                "(== 'yes') or convert it (| int > 0)")
    if value is None:
        return "keep: must render true or false, got null"
    return f"keep: must render true or false, got {type(value).__name__} {shown}"
