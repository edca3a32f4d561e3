"""Fan-out benchmark for the core engine (issue: core engine, "Measure").

Compares, in the same run on the same machine:

1. ``stockade run`` of a 1,000-item fan-out of a trivial command with
   ``--sandbox none --jobs 2`` against ``xargs -P2`` running the same command
   in per-item directories (wall time ratio; target <= 2x);
2. the time from launching ``stockade run`` to the first item's command
   starting (target <= 0.3 s);
3. a 10,000-item run: peak RSS of the engine process (target <= 150 MB);
4. plan time (load + validate + plan + fan-out expansion) for 1k, 10k, 100k
   items, to show it grows linearly.

Usage: ``python bench/bench_fanout.py [--items 1000] [--big 10000] [--sandbox none] [--rounds 3]``

Both sides create their item trees under ``$TMPDIR``. A silent item costs
the engine four new folders (the item, ``meta/``, ``work/``, ``out/``)
against three for the anchor (the item, ``work/``, ``out/``), and the ratio
depends on the filesystem: on an ext4 without a journal that has just
deleted many files the kernel's inode allocator dominates (seen with
``perf``). The engine's step folders ask ext4 to spread their items
(``workspace.spread``), the anchor's parent does not; compare with
``TMPDIR=/dev/shm`` or a freshly made filesystem.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = 'echo "$STOCKADE_ITEM" > out/x.txt'

#: Reports the engine's rusage as the command ends; not from an exit handler,
#: which would make ``stockade`` end the usual slower way (``cli.main._end_now``).
WRAPPER = """
import json, os, resource, runpy, sys
def _report():
    r = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["BENCH_RUSAGE"], "w") as f:
        json.dump({"cpu": r.ru_utime + r.ru_stime, "user": r.ru_utime, "sys": r.ru_stime,
                   "maxrss_mb": r.ru_maxrss / 1024}, f)
sys.argv = ["stockade", *sys.argv[1:]]
try:
    runpy.run_module("stockade.cli.main", run_name="__main__")
finally:
    _report()
"""


def workflow(n: int, first_marker: Path | None = None) -> str:
    mark = ""
    if first_marker is not None:
        mark = f"date +%s.%N > {first_marker}"
    return f"""name: bench
steps:
  - id: gather
    run: |
      {mark}
      seq 0 {n - 1} | awk 'BEGIN {{ printf "[" }} {{ printf "%s%s", (NR > 1 ? "," : ""), $0 }} END {{ print "]" }}' > out/items.json
  - id: fan
    needs: [gather]
    for_each: "{{{{ steps.gather.outputs['items.json'] | from_json }}}}"
    run: '{COMMAND}'
