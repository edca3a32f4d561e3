"""``publish()`` end to end against a real store and a real SQLite sink."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stockade.publish import FLAT_SERIES_EVENT, LEASE_WAIT_EVENT, PublishRequest, publish
from stockade.publish.sink import Write
from stockade.publish.sql import SQLiteSink
from stockade.store import ArtifactRecord, Effect, ItemRecord, RunRecord, Store, open_store
from tests.publish.legacy_provenance import legacy_check_provenance

NOW = 2_000_000_000.0
DAY = 86400.0


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url = None if request.param == "sqlite" else request.getfixturevalue("pg_url")
    s = open_store(url, tmp_path / "root")
    yield s
    s.close()


def req(tmp_path: Path, run: str = "A", item: int = 0, key: str = "2026-09-14",
        payload: Any = None, **kw: Any) -> PublishRequest:
    base: dict[str, Any] = dict(
        run_id=run, step="publish", item=item, attempt=1,
        to="sqlite:///sink/reports.db?table=daily_report", base_dir=tmp_path, key=key,
        payload={"total": 3} if payload is None else payload, lease="wf.publish", lease_ttl=30.0,
        max_age=DAY, run_started_at=NOW - 60, allow_stale=False, input_fingerprint=f"fp-{run}",
    )
    base.update(kw)
    return PublishRequest(**base)


def table(tmp_path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(tmp_path / "sink" / "reports.db") as db:
        return list(db.execute(
            "SELECT key, payload, fencing_token, run_id FROM daily_report ORDER BY key"))


def effects_in_sink(tmp_path: Path) -> list[str]:
    with sqlite3.connect(tmp_path / "sink" / "reports.db") as db:
        return [r[0] for r in db.execute("SELECT idempotency_key FROM stockade_sink_effects")]


def clock() -> float:
    return NOW


def test_publish_then_newer_run_wins(store: Store, tmp_path: Path) -> None:
    a = publish(req(tmp_path, "A"), store, clock=clock)
    b = publish(req(tmp_path, "B", payload={"total": 4}), store, clock=clock)
    assert (a.status, a.token, b.status, b.token) == ("succeeded", 1, "succeeded", 2)
    assert table(tmp_path) == [("2026-09-14", '{"total": 4}', 2, "B")]
    effect = store.get_effect("B/publish/0")
    assert effect is not None and (effect.status, effect.token) == ("done", 2)


@pytest.mark.parametrize("times", [2, 3, 4, 5])
def test_replayed_publish_is_applied_once(store: Store, tmp_path: Path, times: int) -> None:
    outs = [publish(req(tmp_path, attempt=n + 1), store, clock=clock) for n in range(times)]
    assert [o.already_applied for o in outs] == [False] + [True] * (times - 1)
    assert {o.token for o in outs} == {1}
    assert effects_in_sink(tmp_path) == ["A/publish/0"]


def test_finished_run_resume_writes_nothing(store: Store, tmp_path: Path) -> None:
    publish(req(tmp_path, "A"), store, clock=clock)
    db = tmp_path / "sink" / "reports.db"
    before = db.stat().st_mtime_ns, table(tmp_path)
    # Even past its window and with a changed payload: the effect is done.
    out = publish(req(tmp_path, "A", payload={"total": 99}, run_started_at=NOW - 3 * DAY), store,
                  clock=clock)
    assert (out.status, out.already_applied, out.token) == ("succeeded", True, 1)
    assert (db.stat().st_mtime_ns, table(tmp_path)) == before


def test_claimed_effect_that_landed_is_reconciled_not_rewritten(store: Store, tmp_path: Path) -> None:
    """A crash after the sink committed but before the store heard of it."""
    r = req(tmp_path, "A")
    lease = store.acquire_lease(r.lease, "A", 30.0, user=r.idempotency_key)
    assert lease is not None
    store.claim_effect(Effect(key=r.idempotency_key, run_id="A", step="publish", item=0,
                              attempt=1, lease=r.lease, sink=r.to, sink_key=r.key,
                              payload_sha256="x", token=lease.token, claimed_at=NOW))
    sink = SQLiteSink(tmp_path / "sink" / "reports.db", "daily_report")
    assert sink.write(Write(r.idempotency_key, r.key, r.payload, "A", lease.token, r.lease)).status == "applied"
    sink.close()
    # ... process dies here; its lease user is never released. Resume:
    out = publish(dataclasses.replace(r, attempt=2), store, clock=clock)
    assert (out.status, out.already_applied, out.token) == ("succeeded", True, lease.token)
    assert "reconciled" in out.message
    assert effects_in_sink(tmp_path) == ["A/publish/0"]
    done = store.get_effect(r.idempotency_key)
    assert done is not None and done.status == "done"
    # The lease went with the reconciliation: another run can take it at once.
    b = publish(req(tmp_path, "B"), store, clock=clock, lease_wait=0)
    assert (b.status, b.token) == ("succeeded", lease.token + 1)


def test_claimed_effect_that_did_not_land_is_written_once(store: Store, tmp_path: Path) -> None:
    r = req(tmp_path, "A")
    store.claim_effect(Effect(key=r.idempotency_key, run_id="A", step="publish", item=0,
                              attempt=1, lease=r.lease, sink=r.to, sink_key=r.key,
                              payload_sha256="x", token=None, claimed_at=NOW))
    out = publish(dataclasses.replace(r, attempt=2), store, clock=clock)
    assert (out.status, out.already_applied) == ("succeeded", False)
    assert table(tmp_path) == [("2026-09-14", '{"total": 3}', 1, "A")]


def test_stale_holder_is_fenced_and_stays_fenced(store: Store, tmp_path: Path) -> None:
    """A's lease expires mid-publish, B takes it and writes; A's late write changes nothing."""
    r_a = req(tmp_path, "A")
    old = store.acquire_lease(r_a.lease, "A", 30.0, now=store.db_now() - 100)
    assert old is not None
    b = publish(req(tmp_path, "B", key="2026-09-15"), store, clock=clock)
    assert (b.status, b.token) == ("succeeded", 2)
    sink = SQLiteSink(tmp_path / "sink" / "reports.db", "daily_report")
    late = sink.write(Write(r_a.idempotency_key, r_a.key, r_a.payload, "A", old.token, r_a.lease))
    assert (late.status, late.winner_token) == ("fenced", 2)
    assert table(tmp_path) == [("2026-09-15", '{"total": 3}', 2, "B")]


def test_fenced_item_is_not_rewritten_on_resume(store: Store, tmp_path: Path) -> None:
    r = req(tmp_path, "A")
    store.claim_effect(Effect(key=r.idempotency_key, run_id="A", step="publish", item=0,
                              attempt=1, lease=r.lease, sink=r.to, sink_key=r.key,
                              payload_sha256="x", token=1, claimed_at=NOW))
    store.finish_effect(r.idempotency_key, status="fenced", token=1, at=NOW,
                        message="fenced out at sink: token 1 < newer token 2 (written by run B)")
    out = publish(dataclasses.replace(r, attempt=2), store, clock=clock)
    assert out.status == "fenced" and "newer token 2" in out.message
    assert not (tmp_path / "sink" / "reports.db").exists()


def test_row_with_higher_token_fences_the_run(store: Store, tmp_path: Path) -> None:
    sink = SQLiteSink(tmp_path / "sink" / "reports.db", "daily_report")
    sink.write(Write("X/publish/0", "2026-09-14", {"v": 1}, "X", 41, "other-lease"))
    sink.close()
    out = publish(req(tmp_path, "A"), store, clock=clock)
    assert (out.status, out.token, out.winner_token) == ("fenced", 1, 41)
    assert "token 1 < newer token 41" in out.message and "run X" in out.message
    assert table(tmp_path) == [("2026-09-14", '{"v": 1}', 41, "X")]


@pytest.mark.parametrize(
    ("age", "allow_stale", "max_age", "status"),
    [
        (DAY - 1, False, DAY, "succeeded"),
        (DAY + 1, False, DAY, "failed"),
        (DAY + 1, True, DAY, "succeeded"),
        (3601, False, 3600, "failed"),
        (7 * DAY, True, 3600, "succeeded"),
    ],
)
def test_run_window(store: Store, tmp_path: Path, age: float, allow_stale: bool, max_age: float,
                    status: str) -> None:
    out = publish(req(tmp_path, run_started_at=NOW - age, allow_stale=allow_stale,
                      max_age=max_age), store, clock=clock)
    assert out.status == status
    if status == "failed":
        assert "--allow-stale" in out.message and "publish window" in out.message
        assert not (tmp_path / "sink" / "reports.db").exists()


TEXT = "hello"
SHA = hashlib.sha256(TEXT.encode()).hexdigest()


def art(run: str, sha: str = SHA, text: str = TEXT, **meta: Any) -> dict[str, Any]:
    """An artifact reference in the engine's form (``Artifact.__stockade_json__``)."""
    ref = {"run_id": run, "step": "analyse", "item": 2, "attempt": 1, "name": "report.md",
           "sha256": sha, "size": len(text.encode())} | meta
    return {"$artifact": ref, "text": text}


