"""runner.prefetch: items' folders made ahead of their turn, on real folders."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from stockade.runner.prefetch import FolderPrefetch
from stockade.workspace.layout import RunDir


def _settle(fp: FolderPrefetch) -> None:
    # Waits for the helper thread's work, not for time: the deadline only
    # turns a hang into a failure.
    deadline = time.monotonic() + 60
    while not fp.settled():
        assert time.monotonic() < deadline, "the prefetch thread never settled"
        time.sleep(0.001)


def _ready(run: RunDir, step: str = "s") -> list[int]:
    base = run.path / step
    if not base.exists():
        return []
    return sorted(int(n) for n in os.listdir(base) if (base / n / ".next").is_dir())


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    r = RunDir(tmp_path, "r")
    r.path.mkdir(parents=True)
    return r


def test_keeps_a_window_of_items_made_ahead(run: RunDir) -> None:
    fp = FolderPrefetch(run, ahead=3)
    fp.add("s", range(10))
    _settle(fp)
    assert _ready(run) == [0, 1, 2]
    for i in range(10):
        fp.claim("s", i)
        assert run.item("s", i).begin_attempt(1) == 1
        _settle(fp)
        assert _ready(run) == list(range(i + 1, min(i + 4, 10)))
    fp.close()
    assert all(run.item("s", i).attempt_numbers() == [1] for i in range(10))


def test_a_claimed_item_is_never_made_and_close_removes_what_no_attempt_took(
        run: RunDir) -> None:
    fp = FolderPrefetch(run, ahead=2)
    fp.add("s", range(6))
    _settle(fp)
    assert _ready(run) == [0, 1]
    fp.claim("s", 3)  # its attempt began before the thread reached it
    fp.claim("s", 0)
    fp.claim("s", 1)
    _settle(fp)
    assert _ready(run) == [0, 1, 2, 4]  # 3 was claimed: skipped
    fp.close()
    # 0 and 1 were claimed: theirs are the attempts' to take; 2 and 4 are removed.
    assert _ready(run) == [0, 1]
    assert not (run.path / "s" / "3").exists()
    assert os.listdir(run.path / "s" / "2") == ["meta"]


def test_clear_stops_making_and_a_failure_only_skips_the_item(run: RunDir) -> None:
    (run.path / "s").mkdir()
    (run.path / "s" / "1").write_text("a file where the item's folder goes")
    fp = FolderPrefetch(run, ahead=2)
    fp.add("s", range(5))
    _settle(fp)
    assert _ready(run) == [0, 2]
    fp.clear()
    fp.claim("s", 0)
    fp.claim("s", 2)
    _settle(fp)
    assert _ready(run) == [0, 2]  # nothing new after clear
    fp.add("t", [0])
    _settle(fp)
    assert _ready(run, "t") == [0]
    fp.close()
    assert _ready(run, "t") == []
    fp.add("t", [1])  # closed: ignored
    assert not (run.path / "t" / "1").exists()


def test_claims_with_nothing_queued_start_no_thread_and_make_nothing(run: RunDir) -> None:
    # The engine claims every first attempt, also of steps it never queued
    # (their folder took the spread flag).
    before = {t.name for t in threading.enumerate()}
    fp = FolderPrefetch(run, ahead=2)
    for i in range(3):
        fp.claim("s", i)  # a spread step: the engine queued nothing
    assert fp.settled()
    assert "folders" not in {t.name for t in threading.enumerate()} - before
    fp.close()
    assert not (run.path / "s").exists()
    # Queued afterwards, the window is kept as ever.
    fp2 = FolderPrefetch(run, ahead=2)
    fp2.add("s", range(4))
    _settle(fp2)
    fp2.claim("s", 0)
    assert run.item("s", 0).begin_attempt(1) == 1
    _settle(fp2)
    assert _ready(run) == [1, 2]
    fp2.close()
    assert _ready(run) == []
