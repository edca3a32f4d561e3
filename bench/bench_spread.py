"""Item folders made under a plain parent against a spread one (``workspace.spread``).

    python bench/bench_spread.py [--items 1000] [--rounds 8]

Each round makes ``--items`` item trees as a first attempt makes them (the
item, ``meta/``, ``work/``, ``work/out/`` and one file in it) under a new
parent, then removes the tree, as the runs before a run do. Rounds alternate
between a plain parent and one with ``FS_TOPDIR_FL`` (what the engine sets on
each step folder). Prints each round's time and the median ratio.

On an ext4 without a journal the plain rounds slow down as removed inodes
pile up in their group; with a journal, or where the flag is refused
(tmpfs, XFS, btrfs), both sides should match. The trees go under
``$TMPDIR``: run it on the disk you care about.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from stockade.workspace.spread import spread_subfolders


def make(parent: Path, n: int, spread: bool) -> tuple[float, bool]:
    parent.mkdir()
    took = spread_subfolders(str(parent)) if spread else False
    t0 = time.perf_counter()
    for i in range(n):
        item = f"{parent}/{i}"
        os.mkdir(item)
        os.mkdir(f"{item}/meta", 0o700)
        os.mkdir(f"{item}/work")
        os.mkdir(f"{item}/work/out")
        with open(f"{item}/work/out/x.txt", "w") as f:
            f.write("x\n")
    return time.perf_counter() - t0, took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=8, help="rounds per side")
    args = ap.parse_args()
    times: dict[bool, list[float]] = {False: [], True: []}
    accepted = False
    with tempfile.TemporaryDirectory(prefix="stockade-bench-spread-") as d:
        for r in range(2 * args.rounds):
            spread = r % 2 == 1
            parent = Path(d) / f"r{r}"
            took, ok = make(parent, args.items, spread)
            accepted |= ok
            times[spread].append(took)
            t0 = time.perf_counter()
            shutil.rmtree(parent)
            print(f"round {r:2}: {'spread' if spread else 'plain '} {took:6.3f} s "
                  f"(removed in {time.perf_counter() - t0:.3f} s)", flush=True)
    ratios = [p / s for p, s in zip(times[False], times[True], strict=True)]
    print(f"{args.items} item trees: plain median {statistics.median(times[False]):.3f} s, "
          f"spread {statistics.median(times[True]):.3f} s; plain / spread median "
          f"{statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f}); "
          f"flag {'accepted' if accepted else 'refused here: both sides are plain'}")


if __name__ == "__main__":
    main()
