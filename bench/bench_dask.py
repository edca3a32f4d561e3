"""Scale-out benchmark: a fan-out on 2 local Dask workers (issue 15, "Measure").

Runs, on one machine, a ``dask scheduler`` and two ``dask worker`` processes
of one thread each, then times the same N-item fan-out of a trivial command
(``echo "$STOCKADE_ITEM" > out/x.txt``) four ways:

1. bare Dask (the anchor): ``client.map`` of a function that makes a fresh
   folder, runs the command with ``sh -c`` and sends ``out/x.txt`` back;
2. bare Dask in the sandbox: the same, but the command runs in a jail of the
   chosen backend (``backend.start``): 2 minus 1 is the sandbox's own cost;
3. ``stockade run --executor dask://...``;
4. ``stockade run --executor local --jobs 2`` on the engine's machine.

Each is also run with one item, and the per-item figures subtract that
(process start, imports, connecting, the workers' sandbox probe), so what is
left is what every further item costs:
``per item = ((T_N - T_1) - (A_N - A_1)) / (N - 1)``. The target: stockade
over bare Dask in the sandbox, <= 2 ms per item.

Usage: ``python bench/bench_dask.py [--items 1000] [--sandbox bwrap] [--rounds 1]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

COMMAND = 'echo "$STOCKADE_ITEM" > out/x.txt'


def workflow(n: int) -> str:
    items = ", ".join(str(i) for i in range(n))
    return f"""name: bench
