"""What the engine's own costs stand on (issue: performance).

Two floors, each measured in the same run as the figure it explains:

1. ``--sandbox none`` items: the engine's CPU per item against the CPU of
   starting and reaping the same command with the engine's own launcher
   (``_jail.spawn``, a poll on the pidfd, ``waitpid``) from two threads and
   nothing else. The difference is the engine's bookkeeping per item:
   folders, captures, records, the scheduler, the hand-offs between threads.
2. the run path's imports: how much of them is defining dataclasses and
   building pydantic models, timed around ``dataclasses._process_class`` and
   pydantic's model metaclass in fresh interpreters, split between
   stockade's modules and the libraries'.

Usage: ``python bench/bench_floor.py [--items 1000] [--rounds 3]``
Trees go under ``$TMPDIR``.
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


def spawn_floor(work: Path, n: int, threads: int) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) to start and reap ``n``
    commands from ``threads`` threads with the engine's launcher."""
    from stockade.sandbox import _jail

    devnull = os.open(os.devnull, os.O_RDWR)
    argv = [b"/bin/sh", b"-c", COMMAND.encode()]
    env = [b"PATH=/usr/bin:/bin", b"STOCKADE_ITEM=1"]
    cwd = os.fsencode(work)

    def worker(count: int) -> None:
        for _ in range(count):
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

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(n // threads,)) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    os.close(devnull)
    return (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), wall


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
    floor: list[float] = []
    floor_wall: list[float] = []
    engine: list[float] = []
    with tempfile.TemporaryDirectory(prefix="stockade-bench-floor-") as d:
        tmp = Path(d)
        work = tmp / "work"
        for r in range(args.rounds):
            # Alternating which goes first: the machine's state drifts.
            for side in (("floor", "engine") if r % 2 == 0 else ("engine", "floor")):
                if side == "floor":
                    (work / "out").mkdir(parents=True, exist_ok=True)
                    cpu, wall = spawn_floor(work, n, 2)
                    shutil.rmtree(work)
                    floor.append(cpu / n)
                    floor_wall.append(wall)
                else:
                    engine.append(run_stockade(tmp, n, "none", 2, engine_cpu=True)
                                  ["engine_cpu_s"] / n)
    f, e = statistics.median(floor), statistics.median(engine)
    print(f"{n} items, 2 at a time, {args.rounds} alternating rounds (medians):")
    print(f"  launcher alone: {f * 1e3:.3f} ms of CPU per item (wall {statistics.median(floor_wall):.2f} s)")
    print(f"  the engine, --sandbox none: {e * 1e3:.3f} ms of CPU per item = {e / f:.1f}x the "
          f"launcher; its bookkeeping per item: {(e - f) * 1e3:.2f} ms")
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
