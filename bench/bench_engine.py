"""The engine's own cost, at 1k to 100k items (issue: performance).

Measured in the same run on the same machine, each figure next to what it is
compared with:

1. engine CPU per item: the engine process's own user+system time (threads
   included, jails excluded) for N and 2N items of a trivial command under
   ``--sandbox none``; per item = the difference / N, the median of three
   such pairs (target <= 0.4 ms);
2. time to the first item: from launching ``stockade run`` to the first
   item's command writing a timestamp (target <= 0.15 s), against the
   interpreter importing the libraries the run path imports (pydantic,
   jinja2, click, ...), which no engine built on them can go below;
3. files and folders the engine creates per item (target <= 5): counted in
   the run tree, minus what the step itself writes (its input and output);
4. scale: 1k, 10k (and with ``--big``, 100k) items: wall time, time per item
   (linear in N?), the engine's peak RSS (target <= 250 MB at 100k);
5. on the largest run: how long ``stockade show`` (the run, and one item),
   ``logs``, ``why`` and ``runs`` take to answer (target <= 200 ms each) and
   ``show --json`` of every record; a ``keep:`` over all its items (items per
   second, target >= 20,000/s).

Usage: ``python bench/bench_engine.py [--items 1000] [--big] [--jobs 2]``
Trees go under ``$TMPDIR``; the disk there decides the inode costs.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_fanout import WRAPPER


def over_numbers(name: str, n: int, step: str, body: str, *, first: str = "") -> str:
    """A workflow whose ``gather`` writes the numbers 0..n-1 (after the command
    ``first``, if any) and whose ``step`` takes them as its items; ``body``: that
    step's further lines, indented four spaces."""
    before = f"      {first}\n" if first else ""
    return f"""name: {name}
steps:
  - id: gather
    run: |
{before}      python3 -c "import json; print(json.dumps(list(range({n}))))" > out/items.json
  - id: {step}
    needs: [gather]
    for_each: "{{{{ steps.gather.outputs['items.json'] | from_json }}}}"
{body}"""


def workflow(n: int, marker: Path, keep: bool) -> str:
    decide = """  - id: decide
    needs: [fan]
    for_each: "{{ steps.fan.items }}"
    keep: "{{ item.result | int % 2 == 0 }}"
""" if keep else ""
    return over_numbers("enginebench", n, "fan",
                        '    inputs: {n.txt: "{{ item }}"}\n    run: cat n.txt\n' + decide,
                        first=f"date +%s.%N > {marker}")


def run(tmp: Path, n: int, jobs: int, keep: bool = False) -> dict[str, float]:
    tmp.mkdir()
    marker = tmp / f"first-{n}"
    wf = tmp / f"wf-{n}.yaml"
    wf.write_text(workflow(n, marker, keep))
    root = tmp / f"root-{n}"
    usage = tmp / f"rusage-{n}.json"
    env = {**os.environ, "STOCKADE_HOME": str(root), "BENCH_RUSAGE": str(usage)}
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", WRAPPER, "run", str(wf), "--run-id", f"b{n}",
                        "--sandbox", "none", "--jobs", str(jobs)],
                       env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.time() - t0
    if p.returncode != 0:
        raise SystemExit(f"run of {n} items failed ({p.returncode}):\n{p.stderr[-3000:]}")
    ru = json.loads(usage.read_text())
    out = {"n": n, "wall": wall, "cpu": ru["cpu"], "user": ru["user"], "sys": ru["sys"],
           "maxrss_mb": ru["maxrss_mb"],
           "first_item_s": float(marker.read_text()) - t0}
    fan = root / "runs" / f"b{n}" / "fan"
    created = sum(len(dirs) + len(files) for _, dirs, files in os.walk(fan))
    # The step writes n.txt (its input) into work/: not the engine's doing.
    out["engine_inodes_per_item"] = created / n - 1
    if keep:
        out["keep_items_per_s"] = keep_speed(root / "stockade.db", f"b{n}", n)
    out["root"] = str(root)  # type: ignore[assignment]
    return out


def keep_speed(db: Path, run_id: str, n: int) -> float:
    with sqlite3.connect(db) as c:
        at = {}
        for kind, t, data in c.execute("SELECT kind, at, data FROM events WHERE run_id=?",
                                        (run_id,)):
            d = json.loads(data)
            if d.get("step") == "decide" and kind in ("step_started", "step_finished"):
                at[kind] = t
    span = at["step_finished"] - at["step_started"]
    return n / span if span > 0 else float("inf")


