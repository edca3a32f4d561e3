"""``runner.ledger``: the engine's records reach a real SQLite store in batches,
masked, on an injected clock (no sleeping)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.runner.attempt import Outcome
from stockade.runner.env import Masker
from stockade.runner.ledger import FLUSH_EVERY, FLUSH_SECONDS, Ledger
from stockade.runner.status import AttemptStatus, ItemStatus
from stockade.store import RunRecord, Store, open_store
from stockade.workspace.artifacts import Output

SECRET = "hunter2-very-secret"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(None, tmp_path)
    s.create_run(RunRecord(run_id="r1", workflow="wf", workflow_path="/w/wf.yaml",
                           workflow_sha256="ab" * 32, root=str(tmp_path), status="running",
                           started_at=1.0))
    yield s
    s.close()


@pytest.fixture
def mono() -> Clock:
    return Clock()


@pytest.fixture
def ledger(store: Store, mono: Clock) -> Ledger:
    return Ledger("r1", store, Masker([SECRET]), clock=lambda: 5.0, monotonic=mono)


def ok(attempt: int = 1, **kw: object) -> Outcome:
    base: dict[str, object] = dict(started_at=2.0, ended_at=3.0, exit_code=0)
    base.update(kw)
    return Outcome(AttemptStatus.SUCCEEDED, attempt, **base)  # type: ignore[arg-type]


def finish(ledger: Ledger, index: int, out: Outcome, **kw: object) -> None:
    args: dict[str, object] = dict(key=str(index), value=index, usage=None)
    args.update(kw)
    ledger.item_finished("s", index, ItemStatus.SUCCEEDED, out, **args)  # type: ignore[arg-type]


def test_items_wait_for_the_batch_to_age_then_go_in_one_flush(
        ledger: Ledger, store: Store, mono: Clock) -> None:
    ledger.attempt_ended("s", 0, ok())
    finish(ledger, 0, ok())
    assert store.items("r1") == [] and store.attempts("r1", "s", 0) == []
    mono.now += FLUSH_SECONDS - 0.001
    finish(ledger, 1, ok())
    assert store.items("r1") == []
    mono.now += 0.001
    finish(ledger, 2, ok())
    assert [i.item for i in store.items("r1")] == [0, 1, 2]
    assert [a.attempt for a in store.attempts("r1", "s", 0)] == [1]
    # The age counts from the flush, not from the first item.
    finish(ledger, 3, ok())
    assert len(store.items("r1")) == 3


def test_a_full_batch_is_written_at_once(ledger: Ledger, store: Store) -> None:
    for i in range(FLUSH_EVERY - 1):
        finish(ledger, i, ok())
    assert store.items("r1") == []
    finish(ledger, FLUSH_EVERY - 1, ok())
    assert len(store.items("r1")) == FLUSH_EVERY


def test_explicit_flush_writes_everything_pending(ledger: Ledger, store: Store) -> None:
    ledger.attempt_ended("s", 0, ok(message="first try"))
    finish(ledger, 0, ok(outputs=[Output("a.txt", "cd" * 32, 3)]))
    ledger.flush()
    [item] = store.items("r1")
    assert item.status == "succeeded" and item.key == "0" and item.value == 0
    assert [(o.name, o.size, o.attempt, o.run_id) for o in item.outputs] == [("a.txt", 3, 1, "r1")]
    [attempt] = store.attempts("r1", "s", 0)
    assert (attempt.outcome, attempt.message, attempt.exit_code) == ("succeeded", "first try", 0)
    ledger.flush()  # nothing pending: no second copy
    assert len(store.items("r1")) == 1


def test_secrets_are_masked_in_every_record_and_event(ledger: Ledger, store: Store) -> None:
    ledger.attempt_ended("s", 0, ok(message=f"token {SECRET} rejected"))
    finish(ledger, 0, ok(result=f"got {SECRET}", message=SECRET), value={"k": SECRET},
           usage={"input_tokens": 7})
    ledger.event("note", {"said": SECRET})
    ledger.flush()
    [item] = store.items("r1")
    [attempt] = store.attempts("r1", "s", 0)
    events = store.events("r1")
    seen = repr((item, attempt, [(e.kind, e.data) for e in events]))
    assert SECRET not in seen
    assert item.usage == {"input_tokens": 7}
    assert [e.kind for e in events] == ["agent_usage", "note"]
    assert all(e.at == 5.0 for e in events)


def test_only_succeeded_items_with_a_key_are_indexed_for_reuse(ledger: Ledger, store: Store) -> None:
    finish(ledger, 0, ok(reuse_key="k0"))
    finish(ledger, 1, ok())
    ledger.item_finished("s", 2, ItemStatus.FAILED,
                         Outcome(AttemptStatus.FAILED, 1, reuse_key="k2", message="exit status 1"),
                         key="2", value=2, usage=None)
    ledger.flush()
    found = store.reuse_candidates(["k0", "k2"])
    assert sorted(found) == ["k0"]


def test_a_step_that_ran_no_item_gets_one_record_at_once(ledger: Ledger, store: Store) -> None:
    finish(ledger, 0, ok())  # pending, not yet written
    ledger.step_record("t", ItemStatus.ERRORED, f"for_each failed near {SECRET}")
    ledger.step_record("u", ItemStatus.SKIPPED, "skipped: needs t")
    got = {i.step: i for i in store.items("r1")}
    assert set(got) == {"t", "u"}
    assert got["t"].status == "errored" and SECRET not in got["t"].message
    assert (got["u"].status, got["u"].message, got["u"].attempt) == ("skipped", "skipped: needs t", 0)
    assert got["u"].started_at == got["u"].ended_at == 5.0
