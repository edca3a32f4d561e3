"""One contract for every run store: the same tests against SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.errors import InfraError, UserError
from stockade.store import (
    ArtifactRecord,
    AttemptRecord,
    Effect,
    Event,
    ItemRecord,
    PublishRecord,
    ReuseEntry,
    RunExists,
    RunRecord,
    SQLiteStore,
    Store,
    open_store,
)
from stockade.store.base import sum_usage


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s: Store = open_store(None, tmp_path)
    else:
        s = open_store(request.getfixturevalue("pg_url"), tmp_path)
    yield s
    s.close()


def run(run_id: str = "r1", started: float = 100.0, **kw: object) -> RunRecord:
    base: dict[str, object] = dict(
        run_id=run_id, workflow="wf", workflow_path="/w/wf.yaml", workflow_sha256="ab" * 32,
        root="/root", status="running", started_at=started,
    )
    base.update(kw)
    return RunRecord(**base)  # type: ignore[arg-type]


def effect(key: str = "r1/pub/0", **kw: object) -> Effect:
    run_id, step, item = key.split("/")
    base: dict[str, object] = dict(
        key=key, run_id=run_id, step=step, item=int(item), attempt=1, lease="wf.pub",
        sink="sqlite:///x.db?table=t", sink_key="k", payload_sha256="00" * 32, token=3,
        claimed_at=10.0,
    )
    base.update(kw)
    return Effect(**base)  # type: ignore[arg-type]


# -- runs ----------------------------------------------------------------------


def test_run_round_trip_and_duplicate(store: Store) -> None:
    r = run(sandbox="bwrap", enforced=True)
    store.create_run(r)
    assert store.get_run("r1") == r
    with pytest.raises(RunExists):
        store.create_run(r)
    store.update_run("r1", status="succeeded", ended_at=200.5)
    got = store.get_run("r1")
    assert got is not None and (got.status, got.ended_at) == ("succeeded", 200.5)
    assert store.get_run("nope") is None


def test_list_runs_newest_first_with_limit(store: Store) -> None:
    for i, t in enumerate([5.0, 50.0, 20.0]):
        store.create_run(run(f"r{i}", started=t))
    assert [r.run_id for r in store.list_runs()] == ["r1", "r2", "r0"]
    assert [r.run_id for r in store.list_runs(limit=1)] == ["r1"]


def test_attempts_oldest_first_and_replace(store: Store) -> None:
    store.create_run(run())
    for n in (2, 1):
        store.record_attempt(AttemptRecord("r1", "s", 0, n, "failed", 1, 1.0, 2.0, "boom"))
    store.record_attempt(AttemptRecord("r1", "s", 0, 2, "succeeded", 0, 1.0, 3.0))
    got = store.attempts("r1", "s", 0)
    assert [(a.attempt, a.outcome, a.exit_code) for a in got] == [(1, "failed", 1), (2, "succeeded", 0)]
    assert store.attempts("r1", "s", 1) == []


@pytest.mark.parametrize(
    ("result", "value"),
    [
        (None, None),
        ("text\nwith ünïcode", 3),
        ({"a": [1, 2, {"b": None}]}, ["x", 1.5]),
        ([True, False], {"k": "v"}),
    ],
)
def test_items_keep_json_values_and_outputs(store: Store, result: object, value: object) -> None:
    store.create_run(run())
    arts = [ArtifactRecord("r1", "s", 1, 2, n, "cd" * 32, 7) for n in ("b.txt", "a/x.md")]
    store.complete_item(
        ItemRecord("r1", "s", 1, "succeeded", 2, result=result, value=value, message="ok",
                   started_at=1.0, ended_at=2.0),
        arts,
    )
    [got] = store.items("r1", "s")
    assert (got.result, got.value, got.attempt, got.message) == (result, value, 2, "ok")
    assert [a.name for a in got.outputs] == ["a/x.md", "b.txt"]


def test_complete_item_replaces_and_forget_drops(store: Store) -> None:
    store.create_run(run())
    store.complete_item(ItemRecord("r1", "s", 0, "failed", 1),
                        [ArtifactRecord("r1", "s", 0, 1, "old", "00" * 32, 1)])
    store.complete_item(ItemRecord("r1", "s", 0, "succeeded", 2),
                        [ArtifactRecord("r1", "s", 0, 2, "new", "11" * 32, 2)])
    store.complete_item(ItemRecord("r1", "t", 3, "succeeded", 1), [])
    items = store.items("r1")
    assert [(i.step, i.item, i.status) for i in items] == [("s", 0, "succeeded"), ("t", 3, "succeeded")]
    assert [a.name for a in items[0].outputs] == ["new"]
    store.forget_item("r1", "s", 0)
    assert [(i.step, i.item) for i in store.items("r1")] == [("t", 3)]


def test_record_batch_writes_attempts_and_items_together(store: Store) -> None:
    store.create_run(run())
    store.complete_item(ItemRecord("r1", "s", 0, "failed", 1),
                        [ArtifactRecord("r1", "s", 0, 1, "old", "00" * 32, 1)])
    store.record_batch(
        [AttemptRecord("r1", "s", 0, 1, "failed", 1, 1.0, 2.0, "boom"),
         AttemptRecord("r1", "s", 0, 2, "succeeded", 0, 2.0, 3.0),
         AttemptRecord("r1", "s", 1, 1, "succeeded", 0, 2.0, 3.0)],
        [(ItemRecord("r1", "s", 0, "succeeded", 2),
          [ArtifactRecord("r1", "s", 0, 2, "new", "11" * 32, 2)]),
         (ItemRecord("r1", "s", 1, "succeeded", 1), [])],
    )
    store.record_batch([], [])
    items = store.items("r1", "s")
    assert [(i.item, i.status, i.attempt) for i in items] == [(0, "succeeded", 2), (1, "succeeded", 1)]
    assert [a.name for a in items[0].outputs] == ["new"]
    assert [a.outcome for a in store.attempts("r1", "s", 0)] == ["failed", "succeeded"]
    assert [a.attempt for a in store.attempts("r1", "s", 1)] == [1]


def test_record_batch_replaces_outputs_whichever_steps_had_some(store: Store) -> None:
    # One batch: items of a step with outputs recorded, of a step with none
    # yet, and one whose outputs arrive in it; the next batch completes two
    # of them again. Each item ends with only its latest outputs.
    store.create_run(run())
    out = lambda step, item, attempt, name: ArtifactRecord(  # noqa: E731
        "r1", step, item, attempt, name, f"{attempt:02d}" * 32, attempt)
    store.complete_item(ItemRecord("r1", "s", 0, "failed", 1), [out("s", 0, 1, "old")])
    store.record_batch([], [
        (ItemRecord("r1", "k", 0, "succeeded", 1), []),
        (ItemRecord("r1", "s", 0, "succeeded", 2), [out("s", 0, 2, "new")]),
        (ItemRecord("r1", "k", 1, "succeeded", 1), []),
        (ItemRecord("r1", "t", 0, "failed", 1), [out("t", 0, 1, "partial")]),
        (ItemRecord("r1", "s", 1, "succeeded", 1), [out("s", 1, 1, "a"), out("s", 1, 1, "b")]),
    ])
    store.record_batch([], [
        (ItemRecord("r1", "t", 0, "succeeded", 2), [out("t", 0, 2, "whole")]),
        (ItemRecord("r1", "k", 0, "succeeded", 2), [out("k", 0, 2, "late")]),
        (ItemRecord("r1", "s", 1, "succeeded", 2), [out("s", 1, 2, "b")]),
    ])
    outputs = {(i.step, i.item): [(a.name, a.attempt) for a in i.outputs]
               for i in store.items("r1")}
    assert outputs == {
        ("k", 0): [("late", 2)], ("k", 1): [],
        ("s", 0): [("new", 2)], ("s", 1): [("b", 2)],
        ("t", 0): [("whole", 2)],
    }
    assert {(i.step, i.item): i.attempt for i in store.items("r1")} == {
        ("k", 0): 2, ("k", 1): 1, ("s", 0): 2, ("s", 1): 2, ("t", 0): 2}


def test_items_keep_token_usage(store: Store) -> None:
    """Agent usage is part of the item's record, replaced with it, summed by readers."""
    store.create_run(run())
    used = {"input_tokens": 1200, "output_tokens": 80, "cached_tokens": 1000, "reasoning_tokens": 30,
            "model_calls": 3}
    store.complete_item(ItemRecord("r1", "a", 0, "failed", 1, usage={"input_tokens": 5}), [])
    store.record_batch([], [(ItemRecord("r1", "a", 0, "succeeded", 2, usage=used), []),
                            (ItemRecord("r1", "a", 1, "succeeded", 1, usage=used), []),
                            (ItemRecord("r1", "b", 0, "succeeded", 1), [])])
    items = store.items("r1")
    assert [i.usage for i in items] == [used, used, {}]
    assert sum_usage(items) == {k: 2 * v for k, v in used.items()}
    assert sum_usage([]) == {}