"""


def stockade_cmd() -> list[str]:
    return [sys.executable, "-m", "stockade.cli.main"]


def run_stockade(tmp: Path, n: int, sandbox: str, jobs: int, first: bool = False,
                 engine_cpu: bool = False) -> dict[str, float]:
    """``engine_cpu``: run the engine through ``WRAPPER`` and report its own
    CPU seconds (``engine_cpu_s``, the engine process alone, not its helpers
    and jails)."""
    marker = tmp / f"first-{n}-{sandbox}.txt" if first else None
    wf = tmp / f"wf-{n}-{sandbox}.yaml"
    wf.write_text(workflow(n, marker))
    root = tmp / f"root-{n}-{sandbox}"
    env = {**os.environ, "STOCKADE_HOME": str(root)}
    usage = tmp / f"rusage-{n}-{sandbox}.json"
    cmd = stockade_cmd()
    if engine_cpu:
        cmd = [sys.executable, "-c", WRAPPER]
        env["BENCH_RUSAGE"] = str(usage)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.time()
    p = subprocess.run([*cmd, "run", str(wf), "--sandbox", sandbox, "--jobs", str(jobs)],
                       env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.time() - t0
    if p.returncode != 0:
        raise SystemExit(f"stockade run failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = {"wall": wall, "peak_rss_mb": max(rss, before) / 1024.0}
    if engine_cpu:
        out["engine_cpu_s"] = json.loads(usage.read_text())["cpu"]
        usage.unlink()
    if marker is not None:
        out["first_item_s"] = float(marker.read_text()) - t0
    shutil.rmtree(root, ignore_errors=True)
    return out


def run_xargs(tmp: Path, n: int) -> float:
    """The anchor: the same command, one fresh directory per item, two at a time."""
    base = tmp / "xargs"
    base.mkdir(exist_ok=True)
    item = tmp / "item.sh"
    item.write_text('mkdir -p "$1/work/out" && cd "$1/work" && STOCKADE_ITEM="$1" exec sh -c "$2"\n')
    t0 = time.time()
    subprocess.run(
        ["sh", "-c", f'seq 0 {n - 1} | xargs -P2 -I{{}} sh {item} {base}/{{}} "$0"', COMMAND],
        check=True,
    )
    wall = time.time() - t0
    shutil.rmtree(base, ignore_errors=True)
    return wall


def plan_time(n: int) -> float:
    from stockade.plan import build_plan, expand
    from stockade.spec import load_workflow

    text = workflow(n).encode()
    t0 = time.perf_counter()
    spec = load_workflow(text, "bench.yaml")
    build_plan(spec)
    items = expand(list(range(n)))
    assert len(items) == n
    return time.perf_counter() - t0


def chain(steps: int) -> bytes:
    lines = ["name: chain", "steps:"]
    for i in range(steps):
        lines.append(f"  - id: s{i}")
        if i:
            lines.append(f"    needs: [s{i - 1}]")
            lines.append(f"    inputs: {{prev.txt: \"{{{{ steps.s{i - 1}.result }}}}\"}}")
        lines.append("    run: cat prev.txt || true")
    return ("\n".join(lines) + "\n").encode()


def plan_steps_time(steps: int) -> float:
    from stockade.plan import build_plan
    from stockade.spec import load_workflow

    data = chain(steps)
    t0 = time.perf_counter()
    build_plan(load_workflow(data, "chain.yaml"))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--big", type=int, default=10000)
    ap.add_argument("--sandbox", default="none")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="stockade-bench-") as d:
        tmp = Path(d)
        # Alternate anchor and engine so machine noise hits both alike; report medians.
        anchors, runs = [], []
        for _ in range(args.rounds):
            anchors.append(run_xargs(tmp, args.items))
            # The first-item marker is a file outside the jail: only `none` can write it.
            first = args.sandbox == "none"
            runs.append(run_stockade(tmp, args.items, args.sandbox, args.jobs, first=first))
        xargs = statistics.median(anchors)
        ours = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"fan-out of {args.items} items, --sandbox {args.sandbox}, {args.jobs} jobs, "
              f"median of {args.rounds} alternating rounds")
        print(f"  xargs -P2          {xargs:8.2f} s")
        print(f"  stockade run       {ours['wall']:8.2f} s   ratio {ours['wall'] / xargs:5.2f}x (target <= 2x)")
        print(f"  per item overhead  {(ours['wall'] - xargs) / args.items * 1000:8.2f} ms")
        if "first_item_s" in ours:
            print(f"  first item started {ours['first_item_s']:8.3f} s after launch (target <= 0.3 s)")
        if args.big:
            big = run_stockade(tmp, args.big, args.sandbox, args.jobs)
            print(f"{args.big} items: wall {big['wall']:.1f} s, peak RSS {big['peak_rss_mb']:.0f} MB "
                  "(target <= 150 MB)")
        for n in (1000, 10000, 100000):
            print(f"plan {n:>6} items: {plan_time(n) * 1000:8.1f} ms")
        for steps in (250, 500, 1000, 2000):
            t = plan_steps_time(steps)
            print(f"load+plan {steps:>5} steps: {t * 1000:8.1f} ms ({t / steps * 1e6:6.0f} us/step)")


if __name__ == "__main__":
    main()
