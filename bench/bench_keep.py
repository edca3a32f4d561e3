"""A ``keep:`` over N numbers, alone (issue: performance, target >= 20,000 items/s).

``bench_engine.py --big`` times a ``keep:`` after 100,000 jailed items; this
times the decision step by itself, so its figure moves only with the
engine's per-item cost of an inline step: one step writes N numbers, the
next keeps the even ones. Items per second are taken from the run's own
``step_started`` and ``step_finished`` events (the step, not the process's
start and end), with the engine's peak RSS. Each round also times the anchor
(``ANCHOR``: the rule alone, evaluated by Jinja in a loop), and the figure is
reported as how many times as long the engine takes per item. Last, the time
per item is split into the rule alone, the store alone (``STORE_ALONE``: the
same records written in the engine's batches, no engine) and the rest.

``--against SRC`` runs another source tree (a ``git worktree`` of an older
commit: its ``src`` folder) in alternating rounds, so that both see the same
machine states, and prints the rounds side by side with the median ratio.

Usage: ``python bench/bench_keep.py [--items 100000] [--rounds 5] [--against SRC]``
Trees go under ``$TMPDIR`` (``/dev/shm`` takes the disk out of it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_engine import WRAPPER, keep_speed, over_numbers

HERE = Path(__file__).resolve().parents[1] / "src"


RULE = "item | int % 2 == 0"

#: The anchor: the same rule, compiled once by Jinja's sandboxed environment
#: and evaluated over the same numbers in a plain loop, in a fresh interpreter.
#: An engine whose rules are Jinja expressions cannot go faster per item; the
#: ratio is what the engine adds (its context, records, store and scheduler).
ANCHOR = f"""
import sys, time
from jinja2.sandbox import ImmutableSandboxedEnvironment
n = int(sys.argv[1])
rule = ImmutableSandboxedEnvironment().compile_expression({RULE!r})
t0 = time.perf_counter()
kept = [v for v in range(n) if rule(item=v) is True]
assert len(kept) == (n + 1) // 2
print(n / (time.perf_counter() - t0))
"""


#: The store alone: the records such a keep: writes (a boolean result, a
#: number value, kept or dropped), in the engine's batches, into a fresh
#: SQLite store; prints microseconds per record.
STORE_ALONE = """
import sys, tempfile, time
from stockade.runner.ledger import FLUSH_EVERY
from stockade.store.base import ItemRecord, RunRecord
from stockade.store.sqlite import SQLiteStore
n = int(sys.argv[1])
with tempfile.TemporaryDirectory() as d:
    store = SQLiteStore(d + "/stockade.db")
    run = "01a23520-c45a-7888-afc5-d725db5035a3"
    store.create_run(RunRecord(run, "keepbench", "wf.yaml", "0" * 64, d, "running", time.time()))
    now = time.time()
    records = [(ItemRecord(run, "decide", i, "succeeded", 1, result=i % 2 == 0, value=i,
                           message="kept" if i % 2 == 0 else "dropped", started_at=now + i * 1e-5,
                           ended_at=now + i * 1e-5, key=str(i)), []) for i in range(n)]
    t0 = time.perf_counter()
    for at in range(0, n, FLUSH_EVERY):
        store.record_batch([], records[at:at + FLUSH_EVERY])
    print((time.perf_counter() - t0) / n * 1e6)
    store.close()
"""


def store_alone(n: int, src: Path) -> float:
    """Microseconds per record of ``STORE_ALONE`` with the engine from ``src``."""
    p = subprocess.run([sys.executable, "-c", STORE_ALONE, str(n)], capture_output=True,
                       text=True, check=True, env={**os.environ, "PYTHONPATH": str(src)})
    return float(p.stdout)


def workflow(n: int) -> str:
    return over_numbers("keepbench", n, "decide", f'    keep: "{{{{ {RULE} }}}}"\n')


def anchor(n: int) -> float:
    """Items per second of the anchor (``ANCHOR``)."""
    p = subprocess.run([sys.executable, "-c", ANCHOR, str(n)], capture_output=True, text=True,
                       check=True)
    return float(p.stdout)


def run(tmp: Path, n: int, src: Path) -> tuple[float, float]:
    """One run of the workflow with the engine from ``src``: (items/s, peak RSS MB)."""
    tmp.mkdir()
    wf = tmp / "wf.yaml"
    wf.write_text(workflow(n))
    usage = tmp / "rusage.json"
    env = {**os.environ, "STOCKADE_HOME": str(tmp / "home"), "BENCH_RUSAGE": str(usage),
           "PYTHONPATH": str(src)}
    p = subprocess.run([sys.executable, "-c", WRAPPER, "run", str(wf), "--run-id", "k",
                        "--sandbox", "none", "--jobs", "2"],
                       env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise SystemExit(f"run with {src} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    speed = keep_speed(tmp / "home" / "stockade.db", "k", n)
    return speed, float(json.loads(usage.read_text())["maxrss_mb"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--against", type=Path, default=None,
                    help="another tree's src folder, run in alternating rounds")
    args = ap.parse_args()
    trees = {"this": HERE}
    if args.against is not None:
        trees["against"] = args.against.resolve()
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
    anchors: list[float] = []
    with tempfile.TemporaryDirectory(prefix="stockade-bench-keep-") as d:
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            if r % 2:
                anchors.append(anchor(args.items))
            for name in order:
                results[name].append(run(Path(d) / f"{name}{r}", args.items, trees[name]))
            if not r % 2:
                anchors.append(anchor(args.items))
            print(f"round {r + 1}: " + ", ".join(
                f"{k} {v[-1][0]:,.0f} items/s" for k, v in results.items())
                + f", anchor {anchors[-1]:,.0f} items/s", flush=True)
    for name, rows in results.items():
        speeds = [s for s, _ in rows]
        print(f"{name}: keep over {args.items:,} numbers: median {statistics.median(speeds):,.0f} "
              f"items/s (range {min(speeds):,.0f}-{max(speeds):,.0f}), peak RSS "
              f"{max(m for _, m in rows):.0f} MB (target >= 20,000 items/s)")
    slower = [a / r[0] for a, r in zip(anchors, results["this"], strict=True)]
    print(f"anchor (the rule alone, in a loop): median {statistics.median(anchors):,.0f} items/s; "
          f"this takes {statistics.median(slower):.2f} times as long per item (rounds "
          f"{min(slower):.2f}-{max(slower):.2f})")
    per_item = 1e6 / statistics.median(s for s, _ in results["this"])
    rule = 1e6 / statistics.median(anchors)
    store = statistics.median(store_alone(args.items, HERE) for _ in range(3))
    print(f"per item: this {per_item:.1f} us = the rule alone {rule:.1f} us + the store alone "
          f"{store:.1f} us (its records in the engine's batches, median of 3) + the rest "
          f"{per_item - rule - store:.1f} us; 20,000 items/s is 50 us")
    if args.against is not None:
        ratios = [a[0] / b[0] for a, b in zip(results["this"], results["against"], strict=True)]
        print(f"this / against: median {statistics.median(ratios):.3f} "
              f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
