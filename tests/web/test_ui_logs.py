"""Following a log that grows faster than the page can take it: the item's event stream
skips to the log's last window with a marker (it fell behind forever at 64 KiB a
tick), and the page keeps only the last 1 MiB of a log.

The item writes bursts of a size the test asks for (a file ``goN`` in its work
folder holds the line count of burst N), so the test knows how much was written
and reads the stream until it has the burst's end: nothing here sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from stockade.web.live import WINDOW
from tests.integration.conftest import Project
from tests.web.conftest import UIProcess, wait_for
from tests.web.test_ui_browser import WAIT_MS

LINE = "x" * 63  # 64 bytes a line with its newline
CHATTY = f"""\
name: chatty
steps:
  - id: talk
    run: |
      echo started
      i=0
      while [ ! -e stop ]; do
        n=$((i + 1))
        if [ -e "go$n" ]; then
          i=$n
          echo "BURST $i START"
          yes '{LINE}' | head -n "$(cat "go$i")"
          echo "BURST $i END"
        fi
        sleep 0.05
      done
      echo done > out/done.txt
"""


def start_chatty(project: Project, run_id: str) -> tuple[subprocess.Popen[str], Path, Path]:
    wf = project.write("chatty.yaml", CHATTY)
    proc = project.popen("run", str(wf), "--run-id", run_id)
    work = project.item(run_id, "talk", 0) / "work"
    log = project.item(run_id, "talk", 0) / "meta" / "1.out"
    wait_for(lambda: log.exists() and b"started" in log.read_bytes(), "the item to start")
    return proc, work, log


def burst(work: Path, log: Path, n: int, lines: int) -> int:
    """Burst ``n`` of ``lines`` lines, written in full; the log's size after it."""
    (work / f"go{n}.tmp").write_text(f"{lines}\n")
    (work / f"go{n}.tmp").rename(work / f"go{n}")
    end = f"BURST {n} END\n".encode()
    wait_for(lambda: log.read_bytes().endswith(end), f"burst {n} to be written", timeout=120)
    return log.stat().st_size


def finish(proc: subprocess.Popen[str], work: Path) -> None:
    try:
        (work / "stop").write_text("")
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def patches(ui: UIProcess, path: str) -> Iterator[dict[str, Any]]:
    with httpx.stream("GET", ui.url + path, timeout=httpx.Timeout(30, read=120)) as r:
        assert r.status_code == 200
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "patch":
                yield json.loads(line[6:])


def test_a_stream_behind_by_more_than_a_window_skips_to_the_end(project: Project,
                                                                start_ui: Any) -> None:
    proc, work, log = start_chatty(project, "fast1")
    try:
        size = burst(work, log, 1, 50_000)  # 3.2 MB, all on disk before the stream starts
        ui: UIProcess = start_ui()
        # A page drawn at the start (offset 0): its first patch is the log's end.
        stream = patches(ui, "/live/runs/fast1/talk/0?logs=1:stdout:0&finished=0")
        first = next(p for p in stream if "logs" in p)
        text = first["logs"]["1:stdout"]
        assert first["skipped"]["1:stdout"] > size - WINDOW - 100
        assert first["skipped"]["1:stdout"] + len(text) == size
        assert len(text) <= WINDOW and text.endswith("BURST 1 END\n")
        assert text.startswith(LINE + "\n")  # from a whole line
        assert first["offsets"]["1:stdout"] == size
        # Another 3.2 MB while the stream is open: it catches up with a few windows,
        # not the whole burst at a fixed share per tick.
        burst(work, log, 2, 50_000)
        got, skips = "", 0
        for p in stream:
            skips += bool((p.get("skipped") or {}).get("1:stdout"))
            got += (p.get("logs") or {}).get("1:stdout", "")
            if got.endswith("BURST 2 END\n"):
                break
        assert skips >= 1 and len(got) <= 4 * WINDOW, (skips, len(got))
    finally:
        finish(proc, work)


def test_the_page_marks_a_skip_and_keeps_the_last_mib(project: Project, start_ui: Any,
                                                      page: Any) -> None:
    proc, work, log = start_chatty(project, "fast2")
    try:
        ui: UIProcess = start_ui()
        page.goto(ui.url + "/runs/fast2/talk/0")
        page.wait_for_function("() => document.querySelector('#conn').textContent === 'live'",
                               timeout=WAIT_MS)
        pre = 'pre[data-log="1:stdout"]'
        burst(work, log, 1, 50_000)
        page.wait_for_function(f"""() => document.querySelector('{pre}').textContent
                                   .endsWith('BURST 1 END\\n')""", timeout=WAIT_MS)
        note = page.locator(f"{pre} .log-skip")
        assert note.count() == 1
        assert "MiB skipped; the whole log: download" in note.inner_text()
        href = note.locator("a").get_attribute("href")
        assert href == "/runs/fast2/talk/0/log/1/stdout"
        whole = ui.get(href)
        assert whole.status_code == 200 and len(whole.content) >= 50_000 * 64
        # Bursts below the window come whole; past 1 MiB the oldest text goes.
        for n in range(2, 7):
            burst(work, log, n, 3_500)  # 224 KB each
            page.wait_for_function(f"""() => document.querySelector('{pre}').textContent
                                       .endsWith('BURST {n} END\\n')""", timeout=WAIT_MS)
        kept = page.evaluate(f"""() => {{
            const pre = document.querySelector('{pre}');
            const top = pre.querySelector('.log-dropped');
            return {{text: pre.textContent, first: pre.firstChild === top,
                     top: top ? top.textContent : ''}};
        }}""")
        assert kept["first"], "the note on dropped text leads the log"
        assert "older text dropped: this page keeps the last 1.0 MiB" in kept["top"]
        body = kept["text"][len(kept["top"]):]
        assert 1_000_000 < len(body) <= 1 << 20
        assert "BURST 2 START" not in body and "BURST 6 END" in body
        assert body.startswith(LINE + "\n") or body.startswith("BURST")
    finally:
        finish(proc, work)
