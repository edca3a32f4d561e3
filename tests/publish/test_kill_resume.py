"""kill -9 in the middle of a fan-out of publishes, then ``stockade resume``: every
key is present exactly once, from this run; a newer run wins with a larger token;
resuming a finished run writes nothing. Through the real command line."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

ITEMS = 40
CLI = [sys.executable, "-m", "stockade.cli.main"]

WORKFLOW = """\
name: fanpub
steps:
  - id: regions
    run: python3 -c "import json; print(json.dumps([f'r{{i:02d}}' for i in range({n})]))" > out/regions.json
  - id: publish
    needs: [regions]
    for_each: "{{{{ steps.regions.outputs['regions.json'] | from_json }}}}"
    retries: 2
    publish:
      to: {to}
      key: "{{{{ item }}}}"
      payload:
        region: "{{{{ item }}}}"
        run: "{{{{ run.id }}}}"
"""


def stockade(tmp_path: Path, *args: str, wait: bool = True, store: str | None = None) -> Any:
    env = {**os.environ, "STOCKADE_SANDBOX": "none", "STOCKADE_HOME": str(tmp_path / "root")}
    env.pop("STOCKADE_STORE", None)
    if store:
        env["STOCKADE_STORE"] = store
    cmd = [*CLI, *args]
    if wait:
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def sink_rows(tmp_path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(tmp_path / "reports.db") as db:
        return list(db.execute("SELECT key, run_id, fencing_token, payload FROM daily ORDER BY key"))


def applied(tmp_path: Path) -> list[tuple[str, str]]:
    try:
        with sqlite3.connect(tmp_path / "reports.db") as db:
            return list(db.execute("SELECT idempotency_key, run_id FROM stockade_sink_effects"))
    except sqlite3.OperationalError:
        return []


def kill_when(proc: subprocess.Popen[bytes], ready: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_kill_9_mid_fanout_then_resume_sqlite(tmp_path: Path) -> None:
    (tmp_path / "wf.yaml").write_text(WORKFLOW.format(n=ITEMS, to="sqlite:///reports.db?table=daily"))
    proc = stockade(tmp_path, "run", "wf.yaml", "--run-id", "night-1", "--jobs", "4", wait=False)
    kill_when(proc, lambda: len(applied(tmp_path)) >= 5)
    partial = applied(tmp_path)
    assert 5 <= len(partial) < ITEMS, "kill -9 should land in the middle of the fan-out"

    done = stockade(tmp_path, "resume", "night-1", "--jobs", "4")
    assert done.returncode == 0, done.stderr
    rows = sink_rows(tmp_path)
    assert [r[0] for r in rows] == [f"r{i:02d}" for i in range(ITEMS)]
    assert {r[1] for r in rows} == {"night-1"}
    assert all(json.loads(r[3]) == {"region": r[0], "run": "night-1"} for r in rows)
    effects = applied(tmp_path)
    assert sorted(k for k, _ in effects) == sorted(f"night-1/publish/{i}" for i in range(ITEMS))
    assert set(partial) <= set(effects)

    # A finished run's resume writes nothing.
    before = (tmp_path / "reports.db").stat().st_mtime_ns
    again = stockade(tmp_path, "resume", "night-1")
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "reports.db").stat().st_mtime_ns == before
    assert len(applied(tmp_path)) == ITEMS

    # A newer run wins with a larger fence.
    newer = stockade(tmp_path, "run", "wf.yaml", "--run-id", "night-2")
    assert newer.returncode == 0, newer.stderr
    rows2 = sink_rows(tmp_path)
    assert {r[1] for r in rows2} == {"night-2"}
    assert min(r[2] for r in rows2) > max(r[2] for r in rows)


@pytest.fixture
def slow_receiver() -> Iterator[tuple[str, dict[str, Any]]]:
    """An idempotent HTTP sink that takes 30 ms per request and counts applications."""
    state: dict[str, Any] = {"posts": [], "applied": {}, "lock": threading.Lock()}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(0.03)
            key = self.headers["Idempotency-Key"]
            with state["lock"]:
                state["posts"].append((key, body["key"]))
                state["applied"].setdefault(key, body)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/daily", state
    server.shutdown()
    server.server_close()


def test_kill_9_mid_fanout_then_resume_http(tmp_path: Path,
                                            slow_receiver: tuple[str, dict[str, Any]]) -> None:
    url, state = slow_receiver
    (tmp_path / "wf.yaml").write_text(WORKFLOW.format(n=ITEMS, to=url))
    proc = stockade(tmp_path, "run", "wf.yaml", "--run-id", "h-1", "--jobs", "4", wait=False)
    kill_when(proc, lambda: len(state["posts"]) >= 6)
    assert len(state["applied"]) < ITEMS
    done = stockade(tmp_path, "resume", "h-1", "--jobs", "4")
    assert done.returncode == 0, done.stderr
    assert sorted(state["applied"]) == sorted(f"h-1/publish/{i}" for i in range(ITEMS))
    assert sorted(b["key"] for b in state["applied"].values()) == [f"r{i:02d}" for i in range(ITEMS)]
    # Each key went out under a single idempotency key: a repeat is the same effect.
    per_key: dict[str, set[str]] = {}
    for idem, key in state["posts"]:
        per_key.setdefault(key, set()).add(idem)
    assert all(len(v) == 1 for v in per_key.values())


RACE = """\
name: race
vars:
  gated: "no"
