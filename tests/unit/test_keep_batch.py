"""A ``keep:`` decided a batch at a time gives what one render per item gives.

``expr.renderer`` gathers a template's names once for many values of one
name; ``Keep.run_all`` uses it for a batch of items without making attempts.
Both are checked against the one-at-a-time path they replace, on values,
errors, limits and names that shadow each other.
"""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace
from typing import Any, cast

import pytest

from stockade.expr import ExprError, RenderError, compile_template, render, renderer
from stockade.runner.attempt import Attempt, ItemRef
from stockade.runner.kinds.keep import Keep, not_a_decision
from stockade.runner.status import AttemptStatus

CTX: dict[str, Any] = {
    "vars": {"date": "2026-12-02", "n": "3"},
    "run": {"id": "r-1"},
    "steps": {"gather": {"result": "ok", "items": [{"index": 0, "value": 2}]}},
}
FUNCS = {"file": lambda p: f"content of {p}"}

SOURCES = [
    "{{ item }}",
    " {{ item if true else 0 }}",
    "{{ item.value }}",
    "{{ item | int % 2 == 0 }}",
    "x={{ item }} on {{ vars.date }}",
    "{{ vars.date }}",
    "plain text",
    "{{ vars.zzz }}",
    "{{ item.nope }}",
    "{{ 10 // item }}",
    "{{ file('a.txt') ~ item }}",
    "{{ [item] * 3 }}",
    "{{ 'x' * item }}",
    "{{ steps.gather.items[0].value == item }}",
]
VALUES: list[Any] = [0, 2, 3, "us", {"value": "v"}, None, [1, 2], 10_000, 2_000_000]


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return ("ok", call())
    except (RenderError, ExprError) as exc:
        return (type(exc).__name__, exc.message)


@pytest.mark.parametrize("source", SOURCES)
def test_renderer_gives_what_render_gives_for_every_value(source: str) -> None:
    t = compile_template(source)
    one = renderer(t, CTX, "item", functions=FUNCS)
    seen = set()
    for value in VALUES:
        want = _outcome(lambda v=value: render(t, {**CTX, "item": v}, functions=FUNCS))
        got = _outcome(lambda v=value: one(v))
        assert got == want, (source, value)
        seen.add(got[0])
        if source == "{{ item }}":
            assert got[1] is value
    # The table has both endings for the templates that can fail.
    if "zzz" in source or "nope" in source:
        assert seen == {"RenderError"}


class Weighed(list[int]):
    """A list that can be watched with a weak reference."""


def test_a_call_keeps_no_earlier_value_alive() -> None:
    # ``+`` of two lists weighs both, and a weigher memoises what it weighed
    # (by identity, holding the value). One weigher for the whole batch would
    # hold every item of a 100,000-item keep: each call has its own.
    one = renderer(compile_template("{{ (item + [1]) | length > 2 }}"), CTX, "item")
    first = Weighed([1, 2])
    gone = weakref.ref(first)
    assert one(first) is True
    del first
    assert one(Weighed([3])) is False
    gc.collect()
    assert gone() is None


def test_a_value_refused_at_a_cap_leaves_the_next_calls_as_they_were() -> None:
    # '*' of a string is weighed as about three characters each (cap 1,000,000).
    one = renderer(compile_template("{{ 'x' * item }}"), CTX, "item")
    assert len(one(300_000)) == 300_000
    with pytest.raises(RenderError, match="limit"):
        one(400_000)
    assert len(one(300_000)) == 300_000
    assert one(3) == "xxx"


def test_a_function_of_the_same_name_wins_as_in_render() -> None:
    def item() -> int:
        return 1

    t = compile_template("{{ item }}")
    one = renderer(t, CTX, "item", functions={"item": item})
    assert render(t, {**CTX, "item": 5}, functions={"item": item}) is item
    assert one(5) is item


def test_a_bare_name_other_than_the_item_is_the_contexts_value() -> None:
    one = renderer(compile_template("{{ run }}"), CTX, "item")
    assert one(1) is CTX["run"] and one(2) is CTX["run"]


def _run(locate: Any = None) -> Any:
    clock = iter(float(t) for t in range(1_000_000))
    return SimpleNamespace(
        functions={}, clock=lambda: next(clock),
        masker=SimpleNamespace(text=lambda s: s.replace("SECRET", "***")),
        locate=locate or (lambda step, path: f"wf.yaml:7:5 ({step}.{'.'.join(map(str, path))})"),
    )


