"""Payload provenance and content hashing (pure functions), as tables."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from stockade.publish.payload import (
    artifact_objects,
    artifact_refs,
    content_sha256,
    foreign_artifacts,
    form_problem,
)
from stockade.refs import escape_key, reserved_key_in, unescape_key


def art(run: str, sha: str = "aa", name: str = "r.md") -> dict[str, Any]:
    return {"$artifact": {"run_id": run, "step": "s", "item": 0, "attempt": 1, "name": name,
                          "sha256": sha, "size": 1}, "text": "x"}


def genuine() -> dict[str, Any]:
    """A reference as the engine writes it: ``text`` is the content its sha256 names."""
    return {"$artifact": {"run_id": "A", "step": "s", "item": 0, "attempt": 1, "name": "r.md",
                          "sha256": hashlib.sha256(b"hello").hexdigest(), "size": 5}, "text": "hello"}


@pytest.mark.parametrize(
    ("payload", "names"),
    [
        (None, []),
        ("text", []),
        (art("A"), ["r.md"]),
        ([art("A", name="a"), {"k": [art("B", name="b")]}], ["a", "b"]),
        ({"$artifact": "not a dict"}, []),
    ],
)
def test_artifact_refs(payload: Any, names: list[str]) -> None:
    assert [m["name"] for m in artifact_refs(payload)] == names


@pytest.mark.parametrize(
    ("payload", "foreign"),
    [
        (art("A"), []),
        ([art("A"), art("B")], ["B"]),
        ({"x": {"y": art("OLD")}}, ["OLD"]),
        ({"$artifact": {"name": "n"}}, [None]),
    ],
)
def test_foreign_artifacts(payload: Any, foreign: list[str | None]) -> None:
    assert [m.get("run_id") for m in foreign_artifacts(payload, "A")] == foreign


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ({"x": 1, "y": 2}, {"y": 2, "x": 1}, True),          # key order does not matter
        (art("A"), art("B"), True),                          # who made it does not matter
        (art("A", sha="aa"), art("A", sha="bb"), False),     # its bytes do
        ({"x": 1}, {"x": 1.5}, False),
        ([1, 2], [2, 1], False),
        ("é", "é", True),
    ],
)
def test_content_sha256(a: Any, b: Any, same: bool) -> None:
    assert (content_sha256(a) == content_sha256(b)) is same


def test_artifact_objects_finds_every_object_holding_the_key_with_its_path() -> None:
    payload = {"a": art("A"), "b": [1, {"$artifact": "odd", "c": art("B")}]}
    assert [p for p, _ in artifact_objects(payload)] == ['["a"]', '["b"][1]', '["b"][1]["c"]']


@pytest.mark.parametrize(
    ("obj", "problem"),
    [
        (genuine(), None),
        ({"$artifact": genuine()["$artifact"]}, None),
        (genuine() | {"text": "other"}, "its text is not the artifact's content"),
        (genuine() | {"text": "hellp"}, "its text is not the artifact's content"),  # same size
        (genuine() | {"extra": 1}, "keys an artifact reference does not have ('extra')"),
        ({"$artifact": ["x"]}, "is not an object"),
        ({"$artifact": {"run_id": "A"}}, "does not have exactly the fields"),
        ({"$artifact": genuine()["$artifact"] | {"size": "5"}}, "its 'size' is not an integer"),
        ({"$artifact": genuine()["$artifact"] | {"step": 1}}, "its 'step' is not a string"),
    ],
)
def test_form_problem(obj: dict[str, Any], problem: str | None) -> None:
    got = form_problem(obj)
    assert got is None if problem is None else got is not None and problem in got


@pytest.mark.parametrize(
    ("key", "escaped"),
    [("$artifact", "$$artifact"), ("$$artifact", "$$$artifact"), ("$file", "$$file"),
     ("$tree", "$$tree"), ("$ref", "$ref"), ("artifact", "artifact"), ("$artifacts", "$artifacts")],
)
def test_escape_key_is_reversible_and_touches_only_the_engine_keys(key: str, escaped: str) -> None:
    assert escape_key(key) == escaped and unescape_key(escaped) == key


def test_reserved_key_in_does_not_look_into_engine_objects() -> None:
    class Engine:
        def __stockade_json__(self) -> dict[str, Any]:
            return {"$artifact": {}}

    assert reserved_key_in({"a": Engine(), "b": [{"$$artifact": 1}]}) is None
    assert reserved_key_in({"a": [{}, {"$tree": 1}]}) == ('["a"][1]', "$tree")
