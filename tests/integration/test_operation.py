"""Everyday operation through the real CLI: item keys, preflight, crashed runs, run ids,
retries with backoff, readable failures, on_item_failure, templated leases, notify,
gc/rm/cancel.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.integration.conftest import Project, Result


def _wait_for(cond: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met")


SAMPLES = """
name: samples
steps:
  - id: align
    for_each: [{sample: S001, n: 1}, {sample: S002, n: 2}, {sample: S003, n: 3}]
    key: "{{ item.sample }}"
    inputs:
      n.txt: "{{ item.n }}"
    run: |
      echo "$STOCKADE_ITEM_KEY" > out/key.txt
      n=$(cat n.txt); echo $((n * 10)) > out/total.txt
      echo "aligned $STOCKADE_ITEM_KEY" >&2
  - id: good
    needs: [align]
    for_each: "{{ steps.align.items }}"
    keep: "{{ item.value.n != 2 }}"
  - id: report
    needs: [good]
    for_each: "{{ steps.good.items }}"
    inputs:
      total.txt: "{{ item.outputs['total.txt'] }}"
    run: cat total.txt
"""


def test_keys_address_items_everywhere_and_survive_a_keep(project: Project) -> None:
    wf = project.write("wf.yaml", SAMPLES)
    r = project.run("run", str(wf), "--run-id", "keys1")
    assert r.code == 0, r.err
    assert (project.item("keys1", "align", 2) / "work/out/key.txt").read_text() == "S003\n"
    show = project.run("show", "keys1", "align/S003", "--json")
    assert show.code == 0, show.err
    assert show.json()["item"]["key"] == "S003"
    # The keep dropped S002; the next step's items keep the upstream keys.
    report = project.run("show", "keys1", "report", "--json").json()
    assert [i["key"] for i in report["items"]] == ["S001", "S003"]
    assert project.run("logs", "keys1", "report/S003").out == "30\n"
    assert project.run("logs", "keys1", "align/S002", "--stderr").out == "aligned S002\n"
    # STEP/#N is the N-th item.
    assert project.run("logs", "keys1", "report/#1").out == "30\n"
    why = project.run("why", "keys1", "report/S003", "--json").json()
    assert why["key"] == "S003"
    assert why["inputs"][0]["from"]["key"] == "S003"
    # why takes the output name as show prints it.
    assert project.run("why", "keys1", "align/S001", "out/total.txt").code == 0
    bad = project.run("why", "keys1", "align/S001", "out/nope.txt")
    assert bad.code == 2 and "out/total.txt" in bad.err and "out/key.txt" in bad.err
    missing = project.run("show", "keys1", "align/S999")
    assert missing.code == 2 and "S001" in missing.err
    keep_logs = project.run("logs", "keys1", "good/S001")
    assert keep_logs.code == 2 and "keep:" in keep_logs.err and "Traceback" not in keep_logs.err


@pytest.mark.parametrize(("body", "where", "needle"), [
    ("resources: {memory: 512 megs}\n    run: 'true'", "4:", "not a size"),
    ("publish: {to: 'ftp://x/y', key: k, payload: 1}", "4:", "unknown sink"),
    ("publish: {to: 'sqlite:///r.db', key: k, payload: 1}", "4:", "?table="),
    ("inputs: {a: \"{{ file('nope.txt') }}\"}\n    run: 'true'", "4:", "no such file"),
    ("secrets: [TOKEN_X]\n    run: 'true'", "2:", "TOKEN_X is declared but not set"),
    ("agent: {model: anthropic/claude-x, prompt: hi}", "4:", "ANTHROPIC_API_KEY"),
])
def test_preflight_errors_exit_2_before_any_run_folder(
    project: Project, body: str, where: str, needle: str
) -> None:
    secrets = "secrets: [TOKEN_X]\n" if "TOKEN_X" in body else ""
    text = f"name: pf\n{secrets}steps:\n  - id: a\n    {body}\n"
    wf = project.write("wf.yaml", text)
    env = {k: "" for k in ()}
    project.env.pop("ANTHROPIC_API_KEY", None)
    project.env.pop("ANTHROPIC_BASE_URL", None)
    project.env.pop("TOKEN_X", None)
    r = project.run("run", str(wf), env=env)
    assert r.code == 2, r.err
    assert "Traceback" not in r.err
    assert needle in r.err
    line = r.err.strip().splitlines()[0]
    assert line.startswith(f"{wf}:"), line
    runs = project.root / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_validate_reports_static_preflight_problems_with_positions(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: v
        steps:
          - id: a
            resources: {file_size: lots}
            run: "true"
          - id: p
            publish: {to: "ftp://x", key: k, payload: 1}
    """)
    r = project.run("validate", str(wf))
    assert r.code == 2
    lines = r.err.strip().splitlines()
    assert any(line.startswith(f"{wf}:5:") and "not a size" in line for line in lines), r.err
    assert any(line.startswith(f"{wf}:8:") and "unknown sink" in line for line in lines), r.err


