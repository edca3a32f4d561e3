"""The web UI's pure parts: the Host rule, change sets, folded events, packing, escaping."""

from __future__ import annotations

import json

import pytest

from stockade.runner.status import RunStatus
from stockade.store.base import RunRecord
from stockade.web.format import dur, script_json, size, tokens
from stockade.web.guard import allowed_host
from stockade.web.live import changes, parse_offsets
from stockade.web.model import FinalCache, Fold, group, pack


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8765", True), ("localhost:8765", True), ("[::1]:8765", True),
        ("LocalHost:8765", True), (" 127.0.0.1:8765 ", True),
        ("127.0.0.1", False), ("localhost", False), ("127.0.0.1:8766", False),
        ("evil.example:8765", False), ("localhost.evil.example:8765", False),
        ("127.0.0.2:8765", False), ("0.0.0.0:8765", False), ("[::1]", False),
        ("", False), (None, False),
    ],
)
def test_allowed_host(host: str | None, ok: bool) -> None:
    assert allowed_host(host, 8765) is ok


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ({}, {}, None),
        ({"a": 1}, {"a": 1}, None),
        ({"a": 1}, {"a": 2}, {"a": 2}),
        ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
        ({"s": {"x": {"done": 1, "run": 2}}}, {"s": {"x": {"done": 2, "run": 2}}},
         {"s": {"x": {"done": 2}}}),
        ({"s": {}}, {"s": {"y": {"done": 0}}}, {"s": {"y": {"done": 0}}}),
        ({"l": [1, 2]}, {"l": [1, 2, 3]}, {"l": [1, 2, 3]}),
        ({"a": None}, {"a": 0}, {"a": 0}),
    ],
)
def test_changes_carry_only_what_changed(old: dict[str, object], new: dict[str, object],
                                         expected: dict[str, object] | None) -> None:
    assert changes(old, new) == expected


def test_parse_offsets() -> None:
    assert parse_offsets("1:stdout:120,1:stderr:0,2:stdout:5") == {
        (1, "stdout"): 120, (1, "stderr"): 0, (2, "stdout"): 5}
    assert parse_offsets("") == {}
    assert parse_offsets("x:stdout:1,1:passwd:3,1:stdout:-4,1:stdout") == {}


def test_fold_keys_retries_usage_and_statuses() -> None:
    f = Fold()
    f.apply("step_started", {"step": "a", "items": 3})
    f.apply("item_keys", {"step": "a", "keys": ["x", "y", "z"]})
    f.apply("retry_scheduled", {"step": "a", "item": 1, "attempt": 2})
    f.apply("retry_scheduled", {"step": "a", "item": 1, "attempt": 3})
    f.apply("agent_usage", {"step": "a", "usage": {"input_tokens": 5, "output_tokens": 2,
                                                   "flag": True}})
    f.apply("agent_usage", {"step": "a", "usage": {"input_tokens": 1}})
    assert (f.totals, f.status) == ({"a": 3}, {"a": "running"})
    assert (f.key("a", 2), f.index("a", "y"), f.index("a", "nope")) == ("z", 1, None)
    # A step without recorded keys names its items by index.
    assert (f.key("b", 4), f.index("b", "4"), f.index("b", "k4")) == ("4", 4, None)
    assert (f.retried, f.retry_next) == ({"a": {1}}, {"a": {1: 3}})
    assert f.usage == {"input_tokens": 6, "output_tokens": 2}
    f.apply("step_finished", {"step": "a", "status": "failed"})
    assert f.status == {"a": "failed"}


@pytest.mark.parametrize(
    ("status", "count"),
    [("succeeded", "done"), ("failed", "failed"), ("errored", "failed"), ("fenced", "failed"),
     ("skipped", "skipped"), ("interrupted", "interrupted")],
)
def test_group(status: str, count: str) -> None:
    assert group(status) == count


def test_pack_rows_into_columns() -> None:
    assert pack([(0, 1, 3, 10, 20, None), (1, 0, 4, 15, 30, "k")]) == {
        "s": [0, 1], "i": [1, 0], "st": [3, 4], "a": [10, 15], "b": [20, 30], "k": [None, "k"]}
    assert pack([(0, 1, 3, 10, 20, None)])["k"] == []
    assert pack([]) == {"s": [], "i": [], "st": [], "a": [], "b": [], "k": []}


def test_final_cache_keeps_only_ended_runs() -> None:
    cache = FinalCache()
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        return len(calls)

    rec = RunRecord("r", "w", "/w", "00", "/root", "failed", 1.0, 2.0)
    assert cache.get("t", rec, RunStatus.FAILED, compute) == 1
    assert cache.get("t", rec, RunStatus.FAILED, compute) == 1
    # A resume changes the run's end: a new answer.
    assert cache.get("t", RunRecord("r", "w", "/w", "00", "/root", "succeeded", 1.0, 9.0),
                     RunStatus.SUCCEEDED, compute) == 2
    for live in (RunStatus.RUNNING, RunStatus.CRASHED):
        before = len(calls)
        cache.get("t", rec, live, compute)
        assert len(calls) == before + 1


def test_script_json_cannot_close_its_script_element() -> None:
    text = script_json({"k": "</script><script>alert(1)</script>", "c": "<!--", "a": "&"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text)["k"] == "</script><script>alert(1)</script>"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.5, "0.50s"), (12.34, "12.3s"), (61, "1m01s"), (3723, "1h02m")],
)
def test_dur(seconds: float | None, text: str) -> None:
    assert dur(seconds) == text


def test_size_and_tokens() -> None:
    assert [size(n) for n in (None, 0, 1023, 1024, 5 << 20)] == ["-", "0 B", "1023 B", "1.0 KiB",
                                                                 "5.0 MiB"]
    assert tokens({"input_tokens": 1200, "output_tokens": 34, "calls": 3}) == "1,234"
    assert tokens({}) == "-" and tokens(None) == "-"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0.5, "0.5s"), (9.99, "10.0s"), (59.94, "59.9s"), (60, "1m00s"),
     (3599, "59m59s"), (3600, "1h00m"), (90061, "25h01m")],
)
def test_the_cli_durations_have_no_hundredths(seconds: float | None, text: str) -> None:
    from stockade._show import duration

    assert duration(seconds) == text
