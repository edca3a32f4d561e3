"""What the engine's own costs stand on (issue: performance).

Two floors, each measured in the same run as the figure it explains:

1. ``--sandbox none`` items: the engine's CPU per item against what any
   engine must spend per item on this machine:

   * the launcher alone: the same command started and reaped with the
     engine's own launcher (``_jail.spawn``, a poll on the pidfd,
     ``waitpid``) from two threads and nothing else;
   * the launcher and the item's folders: the same, after making the
     folders a first attempt makes (the item, ``meta/``, ``work/``,
     ``work/out/``) under a folder spread as the engine spreads its step
     folders (``workspace.spread``), in ``$TMPDIR``.

   The engine's figure is a marginal cost, as ``bench_engine.py`` takes it:
   the CPU of a 2N-item run less that of an N-item run, over N, so that
   start-up (imports, the probe) is not in it. The difference between the
   engine and the second floor is the engine's bookkeeping per item:
   captures, records, the scheduler, the hand-offs between threads.
2. the run path's imports: how much of them is defining dataclasses and
   building pydantic models, timed around ``dataclasses._process_class`` and
   pydantic's model metaclass in fresh interpreters, split between
   stockade's modules and the libraries'.

Usage: ``python bench/bench_floor.py [--items 1000] [--rounds 3]``
Trees go under ``$TMPDIR``: run it on the disk you care about.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_fanout import COMMAND, run_stockade

from stockade.workspace.spread import spread_subfolders

#: Run in a fresh interpreter: imports what ``stockade run`` imports before
#: its first item (the CLI, the session, and the backends the sandbox probe
#: makes), timing class definitions; prints one JSON line.
IMPORTS = """
import json, time, dataclasses, collections
per = collections.Counter(); count = collections.Counter()
orig = dataclasses._process_class
def timed(cls, *a, **k):
    t = time.perf_counter()
    try:
        return orig(cls, *a, **k)
    finally:
        per[cls.__module__.split(".")[0]] += time.perf_counter() - t
        count[cls.__module__.split(".")[0]] += 1
dataclasses._process_class = timed
import pydantic._internal._model_construction as mc
meta_new = mc.ModelMetaclass.__new__; models = [0.0, 0]
def new(*a, **k):
    t = time.perf_counter()
    try:
        return meta_new(*a, **k)
    finally:
        models[0] += time.perf_counter() - t; models[1] += 1
mc.ModelMetaclass.__new__ = new
t = time.perf_counter()
import stockade.cli.main, stockade.runner.session
from stockade import sandbox
for name in [*sandbox.preference(), "none"]:  # as runner.early_probe makes them
    sandbox.get_backend(name)
total = time.perf_counter() - t
print(json.dumps({"import_s": total, "dataclass_s": dict(per), "dataclasses": dict(count),
                  "models_s": models[0], "models": models[1]}))
"""


def spawn_floor(root: Path, n: int, threads: int, folders: bool) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) to start and reap ``n``
    commands from ``threads`` threads with the engine's launcher.

    ``folders``: each command runs in its own item's ``work/``, made first
    with the item's other folders under ``root`` (spread, as a step folder
    is); otherwise all of them run in one ``root/work``.
    """
    from stockade.sandbox import _jail

    devnull = os.open(os.devnull, os.O_RDWR)
    argv = [b"/bin/sh", b"-c", COMMAND.encode()]
    env = [b"PATH=/usr/bin:/bin", b"STOCKADE_ITEM=1"]
    root.mkdir()
    spread_subfolders(str(root))
    os.makedirs(f"{root}/work/out")
    shared = os.fsencode(f"{root}/work")

    def worker(first: int, count: int) -> None:
        for i in range(first, first + count):
            cwd = shared
            if folders:
                item = f"{root}/{i}"
                os.mkdir(item)
                os.mkdir(f"{item}/meta", 0o700)
                os.mkdir(f"{item}/work")
                os.mkdir(f"{item}/work/out")
                cwd = os.fsencode(f"{item}/work")
            pid = _jail.spawn(b"/bin/sh", argv, env, cwd, [devnull, devnull, devnull], -1, b"",
                              -1, -1, [], None, [], -1)
            pidfd = os.pidfd_open(pid)
            try:
                poll = select.poll()
                poll.register(pidfd, select.POLLIN)
                poll.poll()
                os.waitpid(pid, 0)
            finally:
                os.close(pidfd)

    share = n // threads
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(k * share, share)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    os.close(devnull)
    shutil.rmtree(root)
    return (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), wall


def engine_marginal(tmp: Path, n: int) -> float:
    """The engine's CPU seconds per item under ``--sandbox none``: (2N-item run
    less N-item run) / N."""
    small = run_stockade(tmp, n, "none", 2, engine_cpu=True)["engine_cpu_s"]
    big = run_stockade(tmp, 2 * n, "none", 2, engine_cpu=True)["engine_cpu_s"]
    return (big - small) / n


def imports_once() -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True,
                         check=True)
    return dict(json.loads(out.stdout))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    n = args.items
    floors: dict[str, list[float]] = {"launcher": [], "folders": []}
    walls: dict[str, list[float]] = {"launcher": [], "folders": []}
    engine: list[float] = []
    sides = ["launcher", "folders", "engine"]
    with tempfile.TemporaryDirectory(prefix="stockade-bench-floor-") as d:
        tmp = Path(d)
        for r in range(args.rounds):
            # A different order each round: the machine's state drifts.
            for side in sides[r % 3:] + sides[:r % 3]:
                if side == "engine":
                    engine.append(engine_marginal(tmp, n))
                    continue
                cpu, wall = spawn_floor(tmp / f"{side}{r}", n, 2, side == "folders")
                floors[side].append(cpu / n)
                walls[side].append(wall)
    f = statistics.median(floors["launcher"])
    g = statistics.median(floors["folders"])
    e = statistics.median(engine)
    print(f"{n} items, 2 at a time, {args.rounds} rounds (medians), CPU per item:")
    print(f"  launcher alone: {f * 1e3:.3f} ms (wall {statistics.median(walls['launcher']):.2f} s)")
    print(f"  launcher and the item's folders: {g * 1e3:.3f} ms "
          f"(wall {statistics.median(walls['folders']):.2f} s; the folders: {(g - f) * 1e3:.3f} ms)")
    print(f"  the engine, --sandbox none (2N less N items): {e * 1e3:.3f} ms = {e / g:.1f}x the "
          f"launcher and folders; its bookkeeping per item: {(e - g) * 1e3:.2f} ms")
    runs = [imports_once() for _ in range(args.rounds)]
    print("the run path's imports, fresh interpreters:")
    for run in runs:
        per = run["dataclass_s"]
        count = run["dataclasses"]
        assert isinstance(per, dict) and isinstance(count, dict)
        own = per.get("stockade", 0.0)
        print(f"  {run['import_s']:.3f} s: dataclasses {sum(per.values()) * 1e3:.0f} ms "
              f"({sum(count.values())} classes; stockade's {count.get('stockade', 0)}: "
              f"{own * 1e3:.0f} ms), pydantic models {float(run['models_s']) * 1e3:.0f} ms "
              f"({run['models']})")


if __name__ == "__main__":
    main()
