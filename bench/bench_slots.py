"""Where a jailed item's time goes: the jail itself, and the turn-around
between one jail ending and the next starting in its job slot, for
``stockade run --sandbox bwrap`` against raw bwrap under ``xargs -P``
(issue: performance).

    python bench/bench_slots.py [--items 400] [--jobs 2] [--rounds 3]

Root only, with tracefs (``/sys/kernel/tracing``). The kernel's
``sched_process_fork``, ``exec`` and ``exit`` events time every process of
both sides without slowing them: for each bwrap, from its exec to the exec
of the item's shell (the jail's set-up), the shell's run, and the moment the
last process of its tree exits. The engine runs through ``MARKERS``, which
writes a line to ``trace_marker`` at each phase boundary of an item
(wrapping a few internal functions by name: a renamed one fails the run,
loudly). A slot's time per item is ``jobs * span / items`` (span: the
first bwrap's exec to the last tree's end); the turn-around is that minus
the mean jail. Rounds alternate the anchor and the engine; each figure is
the median of the rounds' means. Tracing settings are restored afterwards.
Trees go under ``$TMPDIR``.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench_fanout import COMMAND, workflow
from bench_sandbox import make_items, run_anchor

TRACING = Path("/sys/kernel/tracing")
EVENTS = ("sched:sched_process_fork", "sched:sched_process_exec", "sched:sched_process_exit")
BWRAP, SHELL = "/usr/bin/bwrap", "/bin/sh"

#: The engine, with a ``trace_marker`` line (``stockade PHASE STEP/INDEX``) at each
#: phase boundary of an item, in the order they happen in a job slot.
MARKERS = """
import functools, os, runpy, sys, threading
fd = os.open("/sys/kernel/tracing/trace_marker", os.O_WRONLY)
here = threading.local()
def mark(phase, item=None):
    item = getattr(here, "item", None) if item is None else item
    os.write(fd, f"stockade {phase} {item}".encode())
def around(owner, name, before, after, item_of=None):
    f = getattr(owner, name)
    @functools.wraps(f)
    def wrapped(*args, **kwargs):
        item = item_of(*args) if item_of else None
        if item is not None:
            here.item = item
        if before:
            mark(before, item)
        try:
            return f(*args, **kwargs)
        finally:
            if after:
                mark(after, item)
    setattr(owner, name, wrapped)
from stockade.runner import engine, executor
from stockade.runner.kinds import process, shell
from stockade.sandbox import _direct, _lifetime, _uids
around(executor.LocalExecutor, "submit", "submit", None, lambda self, a: f"{a.item.step}/{a.item.index}")
around(shell, "in_jail", "begin", "outcome", lambda a, body: f"{a.item.step}/{a.item.index}")
around(shell, "run_jail", "prepared", "jail_done", lambda a, *rest: f"{a.item.step}/{a.item.index}")
around(_direct, "_launch", "spawn", "spawned")
around(_direct.DirectRunning, "wait", None, "reaped")
around(_lifetime.JailGroup, "end", None, "group_ended")
around(_uids, "give_back", None, "given_back")
around(engine.Engine, "_attempt_ended", "engine_got", None,
       lambda self, a, outcome: f"{a.item.step}/{a.item.index}")
