"""The store's JSON columns: one reused encoder writes what ``json.dumps`` with
the same settings writes (keys sorted, text not escaped to ASCII), so rows
written before and after it read and compare alike."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stockade.store._rows import dump_json, load_json

CASES: list[Any] = [
    None, True, False, 0, -7, 10**30, -(2**63), 1.5, 1e300, "", "plain", "é ü 雪 \u2028 \x00 \"quoted\"",
    [], {}, [1, "two", None, [3.0]], {"b": 1, "a": {"z": None, "y": ["ü", {"d": 1, "c": 2}]}},
    {"$artifact": "x", "$$file": "y"},
]


@pytest.mark.parametrize("value", CASES)
def test_dump_json_writes_what_json_dumps_writes(value: Any) -> None:
    text = dump_json(value)
    assert text == json.dumps(value, sort_keys=True, ensure_ascii=False)
    assert load_json(text) == value


def test_dump_json_refuses_what_json_refuses() -> None:
    with pytest.raises(TypeError):
        dump_json({"a": object()})
    with pytest.raises(TypeError):
        dump_json({1: "x", "1": "y"})  # keys of mixed types cannot be sorted


def test_final_run_statuses_are_the_ones_only_a_returning_engine_writes() -> None:
    # The store may not import the runner, so it spells these out; they must
    # stay the run statuses other than running (and crashed, never stored).
    from stockade.runner.status import RunStatus
    from stockade.store.base import FINAL_RUN_STATUSES

    assert {str(s) for s in RunStatus} - {"running", "crashed"} == FINAL_RUN_STATUSES


@pytest.mark.parametrize("value", CASES)
def test_load_json_reads_what_json_loads_reads(value: Any) -> None:
    # The literals and integers read without the decoder keep their type:
    # True is not 1, and 0 is not False.
    text = dump_json(value)
    got = load_json(text)
    assert got == json.loads(text) and type(got) is type(json.loads(text))


@pytest.mark.parametrize("text", ["0", "7", "10", "123456789012345678901234567890", "-0", "-12",
                                  "1e3", "1.0", " 1", '"x"', "[]", "{}"])
def test_load_json_agrees_with_json_on_any_number_text(text: str) -> None:
    got = load_json(text)
    assert got == json.loads(text) and type(got) is type(json.loads(text))


@pytest.mark.parametrize("text", ["007", "01", "\uff11", "\u0663", "1 2", "tru", "Null"])
def test_load_json_refuses_what_json_refuses(text: str) -> None:
    # A leading zero and non-ASCII digits are not JSON numbers; the fast
    # path must not read them as integers.
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        load_json(text)


def test_load_json_of_no_text_is_none() -> None:
    assert load_json(None) is None