steps:
  - id: fan
    for_each: [{items}]
    run: '{COMMAND}'
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def cluster(base: Path, sandbox: str) -> Iterator[tuple[str, dict[str, int]]]:
    """A scheduler and workers w1, w2; yields its address and their pids."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOCKADE_")}
    procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1",
                               "--port", str(port), "--no-dashboard"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                              start_new_session=True)]
    address = f"tcp://127.0.0.1:{port}"
    try:
        time.sleep(2)
        for name in ("w1", "w2"):
            (base / name / "tmp").mkdir(parents=True)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "dask", "worker", address, "--name", name, "--nthreads",
                 "1", "--no-dashboard", "--no-nanny"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=base / name,
                env={**env, "TMPDIR": str(base / name / "tmp"), "STOCKADE_SANDBOX": sandbox},
                start_new_session=True))
        from distributed import Client

        with Client(address, timeout=60, set_as_default=False) as c:
            c.wait_for_workers(2, timeout=120)
        yield address, {"scheduler": procs[0].pid, "w1": procs[1].pid, "w2": procs[2].pid}
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def bare_item(i: int, sandbox: str | None) -> bytes:
    """One item the plain Dask way: a folder, the command (in a jail when asked), the output."""
    d = Path(tempfile.mkdtemp(prefix="bare-"))
    try:
        work = d / "work"
        (work / "out").mkdir(parents=True)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "STOCKADE_ITEM": str(i)}
        if sandbox is None:
            subprocess.run(["/bin/sh", "-c", COMMAND], cwd=work, env=env, check=True,
                           stdin=subprocess.DEVNULL)
        else:
            from stockade.runner.worker import backend_for
            from stockade.sandbox.policy import Policy

            backend, _, _ = backend_for(sandbox)
            policy = Policy(argv=("/bin/sh", "-c", COMMAND), work_dir=work,
                            scratch_dir=d / "scratch", env=env)
            with open(os.devnull, "wb") as null:
                code = backend.start(policy, stdout=null, stderr=null).wait(60)
            if code != 0:
                raise RuntimeError(f"jail exited {code}")
        return (work / "out" / "x.txt").read_bytes()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def bare(address: str, n: int, sandbox: str | None) -> float:
    from distributed import Client

    with Client(address, timeout=60, set_as_default=False) as c:
        c.run(bare_item, 0, sandbox)  # warm each worker (imports, the backend's probe)
        t0 = time.perf_counter()
        futures = c.map(bare_item, range(n), sandbox=sandbox, pure=False)
        results = c.gather(futures)
        wall = time.perf_counter() - t0
    assert results[n - 1] == f"{n - 1}\n".encode()
    return wall


def stockade(tmp: Path, n: int, sandbox: str, executor: str) -> float:
    wf = tmp / f"wf-{n}.yaml"
    wf.write_text(workflow(n))
    root = tmp / f"root-{n}-{executor.split(':')[0]}"
    env = {**os.environ, "STOCKADE_HOME": str(root)}
    t0 = time.perf_counter()
    jobs = ["--jobs", "2"] if executor == "local" else []  # dask: the workers' threads
    p = subprocess.run([sys.executable, "-m", "stockade.cli.main", "run", str(wf), "--sandbox",
                        sandbox, "--executor", executor, *jobs],
                       env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"stockade run failed ({p.returncode}):\n{p.stderr[-3000:]}")
    shutil.rmtree(root, ignore_errors=True)
    return wall


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """Each process's CPU time so far, with its finished children's (the jails)."""
    import psutil  # type: ignore[import-untyped]  # a dependency of distributed

    out = {}
    for name, pid in pids.items():
        t = psutil.Process(pid).cpu_times()
        out[name] = t.user + t.system + t.children_user + t.children_system
    return out


def own_cpu(who: int) -> float:
    r = resource.getrusage(who)
    return float(r.ru_utime + r.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--sandbox", default="bwrap")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    n = args.items
    results: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        results.setdefault(name, []).append(value)

    with tempfile.TemporaryDirectory(prefix="stockade-bench-dask-") as d:
        tmp = Path(d)
        tmp.chmod(0o755)
        with cluster(tmp / "machines", args.sandbox) as (address, pids):
            url = "dask://" + address[len("tcp://"):]
            for _ in range(args.rounds):
                for size in (1, n):
                    add(f"bare {size}", bare(address, size, None))
                    before, mine = cpu_seconds(pids), own_cpu(resource.RUSAGE_SELF)
                    add(f"jail {size}", bare(address, size, args.sandbox))
                    if size == n:  # CPU per item: the cluster's, and the client's (here)
                        for k, v in cpu_seconds(pids).items():
                            add(f"cpu jail {k}", (v - before[k]) / n * 1000)
                        add("cpu jail client", (own_cpu(resource.RUSAGE_SELF) - mine) / n * 1000)
                    before, kids = cpu_seconds(pids), own_cpu(resource.RUSAGE_CHILDREN)
                    add(f"dask {size}", stockade(tmp, size, args.sandbox, url))
                    if size == n:  # the engine is a child process
                        for k, v in cpu_seconds(pids).items():
                            add(f"cpu dask {k}", (v - before[k]) / n * 1000)
                        add("cpu dask client",
                            (own_cpu(resource.RUSAGE_CHILDREN) - kids) / n * 1000)
                    add(f"local {size}", stockade(tmp, size, args.sandbox, "local"))
    m: dict[str, Any] = {k: statistics.median(v) for k, v in results.items()}

    def per_item(name: str, anchor: str) -> float:
        return ((m[f"{name} {n}"] - m[f"{name} 1"]) - (m[f"{anchor} {n}"] - m[f"{anchor} 1"])) \
            / (n - 1) * 1000

    print(f"fan-out of {n} items on 2 local Dask workers (1 thread each), sandbox "
          f"{args.sandbox}, median of {args.rounds} round(s)")
    for name, what in (("bare", "bare Dask client.map, sh -c"),
                       ("jail", f"bare Dask client.map, in a {args.sandbox} jail"),
                       ("dask", "stockade run --executor dask://"),
                       ("local", "stockade run --executor local --jobs 2")):
        print(f"  {what:<46} {m[f'{name} {n}']:8.2f} s  (1 item: {m[f'{name} 1']:6.2f} s)")
    print(f"  the sandbox's own cost per item             {per_item('jail', 'bare'):8.2f} ms")
    print(f"  stockade over bare Dask in the sandbox      {per_item('dask', 'jail'):8.2f} ms per "
          "item (target <= 2 ms)")
    print(f"  stockade over bare Dask, sandbox included   {per_item('dask', 'bare'):8.2f} ms per "
          "item")
    print(f"  --executor dask over --executor local       {per_item('dask', 'local'):8.2f} ms per "
          "item")
    print(f"CPU per item ({n} items), ms:        scheduler   worker w1   worker w2   "
          "client/engine")
    for name, what in (("jail", "bare Dask, in the jail"), ("dask", "stockade --executor dask")):
        cells = "".join(f"{m[f'cpu {name} {k}']:12.2f}" for k in ("scheduler", "w1", "w2",
                                                                    "client"))
        print(f"  {what:<32}{cells}")


if __name__ == "__main__":
    main()
