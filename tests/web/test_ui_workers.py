"""The item page names the Dask worker that ran each attempt, as ``stockade show`` does:
from the attempt's record, drawn with the page and arriving live."""

from __future__ import annotations

import html
import os
import re
import signal
import time
from typing import Any

from stockade.store.base import AttemptRecord
from stockade.store.sqlite import SQLiteStore
from tests.integration.conftest import Project
from tests.web.conftest import GATED, UIProcess, gates_started, release
from tests.web.test_ui_browser import WAIT_MS, big_run

W1 = {"name": "w1", "address": "tcp://10.0.0.5:40001", "host": "node-a", "backend": "bwrap",
      "enforced": True}
W2 = {**W1, "name": "w2", "address": "tcp://10.0.0.6:40002", "host": "node-b"}


def attempt(run_id: str, step: str, item: int, n: int, outcome: str,
            worker: dict[str, Any] | None) -> AttemptRecord:
    t = time.time() - 60 + n
    prov = {"run_id": run_id, "step": step, "item": item, "attempt": n, "status": outcome}
    if worker is not None:
        prov["worker"] = worker
    return AttemptRecord(run_id, step, item, n, outcome, 0 if outcome == "succeeded" else 1,
                         t, t + 0.5, "" if outcome == "succeeded" else "exit status 1", prov)


def test_the_attempts_table_names_each_attempts_worker(project: Project, start_ui: Any) -> None:
    project.root.mkdir(parents=True)
    big_run(project, "dask1", n=2)
    store = SQLiteStore(project.root / "stockade.db")
    try:
        store.record_attempt(attempt("dask1", "many", 0, 1, "failed", W1))
        store.record_attempt(attempt("dask1", "many", 0, 2, "succeeded", W2))
        store.record_attempt(attempt("dask1", "many", 1, 1, "succeeded", None))
    finally:
        store.close()
    ui: UIProcess = start_ui()
    text = ui.get("/runs/dask1/many/k00000").text
    table = text[text.index('id="attempts"'):text.index("</table>", text.index('id="attempts"'))]
    assert '<th data-col="worker">worker</th>' in table
    workers = re.findall(r'<td class="mono" data-f="worker" title="([^"]*)">([^<]*)</td>', table)
    assert [(html.unescape(t), w) for t, w in workers] == [
        ("tcp://10.0.0.5:40001 on node-a", "w1"), ("tcp://10.0.0.6:40002 on node-b", "w2")]
    # As the command line says it, from the same record.
    shown = project.run("show", "dask1", "many/k00000")
    assert shown.code == 0 and "on worker w1" in shown.out and "on worker w2" in shown.out
    # No attempt ran on a worker (a local run): no column.
    local = ui.get("/runs/dask1/many/k00001").text
    assert 'data-col="worker"' not in local and 'data-f="worker"' not in local


def test_a_worker_recorded_while_the_page_is_open_appears(project: Project, start_ui: Any,
                                                          page: Any) -> None:
    wf = project.write("gated.yaml", GATED)
    proc = project.popen("run", str(wf), "--run-id", "live2", "--jobs", "3")
    try:
        gates_started(project, "live2")
        ui: UIProcess = start_ui()
        page.goto(ui.url + "/runs/live2/gate/alpha")
        page.wait_for_function("() => document.querySelector('#conn').textContent === 'live'",
                               timeout=WAIT_MS)
        assert page.locator('#attempts [data-col="worker"]').count() == 0
        # An attempt record naming its worker lands (as a Dask engine writes it).
        store = SQLiteStore(project.root / "stockade.db")
        try:
            store.record_attempt(attempt("live2", "gate", 0, 1, "failed", W2))
        finally:
            store.close()
        page.wait_for_selector('#attempts th[data-col="worker"]', timeout=WAIT_MS)
        cell = page.locator('#attempts tr[data-attempt="1"] [data-f="worker"]')
        page.wait_for_function("""() => (document.querySelector(
            '#attempts tr[data-attempt="1"] [data-f="worker"]') || {}).textContent === 'w2'""",
                               timeout=WAIT_MS)
        assert cell.get_attribute("title") == "tcp://10.0.0.6:40002 on node-b"
        # Every row keeps its cells under their headings.
        heads = page.locator("#attempts thead th").count()
        assert page.locator('#attempts tr[data-attempt="1"] td').count() == heads
        for i in range(3):
            release(project, "live2", "gate", i)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
