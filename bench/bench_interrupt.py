"""Ctrl-C on a running fan-out: how long until ``stockade run`` ends, and its jails.

    python bench/bench_interrupt.py [--rounds 5] [--backend bwrap --backend landlock ...]

For each backend available here, each round starts ``stockade run`` of an
8-item fan-out whose items sleep for five minutes, four at a time (``--jobs
4``, the case of the Ctrl-C issue), waits until four of the items' ``sleep``
processes run, and sends SIGINT: once to the run's process group, as a
terminal's Ctrl-C does (the jails get it too), and once to the engine alone,
as ``kill -INT`` does (the engine must end the jails itself). It times how
long the engine takes to exit, and how long until no process of any jail is
left (found by a marker in their command lines with ``pgrep -f``, polled, so
that figure is a few milliseconds late), and checks that the exit status is
130.

The anchor, in the same rounds: ``xargs -P4`` running the same ``sleep``
commands, its process group given the same signal. The goal is not a ratio
but a bound: exit 130 within 10 s, with every jail process gone.

The tree of each run goes under ``$TMPDIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

GOAL_S = 10.0
ITEMS = 8
JOBS = 4


def marked(marker: str, program: str = "") -> list[int]:
    """Pids of the processes whose command line holds ``marker`` (``pgrep -f``);
    with ``program``, only those whose command line starts with it."""
    pattern = f"^{program} .*{marker}" if program else marker
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(pid) for pid in out.stdout.split()]


def until(cond: Callable[[], object], timeout: float, step: float = 0.01) -> float | None:
    """Seconds until ``cond()`` held (polled every ``step``), or None after ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(step)
    return None


def kill_left(marker: str) -> None:
    for pid in marked(marker):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def interrupt(cmd: list[str], marker: str, env: dict[str, str],
              group: bool) -> tuple[int, float, float]:
    """Start ``cmd`` in a process group of its own, SIGINT the group (``group``)
    or its leader alone once ``JOBS`` sleeps run; (exit status, seconds to
    exit, seconds until no marked process)."""
    # A file, not a pipe nobody reads: the engine must never block on its output.
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=err)
        try:
            running = until(lambda: len(marked(marker, "sleep")) >= JOBS, 120)
            if running is None:
                err.seek(0)
                raise SystemExit(f"{cmd[0]}: the sleeps never started:\n{err.read().decode()}")
            sent = time.monotonic()
            (os.killpg if group else os.kill)(p.pid, signal.SIGINT)
            try:
                code = p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                code = -1
            exited = time.monotonic() - sent
            gone = until(lambda: not marked(marker), 60)
            left = (time.monotonic() - sent) if gone is not None else float("inf")
            return code, exited, left
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            kill_left(marker)


def stockade_round(tmp: Path, backend: str, marker: str, group: bool) -> tuple[int, float, float]:
    wf = tmp / "wf.yaml"
    wf.write_text(f"""name: ctrl-c
steps:
  - id: sleepers
    for_each: {list(range(ITEMS))}
    run: sleep {marker}
""")
    root = tmp / f"root-{backend}"
    env = {**os.environ, "STOCKADE_HOME": str(root)}
    cmd = [sys.executable, "-m", "stockade.cli.main", "run", str(wf), "--sandbox", backend,
           "--jobs", str(JOBS)]
    try:
        return interrupt(cmd, marker, env, group)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def anchor_round(marker: str) -> tuple[int, float, float]:
    cmd = ["sh", "-c", f"seq {ITEMS} | xargs -P{JOBS} -I{{}} sleep {marker}"]
    return interrupt(cmd, marker, dict(os.environ), group=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", action="append", choices=["bwrap", "landlock", "none"])
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from stockade.sandbox import get_backend

    backends = [b for b in args.backend or ["bwrap", "landlock", "none"]
                if get_backend(b).availability().available]
    rows: dict[str, list[tuple[int, float, float]]] = {"xargs, group": []}
    for b in backends:
        rows[f"{b}, group"] = []
        rows[f"{b}, engine"] = []
    with tempfile.TemporaryDirectory(prefix="stockade-bench-interrupt-") as d:
        tmp = Path(d)
        tmp.chmod(0o755)
        for _ in range(args.rounds):
            for name in rows:
                # A fresh marker each time: a jail left by one round is not
                # counted in the next.
                marker = f"300.{secrets.randbelow(10**8):08d}"
                backend, _, to = name.partition(", ")
                rows[name].append(anchor_round(marker) if backend == "xargs" else
                                  stockade_round(tmp, backend, marker, group=to == "group"))
    print(f"SIGINT with {JOBS} of {ITEMS} items sleeping, to the process group or to the "
          f"engine alone; {args.rounds} rounds (median, worst); goal: exit 130 within "
          f"{GOAL_S:g} s, every jail process gone")
    print(f"{'':16} {'exit status':>12} {'to exit s':>16} {'to no process left s':>22}")
    for name, got in rows.items():
        codes = sorted({c for c, _, _ in got})
        exits = [e for _, e, _ in got]
        gones = [g for _, _, g in got]
        print(f"{name:16} {','.join(map(str, codes)):>12} "
              f"{statistics.median(exits):8.3f} {max(exits):7.3f} "
              f"{statistics.median(gones):13.3f} {max(gones):8.3f}")
    bad = [n for n, got in rows.items() if not n.startswith("xargs")
           and any(c != 130 or g > GOAL_S for c, _, g in got)]
    if bad:
        print(f"outside the goal: {', '.join(bad)}")


if __name__ == "__main__":
    main()
