"""The web UI in a real browser (Debian's chromium through Playwright) on real runs.

Live updates are proved during a run whose items wait for a file the test
creates, so the test decides when each item finishes and never sleeps for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from stockade.store.base import Event, ItemRecord, RunRecord
from stockade.store.sqlite import SQLiteStore
from stockade.web.live import RunTicker
from stockade.web.model import SPAN_LIMIT, Folds, Reuse
from tests.integration.conftest import Project
from tests.web.conftest import GATED, UIProcess, gates_started, release, wait_for

WAIT_MS = 60_000


def select_text(page: Any, selector: str, needle: str) -> str:
    """Select ``needle`` inside the first text node of ``selector``; return the selection."""
    return str(page.evaluate("""([sel, needle]) => {
        const el = document.querySelector(sel);
        const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
        let node;
        while ((node = walker.nextNode())) {
            const at = node.data.indexOf(needle);
            if (at >= 0) {
                const r = document.createRange();
                r.setStart(node, at);
                r.setEnd(node, at + needle.length);
                const s = window.getSelection();
                s.removeAllRanges();
                s.addRange(r);
                return s.toString();
            }
        }
        return "";
    }""", [selector, needle]))


def selection(page: Any) -> str:
    return str(page.evaluate("() => window.getSelection().toString()"))


def patches(page: Any) -> int:
    return int(page.evaluate("() => parseInt(document.body.dataset.patches || '0', 10)"))


def cell(page: Any, step: str, field: str) -> str:
    return str(page.inner_text(f'tr[data-step="{step}"] [data-f="{field}"]')).strip()


def test_live_run_updates_without_reload(project: Project, start_ui: Any, page: Any,
                                         browser_context: Any) -> None:
    wf = project.write("gated.yaml", GATED)
    proc = project.popen("run", str(wf), "--run-id", "live1", "--jobs", "3")
    try:
        gates_started(project, "live1")
        ui: UIProcess = start_ui()
        page.goto(ui.url + "/runs/live1")
        page.wait_for_function("() => document.querySelector('#conn').textContent === 'live'",
                               timeout=WAIT_MS)
        assert cell(page, "gate", "running") == "3" and cell(page, "gate", "done") == "0"
        assert page.inner_text("#run-status").strip() == "running"
        page.evaluate("() => { window.__sameDocument = 'yes'; }")
        root_text = str(project.root)
        assert select_text(page, ".card.two dl.facts", root_text) == root_text

        # A second tab follows beta's logs live.
        item = browser_context.new_page()
        item.goto(ui.url + "/runs/live1/gate/beta")
        item.wait_for_function("() => document.querySelector('#conn').textContent === 'live'",
                               timeout=WAIT_MS)
        item.wait_for_function("""() => document.querySelector('pre[data-log="1:stdout"]')
                                   .textContent.includes('started beta')""", timeout=WAIT_MS)
        assert item.inner_text("#item-status").strip() == "running"
        assert select_text(item, 'pre[data-log="1:stdout"]', "started beta") == "started beta"

        release(project, "live1", "gate", 0)
        page.wait_for_function("""() => document.querySelector(
            'tr[data-step="gate"] [data-f="done"]').textContent.trim() === '1'""", timeout=WAIT_MS)
        assert cell(page, "gate", "running") == "2"
        # The graph node says so too, and nothing was reloaded or re-rendered under the selection.
        assert "1/3 done" in (page.text_content('#dag g[data-node="gate"]') or "")
        assert page.evaluate("() => window.__sameDocument") == "yes"
        assert selection(page) == root_text
        assert patches(page) >= 1

        release(project, "live1", "gate", 1)
        item.wait_for_function("""() => document.querySelector('pre[data-log="1:stdout"]')
                                   .textContent.includes('released beta')""", timeout=WAIT_MS)
        item.wait_for_function("() => document.querySelector('#item-status').textContent.trim()"
                               " === 'succeeded'", timeout=WAIT_MS)
        assert selection(item) == "started beta"
        # The parts that exist only once it finished arrive in place.
        item.wait_for_selector('tr[data-output="done.txt"]', timeout=WAIT_MS)
        assert selection(item) == "started beta"
        item.close()

        release(project, "live1", "gate", 2)
        page.wait_for_function("() => document.querySelector('#run-status').textContent.trim()"
                               " === 'succeeded'", timeout=WAIT_MS)
        assert cell(page, "gate", "done") == "3" and cell(page, "after", "done") == "1"
        assert page.evaluate("() => window.__sameDocument") == "yes"
        assert selection(page) == root_text
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_step_page_live_rows_and_runs_list(project: Project, start_ui: Any, page: Any,
                                           browser_context: Any) -> None:
    ui: UIProcess | None = None
    wf = project.write("gated.yaml", GATED)
    assert project.run("run", project.write("first.yaml", "name: first\nsteps:\n  - id: a\n    run: "
                                                  "echo a > out/a.txt\n").as_posix(),
                       "--run-id", "first1").code == 0
    ui = start_ui()
    runs = browser_context.new_page()
    runs.goto(ui.url + "/")
    runs.wait_for_function("() => document.querySelector('#conn').textContent === 'live'",
                           timeout=WAIT_MS)
    proc = project.popen("run", str(wf), "--run-id", "live2", "--jobs", "3")
    try:
        # A run that started after the page was drawn appears in the list by itself.
        runs.wait_for_selector('tr[data-run="live2"]', timeout=WAIT_MS)
        assert runs.inner_text('tr[data-run="live2"] [data-f="status"]').strip() == "running"
        gates_started(project, "live2")
        page.goto(ui.url + "/runs/live2/gate")
        page.wait_for_function("() => document.querySelector('#conn').textContent === 'live'",
                               timeout=WAIT_MS)
        assert page.inner_text('tr[data-index="2"] [data-f="status"]').strip() == "running"
        assert page.inner_text('tr[data-index="2"] td.mono').strip() == "gamma"
        release(project, "live2", "gate", 2)
        page.wait_for_function("""() => document.querySelector('tr[data-index="2"] [data-f="status"]')
                                  .textContent.trim() === 'succeeded'""", timeout=WAIT_MS)
        assert page.inner_text('[data-c="done"]').strip() == "1"
        assert page.inner_text('tr[data-index="0"] [data-f="status"]').strip() == "running"
        release(project, "live2", "gate", 0)
        release(project, "live2", "gate", 1)
        runs.wait_for_function("""() => document.querySelector('tr[data-run="live2"] [data-f="status"]')
                                  .textContent.trim() === 'succeeded'""", timeout=WAIT_MS)
        assert runs.inner_text('tr[data-run="live2"] [data-f="done"]').strip() == "5"
        assert proc.wait(60) == 0
    finally:
        runs.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_failing_item_by_deep_link(project: Project, start_ui: Any, page: Any) -> None:
    marker = "BOOM-" + secrets.token_hex(6)
    wf = project.write("fail.yaml", f"""\
        name: failing
        steps:
          - id: work
            for_each: [fine, broken]
            retries: 1
            run: |
              if [ "$STOCKADE_ITEM_KEY" = broken ]; then
                echo "attempt $STOCKADE_ATTEMPT: {marker[:5]}""{marker[5:]}" >&2; exit 7
              fi
              echo ok > out/ok.txt
        """)
    assert project.run("run", str(wf), "--run-id", "fail1").code == 1
    ui: UIProcess = start_ui()
    # Straight to the failing item, as a link someone sent would.
    page.goto(ui.url + "/runs/fail1/work/broken")
    assert page.inner_text("h1").strip() == "work/broken"
    assert page.inner_text("#item-status").strip() == "failed"
    rows = page.locator("#attempts tbody tr")
    assert rows.count() == 2
    for n in (1, 2):
        assert page.inner_text(f'#attempts tr[data-attempt="{n}"] [data-f="outcome"]').strip() == "failed"
        assert page.inner_text(f'#attempts tr[data-attempt="{n}"] [data-f="exit_code"]').strip() == "7"
    assert f"attempt 2: {marker}" in page.inner_text('pre[data-log="2:stderr"]')
    assert f"attempt 1: {marker}" in page.text_content('pre[data-log="1:stderr"]')
    # The run page lists it with its stderr, and its graph node is coloured failed.
    page.goto(ui.url + "/runs/fail1")
    assert marker in page.inner_text("#failures")
    assert page.get_attribute('#dag g[data-node="work"]', "data-status") == "failed"
    assert page.inner_text('#run-status').strip() == "failed"
    # From the failure to the item, and the whole stderr file by its link.
    page.click('#failures a[href$="/work/broken"]')
    page.wait_for_url("**/runs/fail1/work/broken")
    whole = page.request.get(ui.url + "/runs/fail1/work/broken/log/2/stderr").text()
    assert marker in whole


def test_deep_links_survive_a_reload(project: Project, start_ui: Any, page: Any) -> None:
    wf = project.write("wf.yaml", """\
        name: links
        steps:
          - id: many
            for_each: [a, b, c, d, e]
            run: echo "$STOCKADE_ITEM_KEY" > out/k.txt
          - id: pick
            needs: [many]
            for_each: "{{ steps.many.items }}"
            keep: "{{ item.key in ['b', 'd'] }}"
          - id: last
            needs: [pick, many]
            inputs:
              kept: "{{ steps.pick.items | map(attribute='key') | list | to_json }}"
              c.txt: "{{ steps.many.items[2].outputs['k.txt'] }}"
            run: cat kept c.txt > out/kept.txt
        """)
    assert project.run("run", str(wf), "--run-id", "links1").code == 0
    ui: UIProcess = start_ui()
    for path, check in [
        ("/runs/links1", lambda: page.inner_text("h1").strip() == "links1"),
        ("/runs/links1/many?limit=50&page=1&filter=done",
         lambda: page.locator("#items tbody tr").count() == 5
         and "on" in (page.get_attribute('.tabs a[href$="filter=done"]', "class") or "")),
        ("/runs/links1/many/c", lambda: page.inner_text("h1").strip() == "many/c"
         and "out/k.txt" in page.inner_text("#outputs")),
        ("/runs/links1/pick/d", lambda: page.inner_text("h1").strip() == "pick/d"),
        ("/runs/links1/last/0", lambda: "many/c" in (page.text_content("#chain-graph") or "")
         and "steps.pick.items" in (page.text_content("#chain-graph") or "")),
    ]:
        page.goto(ui.url + path)
        assert check(), path
        page.reload()
        assert page.url == ui.url + path
        assert check(), f"{path} after a reload"
    # Clicking through the graph and the table lands on pages with their own URLs.
    page.goto(ui.url + "/runs/links1")
    page.click('#dag g[data-node="many"]')
    page.wait_for_url(ui.url + "/runs/links1/many")
    page.click('#items a[href$="/many/e"]')
    page.wait_for_url(ui.url + "/runs/links1/many/e")
    page.go_back()
    page.wait_for_url(ui.url + "/runs/links1/many")


def test_download_matches_its_hash(project: Project, start_ui: Any, page: Any,
                                   tmp_path: Path) -> None:
    wf = project.write("wf.yaml", """\
        name: files
        steps:
          - id: make
            run: head -c 300000 /dev/urandom > out/data.bin
        """)
    assert project.run("run", str(wf), "--run-id", "files1").code == 0
    ui: UIProcess = start_ui()
    page.goto(ui.url + "/runs/files1/make/0")
    shown = page.get_attribute('tr[data-output="data.bin"] [data-sha256]', "data-sha256")
    with page.expect_download() as dl:
        page.click('tr[data-output="data.bin"] a.dl')
    saved = tmp_path / "saved.bin"
    dl.value.save_as(saved)
    got = hashlib.sha256(saved.read_bytes()).hexdigest()
    store = SQLiteStore(project.root / "stockade.db")
    try:
        [rec] = store.items("files1", "make")
    finally:
        store.close()
    assert got == shown == rec.outputs[0].sha256
    assert dl.value.suggested_filename == "data.bin"


def test_crashed_run_shown_as_crashed_and_resumed(project: Project, start_ui: Any,
                                                  page: Any) -> None:
    wf = project.write("gated.yaml", GATED)
    proc = project.popen("run", str(wf), "--run-id", "crash1", "--jobs", "3")
    # Every gated item must have begun its first attempt before the engine dies:
    # one that had not would run attempt 1 again on resume and wait for ever.
    gates_started(project, "crash1")
    os.killpg(proc.pid, signal.SIGKILL)  # the engine dies however it dies
    proc.wait()
    ui: UIProcess = start_ui("--allow-actions")
    page.goto(ui.url + "/")
    assert page.inner_text('tr[data-run="crash1"] [data-f="status"]').strip() == "crashed"
    page.goto(ui.url + "/?status=crashed")
    assert page.locator("#runs tbody tr").count() == 1
    page.goto(ui.url + "/runs/crash1")
    assert page.inner_text("#run-status").strip() == "crashed"
    assert "stockade resume crash1" in page.inner_text("#run-resume")
    assert page.inner_text('tr[data-step="gate"] [data-f="status"]').strip() == "interrupted"
    assert page.is_hidden('button[data-action="cancel"]')
    page.wait_for_function("() => document.querySelector('#conn').textContent === 'live'",
                           timeout=WAIT_MS)
    page.on("dialog", lambda d: d.accept())
    page.click('button[data-action="resume"]')
    try:
        page.wait_for_function("() => document.querySelector('#run-status').textContent.trim()"
                               " === 'succeeded'", timeout=120_000)
    except Exception as exc:
        # The resume runs detached: its own output says why it did not succeed,
        # and it must not outlive the test.
        log = project.root / "runs" / "crash1" / "ui-resume.log"
        told = log.read_text(errors="replace") if log.exists() else "(no ui-resume.log)"
        shown = page.inner_text("#run-status").strip()
        project.run("cancel", "crash1")
        raise AssertionError(f"the resumed run shows {shown!r}, not 'succeeded'; "
                             f"ui-resume.log:\n{told}") from exc
    assert cell(page, "gate", "done") == "3"


def test_cancel_button_stops_a_run(project: Project, start_ui: Any, page: Any) -> None:
    wf = project.write("gated.yaml", GATED)
    proc = project.popen("run", str(wf), "--run-id", "stop1", "--jobs", "3")
    try:
        wait_for((project.item("stop1", "gate", 2) / "work").is_dir, "the gated items")
        ui: UIProcess = start_ui("--allow-actions")
        page.goto(ui.url + "/runs/stop1")
        page.wait_for_function("() => document.querySelector('#conn').textContent === 'live'",
                               timeout=WAIT_MS)
        page.on("dialog", lambda d: d.accept())
        page.click('button[data-action="cancel"]')
        assert proc.wait(60) == 130
        page.wait_for_function("() => document.querySelector('#run-status').textContent.trim()"
                               " === 'interrupted'", timeout=WAIT_MS)
        assert page.is_visible('button[data-action="resume"]')
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def big_run(project: Project, run_id: str, n: int = 10_000) -> None:
    """A finished 10,000-item run written through the Store API (records, events and a
    manifest as the engine writes them), not executed: it takes a second, not a minute."""
    path = project.root / "runs" / run_id
    path.mkdir(parents=True)
    t0 = time.time() - 600
    (path / "manifest.json").write_text(json.dumps({
        "run_id": run_id, "vars": {},
        "steps": [{"id": "many", "kind": "run", "needs": [], "fan_out": True}],
        "sandbox": {"backend": "none", "enforced": False}}))
    store = SQLiteStore(project.root / "stockade.db")
    try:
        store.create_run(RunRecord(run_id, "big", str(project.path / "big.yaml"), "00" * 32,
                                   str(project.root), "failed", t0, t0 + 500, "none", False))
        store.add_event(Event(run_id, t0, "step_started", {"step": "many", "items": n}))
        store.add_event(Event(run_id, t0, "item_keys",
                              {"step": "many", "keys": [f"k{i:05d}" for i in range(n)]}))
        store.record_batch([], [
            (ItemRecord(run_id, "many", i, "failed" if i % 1000 == 999 else "succeeded", 1,
                        started_at=t0 + i * 0.05, ended_at=t0 + i * 0.05 + 0.04, key=f"k{i:05d}",
                        message="exit status 1" if i % 1000 == 999 else ""), [])
            for i in range(n)])
        store.add_event(Event(run_id, t0 + 500, "step_finished", {"step": "many", "status": "failed"}))
    finally:
        store.close()


def test_a_timeline_too_big_to_draw_item_by_item_comes_as_counts(
    project: Project, start_ui: Any, page: Any
) -> None:
    # Above model.SPAN_LIMIT items the timeline is how many items ended in
    # each slice of the run's time: a small answer, drawn as bars, hovered.
    n = SPAN_LIMIT + 5_000
    project.root.mkdir(parents=True)
    big_run(project, "big2", n)
    ui: UIProcess = start_ui()
    r = ui.get("/api/runs/big2/timeline")
    assert r.status_code == 200 and len(r.content) < 50_000, len(r.content)
    tl = r.json()
    assert tl["spans"]["s"] == [] and sum(tl["bins"]["n"]) == n
    failed = tl["statuses"].index("failed")
    assert sum(c for st, c in zip(tl["bins"]["st"], tl["bins"]["n"], strict=True)
               if st == failed) == n // 1000
    # The run's 500 s in slices of 1 s; item i ends at 0.05 i + 0.04 s (past
    # the run's recorded end, as big_run writes 25,000 of them).
    assert tl["bins"]["w"] == 1000 and max(tl["bins"]["b"]) == (n - 1) // 20
    assert sorted(set(tl["bins"]["n"])) == [1, 19, 20]  # slices hold 20 items, less a failure
    page.goto(ui.url + "/runs/big2")
    page.wait_for_function("() => document.querySelector('#timeline').height > 0", timeout=WAIT_MS)
    box = page.locator("#timeline").bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 20)
    page.wait_for_function("() => !document.querySelector('#timeline-tip').hidden", timeout=WAIT_MS)
    tip = page.inner_text("#timeline-tip")
    assert tip.startswith("many · ") and " ended: " in tip and "succeeded" in tip, tip


@pytest.mark.parametrize(("n", "binned"), [(100, False), (SPAN_LIMIT + 1, True)])
def test_the_run_stream_sends_spans_or_says_the_counts_are_stale(
    project: Project, n: int, binned: bool
) -> None:
    # A big run's page counts nothing itself (it fetches the counts again),
    # so the stream neither reads nor remembers its spans.
    project.root.mkdir(parents=True)
    big_run(project, "r", n)
    store = SQLiteStore(project.root / "stockade.db")
    try:
        ticker = RunTicker(store, Folds(store), Reuse(store), "r")
        first = ticker.tick()
    finally:
        store.close()
    assert first is not None
    if binned:
        assert first.get("timeline_stale") is True and "spans" not in first
        assert not ticker.spans_seen
    else:
        assert "timeline_stale" not in first and len(first["spans"]["s"]) == n


def test_paging_a_10000_item_run(project: Project, start_ui: Any, page: Any) -> None:
    project.root.mkdir(parents=True)
    big_run(project, "big1")
    ui: UIProcess = start_ui()
    resp = page.goto(ui.url + "/runs/big1/many")
    assert resp is not None and len(resp.body()) < 1_000_000
    assert page.locator("#items tbody tr").count() == 100
    assert page.inner_text("#pages").strip() == "100"
    assert page.inner_text('tr[data-index="0"] td.mono').strip() == "k00000"
    page.click('a[rel="next"]')
    page.wait_for_url("**/runs/big1/many?page=2")
    assert page.inner_text("#items tbody tr:first-child td.mono").strip() == "k00100"
    # Straight to a page far in, and the last one.
    page.goto(ui.url + "/runs/big1/many?page=15&limit=500")
    assert page.locator("#items tbody tr").count() == 500
    assert page.inner_text("#pages").strip() == "20"
    assert page.inner_text("#items tbody tr:first-child td.mono").strip() == "k07000"
    page.goto(ui.url + "/runs/big1/many?page=100")
    assert page.inner_text("#items tbody tr:last-child td.mono").strip() == "k09999"
    # Only the failed ones, paged the same way.
    page.goto(ui.url + "/runs/big1/many?filter=failed")
    assert page.locator("#items tbody tr").count() == 10
    assert page.inner_text("#matching").strip() == "10"
    # The run page stays small and counts all of it.
    resp = page.goto(ui.url + "/runs/big1")
    assert resp is not None and len(resp.body()) < 1_000_000
    assert cell(page, "many", "done") == "9990" and cell(page, "many", "failed") == "10"
    page.wait_for_function("() => document.querySelector('#timeline').height > 0", timeout=WAIT_MS)
    page.goto(ui.url + "/runs/big1/many/k04242")
    assert page.inner_text("h1").strip() == "many/k04242"