def test_empty_run_id_is_an_error(project: Project) -> None:
    wf = project.write("wf.yaml", "name: e\nsteps:\n  - id: a\n    run: 'true'\n")
    r = project.run("run", str(wf), "--run-id", "")
    assert r.code == 2 and "empty run id" in r.err


def test_last_is_not_a_run_id(project: Project) -> None:
    """'last' in a RUN argument is the newest run: a run named so could never be named."""
    wf = project.write("wf.yaml", "name: e\nsteps:\n  - id: a\n    run: 'true'\n")
    r = project.run("run", str(wf), "--run-id", "last")
    assert (r.code, r.err.strip()) == (2, "--run-id 'last': 'last' names the newest run "
                                          "wherever a run id is asked for; choose another id")
    assert not (project.root / "runs").exists()


def test_a_killed_engine_shows_crashed_with_the_resume_command(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: crashy
        steps:
          - id: slow
            run: echo started; sleep 300
    """)
    p = project.popen("run", str(wf), "--run-id", "cr1")
    _wait_for(lambda: (project.item("cr1", "slow", 0) / "meta/1.out").exists())
    # While it runs it is running, not crashed.
    assert project.run("runs", "--json").json()[0]["status"] == "running"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    runs = project.run("runs")
    assert "crashed" in runs.out and "stockade resume cr1" in runs.out
    show = project.run("show", "cr1")
    assert "crashed" in show.out and "stockade resume cr1" in show.out
    assert project.run("show", "cr1", "--json").json()["run"]["status"] == "crashed"


def test_last_prefixes_and_ambiguous_prefixes(project: Project) -> None:
    wf = project.write("wf.yaml", "name: ids\nsteps:\n  - id: a\n    run: echo hi\n")
    for rid in ("abcd-one", "abcd-two", "xyz-three"):
        assert project.run("run", str(wf), "--run-id", rid).code == 0
    assert project.run("show", "last", "--json").json()["run"]["run_id"] == "xyz-three"
    assert project.run("logs", "xyz-", "a").out == "hi\n"
    amb = project.run("show", "abcd")
    assert amb.code == 2 and "abcd-one" in amb.err and "abcd-two" in amb.err
    assert project.run("show", "abcd-t", "--json").json()["run"]["run_id"] == "abcd-two"
    short = project.run("show", "abc")
    assert short.code == 2 and "at least 4" in short.err


def test_retries_back_off_and_show_in_the_summary(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: flaky
        steps:
          - id: f
            retries: 2
            retry_delay: 0.5
            run: |
              if [ "$STOCKADE_ATTEMPT" -lt 3 ]; then echo "try $STOCKADE_ATTEMPT" >&2; exit 3; fi
              echo ok
    """)
    r = project.run("run", str(wf), "--run-id", "rb1")
    assert r.code == 0, r.err
    assert "2 retries" in r.err
    assert "retry in" in r.err
    attempts = project.run("show", "rb1", "f", "--json").json()["attempts"]
    starts = [a["started_at"] for a in attempts]
    ends = [a["ended_at"] for a in attempts]
    # The waits grow: about 0.5 s, then about 1 s (+-20%).
    assert starts[1] - ends[0] >= 0.4
    assert starts[2] - ends[1] >= 0.8
    shown = project.run("show", "rb1")
    assert "2 retries" in shown.out


