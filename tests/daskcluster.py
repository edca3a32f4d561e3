"""A real Dask cluster for tests: ``dask scheduler`` and ``dask worker`` processes.

Each worker is its own process with its own HOME, TMPDIR and stockade scratch
folder (``STOCKADE_WORKER_SCRATCH``), none of them the engine's; the engine
(the test, or a ``stockade run`` it starts) reaches the scheduler on
loopback only. ``kill(name)`` SIGKILLs a worker; ``add(name)`` starts one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOCKADE_", "DASK_"))}
    env.update(extra)
    return env


@dataclass
class Worker:
    name: str
    folder: Path
    proc: subprocess.Popen[bytes]

    @property
    def scratch(self) -> Path:
        return self.folder / "scratch"

    @property
    def home(self) -> Path:
        return self.folder / "home"

    @property
    def log(self) -> str:
        return (self.folder / "worker.log").read_text(errors="replace")


@dataclass
class Cluster:
    base: Path
    port: int = field(default_factory=free_port)
    scheduler: subprocess.Popen[bytes] | None = None
    workers: dict[str, Worker] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"dask://127.0.0.1:{self.port}"

    def start_scheduler(self) -> None:
        log = open(self.base / "scheduler.log", "ab")  # noqa: SIM115 - the process keeps it
        self.scheduler = subprocess.Popen(
            [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port",
             str(self.port), "--no-dashboard"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=_env({}), cwd=self.base,
            start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1):
                return
            time.sleep(0.1)
        raise RuntimeError("dask scheduler did not start: "
                           + (self.base / "scheduler.log").read_text(errors="replace"))

    def add(self, name: str, threads: int = 2, env: Mapping[str, str] | None = None,
            wait: bool = True, nanny: bool = False) -> Worker:
        """A worker process (``nanny``: under a nanny that restarts it, as Dask deploys)."""
        folder = self.base / name
        for sub in ("home", "tmp", "scratch"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        log = open(folder / "worker.log", "ab")  # noqa: SIM115 - the process keeps it
        proc = subprocess.Popen(
            [sys.executable, "-m", "dask", "worker", self.address, "--name", name,
             "--nthreads", str(threads), "--no-dashboard", "--nanny" if nanny else "--no-nanny"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=folder, start_new_session=True,
            env=_env({"HOME": str(folder / "home"), "TMPDIR": str(folder / "tmp"),
                      "STOCKADE_WORKER_SCRATCH": str(folder / "scratch"), **(env or {})}))
        w = Worker(name, folder, proc)
        self.workers[name] = w
        if wait:
            self.wait_for(self.alive())
        return w

    def alive(self) -> int:
        return sum(1 for w in self.workers.values() if w.proc.poll() is None)

    def wait_for(self, n: int, timeout: float = 90) -> None:
        from distributed import Client

        deadline = time.monotonic() + timeout
        with Client(self.address, timeout=30, set_as_default=False) as c:
            while time.monotonic() < deadline:
                if len(c.scheduler_info(n_workers=-1)["workers"]) >= n:
                    return
                time.sleep(0.2)
        logs = "\n".join(w.log[-2000:] for w in self.workers.values())
        raise RuntimeError(f"{n} workers did not register in time:\n{logs}")

    def kill(self, name: str) -> None:
        w = self.workers[name]
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.wait(30)

    def kill_scheduler(self) -> None:
        assert self.scheduler is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.scheduler.pid, signal.SIGKILL)
        self.scheduler.wait(30)

    def stop(self) -> None:
        procs = [w.proc for w in self.workers.values()]
        if self.scheduler is not None:
            procs.append(self.scheduler)
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(15)


@contextlib.contextmanager
def cluster(base: Path, workers: Mapping[str, Mapping[str, str]] | None = None,
            threads: int = 2) -> Iterator[Cluster]:
    """A scheduler and one worker per entry of ``workers`` (name -> extra environment)."""
    base.mkdir(parents=True, exist_ok=True)
    c = Cluster(base)
    try:
        c.start_scheduler()
        for name, env in (workers if workers is not None else {"w1": {}, "w2": {}}).items():
            c.add(name, threads, env, wait=False)
        c.wait_for(len(c.workers))
        yield c
    finally:
        c.stop()
