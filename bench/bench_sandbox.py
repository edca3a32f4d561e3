"""Jailed fan-out through ``Backend.start`` against a raw anchor, in the same run.

    python bench/bench_sandbox.py [--items 1000] [--jobs 2] [--rounds 5]
                                  [--backend bwrap --backend landlock --backend none]
                                  [--engine] [--spread-anchors]

For ``bwrap`` the anchor is raw ``bwrap`` (empty root, system dirs read-only,
fresh namespaces, the item's dir bound and used as cwd) started by
``xargs -P JOBS`` with the same command. For ``landlock`` the anchor is the
bare command started by ``xargs -P JOBS`` (``env -C DIR``): no sandbox at all.
Each side gets its own fresh item directories. Prints a table with the
ratio (ours / anchor; target <= 1.5) and the overhead per item in ms
(wall-clock difference divided by the number of items).

``--engine`` measures the whole engine instead: ``stockade run`` of a
1,000-item fan-out with ``--sandbox NAME --jobs 2`` (process start, probe,
plan, store records, provenance, completion files: everything) against the
same anchors, and for landlock also against raw bwrap (the issue's anchor).
There the anchors' item folders (item/, work/, out/, scratch/) are created
inside the timing, as the engine's are. Each round times one anchor run and
one engine run back to back; the ratio printed is the median of the rounds'
ratios, with their range. Both sides write under ``$TMPDIR`` and make four
folders per item (the engine: the item, ``meta/``, ``work/``, ``out/``; the
anchor: the item, ``work/``, ``out/``, scratch): on an ext4 without a journal
that has just deleted many files, every new inode is slow for a minute or so
(compare with ``TMPDIR=/dev/shm``). The engine asks ext4 to spread its item
folders (``workspace.spread``), which avoids most of that; ``--spread-anchors``
does the same for the anchors' folders, for the comparison without it.
It also prints the CPU time per item of each side's whole process tree
(``RUSAGE_CHILDREN``: the engine's fork-server helpers and its jails are
reaped, so they are in it): with every core busy, wall time follows CPU.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stockade.sandbox import Policy, get_backend
from stockade.sandbox._host import scan_host
from stockade.workspace.spread import spread_subfolders

COMMAND = "echo hi > out/x"
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass(frozen=True)
class Row:
    backend: str
    anchor: str
    items: int
    jobs: int
    anchor_s: float
    ours_s: float
    #: Per-round ratios (engine mode): each round's run against the anchor
    #: timed next to it, so a disk or host that slows down during the
    #: benchmark does not tilt the result.
    round_ratios: tuple[float, ...] = ()
    #: CPU seconds (user + system) of each side's whole process tree, medians
    #: (engine mode): on a host whose cores are all busy, wall time follows them.
    anchor_cpu_s: float | None = None
    ours_cpu_s: float | None = None
    #: Of ``ours_cpu_s``, the engine process alone (the rest: its helpers and jails).
    ours_engine_cpu_s: float | None = None

    @property
    def ratio(self) -> float:
        if self.round_ratios:
            return statistics.median(self.round_ratios)
        return self.ours_s / self.anchor_s

    @property
    def overhead_ms(self) -> float:
        return (self.ours_s - self.anchor_s) / self.items * 1000

    @property
    def spread(self) -> str:
        if not self.round_ratios:
            return ""
        return f"{min(self.round_ratios):.2f}-{max(self.round_ratios):.2f}"


def make_items(base: Path, n: int, spread: bool = False) -> list[Path]:
    """``spread`` (``--spread-anchors``): under a parent with ``FS_TOPDIR_FL``, as
    the engine makes its own (``workspace.spread``), so that neither side pays
    ext4's scan past recently removed inodes."""
    base.mkdir(parents=True)
    base.chmod(0o755)
    if spread:
        spread_subfolders(str(base))
    dirs = []
    for i in range(n):
        d = base / str(i)
        (d / "work" / "out").mkdir(parents=True)
        (d / "scratch").mkdir()
        dirs.append(d)
    return dirs


def raw_bwrap_argv(command: str = COMMAND) -> list[str]:
    layout = scan_host()
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
    for d in layout.dirs:
        argv += ["--ro-bind", d, d]
    for link, target in layout.symlinks.items():
        argv += ["--symlink", target, link]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    argv += ["--bind", "{}", "{}", "--chdir", "{}", "/bin/sh", "-c", command]
    return argv


