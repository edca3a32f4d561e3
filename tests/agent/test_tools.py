"""Strict tool schemas and argument validation, as tables. No file system."""

from __future__ import annotations

from typing import Any

import pytest

from stockade.agent import tools

ALL = tools.ALL_TOOLS


@pytest.mark.parametrize("name", ALL)
def test_schemas_are_strict(name: str) -> None:
    schema = tools.json_schema(tools.TOOLS[name])
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == set(schema["properties"])
    (oa,) = tools.openai_tools([name])
    assert oa["function"]["strict"] is True
    (an,) = tools.anthropic_tools([name])
    assert an["strict"] is True and an["input_schema"] == schema


@pytest.mark.parametrize("name", tools.WRITE_TOOLS)
def test_write_fields_are_never_nullable(name: str) -> None:
    props = tools.json_schema(tools.TOOLS[name])["properties"]
    assert all(p["type"] == "string" for p in props.values())


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("read_file", {"path": "a"}, {"path": "a", "offset": None, "limit": None}),
        ("read_file", {"path": "a", "offset": None, "limit": 5}, {"path": "a", "offset": None, "limit": 5}),
        ("list_dir", {}, {"path": None}),
        ("list_dir", {"path": None}, {"path": None}),
        ("create_file", {"path": "out/a", "content": ""}, {"path": "out/a", "content": ""}),
        ("apply_patch", {"path": "x.py", "diff": "@@"}, {"path": "x.py", "diff": "@@"}),
    ],
)
def test_valid_calls(name: str, args: dict[str, Any], expected: dict[str, Any]) -> None:
    assert tools.validate(name, args, ALL) == expected


@pytest.mark.parametrize(
    ("name", "args", "error"),
    [
        ("apply_patch", {"diff": "@@"}, "required argument 'path' is missing"),
        ("apply_patch", {"path": None, "diff": "@@"}, "'path' is missing"),
        ("apply_patch", {"file": "billing/utils.py", "diff": "@@"}, r"unknown argument\(s\) \['file'\]"),
        ("apply_patch", {"target": "x.py", "path": "x.py", "diff": "@@"}, "unknown argument"),
        ("apply_patch", {"path": "x.py", "diff": "@@", "description": "d"}, "unknown argument"),
        ("apply_patch", {"path": 1, "diff": "@@"}, "must be a string"),
        ("create_file", {"path": "out/a"}, "'content' is missing"),
        ("create_file", {"content": "x"}, "'path' is missing"),
        ("create_file", {"file": "out/a", "content": "x"}, "unknown argument"),
        ("read_file", {}, "'path' is missing"),
        ("read_file", {"path": "a", "offset": "1"}, "integer"),
        ("read_file", {"path": "a", "offset": True}, "integer"),
        ("read_file", {"path": "a", "offset": -1}, ">= 0"),
        ("read_file", {"path": "a", "limit": 0}, ">= 1"),
        ("list_dir", {"dir": "x"}, "unknown argument"),
        ("delete_file", {"path": "x"}, "unknown tool"),
    ],
)
def test_rejected_calls(name: str, args: dict[str, Any], error: str) -> None:
    with pytest.raises(tools.CallRejected, match=error):
        tools.validate(name, args, ALL)


def test_tool_not_allowed_in_step() -> None:
    with pytest.raises(tools.CallRejected, match="unknown tool 'create_file'"):
        tools.validate("create_file", {"path": "out/a", "content": "x"}, ("read_file",))


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ('{"path": "a", "path": "b"}', "given twice"),
        ("[1]", "JSON object"),
        ("{nope", "not valid JSON"),
    ],
)
def test_parse_arguments_rejects(raw: str, error: str) -> None:
    with pytest.raises(tools.CallRejected, match=error):
        tools.parse_arguments(raw)


def test_parse_empty_is_empty_object() -> None:
    assert tools.parse_arguments("") == {}