sys.argv = ["stockade", *sys.argv[1:]]
runpy.run_module("stockade.cli.main", run_name="__main__")
"""

#: Marker phases in slot order; the jail's own span sits between spawned and reaped.
PHASES = ("submit", "begin", "prepared", "spawn", "spawned", "reaped", "group_ended",
          "given_back", "jail_done", "outcome", "engine_got")


@contextmanager
def tracing() -> Iterator[list[str]]:
    """Trace process events (and markers) for the block; the text lands in the list."""
    saved = {name: (TRACING / name).read_text()
             for name in ("buffer_size_kb", "set_event", "tracing_on")}
    out: list[str] = []
    try:
        (TRACING / "tracing_on").write_text("0")
        (TRACING / "trace").write_text("")
        (TRACING / "buffer_size_kb").write_text("32768")
        (TRACING / "set_event").write_text("\n".join(EVENTS) + "\n")
        (TRACING / "tracing_on").write_text("1")
        yield out
        (TRACING / "tracing_on").write_text("0")
        out.append((TRACING / "trace").read_text())
    finally:
        (TRACING / "tracing_on").write_text("0")
        (TRACING / "set_event").write_text(saved["set_event"] or "\n")
        size = saved["buffer_size_kb"].split()[0]
        (TRACING / "buffer_size_kb").write_text(size)
        (TRACING / "trace").write_text("")
        (TRACING / "tracing_on").write_text(saved["tracing_on"])


LINE = re.compile(r"^\s*.+?-(\d+)\s+\[\d+\]\s+\S+\s+(\d+\.\d+): (\w+): (.*)$")


def jails(text: str, step: str | None) -> tuple[list[dict[str, float]], dict[str, dict[str, float]]]:
    """Each bwrap's tree (exec, shell exec and exit, tree gone, s) and the
    engine's markers by item (``STEP/INDEX``); a tree is tied to the item
    whose ``spawn`` marker its thread wrote last. ``step``: only that step's
    trees (the engine's), else all (the anchor's)."""
    parent: dict[int, int] = {}
    item_of_thread: dict[int, str] = {}
    spawned_by: dict[int, str] = {}
    trees: dict[int, dict[str, float]] = {}
    tree_item: dict[int, str] = {}
    marks: dict[str, dict[str, float]] = defaultdict(dict)
    shell_of: dict[int, int] = {}

    def root(pid: int) -> int | None:
        for _ in range(16):
            if pid in trees:
                return pid
            if pid not in parent:
                return None
            pid = parent[pid]
        return None

    for raw in text.splitlines():
        m = LINE.match(raw)
        if not m:
            continue
        tid, at, kind, rest = int(m[1]), float(m[2]), m[3], m[4]
        if kind == "tracing_mark_write":
            _, phase, item = rest.split()
            if item != "None":
                marks[item].setdefault(phase, at)
                if phase == "spawn":
                    item_of_thread[tid] = item
        elif kind == "sched_process_fork":
            parent_pid = int(re.search(r" pid=(\d+)", rest)[1])  # type: ignore[index]
            child = int(re.search(r"child_pid=(\d+)", rest)[1])  # type: ignore[index]
            parent[child] = parent_pid
            if parent_pid in item_of_thread:
                spawned_by[child] = item_of_thread[parent_pid]
        elif kind == "sched_process_exec":
            pid = int(re.search(r" pid=(\d+)", rest)[1])  # type: ignore[index]
            name = re.search(r"filename=(\S+)", rest)[1]  # type: ignore[index]
            if name == BWRAP:
                trees[pid] = {"exec": at}
                tree_item[pid] = spawned_by.get(pid, "")
            elif name == SHELL and (r := root(pid)) is not None and r not in shell_of:
                shell_of[r] = pid
                trees[r]["shell"] = at
        elif kind == "sched_process_exit":
            pid = int(re.search(r" pid=(\d+)", rest)[1])  # type: ignore[index]
            if (r := root(pid)) is not None:
                trees[r]["gone"] = max(trees[r].get("gone", 0.0), at)
                if shell_of.get(r) == pid:
                    trees[r]["shell_exit"] = at
    done = []
    for pid, t in trees.items():
        item = tree_item[pid]
        if {"shell", "shell_exit", "gone"} <= t.keys() and (
                step is None or item.startswith(f"{step}/")):
            done.append(t)
            if item:
                marks[item].update(bwrap_exec=t["exec"], jail_gone=t["gone"])
    if step is not None:
        marks = defaultdict(dict, {k: v for k, v in marks.items() if k.startswith(f"{step}/")})
    return done, dict(marks)


def side(text: str, items: int, jobs: int, step: str | None) -> dict[str, float]:
    """Per-item means, in ms, of one run's jails and slots."""
    trees, marks = jails(text, step)
    if len(trees) < items:
        raise SystemExit(f"only {len(trees)} of {items} bwrap trees were traced")
    span = max(t["gone"] for t in trees) - min(t["exec"] for t in trees)
    ms = 1000.0
    out = {
        "set-up (bwrap exec to the shell's exec)":
            statistics.mean(t["shell"] - t["exec"] for t in trees) * ms,
        "the shell": statistics.mean(t["shell_exit"] - t["shell"] for t in trees) * ms,
        "tear-down (shell exit to tree gone)":
            statistics.mean(t["gone"] - t["shell_exit"] for t in trees) * ms,
    }  # fmt: skip
    out["jail"] = statistics.mean(t["gone"] - t["exec"] for t in trees) * ms
    out["slot per item"] = jobs * span / items * ms
    out["turn-around"] = out["slot per item"] - out["jail"]
    steps = [*PHASES[:PHASES.index("spawned")], "bwrap_exec", "spawned", "jail_gone",
             *PHASES[PHASES.index("reaped"):]]
    for a, b in itertools.pairwise(steps):
        gaps = [m[b] - m[a] for m in marks.values() if a in m and b in m]
        # bwrap's exec and spawned race (vfork returns as the exec does);
        # the jail itself is above.
        if gaps and (a, b) not in (("bwrap_exec", "spawned"), ("spawned", "jail_gone")):
            out[f"  {a} -> {b}"] = statistics.mean(gaps) * ms
    submits = sorted(m["submit"] for m in marks.values() if "submit" in m)
    nexts = [submits[i] - m["engine_got"] for m in marks.values() if "engine_got" in m
             if (i := bisect.bisect_left(submits, m["engine_got"])) < len(submits)]
    if nexts:
        out["  engine_got -> the next submit"] = statistics.mean(nexts) * ms
    return out