def cpu_of(who: int) -> float:
    """User + system CPU seconds of this process (``RUSAGE_SELF``) or of its
    waited-for descendants (``RUSAGE_CHILDREN``: a child's own reaped children
    are in its figure once it is reaped)."""
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def run_anchor(kind: str, dirs: list[Path], jobs: int,
            command: str = COMMAND) -> tuple[float, float]:
    """Wall and CPU seconds of the anchor run (xargs and everything it started).
    ``kind``: ``bwrap`` (raw bwrap per item) or ``bare`` (the command alone)."""
    if kind == "bwrap":
        cmd = ["xargs", f"-P{jobs}", "-I{}", *raw_bwrap_argv(command)]
    else:
        cmd = ["xargs", f"-P{jobs}", "-I{}", "env", "-C", "{}", "/bin/sh", "-c", command]
    listing = "".join(f"{d / 'work'}\n" for d in dirs).encode()
    cpu0 = cpu_of(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, input=listing, check=True, stdout=subprocess.DEVNULL, env=ENV)
    return time.perf_counter() - t0, cpu_of(resource.RUSAGE_CHILDREN) - cpu0


def _ours(backend_name: str, dirs: list[Path], jobs: int) -> float:
    backend = get_backend(backend_name)
    # Output goes where the anchor's goes (xargs' stdout is /dev/null): the
    # figure is the sandbox's cost, not the cost of creating capture files.
    devnull = os.open(os.devnull, os.O_WRONLY)

    def one(d: Path) -> int | None:
        policy = Policy(
            argv=("/bin/sh", "-c", COMMAND),
            work_dir=d / "work",
            scratch_dir=d / "scratch",
            env=ENV,
        )
        running = backend.start(policy, stdout=devnull, stderr=devnull)
        return running.wait(60)

    warm = 4  # start helpers (landlock's fork servers) outside the timing
    for d in dirs[:warm]:
        one(d)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        codes = list(pool.map(one, dirs[warm:]))
    elapsed = time.perf_counter() - t0
    os.close(devnull)
    bad = [c for c in codes if c != 0]
    if bad:
        raise SystemExit(f"{backend_name}: {len(bad)} items failed, e.g. status {bad[0]}")
    return elapsed * len(dirs) / (len(dirs) - warm)