RULES = [
    "{{ item | int % 2 == 0 }}",
    "{{ item if item == 3 else (10 // item) % 2 == 1 }}",
    "{{ item.value == 'SECRET' }}",
    "{{ 'SECRET' ~ item }}",
]


def _one_by_one(rule: str, value: Any) -> tuple[AttemptStatus, Any, str]:
    """What a keep: item ends as, from one plain render (the definition)."""
    where = "wf.yaml:7:5 (decide.keep)"
    try:
        decision = render(compile_template(rule), {**CTX, "item": value})
    except RenderError as exc:
        return AttemptStatus.ERRORED, None, f"{where}: {exc.message}".replace("SECRET", "***")
    if not isinstance(decision, bool):
        return (AttemptStatus.ERRORED, None,
                f"{where}: {not_a_decision(decision)}".replace("SECRET", "***"))
    return AttemptStatus.SUCCEEDED, decision, "kept" if decision else "dropped"


@pytest.mark.parametrize("rule", RULES)
def test_run_all_gives_what_one_render_per_item_gives(rule: str) -> None:
    step: Any = SimpleNamespace(id="decide", keep=rule)
    values: list[Any] = [0, 1, 2, 3, 4, "x", {"value": "SECRET"}, None]
    batch = Keep().run_all(step, CTX, [(v, n + 1) for n, v in enumerate(values)], _run())
    assert [(o.status, o.result, o.message) for o in batch] == \
        [_one_by_one(rule, v) for v in values]
    assert [o.attempt for o in batch] == list(range(1, len(values) + 1))
    for o in batch:
        assert o.started_at == o.ended_at
        assert o.retryable is (o.status is not AttemptStatus.ERRORED)
    # The attempt the executors' interface hands in ends the same way.
    for n, v in enumerate(values):
        attempt = Attempt(run=_run(), step=step, item=ItemRef("decide", n, str(n)), value=v,
                          number=n + 1, dirs=cast(Any, None), context={**CTX, "item": v})
        single = Keep().run(attempt)
        assert (single.status, single.result, single.message) == _one_by_one(rule, v)


def test_run_all_messages_name_the_rule_and_what_went_wrong() -> None:
    step: Any = SimpleNamespace(id="decide", keep=RULES[1])
    outs = Keep().run_all(step, CTX, [(0, 1), (3, 1), (2, 2)], _run())
    assert [o.status for o in outs] == [AttemptStatus.ERRORED, AttemptStatus.ERRORED,
                                         AttemptStatus.SUCCEEDED]
    assert outs[0].message == ("wf.yaml:7:5 (decide.keep): ZeroDivisionError: "
                               "integer division or modulo by zero")
    assert outs[1].message == ("wf.yaml:7:5 (decide.keep): keep: must render true or false, "
                               "got int 3")
    assert (outs[2].result, outs[2].message, outs[2].attempt) == (True, "kept", 2)


def test_a_rule_that_does_not_compile_is_an_error_of_the_engine_as_before() -> None:
    # Validation refuses such a rule before a run starts; at run time it is
    # a broken invariant, raised by both paths alike, never an item's outcome.
    step: Any = SimpleNamespace(id="decide", keep="{{ item ")
    with pytest.raises(ExprError, match="invalid template"):
        Keep().run_all(step, CTX, [(1, 1), (2, 1)], _run())
    attempt: Any = SimpleNamespace(step=step, value=1, number=1, run=_run(),
                                   context={**CTX, "item": 1})
    with pytest.raises(ExprError, match="invalid template"):
        Keep().run(attempt)


@pytest.mark.parametrize(("value", "said"), [
    ("1\n", "keep: must render true or false, got the text '1\\n'; compare it (== 'yes') or "
            "convert it (| int > 0)"),
    (3, "keep: must render true or false, got int 3"),
    (None, "keep: must render true or false, got null"),
    (list(range(30)), "keep: must render true or false, got list [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, "
                      "10, 11..."),
])
def test_a_value_that_cannot_decide_is_shown(value: Any, said: str) -> None:
    assert not_a_decision(value) == said
