"""Step kinds: how an ``Attempt`` of a ``run:``, ``agent:``, ``keep:`` or ``publish:``
item becomes an ``Outcome``.

Every kind implements ``StepKind``; ``kind_of(step)`` picks it. ``inline``
kinds (``keep:``) are evaluated on the engine's thread, take no job slot and
start no process; the others go through an executor.

Must not import the engine, the executors or the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, cast

from stockade.runner.attempt import Attempt, Outcome, RunContext
from stockade.spec.model import Step


class StepKind(Protocol):
    """Runs one attempt of one item of its kind."""

    name: ClassVar[str]
    #: Evaluated on the engine's thread: no process, no job slot, no attempt folder.
    inline: ClassVar[bool]

    def run(self, attempt: Attempt) -> Outcome: ...

    def action(self, attempt: Attempt) -> Any:
        """What the item will do, rendered (the command; the agent settings and prompt):
        part of its reuse key."""
        ...


class InlineKind(StepKind, Protocol):
    """An inline kind also decides a batch of items at once, without attempts."""

    def run_all(self, step: Step, context: Mapping[str, Any],
                items: Sequence[tuple[Any, int]], run: RunContext) -> list[Outcome]:
        """The outcome of each (value, attempt number) of ``items``; ``context``
        is what every item's template sees but ``item``."""
        ...


_KINDS: dict[str, StepKind] = {}


def kind_of(step: Step) -> StepKind:
    """The implementation of ``step``'s kind (imported on first use: agent steps pull in httpx).

    Kinds hold no state, so each is made once: this is asked once per item."""
    found = _KINDS.get(step.kind)
    if found is None:
        found = _KINDS[step.kind] = _make(step.kind)
    return found


def _make(kind: str) -> StepKind:
    if kind == "run":
        from stockade.runner.kinds.shell import Shell

        return Shell()
    if kind == "keep":
        from stockade.runner.kinds.keep import Keep

        return Keep()
    if kind == "publish":
        from stockade.runner.kinds.publish import Publish

        return Publish()
    if kind == "agent":
        from stockade.runner.kinds.agent import AgentKind

        return AgentKind()
    raise ValueError(f"unknown step kind {kind!r}")


def is_inline(step: Step) -> bool:
    return step.kind == "keep"


def inline_kind(step: Step) -> InlineKind:
    """``kind_of`` for an inline step."""
    assert is_inline(step), step.kind
    return cast(InlineKind, kind_of(step))


def makes_attempt_folders(step: Step) -> bool:
    """Whether an attempt of ``step`` begins by making the item's folders
    (``ItemDir.begin_attempt``, through ``process.in_jail``): those the engine
    may make ahead of the item's turn (``runner.prefetch``)."""
    return step.kind in ("run", "agent")


__all__ = ["InlineKind", "StepKind", "inline_kind", "is_inline", "kind_of", "makes_attempt_folders"]
