"""Payload provenance and content hashing (pure functions), as tables."""

from __future__ import annotations

from typing import Any

import pytest

from stockade.publish.payload import artifact_refs, content_sha256, foreign_artifacts


def art(run: str, sha: str = "aa", name: str = "r.md") -> dict[str, Any]:
    return {"$artifact": {"run_id": run, "step": "s", "item": 0, "attempt": 1, "name": name,
                          "sha256": sha, "size": 1}, "text": "x"}


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
