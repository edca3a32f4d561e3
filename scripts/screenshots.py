"""Make the README's screenshots of ``stockade ui`` (PNG files under docs/).

Runs a few real workflows in a temporary folder (the pipeline example, a
fan-out with a retried failure, a run that crashes, and one left running
whose items wait for a file), serves them with ``stockade ui`` and has
Debian's chromium, driven by Playwright, photograph the main pages.

Usage: ``.venv/bin/python scripts/screenshots.py [--out docs]``
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

FANOUT = """name: regions
vars:
  quarter: 2026-Q3
steps:
  - id: fetch
    run: |
      printf '["north","south","east","west","centre","islands","coast","hills"]' > out/regions.json
  - id: score
    needs: [fetch]
    for_each: "{{ steps.fetch.outputs['regions.json'] | from_json }}"
    retries: 1
    inputs:
      region.txt: "{{ item }}"
    run: |
      echo "scoring $(cat region.txt) for {{ vars.quarter }}"
      if [ "$(cat region.txt)" = islands ]; then
        echo "error: no data for islands in the extract (rows 0 of 12)" >&2
        echo "hint: the upstream export skipped offshore stations" >&2
        exit 3
      fi
      sleep 0.$(( $(cat region.txt | wc -c) % 5 ))
      echo "{\\"region\\": \\"$(cat region.txt)\\", \\"score\\": $(cat region.txt | wc -c)}" > out/score.json
  - id: report
    needs: [score]
    inputs:
      scores: "{{ steps.score.items | map(attribute='outputs') | list | to_json }}"
    run: wc -c scores > out/report.txt
"""

GATED = """name: nightly-etl
steps:
  - id: extract
    run: echo extracted > out/rows.txt
  - id: transform
    needs: [extract]
    for_each: [orders, customers, invoices, payments, refunds, shipments]
    run: |
      echo "transforming $STOCKADE_ITEM_KEY"
      for i in 1 2 3; do echo "batch $i of $STOCKADE_ITEM_KEY"; done
      while [ ! -e release ]; do sleep 0.05; done
      echo "$STOCKADE_ITEM_KEY" > out/done.txt
  - id: load
    needs: [transform]
    run: echo loaded > out/load.txt
"""


def stockade(*args: str, cwd: Path, env: dict[str, str], wait: bool = True) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "stockade.cli.main", *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    if wait:
        proc.wait()
    return proc


def until(check, what: str, timeout: float = 60) -> object:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=REPO / "docs")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="stockade-shots-"))
    root = work / ".stockade"
    env = {**os.environ, "STOCKADE_HOME": str(root), "STOCKADE_SANDBOX": "none"}
    shutil.copytree(REPO / "examples" / "pipeline", work / "pipeline")
    (work / "regions.yaml").write_text(FANOUT)
    (work / "etl.yaml").write_text(GATED)
    stockade("run", "workflow.yaml", "--run-id", "01-pipeline", cwd=work / "pipeline", env=env)
    crashed = stockade("run", "etl.yaml", "--run-id", "02-nightly-crashed", cwd=work, env=env,
                       wait=False)
    until(lambda: (root / "runs/02-nightly-crashed/transform/1/work").is_dir(), "the crash run")
    os.killpg(crashed.pid, signal.SIGKILL)
    crashed.wait()
    stockade("run", "regions.yaml", "--run-id", "03-regions", "--jobs", "2", cwd=work, env=env)
    live = stockade("run", "etl.yaml", "--run-id", "04-nightly", "--jobs", "2", cwd=work,
                    env=env, wait=False)
    items = root / "runs" / "04-nightly" / "transform"
    for i in range(3):
        until(lambda i=i: (items / str(i) / "work").is_dir(), f"transform/#{i}")
        if i < 2:
            (items / str(i) / "work" / "release").write_text("go")
    until(lambda: (items / "3" / "work").is_dir(), "transform/#3")
    log = work / "ui.log"
    with open(log, "wb") as out:
        ui = subprocess.Popen([sys.executable, "-m", "stockade.cli.main", "ui", "--port", "0",
                               "--allow-actions"], cwd=work, env=env, stdout=out,
                              stderr=subprocess.STDOUT)
    m = until(lambda: re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text()), "stockade ui")
    base = f"http://127.0.0.1:{m.group(1)}"  # type: ignore[attr-defined]
    args.out.mkdir(parents=True, exist_ok=True)
    shots = [
        ("ui-runs.png", "/", None),
        ("ui-run.png", "/runs/03-regions", None),
        ("ui-run-live.png", "/runs/04-nightly", None),
        ("ui-step.png", "/runs/03-regions/score", None),
        ("ui-item-failed.png", "/runs/03-regions/score/islands", None),
        ("ui-item-live.png", "/runs/04-nightly/transform/invoices", "pre[data-log='1:stdout']"),
        ("ui-publish.png", "/runs/01-pipeline/publish/0", None),
    ]
    try:
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                str(work / "profile"), executable_path=CHROMIUM, headless=True, args=ARGS,
                viewport={"width": 1360, "height": 900}, device_scale_factor=1)
            page = ctx.new_page()
            for name, path, wait_for in shots:
                page.goto(base + path)
                page.wait_for_function("() => !document.body.dataset.live || "
                                       "document.querySelector('#conn').textContent === 'live'")
                if wait_for:
                    page.wait_for_selector(wait_for)
                page.wait_for_timeout(800)
                page.screenshot(path=str(args.out / name), full_page=True)
                print(f"wrote {args.out / name}")
            ctx.close()
    finally:
        ui.terminate()
        ui.wait(10)
        deadline = time.monotonic() + 120
        while live.poll() is None and time.monotonic() < deadline:
            for d in items.glob("*/work"):
                if not (d / "release").exists():
                    (d / "release").write_text("go")
            time.sleep(0.1)
        if live.poll() is None:
            os.killpg(live.pid, signal.SIGKILL)
            live.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