def record_report(store: Store, run: str) -> None:
    """Run ``run`` made analyse/2:out/report.md holding ``TEXT``."""
    store.create_run(RunRecord(run, "wf", "wf.yaml", "0" * 64, "/r", "running", NOW - 60))
    store.complete_item(ItemRecord(run, "analyse", 2, "succeeded", 1),
                        [ArtifactRecord(run, "analyse", 2, 1, "report.md", SHA, len(TEXT))])


@pytest.mark.parametrize(
    ("payload", "refused"),
    [
        (art("A"), None),
        ({"report": art("A"), "rows": [1, 2]}, None),
        ({"report": {"$artifact": art("A")["$artifact"]}}, None),   # no text: a big or binary file
        ([art("A"), {"nested": [art("OLD")]}], "from run OLD"),
        ({"report": art("OLD")}, "from run OLD"),
        # The forgeries: this run's id and a real hash, with other text ...
        ({"report": art("A", text="forged")}, "its text is not the artifact's content"),
        ({"report": art("A", text="forged", size=5)}, "its text is not the artifact's content"),
        # ... a step that does not exist ...
        ({"report": art("A", step="ghost")}, "no step 'ghost'"),
        # ... an output, item, attempt, sha256 or size the run never recorded.
        ({"report": art("A", name="other.md")}, "recorded no output 'other.md' of analyse/2"),
        ({"report": art("A", item=3)}, "recorded no output 'report.md' of analyse/3"),
        ({"report": art("A", attempt=2)}, "has attempt 2, but run A recorded 1"),
        ({"report": {"$artifact": art("A", sha="cd" * 32)["$artifact"]}},
         "has sha256 " + "cd" * 32 + ", but run A recorded"),
        ({"report": {"$artifact": art("A", size=9)["$artifact"]}}, "has size 9, but run A recorded 5"),
        # Not the engine's shape.
        ({"$artifact": {"step": "x"}}, "from run None"),
        ({"$artifact": "not a dict"}, "its '$artifact' is not an object"),
        ({"x": art("A") | {"note": "trust me"}}, "keys an artifact reference does not have ('note')"),
        ({"x": {"$artifact": art("A")["$artifact"] | {"extra": 1}}}, "does not have exactly the fields"),
        ({"x": {"$artifact": art("A")["$artifact"] | {"item": "2"}}}, "its 'item' is not an integer"),
        ({"x": {"$artifact": art("A")["$artifact"] | {"item": True}}}, "its 'item' is not an integer"),
        ({"x": art("A") | {"text": 5}}, "its text is not a string"),
    ],
)
def test_payload_provenance(store: Store, tmp_path: Path, payload: Any, refused: str | None) -> None:
    record_report(store, "A")
    out = publish(req(tmp_path, payload=payload), store, clock=clock)
    if refused is None:
        assert out.status == "succeeded", out.message
        assert [json.loads(r[1]) for r in table(tmp_path)] == [payload]
    else:
        assert out.status == "failed" and "refused" in out.message and refused in out.message, out.message
        assert not out.retryable  # the payload is wrong: another attempt would only repeat it
        assert not (tmp_path / "sink" / "reports.db").exists()