def test_stores_made_before_usage_gain_it(store: Store, tmp_path: Path) -> None:
    """An items table without the usage column (an older store) is migrated on open."""
    store.create_run(run())
    store.complete_item(ItemRecord("r1", "s", 0, "succeeded", 1, usage={"input_tokens": 1}), [])
    store = _reopened_without(store, tmp_path, "items", "usage")
    try:
        [old] = store.items("r1")
        assert old.usage == {} and old.key == "0"
        store.complete_item(ItemRecord("r1", "s", 1, "succeeded", 1, usage={"output_tokens": 2}), [])
        assert [i.usage for i in store.items("r1")] == [{}, {"output_tokens": 2}]
    finally:
        store.close()


def _reopened_without(store: Store, tmp_path: Path, table: str, column: str) -> Store:
    """``store`` closed, ``column`` dropped from ``table`` (a store made before the
    column was), and the store opened again: the migration on open runs."""
    if isinstance(store, SQLiteStore):
        import sqlite3

        store.close()
        with sqlite3.connect(tmp_path / "stockade.db") as db:
            db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        return open_store(None, tmp_path)
    import psycopg

    from stockade.store.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    url = store.conninfo
    store.close()
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(f"ALTER TABLE stockade_{table} DROP COLUMN {column}")
    return open_store(url, tmp_path)


