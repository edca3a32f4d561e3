"""How long jail processes outlive a SIGKILLed engine, and what ending jails
whole costs per item.

    python bench/bench_lifetime.py [--rounds 5] [--backend bwrap ...] [--mode cgroup2 ...]
    python bench/bench_lifetime.py --overhead [--items 300] [--jobs 2]

Default: for each backend/launcher and mechanism, ``stockade run`` an 8-item
fan-out of ``sh -c 'sleep 45 & sleep 45; wait'`` with ``--jobs 4``, wait
until the four running items' eight sleeps exist, SIGKILL the engine and
time until no process carrying the run's marker (``MARK=...`` in its
environment) is left, polling every 5 ms. Prints the median and the worst
round in ms. The contract is 2 s; the tests only assert a generous 10 s.

``--overhead``: ``Backend.start`` + ``wait`` of trivial items on each backend
under each mechanism, in this process, the mechanisms interleaved round by
round; prints the median wall-clock ms per item and the extra against
``off`` (no cgroup, no watchdog: the old path). On a shared, busy host the
spread between rounds is of the same order as the differences.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.sandbox.lifetime_helpers import LAUNCHER_ENV, marked, sandbox_of  # noqa: E402

FANOUT = """
name: fan
steps:
  - id: slow
    for_each: [1, 2, 3, 4, 5, 6, 7, 8]
    env: {{MARK: "{marker}"}}
    run: "sh -c 'sleep 45 & sleep 45; wait'"
"""


def one_round(name: str, mode: str | None, base: Path) -> float:
    marker = secrets.token_hex(8)
    wf = base / f"{marker}.yaml"
    wf.write_text(FANOUT.format(marker=marker))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOCKADE_")}
    env.update(LAUNCHER_ENV[name], STOCKADE_SANDBOX=sandbox_of(name), STOCKADE_HOME=str(base / "root"))
    if mode:
        env["STOCKADE_JAIL_LIFETIME"] = mode
    engine = subprocess.Popen(
        [sys.executable, "-m", "stockade.cli.main", "run", str(wf), "--jobs", "4"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(marked(marker, "sleep")) < 8:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}/{mode}: the jails did not start")
            time.sleep(0.02)
        engine.send_signal(signal.SIGKILL)
        engine.wait()
        killed = time.monotonic()
        while marked(marker):
            if time.monotonic() - killed > 30:
                raise RuntimeError(f"{name}/{mode}: jail processes outlived the engine by 30 s")
            time.sleep(0.005)
        return time.monotonic() - killed
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
        for pid in marked(marker):
            os.kill(pid, signal.SIGKILL)


def outlive(args: argparse.Namespace) -> None:
    base = Path(tempfile.mkdtemp(prefix="bench-lifetime-"))
    try:
        print(f"{'backend':16} {'mechanism':10} {'median ms':>10} {'worst ms':>10}")
        for name in args.backend:
            for mode in args.mode:
                times = [one_round(name, None if mode == "auto" else mode, base)
                         for _ in range(args.rounds)]  # fmt: skip
                print(f"{name:16} {mode:10} {statistics.median(times) * 1000:10.0f} "
                      f"{max(times) * 1000:10.0f}")  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)


def overhead(args: argparse.Namespace) -> None:
    from stockade.sandbox import Policy, _lifetime
    from stockade.sandbox.bwrap import BwrapBackend
    from stockade.sandbox.landlock import LandlockBackend
    from stockade.sandbox.none import NoneBackend

    modes = ("off", "pgroup", "cgroup1", "cgroup2")
    lifetimes = {m: _lifetime.Lifetime(m) for m in modes}
    base = Path(tempfile.mkdtemp(prefix="bench-lifetime-"))
    base.chmod(0o755)
    print(f"{'backend':10} {'mechanism':10} {'ms/item':>8} {'extra':>8}   (median of {args.rounds} "
          f"interleaved rounds of {args.items} items, {args.jobs} jobs)")  # fmt: skip
    # One pool for everything, as in a run: an exec helper dies with the
    # thread that started it (its parent-death signal follows that thread).
    pool = ThreadPoolExecutor(args.jobs)
    try:
        for name, cls in (("bwrap", BwrapBackend), ("landlock", LandlockBackend),
                          ("none", NoneBackend)):  # fmt: skip
            backend = cls()
            times: dict[str, list[float]] = {m: [] for m in modes}
            for rnd in range(args.rounds):
                for mode in modes:
                    _lifetime._current = lifetimes[mode]
                    folder = base / name / f"{mode}-{rnd}"

                    def item(i: int, folder: Path = folder, backend: object = backend) -> None:
                        d = folder / str(i)
                        (d / "work").mkdir(parents=True)
                        policy = Policy(("/bin/sh", "-c", "echo hi > x"), d / "work",
                                        d / "scratch", {"PATH": "/usr/bin:/bin"})  # fmt: skip
                        with open(d / "out", "wb") as out:
                            started = backend.start(policy, stdout=out, stderr=out)  # type: ignore[attr-defined]
                            assert started.wait(60) == 0

                    pool.submit(item, -1).result()  # warm up: helpers, watchdog, cgroups
                    t = time.perf_counter()
                    list(pool.map(item, range(args.items)))
                    times[mode].append((time.perf_counter() - t) / args.items * 1000)
            off = statistics.median(times["off"])
            for mode in modes:
                per = statistics.median(times[mode])
                print(f"{name:10} {mode:10} {per:8.2f} {per - off:8.2f}")
            backend.close()
    finally:
        pool.shutdown()
        for lt in lifetimes.values():
            lt.close()
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", action="append",
                    choices=sorted(LAUNCHER_ENV))  # fmt: skip
    ap.add_argument("--mode", action="append", choices=["auto", "cgroup2", "cgroup1", "pgroup"])
    ap.add_argument("--overhead", action="store_true")
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    args.backend = args.backend or sorted(LAUNCHER_ENV)
    args.mode = args.mode or ["auto", "cgroup1", "pgroup"]
    if args.overhead:
        overhead(args)
    else:
        outlive(args)


if __name__ == "__main__":
    main()