def test_a_limit_kill_names_the_limit_and_the_failure_shows_stderr(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: limits
        steps:
          - id: big
            resources: {file_size: 1M}
            run: echo "writing now" >&2; head -c 5000000 /dev/zero > out/big.bin
    """)
    r = project.run("run", str(wf), "--run-id", "lim1")
    assert r.code == 1
    assert "exceeded file_size 1M" in r.err
    assert "writing now" in r.err
    assert "stockade logs lim1 big/0 --stderr" in r.err
    item = project.run("show", "lim1", "big", "--json").json()
    assert "exceeded file_size 1M" in item["item"]["message"]


def test_on_item_failure_continue_runs_the_join_on_the_good_items(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: cont
        steps:
          - id: each
            for_each: [a, b, dead, c]
            on_item_failure: continue
            inputs: {name.txt: "{{ item }}"}
            run: |
              if [ "$(cat name.txt)" = dead ]; then exit 1; fi
              cat name.txt
          - id: join
            needs: [each]
            inputs: {all.json: "{{ steps.each.result }}"}
            run: cat all.json
    """)
    r = project.run("run", str(wf), "--run-id", "cont1")
    assert r.code == 1
    assert json.loads(project.run("logs", "cont1", "join").out) == ["a", "b", "c"]
    show = project.run("show", "cont1", "--json").json()
    steps = {s["id"]: s for s in show["steps"]}
    assert steps["join"]["counts"] == {"succeeded": 1}
    assert steps["each"]["counts"] == {"succeeded": 3, "failed": 1}


def test_a_keep_rule_that_fails_on_some_items_names_its_line_and_keeps_the_rest(
        project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: decide
        vars: {n: "[1, 0, 2, 3, 4, 6]"}
        steps:
          - id: pick
            for_each: "{{ vars.n | from_json }}"
            on_item_failure: continue
            keep: "{{ item if item == 3 else (10 // item) % 2 == 1 }}"
          - id: after
            needs: [pick]
            inputs: {kept.json: "{{ steps.pick.result }}"}
            run: cat kept.json
    """)
    line = next(n for n, text in enumerate(wf.read_text().splitlines(), 1) if "keep:" in text)
    where = f"{wf}:{line}:"
    r = project.run("run", str(wf), "--run-id", "k1")
    assert r.code == 1
    items = project.run("show", "k1", "pick", "--json").json()["items"]
    got = [(i["key"], i["status"], i["result"], i["message"]) for i in items]
    assert [g[:3] for g in got] == [("1", "succeeded", False), ("0", "errored", None),
                                    ("2", "succeeded", True), ("3", "errored", None),
                                    ("4", "succeeded", False), ("6", "succeeded", True)]
    assert [g[3] for g in got if g[1] == "succeeded"] == ["dropped", "kept", "dropped", "kept"]
    zero, three = (g[3] for g in got if g[1] == "errored")
    assert zero.startswith(where) and zero.endswith(
        ": ZeroDivisionError: integer division or modulo by zero")
    assert three.startswith(where) and three.endswith(
        ": keep: must render true or false, got int 3")
    assert json.loads(project.run("logs", "k1", "after").out) == [2, 6]


def test_templated_leases_let_parallel_backfills_both_publish(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: backfill
        vars: {day: "2026-01-01"}
        steps:
          - id: make
            run: sleep 1; echo "{{ vars.day }}"
          - id: pub
            needs: [make]
            publish:
              to: sqlite:///out.db?table=daily
              key: "{{ vars.day }}"
              payload: "{{ steps.make.result }}"
              lease: "backfill-{{ vars.day }}"
    """)
    a = project.popen("run", str(wf), "--var", "day=2026-01-01")
    time.sleep(0.5)
    b = project.popen("run", str(wf), "--var", "day=2026-01-02")
    assert b.wait(120) == 0, b.communicate()[1]
    assert a.wait(120) == 0, a.communicate()[1]
    rows = sqlite3.connect(project.path / "out.db").execute(
        "SELECT key, payload FROM daily ORDER BY key").fetchall()
    assert rows == [("2026-01-01", '"2026-01-01"'), ("2026-01-02", '"2026-01-02"')]