def test_items_keep_why_they_were_not_reused(store: Store, tmp_path: Path) -> None:
    """Each reader gives the reason; a store made before it had the column gains it."""
    store.create_run(run())
    why = "an earlier item matched (run r0, a/#1) but its out/x.txt is gone"
    store.complete_item(ItemRecord("r1", "a", 0, "succeeded", 1, not_reused=why), [])
    store.record_batch([], [(ItemRecord("r1", "a", 1, "succeeded", 1, not_reused="no"), []),
                            (ItemRecord("r1", "a", 2, "succeeded", 1), [])])
    assert [i.not_reused for i in store.items("r1")] == [why, "no", None]
    assert [i.not_reused for i in store.item_page("r1", "a")] == [why, "no", None]
    assert (store.get_item("r1", "a", 0) or ItemRecord("", "", 0, "", 0)).not_reused == why
    assert (store.find_item("r1", "a", key="1") or ItemRecord("", "", 0, "", 0)).not_reused == "no"
    store = _reopened_without(store, tmp_path, "items", "not_reused")
    try:
        assert [i.not_reused for i in store.items("r1")] == [None, None, None]
        store.complete_item(ItemRecord("r1", "a", 3, "succeeded", 1, not_reused=why), [])
        assert store.items("r1")[3].not_reused == why
    finally:
        store.close()


def test_events_in_order_after_id(store: Store) -> None:
    for k in ("a", "b", "c"):
        store.add_event(Event("r1", 1.0, k, {"k": k}))
    store.add_event(Event("r2", 1.0, "other", {}))
    evs = store.events("r1")
    assert [e.kind for e in evs] == ["a", "b", "c"]
    assert [e.kind for e in store.events("r1", after_id=evs[0].id)] == ["b", "c"]
    assert evs[2].data == {"k": "c"}


# -- reading large runs a page at a time (the web UI) ------------------------------


def _fill(store: Store, n: int = 25) -> None:
    """Step ``s``: n items, every 5th failed (attempt 2), item i keyed ``k{i}`` and
    started at i; step ``t``: one record made before keys (key '')."""
    store.create_run(run())
    batch = []
    for i in range(n):
        bad = i % 5 == 0
        arts = [] if bad else [ArtifactRecord("r1", "s", i, 1, f"o{i}.txt", "ab" * 32, i)]
        batch.append((ItemRecord("r1", "s", i, "failed" if bad else "succeeded", 2 if bad else 1,
                                 started_at=float(i), ended_at=float(i) + 0.5, key=f"k{i}"),
                      arts))
    batch.append((ItemRecord("r1", "t", 7, "skipped", 0, started_at=100.0, ended_at=100.0), []))
    store.record_batch([], batch)


@pytest.mark.parametrize(
    ("offset", "limit", "statuses", "expected"),
    [
        (0, 3, None, [0, 1, 2]),
        (10, 4, None, [10, 11, 12, 13]),
        (23, 10, None, [23, 24]),
        (30, 10, None, []),
        (0, 10, ["failed"], [0, 5, 10, 15, 20]),
        (2, 2, ["failed"], [10, 15]),
        (0, 3, ["succeeded", "failed"], [0, 1, 2]),
        (0, 5, [], []),
        (-5, 2, None, [0, 1]),
    ],
)
def test_item_page_pages_and_filters(store: Store, offset: int, limit: int,
                                     statuses: list[str] | None, expected: list[int]) -> None:
    _fill(store)
    page = store.item_page("r1", "s", offset=offset, limit=limit, statuses=statuses)
    assert [i.item for i in page] == expected
    for i in page:
        assert i.key == f"k{i.item}"
        assert [o.name for o in i.outputs] == ([] if i.status == "failed" else [f"o{i.item}.txt"])


def test_item_page_from_an_index(store: Store) -> None:
    _fill(store)
    store.forget_item("r1", "s", 12)
    page = store.item_page("r1", "s", from_index=10, limit=4)
    assert [i.item for i in page] == [10, 11, 13, 14]
    assert [i.item for i in store.item_page("r1", "s", from_index=6, statuses=["failed"])] == \
        [10, 15, 20]
    assert [i.item for i in store.item_page("r1", "s", from_index=20, offset=3)] == [23, 24]


