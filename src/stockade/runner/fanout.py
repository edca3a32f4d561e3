"""What a step fans out over: its items' values and keys, rendered in the run.

``items_of`` renders a step's ``for_each`` (or gives the one item of a step
without it) and its ``key:`` for each value, then checks the keys: each must
name one item. Every mistake is a ``UserError`` at the field's
``FILE:LINE:COL``; the engine records it as the step's error.

Must not import the engine, the executors, the sandbox or the CLI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from stockade.errors import UserError
from stockade.expr import compile_template, render
from stockade.plan import expand
from stockade.runner.attempt import ITEM_ERRORS, RunContext, error_message
from stockade.runner.keys import check_key, item_keys, key_problem
from stockade.spec.model import Step

#: The template context of a step, with an item (``with_item``) or without.
ContextFor = Callable[..., Mapping[str, Any]]


def items_of(step: Step, run: RunContext, context: ContextFor) -> tuple[list[Any], list[str]]:
    """The step's item values and their keys, in order."""
    values = _values(step, run, context)
    explicit = None
    if step.key is not None:
        template = compile_template(step.key)
        with _located(run, step.id, "key"):
            explicit = [check_key(render(template, context(step, v, with_item=True),
                                         functions=run.functions)) for v in values]
    keys = item_keys(values, explicit)
    problem = key_problem(keys, run.masker.text)
    if problem:
        raise UserError(f"{run.locate(step.id, ('key' if explicit else 'for_each',))}: "
                        f"{problem}")
    return values, keys


def _values(step: Step, run: RunContext, context: ContextFor) -> list[Any]:
    if step.for_each is None:
        return [None]
    with _located(run, step.id, "for_each"):
        if isinstance(step.for_each, str):
            value = render(compile_template(step.for_each), context(step),
                           functions=run.functions)
        else:
            value = step.for_each
        return expand(value)


@contextmanager
def _located(run: RunContext, sid: str, *path: str | int) -> Iterator[None]:
    try:
        yield
    except ITEM_ERRORS as exc:
        raise UserError(f"{run.locate(sid, path)}: {error_message(exc)}") from exc