@pytest.mark.parametrize("forged", [
    art("A", text="forged"),                 # this run's id, a real hash, other text
    art("A", step="ghost", text="forged"),   # a step that does not exist
])
def test_forged_references_passed_the_old_check(store: Store, tmp_path: Path,
                                                forged: dict[str, Any]) -> None:
    record_report(store, "A")
    assert legacy_check_provenance({"report": forged}, "A", store) is None
    out = publish(req(tmp_path, payload={"report": forged}), store, clock=clock)
    assert out.status == "failed" and "refused" in out.message


@pytest.mark.parametrize(
    ("first", "second", "fp_same", "warned"),
    [
        ({"total": 3}, {"total": 3}, False, True),       # the seed's flat day-over-day series
        ({"total": 3}, {"total": 4}, False, False),
        ({"total": 3}, {"total": 3}, True, False),       # same inputs, same answer: fine
        (art("A"), art("B"), False, True),               # same bytes from two runs
    ],
)
def test_flat_series_warning(store: Store, tmp_path: Path, first: Any, second: Any, fp_same: bool,
                             warned: bool) -> None:
    record_report(store, "A")
    record_report(store, "B")
    publish(req(tmp_path, "A", key="2026-09-13", payload=first), store, clock=clock)
    out = publish(req(tmp_path, "B", key="2026-09-14", payload=second,
                      input_fingerprint="fp-A" if fp_same else "fp-B"), store, clock=clock)
    assert out.status == "succeeded"
    events = [e for e in store.events("B") if e.kind == FLAT_SERIES_EVENT]
    if warned:
        assert len(out.warnings) == 1 and "run A" in out.warnings[0]
        assert len(events) == 1 and events[0].data["previous_run"] == "A"
    else:
        assert out.warnings == () and events == []