def anchor_run(tmp: Path, items: int, jobs: int) -> str:
    dirs = make_items(tmp / "anchor", items)
    with tracing() as text:
        run_anchor("bwrap", dirs, jobs, COMMAND)
    shutil.rmtree(tmp / "anchor")
    return text[0]


def engine_run(tmp: Path, items: int, jobs: int) -> str:
    wf = tmp / "wf.yaml"
    wf.write_text(workflow(items))
    root = tmp / "root"
    env = {**os.environ, "STOCKADE_HOME": str(root)}
    with tracing() as text:
        p = subprocess.run([sys.executable, "-c", MARKERS, "run", str(wf), "--sandbox", "bwrap",
                            "--jobs", str(jobs)], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"stockade run failed ({p.returncode}):\n{p.stderr[-3000:]}")
    shutil.rmtree(root)
    return text[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0 or not (TRACING / "trace_marker").exists():
        raise SystemExit("bench_slots.py needs root and tracefs at /sys/kernel/tracing")
    rounds: dict[str, list[dict[str, float]]] = {"raw bwrap": [], "stockade": []}
    with tempfile.TemporaryDirectory(prefix="stockade-bench-") as d:
        tmp = Path(d)
        tmp.chmod(0o755)
        for r in range(args.rounds):
            order = ("raw bwrap", "stockade") if r % 2 == 0 else ("stockade", "raw bwrap")
            for name in order:
                if name == "raw bwrap":
                    got = side(anchor_run(tmp, args.items, args.jobs), args.items, args.jobs, None)
                else:
                    got = side(engine_run(tmp, args.items, args.jobs), args.items, args.jobs, "fan")
                rounds[name].append(got)
    print(f"{args.items} items, xargs -P{args.jobs} / --jobs {args.jobs}, "
          f"medians of {args.rounds} rounds' means, ms per item")
    keys = list(dict.fromkeys(k for runs in rounds.values() for k in runs[0]))
    print(f"{'':44s} {'raw bwrap':>10s} {'stockade':>10s}")
    for k in keys:
        cells = []
        for name in rounds:
            vals = [run[k] for run in rounds[name] if k in run]
            cells.append(f"{statistics.median(vals):10.2f}" if vals else f"{'':10s}")
        print(f"{k:44s} {' '.join(cells)}")


if __name__ == "__main__":
    main()