def test_item_page_caps_a_page_at_1000(store: Store) -> None:
    store.create_run(run())
    store.record_batch([], [(ItemRecord("r1", "s", i, "succeeded", 1), []) for i in range(1005)])
    assert len(store.item_page("r1", "s", limit=5000)) == 1000


def test_find_item_by_index_or_key(store: Store) -> None:
    _fill(store)
    by_key = store.find_item("r1", "s", key="k6")
    assert by_key is not None and by_key.item == 6 and [o.name for o in by_key.outputs] == ["o6.txt"]
    by_index = store.find_item("r1", "s", index=6)
    assert by_index == by_key
    # A record made before keys answers to its index as text, as its label shows.
    old = store.find_item("r1", "t", key="7")
    assert old is not None and (old.item, old.label) == (7, "7")
    assert store.find_item("r1", "s", key="6") is None
    assert store.find_item("r1", "s", key="nope") is None
    assert store.find_item("r1", "s", index=99) is None
    assert store.find_item("r2", "s", index=6) is None
    with pytest.raises(ValueError, match="index or a key"):
        store.find_item("r1", "s")


def test_step_and_run_tallies(store: Store) -> None:
    _fill(store)
    store.create_run(run("r2"))
    store.complete_item(ItemRecord("r2", "x", 0, "errored", 1, started_at=5, ended_at=6), [])
    tallies = store.step_tallies("r1")
    assert sorted(tallies) == ["s", "t"]
    s = tallies["s"]
    assert (s.counts, s.total) == ({"failed": 5, "succeeded": 20}, 25)
    assert (s.started_at, s.ended_at) == (0.0, 24.5)
    assert tallies["t"].counts == {"skipped": 1}
    assert store.step_tallies("nope") == {}
    assert store.run_tallies(["r1", "r2", "r3"]) == {
        "r1": {"failed": 5, "succeeded": 20, "skipped": 1}, "r2": {"errored": 1}}
    assert store.run_tallies([]) == {}


def test_step_tallies_of_some_steps(store: Store) -> None:
    _fill(store)
    assert sorted(store.step_tallies("r1", ["t"])) == ["t"]
    assert store.step_tallies("r1", ["s", "nope"])["s"].total == 25
    assert store.step_tallies("r1", []) == {}


def _finish_step(store: Store, step: str, tally: object, *, kind: str = "step_finished",
                 at: float = 1.0) -> None:
    data: dict[str, object] = {"step": step}
    if tally != "absent":
        data["tally"] = tally
    store.add_event(Event("r1", at, kind, data))


#: (run status, events as (kind, step, tally or "absent"), expected counts of s and t).
#: The events' tallies differ from the records (s: 5 failed + 20 succeeded; t: 1
#: skipped), so each case shows which one was read.
_EVENT_TALLY = {"counts": {"succeeded": 3}, "started_at": 1.0, "ended_at": 2.0}
RECORDED = [
    ("running", [("step_finished", "s", _EVENT_TALLY)], {"failed": 5, "succeeded": 20}, {"skipped": 1}),
    ("succeeded", [("step_finished", "s", _EVENT_TALLY), ("step_finished", "t", None)],
     {"succeeded": 3}, None),
    ("failed", [("step_finished", "s", _EVENT_TALLY), ("step_finished", "t", "absent")],
     {"succeeded": 3}, {"skipped": 1}),
    ("succeeded", [("step_finished", "s", _EVENT_TALLY), ("step_started", "s", "absent"),
                   ("step_finished", "t", None)], {"failed": 5, "succeeded": 20}, None),
    # A finished engine wrote a step event for every step with records: t has none here.
    ("interrupted", [("step_started", "s", "absent"), ("step_finished", "s", _EVENT_TALLY)],
     {"succeeded": 3}, None),
    ("succeeded", [], {"failed": 5, "succeeded": 20}, {"skipped": 1}),
]


@pytest.mark.parametrize(("status", "events", "s", "t"), RECORDED)
def test_recorded_tallies(store: Store, status: str, events: list[tuple[str, str, object]],
                          s: dict[str, int], t: dict[str, int] | None) -> None:
    _fill(store)
    for n, (kind, step, tally) in enumerate(events):
        _finish_step(store, step, tally, kind=kind, at=float(n))
    if status != "running":
        store.update_run("r1", status=status, ended_at=200.0)
    record = store.get_run("r1")
    assert record is not None
    got = store.recorded_tallies(record)
    assert got["s"].counts == s
    assert (got["t"].counts if "t" in got else None) == t
    if s == {"succeeded": 3}:
        assert (got["s"].started_at, got["s"].ended_at) == (1.0, 2.0)