steps:
  - id: compute
    run: |
      if [ "{{ vars.gated }}" = yes ]; then
        while [ ! -e release ]; do sleep 0.05; done
      fi
      echo computed
  - id: publish
    needs: [compute]
    publish:
      to: sqlite:///reports.db?table=daily
      key: today
      payload:
        run: "{{ run.id }}"
"""


def test_older_run_publishing_last_is_fenced(tmp_path: Path) -> None:
    """A starts first but publishes after B: B, the newer run, keeps the row; A's item
    ends fenced, the run exits 1 and names the newer token."""
    (tmp_path / "wf.yaml").write_text(RACE)
    old = stockade(tmp_path, "run", "wf.yaml", "--run-id", "old", "--var", "gated=yes",
                   wait=False)
    try:
        # The order is made, not hoped for: A has started (its start time,
        # which fencing compares, is fixed before any item begins) and waits
        # for its release until B is done.
        gate = tmp_path / "root" / "runs" / "old" / "compute" / "0" / "work"
        deadline = time.monotonic() + 60
        while not gate.is_dir():
            assert old.poll() is None, "the older run ended before its item began"
            assert time.monotonic() < deadline, "the older run's item never began"
            time.sleep(0.05)
        new = stockade(tmp_path, "run", "wf.yaml", "--run-id", "new")
        assert new.returncode == 0, new.stderr
        (gate / "release").touch()
        assert old.wait(timeout=60) == 1
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()
    assert [r[:3] for r in sink_rows(tmp_path)] == [("today", "new", 1)]
    shown = stockade(tmp_path, "show", "old", "publish/0")
    assert "fenced" in shown.stdout + shown.stderr
    assert "token 1" in shown.stdout + shown.stderr
    # A publish attempt runs no process: its line has no exit status.
    [attempt] = [ln for ln in shown.stdout.splitlines() if ln.startswith("  attempt 1:")]
    assert " exit " not in attempt, attempt


def test_kill_9_mid_fanout_then_resume_postgresql(tmp_path: Path, pg_url: str) -> None:
    """The same with the run store and the sink table in PostgreSQL."""
    import psycopg

    (tmp_path / "wf.yaml").write_text(WORKFLOW.format(n=ITEMS, to=pg_url + "&table=daily"))

    def landed() -> list[tuple[str, str]]:
        with psycopg.connect(pg_url) as conn:
            try:
                return list(conn.execute(  # type: ignore[arg-type]
                    "SELECT idempotency_key, run_id FROM stockade_sink_effects"))
            except psycopg.errors.UndefinedTable:
                return []

    proc = stockade(tmp_path, "run", "wf.yaml", "--run-id", "pg-1", "--jobs", "4", wait=False,
                    store=pg_url)
    kill_when(proc, lambda: len(landed()) >= 5)
    assert len(landed()) < ITEMS
    done = stockade(tmp_path, "resume", "pg-1", "--jobs", "4", store=pg_url)
    assert done.returncode == 0, done.stderr
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT key, run_id FROM daily ORDER BY key").fetchall()
        effects = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'done') FROM stockade_effects"
            " WHERE run_id = 'pg-1'").fetchone()
    assert rows == [(f"r{i:02d}", "pg-1") for i in range(ITEMS)]
    assert sorted(k for k, _ in landed()) == sorted(f"pg-1/publish/{i}" for i in range(ITEMS))
    assert effects == (ITEMS, ITEMS)


def test_a_publish_attempt_cut_by_kill_9_is_recorded_as_lost(tmp_path: Path) -> None:
    """The engine killed while its POST was in flight: resume reran the item as
    attempt 1 again and the killed attempt, which had reached the sink, was
    in no record. It is recorded as lost, with the time it claimed the effect."""
    posted = threading.Event()
    release = threading.Event()

    class Holding(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            posted.set()
            release.wait(60)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Holding)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        (tmp_path / "wf.yaml").write_text(
            "name: held\nsteps:\n  - id: publish\n    publish:\n"
            f"      to: http://127.0.0.1:{server.server_address[1]}/daily\n"
            "      key: today\n      payload: 1\n")
        t0 = time.time()
        proc = stockade(tmp_path, "run", "wf.yaml", "--run-id", "held-1", wait=False)
        kill_when(proc, posted.is_set)
        killed_at = time.time()
        release.set()
        done = stockade(tmp_path, "resume", "held-1")
        assert done.returncode == 0, done.stderr
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    shown = stockade(tmp_path, "show", "held-1", "publish/0", "--json")
    attempts = json.loads(shown.stdout)["attempts"]
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "lost"), (2, "succeeded")]
    assert t0 <= attempts[0]["started_at"] <= killed_at
    assert attempts[0]["message"] == "the engine stopped during this attempt"