def run(backends: list[str], items: int, jobs: int, rounds: int = 5,
        spread: bool = False) -> list[Row]:
    """Alternate anchor and ours in ``rounds`` chunks so background load hits both alike."""
    rows = []
    chunk = max(items // rounds, 10)
    for name in backends:
        if not get_backend(name).availability().available:
            print(f"{name}: not available here ({get_backend(name).availability().reason})")
            continue
        base = Path(tempfile.mkdtemp(prefix="stockade-bench-"))
        base.chmod(0o755)
        anchor = ours = 0.0
        try:
            for r in range(rounds):
                anchor_dirs = make_items(base / f"anchor{r}", chunk, spread)
                our_dirs = make_items(base / f"ours{r}", chunk, spread)
                anchor += run_anchor(ANCHORS[name][0], anchor_dirs, jobs)[0]
                ours += _ours(name, our_dirs, jobs)
                assert all((d / "work" / "out" / "x").exists() for d in our_dirs)
            rows.append(Row(name, ANCHORS[name][0], chunk * rounds, jobs, anchor, ours))
        finally:
            shutil.rmtree(base, ignore_errors=True)
    get_backend("landlock").close()
    return rows


#: The anchors each backend is compared with (the first is the headline).
ANCHORS = {"bwrap": ("bwrap", "bare"), "landlock": ("bare", "bwrap"), "none": ("bare",)}


def run_engine(backends: list[str], items: int, jobs: int, rounds: int = 3,
               spread: bool = False) -> list[Row]:
    """Whole ``stockade run`` fan-outs against each anchor, alternating, medians."""
    from bench_fanout import COMMAND as FANOUT_COMMAND
    from bench_fanout import run_stockade

    rows = []
    for name in backends:
        if not get_backend(name).availability().available:
            continue
        anchors: dict[str, list[float]] = {kind: [] for kind in ANCHORS[name]}
        anchor_cpu: dict[str, list[float]] = {kind: [] for kind in ANCHORS[name]}
        ours: list[float] = []
        ours_cpu: list[float] = []
        engine_cpu: list[float] = []
        with tempfile.TemporaryDirectory(prefix="stockade-bench-") as d:
            tmp = Path(d)
            tmp.chmod(0o755)
            for r in range(rounds):
                for kind in ANCHORS[name]:
                    # The engine makes its item folders inside its timing, so
                    # the anchor's folder creation is timed (and its CPU counted) too.
                    cpu0 = cpu_of(resource.RUSAGE_SELF)
                    t0 = time.perf_counter()
                    dirs = make_items(tmp / f"{kind}{r}", items, spread)
                    made = time.perf_counter() - t0
                    made_cpu = cpu_of(resource.RUSAGE_SELF) - cpu0
                    wall, cpu = run_anchor(kind, dirs, jobs, FANOUT_COMMAND)
                    anchors[kind].append(made + wall)
                    anchor_cpu[kind].append(made_cpu + cpu)
                    shutil.rmtree(tmp / f"{kind}{r}")
                cpu0 = cpu_of(resource.RUSAGE_CHILDREN)
                got = run_stockade(tmp, items, name, jobs, engine_cpu=True)
                ours_cpu.append(cpu_of(resource.RUSAGE_CHILDREN) - cpu0)
                ours.append(got["wall"])
                engine_cpu.append(got["engine_cpu_s"])
        for kind, times in anchors.items():
            ratios = tuple(o / a for o, a in zip(ours, times, strict=True))
            rows.append(Row(
                name, kind, items, jobs, statistics.median(times), statistics.median(ours), ratios,
                statistics.median(anchor_cpu[kind]), statistics.median(ours_cpu),
                statistics.median(engine_cpu),
            ))  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5,
                    help="alternating rounds (backend mode: chunks of --items; engine mode: "
                    "whole runs of --items each)")  # fmt: skip
    ap.add_argument("--backend", action="append", choices=["bwrap", "landlock", "none"])
    ap.add_argument("--engine", action="store_true", help="time whole `stockade run`s")
    ap.add_argument("--spread-anchors", action="store_true",
                    help="make the item folders the bench makes (the anchors'; in backend "
                         "mode ours too) under a spread parent, as the engine makes its own")
    args = ap.parse_args()
    backends = args.backend or ["bwrap", "landlock"]
    if args.engine:
        rows = run_engine(backends, args.items, args.jobs, args.rounds, args.spread_anchors)
    else:
        rows = run(backends, args.items, args.jobs, args.rounds, args.spread_anchors)
    what = "stockade run (whole engine)" if args.engine else "Backend.start + wait"
    print(f"{what}; anchors run by xargs -P{args.jobs}: bwrap = raw bwrap per item, "
          "bare = the command alone, unsandboxed"
          + ("; anchors' folders under a spread parent" if args.spread_anchors else ""))  # fmt: skip
    print(f"{'backend':<10} {'anchor':<7} {'items':>6} {'jobs':>4} {'anchor s':>9} {'ours s':>8} "
          f"{'ratio':>6} {'rounds':>10} {'overhead ms/item':>17}")  # fmt: skip
    for r in rows:
        print(
            f"{r.backend:<10} {r.anchor:<7} {r.items:>6} {r.jobs:>4} {r.anchor_s:>9.2f} "
            f"{r.ours_s:>8.2f} {r.ratio:>6.2f} {r.spread:>10} {r.overhead_ms:>17.2f}"
        )
    cpu_rows = [r for r in rows if r.anchor_cpu_s is not None and r.ours_cpu_s is not None]
    if cpu_rows:
        print("CPU per item (user + system, every process of each side, medians of the rounds):")
        for r in cpu_rows:
            assert r.anchor_cpu_s is not None and r.ours_cpu_s is not None
            a, o = r.anchor_cpu_s / r.items * 1000, r.ours_cpu_s / r.items * 1000
            e = (r.ours_engine_cpu_s or 0.0) / r.items * 1000
            print(f"  {r.backend:<10} {r.anchor:<7} anchor {a:6.2f} ms, ours {o:6.2f} ms "
                  f"({o / a:.2f}x; {o - a:+.2f} ms) = engine process {e:.2f} ms "
                  f"+ its helpers and jails {o - e:.2f} ms")
    print(f"(host: {os.cpu_count()} cpus)")


if __name__ == "__main__":
    main()
