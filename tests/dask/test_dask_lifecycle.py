"""A cluster that loses a worker, an engine killed with -9, a scheduler restarted mid-run."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path

import daskcluster
import pytest

from tests.dask.conftest import all_attempts
from tests.integration.conftest import Project
from tests.sandbox.lifetime_helpers import await_

SLOW = """\
name: slow
steps:
  - id: work
    for_each: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    retries: 0
    run: |
      sleep {{ vars.pause }}
      echo "item $STOCKADE_ITEM attempt $STOCKADE_ATTEMPT" > out/done.txt
vars:
  pause: 3
"""


def _busy(scratch: Path) -> bool:
    return any(p.name.startswith("job-") for p in scratch.iterdir())


@pytest.mark.parametrize(("threads", "items", "pause"), [
    (2, 8, 3),  # a task per item
    (1, 12, 1),  # 12 ready for 2 threads: tasks of 3 items (dask_executor.batches)
])
def test_a_worker_killed_mid_run_loses_its_attempts_and_the_run_succeeds(
        private_cluster: daskcluster.Cluster, project: Project, threads: int, items: int,
        pause: int) -> None:
    victim = private_cluster.add("victim", threads, wait=False)
    private_cluster.add("survivor", threads, wait=False)
    private_cluster.wait_for(2)
    listed = ", ".join(str(i) for i in range(1, items + 1))
    project.write("wf.yaml", SLOW.replace("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]", f"[{listed}]")
                  .replace("pause: 3", f"pause: {pause}"))
    proc = project.popen("run", "wf.yaml", "--executor", private_cluster.url, "--json")
    try:
        await_(lambda: _busy(victim.scratch), "an attempt running on the victim", 120)
        private_cluster.kill("victim")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    data = json.loads(out)
    assert data["status"] == "succeeded" and data["items"]["work"] == {"succeeded": items}
    assert data["retries"] == {}  # a loss is not a retry
    rows = all_attempts(project, data["run_id"])
    lost = [a for a in rows if a["outcome"] == "lost"]
    assert lost, rows
    for a in lost:
        assert "worker victim" in a["message"] and "died during this attempt" in a["message"]
        assert a["provenance"]["worker"]["name"] == "victim"
        assert a["provenance"]["status"] == "lost"
        # The item ran again in a fresh attempt, elsewhere, and succeeded.
        after = [b for b in rows if b["item"] == a["item"] and b["attempt"] > a["attempt"]]
        assert after and after[-1]["outcome"] == "succeeded"
        assert after[-1]["provenance"]["worker"]["name"] == "survivor"
        done = project.item(data["run_id"], "work", a["item"]) / "work" / "out" / "done.txt"
        assert done.read_text() == f"item {a['item']} attempt {after[-1]['attempt']}\n"
    assert "lost (" in err and "it runs again" in err


def _succeeded(project: Project) -> int:
    db = project.root / "stockade.db"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
            return int(c.execute("SELECT count(*) FROM items WHERE status='succeeded'")
                       .fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def test_kill_9_of_the_engine_then_resume(dask_cluster: daskcluster.Cluster,
                                          project: Project) -> None:
    project.write("wf.yaml", SLOW)
    proc = project.popen("run", "wf.yaml", "--executor", dask_cluster.url, "--run-id", "r-dask",
                         "--jobs", "2")
    try:
        await_(lambda: _succeeded(project) >= 2, "two finished items", 240)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    # The dead engine's tasks are released by the scheduler and their jails stop.
    for w in dask_cluster.workers.values():
        await_(lambda w=w: not _busy(w.scratch), f"{w.name}'s scratch to empty", 120)
    shown = project.run("runs", "--json")
    assert [r["status"] for r in shown.json() if r["run_id"] == "r-dask"] == ["crashed"]
    # resume goes back to the run's own cluster (recorded in its manifest).
    r = project.run("resume", "r-dask", "--json", env={"STOCKADE_EXECUTOR": ""}, timeout=300)
    assert r.code == 0, r.err
    data = r.json()
    assert data["status"] == "succeeded" and data["items"]["work"] == {"succeeded": 12}
    rows = all_attempts(project, "r-dask")
    kept = {a["item"] for a in rows if a["outcome"] == "succeeded" and a["attempt"] == 1}
    assert len(kept) >= 2
    for a in rows:
        if a["outcome"] == "lost":
            assert a["message"] == ("the engine stopped during this attempt (when it began "
                                    "was not recorded: its times are the resume's)")
    assert all(a["provenance"]["worker"]["name"] in ("w1", "w2")
               for a in rows if a["outcome"] == "succeeded")


def test_a_scheduler_restart_mid_run_is_survived(private_cluster: daskcluster.Cluster,
                                                 project: Project) -> None:
    """Dask workers stop with their scheduler; the operator (or jobqueue, or Kubernetes)
    starts scheduler and workers again, and the run goes on: its attempts that were
    running are lost and run again."""
    for name in ("n1", "n2"):
        private_cluster.add(name, 2, wait=False, nanny=True)
    private_cluster.wait_for(2)
    project.write("wf.yaml", SLOW)
    proc = project.popen("run", "wf.yaml", "--executor", private_cluster.url, "--json")
    try:
        await_(lambda: any(_busy(w.scratch) for w in private_cluster.workers.values()),
               "an attempt running", 120)
        private_cluster.kill_scheduler()
        private_cluster.start_scheduler()
        for name in ("n3", "n4"):
            private_cluster.add(name, 2, wait=False)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    data = json.loads(out)
    assert data["status"] == "succeeded" and data["items"]["work"] == {"succeeded": 12}
    lost = [a for a in all_attempts(project, data["run_id"]) if a["outcome"] == "lost"]
    assert lost and all("scheduler" in a["message"] for a in lost), lost


def test_a_scheduler_that_stays_away_stops_the_run_resumable(
        private_cluster: daskcluster.Cluster, project: Project) -> None:
    private_cluster.add("w1", 2)
    project.write("wf.yaml", SLOW)
    proc = project.popen("run", "wf.yaml", "--executor", private_cluster.url, "--run-id", "gone",
                         env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "5s",
                              "STOCKADE_DASK_WAIT_WORKERS": "5"})
    try:
        await_(lambda: _busy(private_cluster.workers["w1"].scratch), "an attempt running", 120)
        private_cluster.kill_scheduler()
        _out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert f"the Dask scheduler at {private_cluster.address} is unreachable" in err
    assert "stockade resume gone" in err
    assert "Traceback" not in err


def test_a_cluster_left_without_workers_stops_the_run_resumable(
        private_cluster: daskcluster.Cluster, project: Project) -> None:
    private_cluster.add("only", 2)
    project.write("wf.yaml", SLOW)
    proc = project.popen("run", "wf.yaml", "--executor", private_cluster.url, "--run-id",
                         "orphan", env={"STOCKADE_DASK_WAIT_WORKERS": "4"})
    try:
        await_(lambda: _busy(private_cluster.workers["only"].scratch), "an attempt running",
               120)
        private_cluster.kill("only")
        _out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert f"the Dask cluster at {private_cluster.address} has had no workers for 4 s" in err
    assert "stockade resume orphan" in err and "Traceback" not in err
    # Started again with a worker, the run finishes.
    private_cluster.add("back", 2)
    r = project.run("resume", "orphan", "--json", timeout=300)
    assert r.code == 0, r.err
    assert r.json()["items"]["work"] == {"succeeded": 12}
