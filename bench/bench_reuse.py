"""Reuse benchmark (issue: incremental runs, "Measure").

For N items (default 1,000 and 10,000) of a trivial command under the
default sandbox, in the same run on the same machine:

1. ``stockade run`` from scratch (every item runs in its jail);
2. the same workflow again with ``--reuse`` (every item is taken from run 1):
   the wall time ratio run / reused (target >= 10x at 10,000 items);
3. the reuse decision for the fan-out step: keying every item, one batched
   lookup in the store (the ``reuse_lookup`` event), and verifying and
   placing the outputs (the rest of the reused run's step time); target
   <= 1 s for 10,000 items.

Usage: ``python bench/bench_reuse.py [--items 1000 10000] [--sandbox bwrap] [--jobs 2]``
Both runs' trees are under ``$TMPDIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def workflow(n: int) -> str:
    return f"""name: reusebench
steps:
  - id: gather
    run: seq 0 {n - 1} | python3 -c "import sys, json; print(json.dumps([int(x) for x in sys.stdin]))" > out/items.json
  - id: fan
    needs: [gather]
    for_each: "{{{{ steps.gather.outputs['items.json'] | from_json }}}}"
    inputs: {{n.txt: "{{{{ item }}}}"}}
    run: cat n.txt > out/x.txt
"""


def run(tmp: Path, wf: Path, run_id: str, extra: list[str], sandbox: str | None,
        jobs: int) -> float:
    env = {**os.environ, "STOCKADE_HOME": str(tmp / "root")}
    cmd = [sys.executable, "-m", "stockade.cli.main", "run", str(wf), "--run-id", run_id,
           "--jobs", str(jobs), *extra]
    if sandbox:
        cmd += ["--sandbox", sandbox]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"run {run_id} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return wall


def step_times(tmp: Path, run_id: str) -> tuple[float, float]:
    """(the reuse lookup's seconds, the fan step's wall time) from the store's events."""
    db = sqlite3.connect(tmp / "root" / "stockade.db")
    lookup, started, finished = 0.0, 0.0, 0.0
    for kind, at, data in db.execute(
            "SELECT kind, at, data FROM events WHERE run_id=? ORDER BY id", (run_id,)):
        d = json.loads(data)
        if d.get("step") != "fan":
            continue
        if kind == "reuse_lookup":
            lookup = float(d["seconds"])
        elif kind == "step_started":
            started = at
        elif kind == "step_finished":
            finished = at
    return lookup, finished - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--sandbox", default=None)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    for n in args.items:
        with tempfile.TemporaryDirectory(prefix="stockade-bench-reuse-") as d:
            tmp = Path(d)
            wf = tmp / "wf.yaml"
            wf.write_text(workflow(n))
            fresh = run(tmp, wf, "fresh", [], args.sandbox, args.jobs)
            reused = run(tmp, wf, "reused", ["--reuse"], args.sandbox, args.jobs)
            lookup, fan = step_times(tmp, "reused")
            print(f"{n:>6} items: run {fresh:7.2f}s  reused {reused:6.2f}s  "
                  f"ratio {fresh / reused:5.1f}x  decision: lookup {lookup:.3f}s, "
                  f"fan step with verify+place {fan:.3f}s", flush=True)


if __name__ == "__main__":
    main()