def test_lease_held_by_live_run_fails_after_waiting(store: Store, tmp_path: Path) -> None:
    assert store.acquire_lease("wf.publish", "other-run", 60.0) is not None
    slept: list[float] = []
    out = publish(req(tmp_path), store, clock=clock, sleep=slept.append, lease_wait=2.0)
    assert out.status == "failed" and "held by other-run (token 1)" in out.message
    assert sum(slept) >= 2.0 and not (tmp_path / "sink" / "reports.db").exists()
    [waiting] = [e for e in store.events("A") if e.kind == LEASE_WAIT_EVENT]
    assert (waiting.data["holder"], waiting.data["max_wait"]) == ("other-run", 2.0)


def test_items_of_one_run_share_the_token(store: Store, tmp_path: Path) -> None:
    outs = [publish(req(tmp_path, "A", item=i, key=f"k{i}"), store, clock=clock) for i in range(3)]
    assert [o.token for o in outs] == [1, 1, 1]
    assert publish(req(tmp_path, "B", key="k9"), store, clock=clock, lease_wait=0).token == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"to": "ftp://x/y"}, "unknown sink"),
        ({"to": "sqlite:///x.db"}, "?table=NAME"),
        ({"key": ""}, "key rendered to an empty string"),
        ({"payload": {"x": float("nan")}}, "not a JSON value"),
        ({"payload": {"x": object()}}, "not a JSON value"),
    ],
)
def test_bad_request_is_a_failed_outcome(store: Store, tmp_path: Path, change: dict[str, Any],
                                         message: str) -> None:
    out = publish(req(tmp_path, **change), store, clock=clock)
    assert out.status == "failed" and message in out.message
    assert not (tmp_path / "sink").exists()


@pytest.mark.parametrize(
    ("a_started", "allow_stale", "status"),
    [
        (NOW - 120, False, "fenced"),      # A is older than B, which already published
        (NOW - 120, True, "succeeded"),    # the operator insists
        (NOW - 60, False, "succeeded"),    # same start: not older
        (NOW - 30, False, "succeeded"),    # A is the newer run
    ],
)
def test_older_run_does_not_overwrite_newer(store: Store, tmp_path: Path, a_started: float,
                                            allow_stale: bool, status: str) -> None:
    """B started after A but published first; A's later publish must not undo it."""
    b = publish(req(tmp_path, "B", payload={"total": 4}, run_started_at=NOW - 60), store, clock=clock)
    assert (b.status, b.token) == ("succeeded", 1)
    a = publish(req(tmp_path, "A", run_started_at=a_started, allow_stale=allow_stale), store,
                clock=clock)
    assert a.status == status
    if status == "fenced":
        assert a.winner_token == 1 and "run B" in a.message and "--allow-stale" in a.message
        assert table(tmp_path) == [("2026-09-14", '{"total": 4}', 1, "B")]
    else:
        assert table(tmp_path)[0][3] == "A"


def test_rerun_of_crashed_item_frees_the_lease_even_when_it_refuses(
    store: Store, tmp_path: Path
) -> None:
    """Item A/publish/0 died holding the lease; its rerun is refused (window) yet lets
    go of the lease, so the next run does not wait out the TTL."""
    assert store.acquire_lease("wf.publish", "A", 300.0, user="A/publish/0") is not None
    out = publish(req(tmp_path, "A", run_started_at=NOW - 2 * DAY), store, clock=clock)
    assert out.status == "failed" and "publish window" in out.message
    b = publish(req(tmp_path, "B"), store, clock=clock, lease_wait=0)
    assert (b.status, b.token) == ("succeeded", 2)


def test_short_ttl_waits_for_a_live_holder(store: Store, tmp_path: Path) -> None:
    """A keeps its 0.5 s lease alive for 1.5 s; B, with the same short TTL, waits it out
    instead of giving up after one TTL, then publishes with the next token.

    A renews every 0.05 s: only a stall of 0.45 s on a busy machine would let B in early."""
    import threading
    import time

    assert store.acquire_lease("wf.publish", "A", 0.5, user="A/publish/0") is not None

    def keep_alive() -> None:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            store.acquire_lease("wf.publish", "A", 0.5, user="A/publish/0")
            time.sleep(0.05)
        store.release_lease("wf.publish", "A", user="A/publish/0")

    t = threading.Thread(target=keep_alive)
    t.start()
    started = time.monotonic()
    b = publish(req(tmp_path, "B", lease_ttl=0.5), store, clock=clock)
    t.join()
    assert (b.status, b.token) == ("succeeded", 2)
    assert time.monotonic() - started >= 1.4
