"""Items' folders made ahead of their turn (``runner.prefetch``), end to end.

The engine makes them only where the step's folder refused the spread flag
(``workspace.spread``): tmpfs refuses it, this suite's ext4 takes it. Item 0
of each run looks, from its own ``work/``, for the ``.next/`` of the items
queued behind it (``--sandbox none``, so the folders are in its world) and
writes what it saw.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.workspace.spread import is_spread
from tests.integration.conftest import Project

#: Item 0's first attempt waits for items 1 and 2's ``.next/`` for up to
#: ``wait`` seconds, then writes "ahead" or "none"; with ``hold`` set it then
#: waits for that file to go. (A resumed attempt, the second, does neither.)
WORKFLOW = """
name: ahead
vars: {wait: "1", hold: ""}
steps:
  - id: fan
    for_each: [0, 1, 2]
    run: |
      WAIT={{ vars.wait }}
      HOLD={{ vars.hold }}
      if [ "$STOCKADE_ITEM" = 0 ] && [ "$STOCKADE_ATTEMPT" = 1 ]; then
        n=0
        while [ $n -lt $((WAIT * 20)) ] && ! [ -d ../../1/.next/out -a -d ../../2/.next/out ]; do
          sleep 0.05; n=$((n + 1))
        done
        if [ -d ../../1/.next/out ] && [ -d ../../2/.next/out ]; then echo ahead; else echo none; fi > seen.txt
        if [ -n "$HOLD" ]; then while [ -e "$HOLD" ]; do sleep 0.05; done; fi
        mv seen.txt out/seen.txt
      else
        echo "$STOCKADE_ITEM" > out/seen.txt
      fi
"""


@pytest.fixture
def on_tmpfs() -> Iterator[Project]:
    shm = Path("/dev/shm")
    assert shm.is_dir() and os.access(shm, os.W_OK), "the test needs a writable /dev/shm (tmpfs)"
    # A space in the path: the hold file reaches the shell through a var
    # (a value rendered into `run:` is shell-quoted).
    with tempfile.TemporaryDirectory(dir=shm, prefix="stockade-test-with space-") as d:
        yield Project(Path(d))


def _seen(project: Project, run_id: str) -> str:
    return (project.item(run_id, "fan", 0) / "work" / "out" / "seen.txt").read_text().strip()


def _run(project: Project, run_id: str, wait: int) -> None:
    wf = project.write("wf.yaml", WORKFLOW)
    r = project.run("run", str(wf), "--run-id", run_id, "--sandbox", "none", "--jobs", "1",
                    "--var", f"wait={wait}")
    assert r.code == 0, r.err
    assert project.succeeded(run_id, "fan") == {0, 1, 2}
    step = project.root / "runs" / run_id / "fan"
    assert not list(step.rglob(".next*"))  # every one taken by its item
    for i in (1, 2):
        assert (project.item(run_id, "fan", i) / "work" / "out" / "seen.txt").read_text() == f"{i}\n"


def test_on_tmpfs_the_next_items_folders_are_made_ahead(on_tmpfs: Project) -> None:
    _run(on_tmpfs, "t1", wait=120)  # bounded only so a broken engine fails, not hangs
    assert not is_spread(str(on_tmpfs.root / "runs" / "t1" / "fan"))
    assert _seen(on_tmpfs, "t1") == "ahead"


def test_under_a_spread_step_folder_nothing_is_made_ahead(tmp_path: Path) -> None:
    project = Project(tmp_path)
    _run(project, "e1", wait=1)
    spread = is_spread(str(project.root / "runs" / "e1" / "fan"))
    # Wherever the suite runs: made ahead exactly when the flag did not take.
    assert _seen(project, "e1") == ("none" if spread else "ahead")


def test_on_tmpfs_an_interrupted_run_removes_the_folders_it_made_ahead(on_tmpfs: Project) -> None:
    project = on_tmpfs
    wf = project.write("wf.yaml", WORKFLOW)
    hold = project.path / "hold"
    hold.write_text("")
    p = project.popen("run", str(wf), "--run-id", "t2", "--sandbox", "none", "--jobs", "1",
                      "--var", "wait=120", "--var", f"hold={hold}")
    try:
        seen = project.item("t2", "fan", 0) / "work" / "seen.txt"
        deadline = time.monotonic() + 120
        while not seen.exists() or not seen.read_text():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "item 0 never wrote what it saw"
            time.sleep(0.05)
        assert seen.read_text().strip() == "ahead"
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=120)
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        raise
    finally:
        hold.unlink(missing_ok=True)
    assert p.returncode == 130, err
    step = project.root / "runs" / "t2" / "fan"
    assert not list(step.rglob(".next*")), sorted(map(str, step.rglob("*")))
    # Items that never began keep no attempt: no work/.
    assert not (step / "1" / "work").exists() and not (step / "2" / "work").exists()
    r = project.run("resume", "t2")
    assert r.code == 0, r.err
    assert project.succeeded("t2", "fan") == {0, 1, 2}