def test_item_spans_light_and_filtered(store: Store) -> None:
    _fill(store, n=6)
    spans = store.item_spans("r1")
    assert [(s.step, s.item) for s in spans] == [("s", i) for i in range(6)] + [("t", 7)]
    first = spans[0]
    assert (first.key, first.status, first.attempt, first.started_at, first.ended_at) == \
        ("k0", "failed", 2, 0.0, 0.5)
    assert spans[-1].key == "7"
    assert [s.item for s in store.item_spans("r1", step="s", ended_after=3.0)] == [3, 4, 5]
    assert [s.item for s in store.item_spans("r1", ended_after=6.0)] == [7]


def test_span_bins_count_items_by_step_status_and_slice_of_end(store: Store) -> None:
    # Ends at i + 0.5 for i in 0..9; slices of 2 s from -1: [-1, 1), [1, 3), ...
    _fill(store, n=10)
    store.record_batch([], [(ItemRecord("r1", "t", 8, "skipped", 1, started_at=3.0,
                                        ended_at=3.0), [])])
    got = sorted(store.span_bins("r1", -1.0, 2.0))
    assert got == [
        ("s", "failed", 0, 1), ("s", "failed", 3, 1),          # items 0 and 5
        ("s", "succeeded", 1, 2), ("s", "succeeded", 2, 2),    # 1, 2; 3, 4
        ("s", "succeeded", 3, 1), ("s", "succeeded", 4, 2),    # 6; 7, 8
        ("s", "succeeded", 5, 1),                              # 9
        ("t", "skipped", 2, 1),  # skipped after an attempt; t/7 never ran: left out
    ]
    assert sum(n for *_, n in got) == 11
    assert store.span_bins("nope", 0.0, 1.0) == []


def test_events_of_runs_and_kinds(store: Store) -> None:
    for rid, kind in [("r1", "a"), ("r2", "a"), ("r1", "b"), ("r3", "a"), ("r1", "c")]:
        store.add_event(Event(rid, 1.0, kind, {"r": rid}))
    got = store.events_of(["r1", "r2"], ["a", "c"])
    assert [(e.run_id, e.kind) for e in got] == [("r1", "a"), ("r2", "a"), ("r1", "c")]
    assert [e.kind for e in store.events_of(["r1"], ["a", "c"], after_id=got[0].id)] == ["c"]
    assert store.events_of([], ["a"]) == [] and store.events_of(["r1"], []) == []


# -- leases (injected clock) ----------------------------------------------------

T0 = 1_000_000.0


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # (holder, now) -> token or None
        ([("a", T0), ("a", T0 + 1)], [1, 1]),                       # same holder keeps the token
        ([("a", T0), ("b", T0 + 5)], [1, None]),                    # held, not expired
        ([("a", T0), ("b", T0 + 10)], [1, 2]),                      # expired exactly at ttl
        ([("a", T0), ("b", T0 + 11), ("a", T0 + 12)], [1, 2, None]),  # old holder is out
        ([("a", T0), ("b", T0 + 11), ("a", T0 + 30)], [1, 2, 3]),   # and comes back higher
        ([("a", T0), ("a", T0 + 50)], [1, 1]),                      # nobody took it: same token
    ],
)
def test_lease_tokens(store: Store, steps: list[tuple[str, float]], expected: list[int | None]) -> None:
    got = []
    for holder, now in steps:
        lease = store.acquire_lease("L", holder, 10.0, now=now)
        got.append(None if lease is None else lease.token)
        if lease is not None:
            assert (lease.holder, lease.expires_at) == (holder, now + 10.0)
    assert got == expected


def test_lease_renewal(store: Store) -> None:
    lease = store.acquire_lease("L", "a", 10.0, now=T0)
    assert lease is not None
    renewed = store.renew_lease("L", "a", lease.token, 10.0, now=T0 + 9)
    assert renewed is not None and renewed.expires_at == T0 + 19
    assert store.acquire_lease("L", "b", 10.0, now=T0 + 15) is None   # the renewal counted
    assert store.renew_lease("L", "a", lease.token, 10.0, now=T0 + 20) is None  # expired: lost
    assert store.renew_lease("L", "a", lease.token + 1, 10.0, now=T0 + 12) is None  # wrong token
    b = store.acquire_lease("L", "b", 10.0, now=T0 + 20)
    assert b is not None and b.token == 2
    assert store.renew_lease("L", "a", lease.token, 10.0, now=T0 + 21) is None


def test_lease_release_waits_for_last_user(store: Store) -> None:
    assert store.acquire_lease("L", "run1", 100.0, user="i0", now=T0) is not None
    assert store.acquire_lease("L", "run1", 100.0, user="i1", now=T0) is not None
    store.release_lease("L", "run1", user="i0", now=T0 + 1)
    assert store.acquire_lease("L", "run2", 100.0, now=T0 + 2) is None
    store.release_lease("L", "run1", user="i1", now=T0 + 3)
    got = store.acquire_lease("L", "run2", 100.0, now=T0 + 3)
    assert got is not None and got.token == 2
    store.release_lease("L", "run1", user="i1", now=T0 + 4)  # not the holder: no effect
    assert store.acquire_lease("L", "run1", 100.0, now=T0 + 5) is None
    lease = store.get_lease("L")
    assert lease is not None and (lease.holder, lease.token) == ("run2", 2)


