"""Every query parameter ``stockade ui`` reads, given badly by hand (huge, negative, not a
number, given twice): the last page, or a 400 that says what is wrong, never a 500."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import httpx

from tests.integration.conftest import Project
from tests.web.conftest import UIProcess
from tests.web.test_ui_browser import big_run

HUGE = "99999999999999999999"  # more than SQLite's 64-bit integers hold


def first_patch(ui: UIProcess, path: str) -> dict[str, Any]:
    """The first ``patch`` event of an event stream (it carries the whole small state)."""
    with httpx.stream("GET", ui.url + path, timeout=60) as r:
        assert r.status_code == 200, path
        assert r.headers["content-type"].startswith("text/event-stream")
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "patch":
                out: dict[str, Any] = json.loads(line[6:])
                return out
    raise AssertionError(f"{path}: the stream ended without a patch")


def test_paging_parameters_out_of_range_give_the_last_page(project: Project,
                                                           start_ui: Any) -> None:
    project.root.mkdir(parents=True)
    big_run(project, "q1", n=1200)
    ui: UIProcess = start_ui()
    step = "/runs/q1/many"
    for query, pages, first, last in [
        (f"?page={HUGE}", 12, "k01100", "k01199"),
        (f"?page={HUGE}&limit=50", 24, "k01150", "k01199"),
        ("?page=" + "9" * 5000, 12, "k01100", "k01199"),
        ("?page=13", 12, "k01100", "k01199"),
        ("?page=0", 12, "k00000", "k00099"),
        ("?page=-3", 12, "k00000", "k00099"),
        (f"?page=-{HUGE}", 12, "k00000", "k00099"),
        ("?page=", 12, "k00000", "k00099"),
        (f"?limit={HUGE}", 3, "k00000", "k00499"),
        ("?limit=-1", 24, "k00000", "k00049"),
        ("?limit=150", 12, "k00000", "k00099"),
        # k00999 failed: the 1,100th item done is k01101.
        (f"?filter=done&page={HUGE}", 12, "k01101", "k01199"),
    ]:
        r = ui.get(step + query)
        assert r.status_code == 200, (query, r.text[-300:])
        assert f'id="pages">{pages}<' in r.text, query
        keys = re.findall(r'<a href="/runs/q1/many/(k\d+)">', r.text)
        assert (keys[0], keys[-1]) == (first, last), query
    # The failed-only filter (one failure in 1,200) and one computed from the folder.
    assert "k00999" in ui.get(f"{step}?filter=failed&page={HUGE}").text
    assert ui.get(f"{step}?filter=running&page={HUGE}").status_code == 200
    # The same numbers on the step's event stream: the last page's rows, not a crash.
    patch = first_patch(ui, f"/live{step}?page={HUGE}&limit=500")
    assert "1199" in patch["rows"] and "1000" in patch["rows"] and "999" not in patch["rows"]
    patch = first_patch(ui, f"/live{step}?page=-1&filter=failed")
    assert list(patch["rows"]) == ["999"]


def test_unusable_parameters_are_a_400_that_says_why(project: Project, start_ui: Any) -> None:
    project.root.mkdir(parents=True)
    big_run(project, "q2", n=3)
    ui: UIProcess = start_ui()
    item = "/runs/q2/many/k00001"
    for path, says in [
        ("/runs/q2/many?page=abc", "page='abc' is not a whole number"),
        ("/runs/q2/many?page=1.5", "page='1.5' is not a whole number"),
        ("/runs/q2/many?page=%C2%B2", "page='²' is not a whole number"),  # int("²") raises
        ("/runs/q2/many?page=1&page=2", "page is given 2 times in the URL: give it once"),
        ("/runs/q2/many?limit=lots", "limit='lots' is not a whole number"),
        ("/runs/q2/many?limit=50&limit=50", "limit is given 2 times"),
        ("/runs/q2/many?filter=done&filter=failed", "filter is given 2 times"),
        ("/runs/q2/many?filter=bogus", "unknown filter 'bogus': use one of done,"),
        ("/?status=failed&status=running", "status is given 2 times"),
        ("/?workflow=a&workflow=b", "workflow is given 2 times"),
        (f"{item}?attempt=first", "attempt='first' is not a whole number"),
        (f"{item}?attempt=1&attempt=1", "attempt is given 2 times"),
        ("/live/runs/q2/many?page=abc", "page='abc' is not a whole number"),
        ("/live/runs/q2/many?filter=bogus", "unknown filter 'bogus'"),
        ("/live/runs?status=a&status=b", "status is given 2 times"),
        (f"/live{item}?logs=1:stdout:0&logs=1:stderr:0", "logs is given 2 times"),
        (f"{item}/files/out/x.txt?attempt=x", "attempt='x' is not a whole number"),
    ]:
        r = ui.get(path)
        assert r.status_code == 400, (path, r.status_code, r.text[-300:])
        assert says in html.unescape(r.text), (path, r.text[-500:])
        assert "Traceback" not in r.text
    # Attempts and log offsets that no item has: a 404 naming what there is, or
    # nothing to show; never a number handed on to the store.
    for path, status, says in [
        (f"{item}?attempt={HUGE}", 404, "many/k00001 has no attempt 2147483647 (its attempts: 1)"),
        (f"{item}?attempt=7", 404, "has no attempt 7 (its attempts: 1)"),
        (f"{item}?attempt=-1", 200, "k00001"),
        (f"{item}?attempt=1", 200, "k00001"),
        (f"{item}/files/out/x.txt?attempt={HUGE}", 404, "has no output 'x.txt'"),
        (f"{item}/log/{HUGE}/stdout", 404, "no stdout"),
        ("/?status=" + "9" * 5000, 200, "no runs match"),
    ]:
        r = ui.get(path)
        assert r.status_code == status and says in html.unescape(r.text), \
            (path, r.status_code, r.text[-500:])
    patch = first_patch(ui, f"/live{item}?logs=1:stdout:{HUGE},{HUGE}:stderr:1&finished=1")
    assert patch["status"] == "succeeded"
    assert "Traceback" not in ui.log.read_text()