class _Hook(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[dict[str, str], Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((dict(self.headers), json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _hook() -> Iterator[str]:
    """A real HTTP server on loopback for the block; what is posted to its
    URL is in ``_Hook.received``."""
    _Hook.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()


def test_notify_posts_once_with_the_failed_items(project: Project) -> None:
    with _hook() as url:
        wf = project.write("wf.yaml", f"""
            name: notified
            secrets: [HOOK_TOKEN]
            notify:
              - url: {url}
                on: [failed]
                secret: HOOK_TOKEN
              - url: {url}
                on: [succeeded]
            steps:
              - id: each
                for_each: [ok, bad]
                inputs: {{n.txt: "{{{{ item }}}}"}}
                run: test "$(cat n.txt)" = ok
        """)
        r = project.run("run", str(wf), "--run-id", "nt1", env={"HOOK_TOKEN": "tok-secret-123"})
        assert r.code == 1
    assert len(_Hook.received) == 1
    headers, body = _Hook.received[0]
    assert headers["Authorization"] == "Bearer tok-secret-123"
    assert body["status"] == "failed" and body["run_id"] == "nt1"
    assert body["failed"] == [{"step": "each", "key": "bad", "status": "failed",
                               "message": "exit status 1"}]
    assert isinstance(body["duration"], float)


def test_notify_lists_the_first_failures_in_step_order_and_counts_them_all(
    project: Project
) -> None:
    # zeta is declared first: its failures come first, though "alpha" sorts
    # before it; 28 + 40 failed items, of which the first 50 are listed.
    with _hook() as url:
        wf = project.write("wf.yaml", f"""
            name: many
            notify: [{{url: {url}, on: [failed]}}]
            steps:
              - id: zeta
                for_each: {list(range(30))}
                inputs: {{n.txt: "{{{{ item }}}}"}}
                run: test "$(cat n.txt)" -gt 27
              - id: alpha
                for_each: {list(range(40))}
                run: exit 3
        """)
        r = project.run("run", str(wf), "--run-id", "nt2", "--jobs", "2")
        assert r.code == 1, r.err
    assert len(_Hook.received) == 1
    body = _Hook.received[0][1]
    assert body["failed_count"] == 68 and body["fenced"] is False
    listed = [(f["step"], f["key"]) for f in body["failed"]]
    assert listed == [("zeta", str(i)) for i in range(28)] + [("alpha", str(i)) for i in range(22)]
    assert {f["message"] for f in body["failed"] if f["step"] == "alpha"} == {"exit status 3"}


def test_gc_rm_and_cancel_never_touch_a_running_run(project: Project) -> None:
    wf = project.write("wf.yaml", "name: g\nsteps:\n  - id: a\n    run: echo hi\n")
    slow = project.write("slow.yaml",
                         "name: s\nsteps:\n  - id: a\n    run: echo started; sleep 300\n")
    for rid in ("old-1", "old-2", "old-3"):
        assert project.run("run", str(wf), "--run-id", rid).code == 0
    p = project.popen("run", str(slow), "--run-id", "live-1")
    _wait_for(lambda: (project.item("live-1", "a", 0) / "meta/1.out").exists())
    dry = project.run("gc", "--keep", "0", "--dry-run")
    assert dry.code == 0 and "old-1" in dry.out and "live-1" not in dry.out
    assert (project.root / "runs/old-1").exists()
    refused = project.run("rm", "live-1")
    assert refused.code == 2 and "running" in refused.err
    gc = project.run("gc", "--keep", "1")
    assert gc.code == 0
    assert not (project.root / "runs/old-1").exists()
    assert not (project.root / "runs/old-2").exists()
    assert (project.root / "runs/live-1").exists()
    cancel = project.run("cancel", "live-1")
    assert cancel.code == 0, cancel.err
    assert p.wait(60) == 130
    runs = {r["run_id"]: r["status"] for r in project.run("runs", "--json").json()}
    assert runs["live-1"] == "interrupted"
    assert "old-1" not in runs
    assert project.run("rm", "live-1").code == 0
    assert not (project.root / "runs/live-1").exists()
    assert "live-1" not in {r["run_id"] for r in project.run("runs", "--json").json()}


def test_the_id_of_a_deleted_run_is_not_taken_again(project: Project) -> None:
    """A scheduler's `--run-id report-$(date +%F)`, its run deleted and run
    again: the sink's idempotency key (run_id/step/item) took the new run's
    payload for the old one's, already applied, and the old row stayed."""
    wf = project.write("wf.yaml", """
        name: rid
        vars: {v: one}
        steps:
          - id: publish
            publish: {to: "sqlite:///reports.db?table=t", key: k, payload: "{{ vars.v }}"}
    """)
    assert project.run("run", str(wf), "--run-id", "nightly-1").code == 0
    for remove, fresh in ((("rm", "nightly-1"), "nightly-1b"), (("gc", "--keep", "0"), "nightly-1c")):
        assert project.run(*remove).code == 0
        again = project.run("run", str(wf), "--run-id", "nightly-1", "--var", "v=two")
        assert again.code == 2 and again.out == "", again.err
        assert again.err.strip() == (
            "run id 'nightly-1' was a run's, since deleted; run ids are never reused (a sink "
            "would take this run's publish for that run's, already applied): choose another id")
        assert not (project.root / "runs" / "nightly-1").exists()
        assert project.run("run", str(wf), "--run-id", fresh).code == 0
    with sqlite3.connect(project.path / "reports.db") as db:
        assert db.execute("SELECT payload, run_id FROM t").fetchall() == [('"one"', "nightly-1c")]


def test_ui_refuses_a_taken_port_and_a_missing_root(project: Project, tmp_path: Path) -> None:
    import socket

    r = project.run("ui", "--root", str(tmp_path / "nowhere"))
    assert r.code == 2 and "no runs under" in r.err
    assert not (tmp_path / "nowhere").exists()
    wf = project.write("wf.yaml", "name: u\nsteps:\n  - id: a\n    run: 'true'\n")
    assert project.run("run", str(wf)).code == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        taken = project.run("ui", "--port", str(port))
    assert taken.code == 2 and "in use" in taken.err and "Traceback" not in taken.err


def test_a_taken_run_id_in_a_shared_store_is_refused_without_an_orphan_folder(
    project: Project, tmp_path: Path
) -> None:
    wf = project.write("wf.yaml", "name: shared\nsteps:\n  - id: a\n    run: 'true'\n")
    store = f"sqlite:///{tmp_path / 'shared.db'}"
    first = project.run("run", str(wf), "--run-id", "dup1", "--store", store,
                        "--root", str(tmp_path / "root-a"))
    assert first.code == 0, first.err
    second = project.run("run", str(wf), "--run-id", "dup1", "--store", store,
                         "--root", str(tmp_path / "root-b"))
    assert second.code == 2
    assert "taken" in second.err and "Traceback" not in second.err
    assert not (tmp_path / "root-b" / "runs" / "dup1").exists()


def test_a_refused_publish_is_not_retried(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: refusal
        steps:
          # Made by a step, so known only when the publish runs (one of vars
          # alone is refused before the run: test_user_errors).
          - id: scheme
            run: printf ftp
          - id: pub
            needs: [scheme]
            retries: 3
            retry_delay: 0
            publish:
              to: "{{ steps.scheme.result }}://example/x"
              key: k
              payload: 1
    """)
    r = project.run("run", str(wf), "--run-id", "ref1")
    assert r.code == 1
    item = project.run("show", "ref1", "pub", "--json").json()
    assert [a["attempt"] for a in item["attempts"]] == [1]
    assert "unknown sink" in item["item"]["message"]


def test_meta_is_the_engines_alone(project: Project) -> None:
    import stat
    import subprocess

    wf = project.write("wf.yaml", "name: m\nsteps:\n  - id: a\n    run: echo private\n")
    assert project.run("run", str(wf), "--run-id", "meta1").code == 0
    meta = project.item("meta1", "a") / "meta"
    assert stat.S_IMODE(meta.stat().st_mode) & 0o077 == 0
    capture = meta / "1.out"
    assert capture.read_text() == "private\n"  # the engine reads it
    if os.geteuid() == 0:
        # Another local user cannot list it or read a capture in it.
        other = subprocess.run(
            ["setpriv", "--reuid=54321", "--regid=54321", "--clear-groups",
             "cat", str(meta / "1.out")],
            capture_output=True, text=True)
        assert other.returncode != 0 and "private" not in other.stdout


def test_a_starting_or_resuming_run_is_never_shown_crashed(tmp_path: Path) -> None:
    """The engine holds its run lock from the moment the run folder exists
    (and, on resume, before the status turns back to running): at the
    ``on_start`` moment, before any item, a reader must see ``running``."""
    import io

    from stockade.cli.progress import PlainReporter
    from stockade.runner.runs import state
    from stockade.runner.session import RunOptions, open_run_store, resume_run, start_run

    wf = tmp_path / "wf.yaml"
    wf.write_text("name: s\nsteps:\n  - id: a\n    run: echo a\n")
    root = tmp_path / "root"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOCKADE_")}
    seen: list[str] = []

    def look(run_id: str, _path: Path, _choice: Any) -> None:
        store = open_run_store(root, None, env)
        try:
            record = store.get_run(run_id)
            assert record is not None
            seen.append(str(state(record)))
        finally:
            store.close()

    opts = RunOptions(root=root, run_id="st1", sandbox="none")
    result = start_run(wf, opts, PlainReporter(io.StringIO()), env=env, on_start=look)
    assert str(result.summary.status) == "succeeded"
    resume_run("st1", opts, PlainReporter(io.StringIO()), env=env, on_start=look)
    assert seen == ["running", "running"]


def test_a_finished_runs_tallies_come_from_its_step_events(project: Project) -> None:
    """``show`` and the UI read a finished run's counts from its step_finished
    events; they must agree with counting the records, through a resume too."""
    from stockade.store import open_store

    wf = project.write("wf.yaml", """
        name: tallies
        steps:
          - id: good
            for_each: [1, 2, 3]
            run: echo {{ item }} > out/x.txt
          - id: mixed
            for_each: [1, 2, 3]
            on_item_failure: continue
            run: test {{ item }} != 2
          - id: bad
            run: exit 3
          - id: after_bad
            needs: [bad]
            run: echo never
          - id: decide
            needs: [good]
            for_each: "{{ steps.good.items }}"
            keep: "{{ item.value != 2 }}"
    """)
    assert project.run("run", str(wf), "--run-id", "t1").code == 1
    store = open_store(None, project.root)
    try:
        record = store.get_run("t1")
        assert record is not None and record.status == "failed"
        counted = store.step_tallies("t1")
        assert counted["mixed"].counts == {"failed": 1, "succeeded": 2}
        assert counted["after_bad"].counts == {"skipped": 1}
        finished = store.events_of(["t1"], ["step_finished"])
        assert sorted(ev.data["step"] for ev in finished if ev.data.get("tally")) == sorted(counted)
        assert store.recorded_tallies(record) == counted
        # Resume re-runs what did not succeed and what no longer verifies.
        (project.item("t1", "good", 1) / "work/out/x.txt").write_text("changed\n")
        assert project.run("resume", "t1").code == 1
        record = store.get_run("t1")
        assert record is not None and record.status == "failed"
        assert store.recorded_tallies(record) == store.step_tallies("t1")
        shown = project.run("show", "t1", "--json").json()
        assert {s["id"]: s["counts"] for s in shown["steps"]}["mixed"] == {
            "failed": 1, "succeeded": 2}
    finally:
        store.close()


def _read_only(project: Project, root: Path, *args: str) -> Result:
    """``stockade ARGS`` with ``root`` on a read-only mount (a mount namespace of
    its own; a user namespace too where the suite does not run as root)."""
    cmd = " ".join(shlex.quote(a) for a in project.cmd(*args, "--root", str(root)))
    script = (f"mount --bind {shlex.quote(str(root))} {shlex.quote(str(root))} && "
              f"mount -o remount,ro,bind {shlex.quote(str(root))} && {cmd}")
    argv = ["unshare", "-m", *([] if os.geteuid() == 0 else ["-r"]), "sh", "-c", script]
    p = subprocess.run(argv, cwd=project.path, env=project.env, capture_output=True, text=True,
                       timeout=120)
    return Result(p.returncode, p.stdout, p.stderr)


def test_a_read_only_root_is_read_and_refused_for_writes_in_one_line(project: Project) -> None:
    """run and gc printed sqlite3's and shutil's tracebacks (exit 1), and gc
    had deleted part of a run's folder that the store still listed."""
    wf = project.write("wf.yaml", "name: ro\nsteps:\n  - id: a\n    run: echo hi > out/x\n")
    root = project.path / "ro-root"
    for rid in ("old-1", "old-2"):
        assert project.run("run", str(wf), "--run-id", rid, "--root", str(root)).code == 0
    listed = _read_only(project, root, "runs", "--json")
    assert listed.code == 0 and [r["run_id"] for r in json.loads(listed.out)] == ["old-2", "old-1"]
    shown = _read_only(project, root, "show", "old-1", "a/0", "--json")
    assert shown.code == 0 and json.loads(shown.out)["item"]["status"] == "succeeded", shown.err
    logs = _read_only(project, root, "logs", "old-1", "a/0")
    assert logs.code == 0, logs.err
    ran = _read_only(project, root, "run", str(wf))
    assert ran.code == 2 and "Traceback" not in ran.err, ran.err
    assert "cannot be written" in ran.err or "Read-only file system" in ran.err, ran.err
    gone = _read_only(project, root, "gc", "--keep", "1")
    assert gone.code == 2 and "Traceback" not in gone.err, gone.err
    assert gone.err.strip().startswith("error: cannot delete run old-1: "), gone.err
    assert gone.err.strip().endswith("nothing was deleted"), gone.err
    # Writable again: old-1 is whole, and gc takes it.
    assert (root / "runs/old-1/a/0/work/out/x").read_text() == "hi\n"
    assert project.run("gc", "--keep", "1", "--root", str(root)).code == 0
    assert sorted(p.name for p in (root / "runs").iterdir()) == ["old-2"]


def test_runs_of_a_root_never_run_in_is_an_empty_list(project: Project) -> None:
    (project.path / "fresh").mkdir()
    r = project.run("runs", "--root", str(project.path / "fresh"), "--json")
    assert (r.code, r.out.strip()) == (0, "[]"), r.err
    r = project.run("runs", "--root", str(project.path / "fresh"))
    assert (r.code, r.out.strip()) == (0, "no runs yet"), r.err
    missing = project.run("runs", "--root", str(project.path / "typo"))
    assert missing.code == 2 and "no runs under" in missing.err


def test_every_command_that_reads_runs_takes_store(project: Project, pg_url: str) -> None:
    """`run --store URL` wrote to PostgreSQL; `runs`, `show`, `logs`, `why`, `gc`
    and `rm` took no --store and said the root had no runs."""
    wf = project.write("wf.yaml", "name: pg\nsteps:\n  - id: a\n    run: echo hi > out/x\n")
    root = str(project.path / "pg-root")
    for rid in ("p1", "p2"):
        assert project.run("run", str(wf), "--run-id", rid, "--root", root,
                           "--store", pg_url).code == 0
    store = ("--root", root, "--store", pg_url)
    listed = project.run("runs", "--json", *store)
    assert listed.code == 0 and [r["run_id"] for r in listed.json()] == ["p2", "p1"], listed.err
    assert project.run("show", "last", "a/0", *store).code == 0
    assert project.run("why", "p1", "a/0", *store).code == 0
    assert project.run("logs", "p1", "a/0", *store).code == 0
    assert project.run("gc", "--keep", "1", "--dry-run", *store).out.startswith("would delete p1")
    assert project.run("rm", "p1", *store).out.strip() == "deleted p1"
    alone = project.run("runs", "--root", root)  # the root's own SQLite has none
    assert alone.code == 2 and "no store of its own: their records are in the store they ran " \
        "with (--store URL, $STOCKADE_STORE)" in alone.err, alone.err


def test_logs_of_a_large_capture_streams_it(project: Project) -> None:
    """`logs` read a whole capture into memory before writing a byte (221 MB
    of RSS for a 200 MB log), and `--stderr` of an item that wrote only
    stdout read stdout whole to count its lines (520 MB)."""
    size = 128 << 20
    wf = project.write("wf.yaml", f"name: big\nsteps:\n  - id: b\n"
                                  f"    run: head -c {size} /dev/zero | tr '\\\\0' a | fold -w 99\n")
    assert project.run("run", str(wf), "--run-id", "big1", timeout=300).code == 0

    def peak(*args: str) -> tuple[int, str, int]:
        """Exit code, stderr, and the command's peak RSS in bytes; stdout is counted.

        Measured by a small parent of its own: a child forked from this test's
        process (pytest, hundreds of MB into the suite) starts its peak RSS at
        the parent's, whatever it does after exec."""
        measure = ("import resource, subprocess, sys\n"
                   "code = subprocess.call(sys.argv[1:])\n"
                   "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
                   "print(f'peak-kib {peak}', file=sys.stderr)\n"
                   "sys.exit(code)\n")
        p = subprocess.Popen([sys.executable, "-c", measure, *project.cmd(*args)],
                             cwd=project.path, env=project.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.stdout is not None and p.stderr is not None
        got = sum(len(chunk) for chunk in iter(lambda: p.stdout.read(1 << 20), b""))  # type: ignore[union-attr]
        err = p.stderr.read().decode()
        p.wait()
        assert args[-1] == "--stderr" or got == size + size // 99, got
        said, _, kib = err.rstrip("\n").rpartition("peak-kib ")
        return p.returncode, said, int(kib) * 1024

    code, _, rss = peak("logs", "big1", "b")
    assert code == 0 and rss < 100 << 20, rss
    code, err, rss = peak("logs", "big1", "b", "--stderr")
    assert code == 0 and rss < 100 << 20, rss
    assert f"its stdout has {size // 99 + 1} lines" in err, err
