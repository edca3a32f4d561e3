"""Large inputs: engine memory and disk for one big artifact fanned out (issue 12).

A first step writes SIZE bytes to ``out/big.bin``; a fan-out step of ITEMS
items takes it as an input and reads it whole (``cksum``). For each mode the
engine (``stockade run``, a subprocess) is polled for its peak resident set
(``VmHWM`` of ``/proc/PID/status``), and the run folder's disk use is
counted (allocated blocks, a hard-linked inode once):

* ``shared``: what the backend allows (bwrap: a read-only bind of the
  artifact; landlock under a root engine: an engine-owned read-only hard
  link; a reflink where the filesystem has them);
* ``copy``: ``STOCKADE_SHARE_INPUTS=0``, every item gets a streamed copy
  (the plain copy to compare with: constant memory, ITEMS times the disk).

Usage: ``python bench/bench_inputs.py [--size 2G] [--items 8] [--sandbox bwrap]
[--modes shared,copy] [--dir DIR]``. The run folders go under ``--dir``
(default ``$TMPDIR``) and are removed after each mode; ``copy`` needs about
SIZE x (ITEMS + 1) of free disk.

``--fingerprint N`` instead times the stat fingerprint of a ``mounts:``
folder of N files in 500 folders, as a conda env lays them out (best and
worst of 5, after one warm-up that fills the dentry cache as a run start
after an install would find it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stockade.spec.sizes import parse_size

WORKFLOW = """name: big-inputs
steps:
  - id: make
    run: head -c {size} /dev/zero > out/big.bin
  - id: fan
    needs: [make]
    for_each: {items}
    inputs:
      big.bin: "{{{{ steps.make.outputs['big.bin'] }}}}"
    run: cksum < big.bin
"""


def peak_rss(pid: int) -> int:
    """VmHWM of ``pid`` in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def disk_use(path: Path) -> int:
    """Allocated bytes below ``path``, each inode once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [*dirnames, *filenames]:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def run_mode(mode: str, size: int, items: int, sandbox: str, base: Path) -> dict[str, float]:
    project = Path(tempfile.mkdtemp(prefix=f"bench-inputs-{mode}-", dir=base))
    try:
        (project / "wf.yaml").write_text(WORKFLOW.format(size=size, items=list(range(items))))
        env = {**os.environ, "STOCKADE_HOME": str(project / ".stockade"),
               "STOCKADE_SANDBOX": sandbox}
        if mode == "copy":
            env["STOCKADE_SHARE_INPUTS"] = "0"
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "stockade.cli.main", "run", "wf.yaml"],
                                cwd=project, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, peak_rss(proc.pid))
            time.sleep(0.05)
        _out, err = proc.communicate()
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{mode}: stockade run failed ({proc.returncode}):\n{err}")
        disk = disk_use(project / ".stockade" / "runs")
        return {"rss": peak, "disk": disk, "wall": wall}
    finally:
        shutil.rmtree(project, ignore_errors=True)


def fingerprint_time(files: int, base: Path) -> None:
    from stockade.sandbox.toolchain import fingerprint

    env = Path(tempfile.mkdtemp(prefix="bench-fingerprint-", dir=base))
    try:
        for i in range(files):
            d = env / "lib" / "python3.11" / "site-packages" / f"pkg{i % 500}"
            if i < 500:
                d.mkdir(parents=True)
            (d / f"mod{i}.py").write_bytes(b"x = 1\n")
        fingerprint(str(env))
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fp = fingerprint(str(env))
            times.append(time.perf_counter() - t0)
        print(f"fingerprint of {fp.entries} entries: best {min(times):.3f} s, "
              f"worst {max(times):.3f} s")
    finally:
        shutil.rmtree(env, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size", default="2G")
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--sandbox", default="bwrap")
    ap.add_argument("--modes", default="shared,copy")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--fingerprint", type=int, default=0, metavar="N")
    args = ap.parse_args()
    if args.fingerprint:
        fingerprint_time(args.fingerprint, args.dir)
        return
    size = parse_size(args.size)
    assert size is not None
    mib = 1 << 20
    print(f"{args.items} items x {size / mib:.0f} MiB input, sandbox {args.sandbox}, "
          f"engine uid {os.geteuid()}")
    print(f"{'mode':8} {'engine peak RSS':>16} {'run folder on disk':>19} {'wall':>8}")
    for mode in args.modes.split(","):
        r = run_mode(mode, size, args.items, args.sandbox, args.dir)
        print(f"{mode:8} {r['rss'] / mib:13.0f} MiB {r['disk'] / mib:15.0f} MiB "
              f"{r['wall']:7.1f}s", flush=True)


if __name__ == "__main__":
    main()