def test_lease_uses_database_clock(store: Store) -> None:
    import time

    # A second long enough that a busy machine cannot let it lapse between
    # the two acquisitions below; the test then waits it out for real.
    ttl = 1.0
    before = time.time()
    lease = store.acquire_lease("L", "a", ttl)
    assert lease is not None and before < lease.expires_at < time.time() + ttl + 1
    assert store.acquire_lease("L", "b", ttl) is None
    time.sleep(ttl + 0.05)
    b = store.acquire_lease("L", "b", ttl)
    assert b is not None and b.token == 2
    assert abs(store.db_now() - time.time()) < 1.0


def test_lease_is_exclusive_under_contention(store: Store, tmp_path: Path) -> None:
    """Threads with their own store object race for one lease: exactly one wins."""
    url = getattr(store, "conninfo", None) or f"sqlite:///{store.path}"  # type: ignore[attr-defined]
    winners: list[str] = []
    barrier = threading.Barrier(6)

    def race(i: int) -> None:
        s = open_store(url, tmp_path)
        barrier.wait()
        if s.acquire_lease("C", f"h{i}", 60.0) is not None:
            winners.append(f"h{i}")
        s.close()

    threads = [threading.Thread(target=race, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    lease = store.get_lease("C")
    assert lease is not None and lease.holder == winners[0] and lease.token == 1


# -- fences ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "accepted", "final"),
    [
        ([1, 2, 3], [True, True, True], 3),
        ([3, 1], [True, False], 3),
        ([2, 2], [True, True], 2),         # the same holder writing again
        ([5, 4, 6, 5], [True, False, True, False], 6),
    ],
)
def test_fence_only_moves_up(store: Store, tokens: list[int], accepted: list[bool], final: int) -> None:
    got = [store.advance_fence("S", t, f"run{t}").accepted for t in tokens]
    assert got == accepted
    fence = store.get_fence("S")
    assert fence is not None and (fence.high_water, fence.holder) == (final, f"run{final}")
    refused = store.advance_fence("S", final - 1, "late")
    assert (refused.accepted, refused.high_water, refused.holder) == (False, final, f"run{final}")
    assert store.get_fence("other") is None


# -- effects ----------------------------------------------------------------------


def test_effect_claim_done_is_final(store: Store) -> None:
    assert store.get_effect("r1/pub/0") is None
    got = store.claim_effect(effect())
    assert (got.status, got.token, got.finished_at) == ("claimed", 3, None)
    again = store.claim_effect(effect(attempt=2, token=4, claimed_at=11.0))
    assert (again.status, again.attempt, again.token) == ("claimed", 2, 4)
    store.finish_effect("r1/pub/0", status="done", token=4, at=12.0, message="applied")
    after = store.claim_effect(effect(attempt=3, token=9))
    assert (after.status, after.attempt, after.token, after.finished_at) == ("done", 2, 4, 12.0)
    store.finish_effect("r1/pub/0", status="fenced", token=9, at=13.0)
    final = store.get_effect("r1/pub/0")
    assert final is not None and (final.status, final.message) == ("done", "applied")


def test_effect_fenced_and_listing(store: Store) -> None:
    store.claim_effect(effect("r1/pub/1"))
    store.claim_effect(effect("r1/pub/0"))
    store.claim_effect(effect("r2/pub/0"))
    store.finish_effect("r1/pub/1", status="fenced", token=3, at=5.0, message="token 3 < 4")
    got = store.effects("r1")
    assert [(e.key, e.status) for e in got] == [("r1/pub/0", "claimed"), ("r1/pub/1", "fenced")]
    with pytest.raises(ValueError):
        store.finish_effect("r1/pub/0", status="claimed", token=1, at=1.0)


def test_last_publish_swap(store: Store) -> None:
    a = PublishRecord("L", "r1", "2026-09-13", "aa" * 32, "fp1", 1.0, run_started_at=0.5, token=3)
    b = PublishRecord("L", "r2", "2026-09-14", "aa" * 32, "fp2", 2.0, run_started_at=1.5, token=4)
    assert store.get_last_publish("L") is None
    assert store.swap_last_publish(a) is None
    assert store.swap_last_publish(b) == a
    assert store.get_last_publish("L") == b
    assert store.swap_last_publish(a) == b
    assert store.get_last_publish("other") is None


def test_sqlite_store_migrates_old_last_publish(tmp_path: Path) -> None:
    import sqlite3

    with sqlite3.connect(tmp_path / "stockade.db") as db:
        db.execute("CREATE TABLE last_publish (lease TEXT PRIMARY KEY, run_id TEXT NOT NULL,"
                   " key TEXT NOT NULL, payload_sha256 TEXT NOT NULL,"
                   " input_fingerprint TEXT NOT NULL, at REAL NOT NULL)")
        db.execute("INSERT INTO last_publish VALUES ('L', 'r0', 'k', 'x', 'fp', 1.0)")
    s = open_store(None, tmp_path)
    assert s.get_last_publish("L") == PublishRecord("L", "r0", "k", "x", "fp", 1.0, 0.0, 0)
    s.close()


def test_sqlite_clock_expression_works_on_this_sqlite() -> None:
    """``unixepoch('subsec')`` only exists from SQLite 3.42; the store must not rely on it."""
    import sqlite3
    import time

    from stockade.store.sqlite import NOW_SQL

    db = sqlite3.connect(":memory:")
    if sqlite3.sqlite_version_info < (3, 42):
        # Before 3.38 unixepoch() does not exist at all.
        with contextlib.suppress(sqlite3.OperationalError):
            assert db.execute("SELECT unixepoch('subsec')").fetchone()[0] is None
    now = db.execute(f"SELECT {NOW_SQL}").fetchone()[0]
    assert isinstance(now, float) and abs(now - time.time()) < 1.0


# -- opening ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "error"),
    [("mysql://x/y", UserError), ("sqlite:///", UserError),
     ("postgresql://nobody@/x?host=/nonexistent-socket-dir&connect_timeout=2", InfraError)],
)
def test_open_store_refuses(tmp_path: Path, url: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        open_store(url, tmp_path)


def test_open_store_default_and_sqlite_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = open_store(None, tmp_path)
    assert isinstance(s, SQLiteStore) and Path(s.path) == tmp_path / "stockade.db"
    s.close()
    monkeypatch.chdir(tmp_path)
    s = open_store("sqlite:///sub/other.db", tmp_path / "ignored")
    assert isinstance(s, SQLiteStore) and (tmp_path / "sub" / "other.db").exists()
    s.close()
    s = open_store(f"sqlite:///{tmp_path}/abs.db", tmp_path)
    assert (tmp_path / "abs.db").exists()
    s.close()


def test_store_survives_fork(store: Store) -> None:
    """A child made by fork() gets its own connections, and the parent's still work."""
    import os

    store.create_run(run("parent"))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        try:
            store.create_run(run("child"))
            code = 0 if store.get_run("parent") is not None else 1
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert {r.run_id for r in store.list_runs()} == {"parent", "child"}


# -- finding, deleting, keys, reuse --------------------------------------------


def test_find_runs_by_literal_prefix(store: Store) -> None:
    for rid, at in (("abcd-1", 1.0), ("abcd-2", 2.0), ("ab_d-3", 3.0), ("xyz", 4.0)):
        store.create_run(run(rid, at))
    assert [r.run_id for r in store.find_runs("abcd")] == ["abcd-2", "abcd-1"]
    # "_" and "%" are taken literally, never as LIKE wildcards.
    assert [r.run_id for r in store.find_runs("ab_d")] == ["ab_d-3"]
    assert store.find_runs("ab%") == []
    assert store.find_runs("ABCD") == []


def test_items_keep_their_keys_and_reuse_origin(store: Store) -> None:
    store.create_run(run())
    origin = {"run_id": "r0", "step": "a", "item": 3, "attempt": 1}
    store.complete_item(ItemRecord("r1", "a", 0, "succeeded", 1, key="S003",
                                   reused_from=origin), [])
    store.complete_item(ItemRecord("r1", "a", 1, "succeeded", 1), [])
    got = {i.item: i for i in store.items("r1")}
    assert got[0].key == "S003" and got[0].label == "S003" and got[0].reused_from == origin
    assert got[1].label == "1" and got[1].reused_from is None


def test_delete_run_forgets_everything_of_that_run_only(store: Store) -> None:
    for rid in ("r1", "r2"):
        store.create_run(run(rid))
        art = ArtifactRecord(rid, "a", 0, 1, "o.txt", "cd" * 32, 3)
        store.record_batch([AttemptRecord(rid, "a", 0, 1, "succeeded", 0, 1.0, 2.0)],
                           [(ItemRecord(rid, "a", 0, "succeeded", 1), [art])])
        store.add_event(Event(rid, 1.0, "x", {}))
        store.index_reuse([ReuseEntry(f"k-{rid}", rid, "a", 0, 1, 1.0)])
    store.delete_run("r1")
    assert store.get_run("r1") is None and store.items("r1") == []
    assert store.attempts("r1", "a", 0) == [] and store.events("r1") == []
    assert store.reuse_candidates(["k-r1"]) == {}
    assert store.get_run("r2") is not None and len(store.items("r2")) == 1
    assert len(store.reuse_candidates(["k-r2"])["k-r2"]) == 1


def test_a_deleted_runs_id_is_never_given_again(store: Store) -> None:
    # A sink's idempotency key is run_id/step/item: a new run under a deleted
    # run's id would have its publish taken for the old one's, already applied.
    store.create_run(run("nightly"))
    with pytest.raises(RunExists) as taken:
        store.create_run(run("nightly"))
    assert not taken.value.removed
    store.delete_run("nightly")
    store.delete_run("nightly")  # twice: still one record of the id
    with pytest.raises(RunExists) as removed:
        store.create_run(run("nightly"))
    assert removed.value.removed
    assert store.get_run("nightly") is None
    store.create_run(run("nightly-2"))


def test_reuse_candidates_newest_first_with_outputs(store: Store) -> None:
    for rid, at in (("old", 1.0), ("new", 2.0), ("this", 3.0)):
        store.create_run(run(rid, at, root=f"/roots/{rid}"))
        arts = [ArtifactRecord(rid, "a", 0, 2, "o.txt", "cd" * 32, 3)]
        store.complete_item(ItemRecord(rid, "a", 0, "succeeded", 2), arts)
        store.index_reuse([ReuseEntry("k", rid, "a", 0, 2, at)])
    got = store.reuse_candidates(["k", "missing"], exclude_run="this")
    assert list(got) == ["k"]
    assert [(c.run_id, c.root) for c in got["k"]] == [("new", "/roots/new"), ("old", "/roots/old")]
    assert [o.name for o in got["k"][0].outputs] == ["o.txt"]
    assert len(store.reuse_candidates(["k"], limit=1)["k"]) == 1
    many = [f"k{i}" for i in range(1200)]
    assert store.reuse_candidates(many) == {}


def test_reuse_reads_and_writes_in_chunks_lose_nothing(store: Store,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Lists longer than a dialect takes at once (``_LIST_LIMIT``, made small
    here where there is one) are split: every key, item and output comes back,
    and the index trims every key of a batch."""
    from stockade.store.base import REUSE_KEEP

    if getattr(store, "_LIST_LIMIT", None) is not None:
        monkeypatch.setattr(store, "_LIST_LIMIT", 7)
    n = 50
    for r in range(REUSE_KEEP + 1):
        rid = f"r{r}"
        store.create_run(run(rid, float(r)))
        store.record_batch([], [(ItemRecord(rid, "a", i, "succeeded", 1),
                                 [ArtifactRecord(rid, "a", i, 1, f"o{i}.txt", "cd" * 32, i)])
                                for i in range(n)])
        store.index_reuse([ReuseEntry(f"k{i}", rid, "a", i, 1, float(r)) for i in range(n)])
    got = store.reuse_candidates([f"k{i}" for i in range(n)], limit=REUSE_KEEP + 1)
    assert sorted(got) == sorted(f"k{i}" for i in range(n))
    for i in range(n):
        # Trimmed to REUSE_KEEP per key, newest first, each with its own output.
        assert [c.run_id for c in got[f"k{i}"]] == [f"r{r}" for r in range(REUSE_KEEP, 0, -1)]
        assert all([(o.name, o.size) for o in c.outputs] == [(f"o{i}.txt", i)]
                   for c in got[f"k{i}"])


def test_the_reuse_index_keeps_the_newest_entries_of_a_key(store: Store) -> None:
    """A key reused night after night keeps REUSE_KEEP entries, not one per run."""
    from stockade.store.base import REUSE_KEEP

    for n in range(REUSE_KEEP + 3):
        rid = f"night{n}"
        store.create_run(run(rid, float(n)))
        store.complete_item(ItemRecord(rid, "a", 0, "succeeded", 1), [])
        store.index_reuse([ReuseEntry("k", rid, "a", 0, 1, float(n)),
                           ReuseEntry(f"only-{n}", rid, "a", 0, 1, float(n))])
    got = store.reuse_candidates(["k"], limit=REUSE_KEEP + 3)["k"]
    newest = [f"night{n}" for n in range(REUSE_KEEP + 2, 2, -1)]
    assert [c.run_id for c in got] == newest
    # Other keys keep their own entries.
    assert all(len(store.reuse_candidates([f"only-{n}"])[f"only-{n}"]) == 1
               for n in range(REUSE_KEEP + 3))


def test_reused_counts_per_step(store: Store) -> None:
    store.create_run(run())
    origin = {"run_id": "r0", "step": "a", "item": 0, "attempt": 1}
    store.record_batch([], [
        (ItemRecord("r1", "a", 0, "succeeded", 1, reused_from=origin), []),
        (ItemRecord("r1", "a", 1, "succeeded", 1, reused_from=origin), []),
        (ItemRecord("r1", "a", 2, "succeeded", 1), []),
        (ItemRecord("r1", "b", 0, "succeeded", 1, reused_from=origin), []),
    ])
    assert store.reused_counts("r1") == {"a": 2, "b": 1}
    assert store.reused_counts("nope") == {}