def answer_time(root: str, *args: str, rounds: int = 5) -> float:
    env = {**os.environ, "STOCKADE_HOME": root}
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "stockade.cli.main", *args], env=env,
                           capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise SystemExit(f"stockade {' '.join(args)} failed: {p.stderr[-2000:]}")
    return statistics.median(times)


def _timed(argv: list[str], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def startup_floor(rounds: int = 5) -> float:
    """``stockade --version``: the interpreter and the CLI's imports alone."""
    return _timed([sys.executable, "-m", "stockade.cli.main", "--version"], rounds)


def run_path_libraries() -> list[str]:
    """The modules from outside the standard library that ``stockade run``
    imports before its first item, in the order it imports them (read from
    ``sys.modules``, not listed by hand; names with a leading underscore at the
    top, such as ``__main__`` and the site hooks, are the interpreter's)."""
    probe = ("import sys, stockade.cli.main, stockade.runner.session\n"
             "std = set(sys.stdlib_module_names) | set(sys.builtin_module_names)\n"
             "print(' '.join(m for m in list(sys.modules) if m.split('.')[0] not in std "
             "and m.split('.')[0] != 'stockade' and not m.startswith('_')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    return out.split()


def library_floor(modules: list[str], rounds: int = 5) -> float:
    """The interpreter importing ``modules`` and nothing of stockade: the least
    a Python engine built on these libraries can take to its first item."""
    code = f"import importlib\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
    return _timed([sys.executable, "-c", code], rounds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--big", action="store_true", help="also 100,000 items (minutes)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only-cpu", action="store_true", help="just the CPU and start figures")
    ap.add_argument("--pairs", type=int, default=3, help="N/2N pairs for the CPU per item")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="stockade-bench-engine-") as d:
        tmp = Path(d)
        n = args.items
        # Pairs of N and 2N, medians: a run's kernel time depends on what the
        # disk went through just before (ext4 without a journal makes every new
        # inode skip the ones removed in the last half minute or so), and one
        # pair alone has given negative figures.
        pairs = [(run(tmp / f"a{r}", n, args.jobs), run(tmp / f"b{r}", 2 * n, args.jobs))
                 for r in range(args.pairs)]
        small = pairs[0][0]

        def per(field: str) -> float:
            return float(statistics.median((b[field] - a[field]) / n * 1000 for a, b in pairs))

        each = ", ".join(f"{a['cpu']:.2f}s/{b['cpu']:.2f}s" for a, b in pairs)
        print(f"engine CPU per item: {per('cpu'):.3f} ms = user {per('user'):.3f} + kernel "
              f"{per('sys'):.3f} (medians of {len(pairs)} pairs; cpu for {n}/{2 * n} items: "
              f"{each}; target <= 0.4 ms)")
        first = statistics.median(a["first_item_s"] for a, _ in pairs)
        modules = run_path_libraries()
        floor = library_floor(modules)
        packages = sorted({m.split(".")[0] for m in modules})
        print(f"first item started: {first:.3f} s after launch (median of {len(pairs)} runs; "
              f"target <= 0.15 s) = {first / floor:.2f}x the interpreter importing the "
              f"{len(modules)} modules of other packages the run path imports, alone "
              f"({floor:.3f} s: {', '.join(packages)}); `stockade --version`: "
              f"{startup_floor():.3f} s")
        print(f"files and folders the engine creates per item: "
              f"{small['engine_inodes_per_item']:.2f} (target <= 5)")
        if args.only_cpu:
            return
        sizes = [1000, 10000] + ([100000] if args.big else [])
        results = [run(tmp / f"s{s}", s, args.jobs, keep=True) for s in sizes]
        for r in results:
            print(f"{int(r['n']):>7} items: wall {r['wall']:8.1f}s  "
                  f"{r['wall'] / r['n'] * 1000:6.2f} ms/item  peak RSS {r['maxrss_mb']:6.1f} MB  "
                  f"keep {r['keep_items_per_s']:,.0f} items/s")
        big = results[-1]
        root = str(big["root"])
        mid = f"fan/#{int(big['n']) // 2}"
        answers = [("show", "last"), ("show", "last", mid), ("logs", "last", mid),
                   ("why", "last", mid), ("runs",), ("show", "last", "--json")]
        print(f"on {int(big['n'])} items (target <= 200 ms; the last one lists every record):")
        for args in answers:
            print(f"  stockade {' '.join(args)}: {answer_time(root, *args) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
