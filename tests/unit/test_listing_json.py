"""``show --json``'s writer: the same document as ``json.dumps(indent=2,
sort_keys=True, default=str)``, with each element of an ``items`` list on one
line (the indenting encoder is pure Python: seconds on a 100,000-item run)."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest

from stockade.cli.browse import _listing_json


def reference(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


WITHOUT_ITEMS: list[Any] = [
    None, True, 0, -1.5, "", "é \u2028 \"q\"", [], {}, (), [[]], [{}], {"a": {}},
    {"b": [1, [2, {"d": None, "c": "x"}]], "a": ()},
    {"when": datetime.date(2026, 12, 2)},  # default=str
    {"items": []},  # empty: written as json writes it
    {"items": "not a list"},
]


@pytest.mark.parametrize("value", WITHOUT_ITEMS)
def test_without_item_lists_the_text_is_json_dumps(value: Any) -> None:
    assert _listing_json(value) == reference(value)


WITH_ITEMS: list[Any] = [
    {"items": [{"b": 1, "a": [1, {"y": 2, "x": 3}]}, {"é": "\u2028"}]},
    {"steps": [{"id": "s", "items": [1, "two", None]}, {"id": "t", "items": [{"k": 1.25}]}]},
    {"run": {"id": "r"}, "steps": [{"items": [{"outputs": [{"name": "a"}], "when":
                                               datetime.date(2026, 1, 1)}]}]},
]


@pytest.mark.parametrize("value", WITH_ITEMS)
def test_items_are_one_line_each_and_the_document_is_the_same(value: Any) -> None:
    text = _listing_json(value)
    assert json.loads(text) == json.loads(reference(value))
    lines = text.splitlines()
    # Every element of every items list: exactly one line, in order, compact.
    for items in _item_lists(value):
        for element in items:
            one = json.dumps(element, sort_keys=True, default=str)
            assert sum(line.strip().rstrip(",") == one for line in lines) >= 1, one
    # Outside the items, the indentation is json's.
    assert lines[0] == "{" and lines[-1] == "}"
    assert all(line.startswith("  ") for line in lines[1:-1])


def _item_lists(value: Any) -> list[list[Any]]:
    found: list[list[Any]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "items" and isinstance(v, list):
                found.append(v)
            else:
                found += _item_lists(v)
    elif isinstance(value, list):
        for v in value:
            found += _item_lists(v)
    return found



def test_the_exact_text_of_a_step_listing() -> None:
    # The layout outside the items is json's own, byte for byte; each item is
    # json's compact form on a line of its own, indented one level further.
    value = {"id": "s", "counts": {"ok": 2}, "items": [{"b": 1.5, "a": None}, {"k": "é"}]}
    assert _listing_json(value) == (
        '{\n'
        '  "counts": {\n'
        '    "ok": 2\n'
        '  },\n'
        '  "id": "s",\n'
        '  "items": [\n'
        '    {"a": null, "b": 1.5},\n'
        '    {"k": "\\u00e9"}\n'
        '  ]\n'
        '}'
    )
