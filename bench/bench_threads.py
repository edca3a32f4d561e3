"""Where the engine's CPU goes, per thread, per item (issue: performance).

Runs ``stockade run`` over N trivial items (``cat`` of one input) and reads
each engine thread's own CPU time when the run ends: the item threads, the
engine (main) thread, the capture hub in code before 7466036, and any
launcher or reaper thread.
Printed per item, in ms, for each interpreter given: ``--python`` names
other interpreters (say an older checkout's ``.venv/bin/python``, compiled)
to alternate with this one round by round, so both meet the same state of
the machine.

Usage: ``python bench/bench_threads.py [--items 3000] [--backend none]
[--rounds 3] [--python OTHER]``. Trees go under ``$TMPDIR`` in a folder
others may search (so a root engine's bwrap takes its direct launcher).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_engine import over_numbers

#: Run in the measured interpreter: the CLI, then each thread's CPU at exit.
WRAPPER = """
import atexit, json, os, runpy, sys, threading, time
ended = {}
run = threading.Thread.run
def timed(self):
    try:
        run(self)
    finally:
        name = self.name.split("_")[0]
        ended[name] = ended.get(name, 0.0) + time.thread_time()
threading.Thread.run = timed
def report():
    tick = os.sysconf("SC_CLK_TCK")
    out = dict(ended)
    for t in threading.enumerate():
        name = "main" if t is threading.main_thread() else t.name.split("_")[0]
        if t is threading.main_thread():
            out[name] = out.get(name, 0.0) + time.thread_time()
            continue
        try:
            with open(f"/proc/self/task/{t.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    with open(os.environ["BENCH_THREADS"], "w") as f:
        json.dump(out, f)
atexit.register(report)
sys.argv = ["stockade", *sys.argv[1:]]
runpy.run_module("stockade.cli.main", run_name="__main__")
"""


def workflow(n: int) -> str:
    return over_numbers("threadbench", n, "fan",
                        '    inputs: {n.txt: "{{ item }}"}\n    run: cat n.txt\n')


def one(python: str, n: int, backend: str) -> dict[str, float]:
    """Per-thread CPU per item (ms) of one run under ``python``."""
    base = Path(tempfile.mkdtemp(prefix="stockade-threads-"))
    base.chmod(0o755)
    try:
        (base / "wf.yaml").write_text(workflow(n))
        usage = base / "threads.json"
        env = {**os.environ, "STOCKADE_HOME": str(base / "root"), "BENCH_THREADS": str(usage)}
        p = subprocess.run([python, "-c", WRAPPER, "run", str(base / "wf.yaml"),
                            "--sandbox", backend, "--jobs", "2"],
                           env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"stockade run under {python} failed: {p.stderr[-2000:]}")
        cpu = json.loads(usage.read_text())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {k: v / n * 1e3 for k, v in cpu.items() if v > 0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=3000)
    ap.add_argument("--backend", default="none", choices=["none", "bwrap", "landlock"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python", action="append", default=[],
                    help="another interpreter to alternate with this one")
    args = ap.parse_args()
    pythons = [sys.executable, *args.python]
    print(f"engine CPU per item by thread, ms ({args.items} items, {args.backend}, 2 jobs; "
          "main includes the start-up, spread over the items)")
    for r in range(args.rounds):
        for py in pythons:
            cpu = one(py, args.items, args.backend)
            threads = "  ".join(f"{k} {v:.3f}" for k, v in sorted(cpu.items()))
            print(f"round {r + 1}  {py}\n    sum {sum(cpu.values()):.3f}   {threads}")


if __name__ == "__main__":
    main()
