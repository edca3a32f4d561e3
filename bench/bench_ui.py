"""Web UI benchmark (issue 14): a 10,000-item run stays fast in ``stockade ui``.

Makes a real run of 10,000 trivial items (``--sandbox none``, every 500th
fails, keys ``k00000`` ...), starts ``stockade ui`` on it, and measures, over
real HTTP with the server's loopback ``Host``, every kind of request a person's
browser makes: the runs list, the run page, its timeline, the step page (first,
middle and last page, 500 a page, failed only), an item page, a download, and
the first message of each event stream. For each it prints the median and the
worst time over ``--rounds`` requests (after one warm-up request, whose time is
printed too) and the size of the answer. Targets: every page <= 1 MB, every
request <= 50 ms.

Usage: ``python bench/bench_ui.py [--items 10000] [--rounds 20] [--keep DIR]``
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

WORKFLOW = """name: bench-ui
steps:
  - id: many
    for_each: "{{ file('items.json') | from_json }}"
    run: |
      echo "item $STOCKADE_ITEM_KEY" > out/k.txt
      if [ $(( STOCKADE_ITEM % 500 )) = 499 ]; then echo "failing on purpose" >&2; exit 1; fi
  - id: total
    needs: [many]
    run: echo done > out/total.txt
"""


def stockade() -> list[str]:
    return [sys.executable, "-m", "stockade.cli.main"]


def make_run(folder: Path, n: int) -> str:
    (folder / "items.json").write_text(json.dumps([f"k{i:05d}" for i in range(n)]))
    (folder / "wf.yaml").write_text(WORKFLOW)
    t = time.monotonic()
    r = subprocess.run([*stockade(), "run", "wf.yaml", "--sandbox", "none", "--run-id", "big",
                        "--jobs", "2", "--root", str(folder / "root")], cwd=folder,
                       capture_output=True, text=True)
    print(f"made a {n}-item run in {time.monotonic() - t:.1f} s (exit {r.returncode})")
    return "big"


def start_ui(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    log = folder / "ui.log"
    out = open(log, "wb")  # noqa: SIM115 - the server's log, open while it runs
    proc = subprocess.Popen([*stockade(), "ui", "--port", "0", "--root", str(folder / "root")],
                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text(errors="replace"))
        if m:
            return proc, f"http://127.0.0.1:{m.group(1)}"
        time.sleep(0.05)
    raise SystemExit(f"stockade ui did not start: {log.read_text()}")


def measure(client: httpx.Client, url: str, rounds: int) -> tuple[float, float, float, int]:
    t = time.perf_counter()
    first = client.get(url)
    warm = time.perf_counter() - t
    first.raise_for_status()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        r = client.get(url)
        times.append(time.perf_counter() - t)
        r.raise_for_status()
    return warm, statistics.median(times), max(times), len(first.content)


def first_event(base: str, path: str) -> tuple[float, int]:
    """Time to the stream's first message (the ``retry:`` line) and the first patch's size."""
    t = time.perf_counter()
    with httpx.stream("GET", base + path, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("retry:"):
                return time.perf_counter() - t, 0
    return float("nan"), 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--keep", type=Path, default=None, help="reuse or keep the run here")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-ui-"))
    folder.mkdir(parents=True, exist_ok=True)
    run_id = "big"
    if not (folder / "root" / "runs" / run_id).exists():
        make_run(folder, args.items)
    proc, base = start_ui(folder)
    try:
        last = -(-args.items // 100)
        paths = [
            ("runs list", "/"),
            ("run page", f"/runs/{run_id}"),
            ("timeline (json)", f"/api/runs/{run_id}/timeline"),
            ("step page 1", f"/runs/{run_id}/many"),
            ("step page middle", f"/runs/{run_id}/many?page={last // 2}"),
            ("step page last", f"/runs/{run_id}/many?page={last}"),
            ("step, 500 a page", f"/runs/{run_id}/many?page=3&limit=500"),
            ("step, failed only", f"/runs/{run_id}/many?filter=failed"),
            ("item page", f"/runs/{run_id}/many/k04999"),
            ("download", f"/runs/{run_id}/many/k04242/files/out/k.txt"),
            ("run json", f"/api/runs/{run_id}"),
        ]
        print(f"{'request':<20} {'first':>8} {'median':>8} {'worst':>8} {'size':>10}")
        worst_all, biggest = 0.0, 0
        # As browsers do: without TCP_NODELAY a keep-alive client waits for the
        # server's delayed ACK (40 ms on Linux) before each request.
        transport = httpx.HTTPTransport(
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        with httpx.Client(base_url=base, timeout=60, transport=transport) as client:
            for label, path in paths:
                warm, med, worst, size = measure(client, path, args.rounds)
                worst_all, biggest = max(worst_all, med), max(biggest, size)
                print(f"{label:<20} {warm * 1000:7.1f}ms {med * 1000:7.1f}ms "
                      f"{worst * 1000:7.1f}ms {size / 1024:8.1f}KiB")
        for label, path in [("run stream", f"/live/runs/{run_id}"),
                            ("step stream", f"/live/runs/{run_id}/many"),
                            ("item stream", f"/live/runs/{run_id}/many/k04999")]:
            t, _ = first_event(base, path)
            print(f"{label:<20} first message after {t * 1000:.1f} ms")
        verdict = "ok" if worst_all <= 0.050 and biggest <= 1_000_000 else "OVER TARGET"
        print(f"largest answer {biggest / 1024:.0f} KiB (target <= 1 MB); slowest median "
              f"{worst_all * 1000:.1f} ms (target <= 50 ms): {verdict}")
    finally:
        proc.terminate()
        proc.wait(10)
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
