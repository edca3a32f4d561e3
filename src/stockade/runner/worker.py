"""The worker side of a job: materialise, verify, jail, collect, hand back by content.

``run_job(job)`` is the plain function a remote executor ships to a worker
(a Dask worker process, or any process with stockade installed). It picks
that machine's own best sandbox backend (``select_backend``, once per
process), refuses to run when the job requires an enforced sandbox and this
one is not, makes a private scratch folder of its own
(``$STOCKADE_WORKER_SCRATCH``, else ``stockade-worker`` under the worker's
TMPDIR; never a path of the engine's), writes the job's files into a fresh
``work/`` and checks each one's sha256 before the jail starts, runs the jail
under the job's timeout, collects ``out/`` after exit 0 and returns
everything as a ``JobResult``. The scratch folder is removed whatever
happened. It never touches the run tree, the store or provenance: those are
the engine's.

``cancelled`` is polled while the jail runs (the Dask executor passes one
that reads the task's state on its worker: a cancelled or lost attempt stops
its jail within a second).

Must not import the engine, the executors or the CLI.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stockade.errors import InfraError
from stockade.runner.captures import read_capture
from stockade.runner.env import Masker, build_env
from stockade.runner.jobs import (
    CAPTURE_MAX,
    AgentResult,
    Blob,
    BlobMismatch,
    Job,
    JobResult,
    WorkerInfo,
)
from stockade.runner.transfer import pack, pack_bytes, unpack
from stockade.sandbox.base import Backend
from stockade.sandbox.policy import Policy
from stockade.workspace.artifacts import OutputRefused, collect_outputs
from stockade.workspace.spread import make_spread_folder

SCRATCH_ENV = "STOCKADE_WORKER_SCRATCH"
#: How often a running jail checks whether its attempt was cancelled.
POLL = 0.5

_selected: dict[str | None, tuple[Backend, bool, str]] = {}
_select_lock = threading.Lock()


def backend_for(requested: str | None) -> tuple[Backend, bool, str]:
    """This process's backend for ``requested`` (None: the best), its enforcement, and why."""
    with _select_lock:
        if requested not in _selected:
            from stockade import sandbox

            sel = sandbox.select_backend(requested, os.environ)
            _selected[requested] = (sel.backend, sel.report.enforced, sel.report.reason)
        return _selected[requested]


def scratch_base() -> Path:
    """This worker's own scratch folder (private to its user).

    Its job folders are unrelated trees, each made and removed with its job,
    so the worker that makes it asks ext4 to spread them, as a run's step
    folders do (``workspace.spread``)."""
    base = Path(os.environ.get(SCRATCH_ENV) or Path(tempfile.gettempdir()) / "stockade-worker")
    make_spread_folder(str(base), 0o700)
    return base


def worker_identity() -> tuple[str, str]:
    """(name, address) of the Dask worker running this thread, else this host and pid."""
    try:
        from distributed import get_worker

        w = get_worker()
        return str(w.name), str(w.address)
    except (ImportError, ValueError):
        return f"{socket.gethostname()}:{os.getpid()}", ""


def _info(backend: str, enforced: bool) -> WorkerInfo:
    name, address = worker_identity()
    return WorkerInfo(name, address, socket.gethostname(), backend, enforced)


_swept: set[str] = set()
_sweep_lock = threading.Lock()


def _sweep_once(base: Path) -> None:
    """Remove the job folders (with their inputs) that a worker process killed
    mid-job left in ``base``, once per process. Several workers of one user
    share ``base``: a folder is named after its process (``job-<pid>-*``) and
    only those of a pid that no longer exists go."""
    with _sweep_lock:
        if str(base) in _swept:
            return
        _swept.add(str(base))
    for entry in os.scandir(base):
        pid = entry.name.split("-")[1] if entry.name.startswith("job-") else ""
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
        except PermissionError:
            pass  # alive, another user's: not ours to judge


def _never() -> bool:
    return False


def run_job(job: Job, cancelled: Callable[[], bool] = _never,
            echo: Callable[[str], None] | None = None) -> JobResult:
    """Run one job here; every ending is a ``JobResult`` (see the module docstring)."""
    t0 = time.monotonic()
    try:
        name = job.sandbox if job.isolate else "none"
        backend, enforced, reason = backend_for(name)
    except InfraError as exc:
        return JobResult("error", _info("", False), message=f"sandbox on this worker: {exc}")
    enforced = enforced and job.isolate
    info = _info(backend.name, enforced)
    if job.require_enforced and job.isolate and not enforced:
        return JobResult("refused", info, message=(
            f"refused: worker {info.name} ({info.host}) has no enforced sandbox "
            f"({backend.name}: {reason}) and this run requires one; install bubblewrap "
            "there or run `stockade doctor` on it"))
    base = scratch_base()
    _sweep_once(base)
    home = Path(tempfile.mkdtemp(prefix=f"job-{os.getpid()}-", dir=base))
    try:
        return _run(job, backend, info, home, cancelled, echo, t0)
    except BlobMismatch as exc:
        return JobResult("error", info, message=str(exc), seconds=time.monotonic() - t0)
    except (InfraError, OSError) as exc:
        return JobResult("error", info, message=f"on worker {info.name}: {exc}",
                         seconds=time.monotonic() - t0)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _run(job: Job, backend: Backend, info: WorkerInfo, home: Path,
         cancelled: Callable[[], bool], echo: Callable[[str], None] | None,
         t0: float) -> JobResult:
    work, scratch, meta = home / "work", home / "scratch", home / "meta"
    work.mkdir()
    meta.mkdir(mode=0o700)
    for folder in job.folders:
        (work / folder).mkdir(parents=True, exist_ok=True)
    for blob in job.files:
        unpack(blob, work, "input")  # each one verified before any jail starts
    (work / "out").mkdir(exist_ok=True)
    env = build_env(os.environ, step_env=job.env, secrets=(), stockade_vars={})
    out_path, err_path = meta / "stdout", meta / "stderr"
    agent: AgentResult | None = None
    mask: list[str] = []
    if job.kind == "agent":
        code, timed_out, agent = _agent(job, backend, work, scratch, meta, env, out_path,
                                        err_path, cancelled, echo)
    else:
        assert job.command is not None
        policy = Policy(argv=("/bin/sh", "-c", job.command), work_dir=work, scratch_dir=scratch,
                        env=env, network=job.network, resources=job.resources)
        code, timed_out, mask = _jail(job, backend, policy, meta, out_path, err_path, cancelled)
    if code is None and not timed_out:
        return JobResult("cancelled", info, message="cancelled", seconds=time.monotonic() - t0)
    prefix = job.id.replace("/", "_")
    masker = Masker(mask)
    outputs: tuple[Blob, ...] = ()
    output_error = ""
    if code == 0 and not timed_out:
        try:
            found = collect_outputs(work / "out")
        except OutputRefused as exc:
            output_error = str(exc)
        else:
            outputs = tuple(pack(work / "out" / o.name, o.name, job.artifacts, f"{prefix}/out")
                            for o in found)
    records = tuple(
        _record(meta / rel, rel, masker, job.artifacts, prefix)
        for rel, _ in _records(meta) if rel not in ("stdout", "stderr")
    )
    return JobResult(
        "ran", info, exit_code=code, timed_out=timed_out,
        stdout=_capture(out_path, "stdout", masker, job.artifacts, prefix),
        stderr=_capture(err_path, "stderr", masker, job.artifacts, prefix),
        outputs=outputs, output_error=output_error, records=records, agent=agent,
        seconds=time.monotonic() - t0,
    )


def _records(meta: Path) -> list[tuple[str, os.stat_result]]:
    from stockade.runner.jobs import walk_files

    return list(walk_files(meta))


def _capture(path: Path, name: str, masker: Masker, artifacts: str | None,
             prefix: str) -> Blob | None:
    try:
        data = read_capture(path, CAPTURE_MAX + 1)
    except FileNotFoundError:
        return None
    if len(data) > CAPTURE_MAX:
        data = data[:CAPTURE_MAX] + b"\n[stockade: cut at 64 MiB on the worker]\n"
    if masker:
        data = masker.data(data)
    return pack_bytes(name, data, artifacts, f"{prefix}/meta")


def _record(path: Path, rel: str, masker: Masker, artifacts: str | None, prefix: str) -> Blob:
    if not masker:
        return pack(path, rel, artifacts, f"{prefix}/meta")
    return pack_bytes(rel, masker.data(path.read_bytes()), artifacts, f"{prefix}/meta")


def _wait(jail: Any, timeout: float | None, cancelled: Callable[[], bool]) -> tuple[int | None, bool]:
    """Wait for the jail under the timeout, polling for a cancel; (status, timed out)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        step = POLL if deadline is None else max(0.0, min(POLL, deadline - time.monotonic()))
        code: int | None = jail.wait(step)
        if code is not None:
            return code, False
        if deadline is not None and time.monotonic() >= deadline:
            jail.kill(grace=2.0)
            return jail.wait(10), True
        if cancelled():
            jail.kill(grace=1.0)
            jail.wait(10)
            return None, False


def _jail(job: Job, backend: Backend, policy: Policy, meta: Path, out_path: Path,
          err_path: Path, cancelled: Callable[[], bool]) -> tuple[int | None, bool, list[str]]:
    """Start the jail (with its egress proxy when the step has an allowlist) and wait."""
    from dataclasses import replace

    proxy = None
    mask: list[str] = []
    if policy.network == "proxy":
        from stockade.sandbox.proxy import EgressProxy, credential_headers

        policy.scratch_dir.mkdir(parents=True, exist_ok=True)
        proxy = EgressProxy(job.allow, meta / "network.jsonl", policy.scratch_dir)
        proxy.start()
        policy = replace(policy, proxy_socket=proxy.socket_path, proxy_token=proxy.token)
        mask = list(credential_headers(proxy.token))
    try:
        if cancelled():
            return None, False, mask
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            jail = backend.start(policy, stdout=out, stderr=err)
        code, timed_out = _wait(jail, job.timeout, cancelled)
        return code, timed_out, mask
    finally:
        if proxy is not None:
            proxy.close()


def _agent(job: Job, backend: Backend, work: Path, scratch: Path, meta: Path,
           env: Mapping[str, str], out_path: Path, err_path: Path,
           cancelled: Callable[[], bool],
           echo: Callable[[str], None] | None) -> tuple[int | None, bool, AgentResult]:
    """The agent's session here (broker beside the files), model calls through the engine."""
    from stockade.agent import AgentJob, start_agent
    from stockade.runner.gateway import GatewayClient

    spec = job.agent
    assert spec is not None
    gateway = GatewayClient(spec.gateway, spec.grant, spec.token)
    records = meta / "agent"
    records.mkdir(mode=0o700)
    agent_job = AgentJob(
        run_id=spec.run_id, step=spec.step, item=spec.item, attempt=job.attempt,
        config=spec.config, work_dir=work, meta_dir=records, timeout=job.timeout,
        host_env=dict(spec.env), echo=echo or gateway.echo, interactive=spec.interactive,
        outputs=spec.outputs, secrets=spec.secrets,
    )
    with gateway.http() as http, start_agent(agent_job, ask=gateway.ask, http=http) as session:
        launch = session.launch
        policy = Policy(argv=tuple(launch.argv), work_dir=work, scratch_dir=scratch,
                        env={**env, **launch.env}, mounts=tuple(launch.mounts), network="none",
                        resources=job.resources, pass_fds=launch.pass_fds)
        code, timed_out, _ = _jail(job, backend, policy, meta, out_path, err_path, cancelled)
        outcome = session.finish(code)
        if outcome.ok and outcome.diff and not (work / "out" / "changes.diff").exists():
            (work / "out" / "changes.diff").write_text(outcome.diff, encoding="utf-8")
    # The session's files become the attempt's agent records (meta/<n>/ on the engine).
    for name in os.listdir(records):
        with contextlib.suppress(OSError):
            os.replace(records / name, meta / name)
    records.rmdir()
    return code, timed_out, AgentResult(outcome.ok, outcome.result, outcome.message,
                                        outcome.diff, dict(outcome.usage), outcome.retryable)


__all__ = ["SCRATCH_ENV", "backend_for", "dask_task", "probe_worker", "run_job", "scratch_base",
           "worker_identity"]


# -- the Dask side of a worker (distributed is imported only when this runs there) --------


def _task_cancelled() -> Callable[[], bool]:
    """Whether the running Dask task was cancelled or released (read on this worker, no RPC)."""
    try:
        from distributed import get_worker
        from distributed.worker import thread_state  # type: ignore[attr-defined]

        w = get_worker()
        key = thread_state.key
    except (ImportError, ValueError, AttributeError):
        return _never

    def check() -> bool:
        ts = w.state.tasks.get(key)
        return ts is None or ts.state not in ("executing", "long-running")

    return check


def dask_task(jobs: list[Job]) -> list[JobResult]:
    """What the Dask executor submits: a batch of jobs run one after another
    (one Dask task for several small items: each task costs the scheduler and
    the engine's client a round of their own), each stopping when the task is
    cancelled; a job the cancel reached before it began is ``cancelled``."""
    cancelled = _task_cancelled()
    out = []
    for job in jobs:
        if cancelled():
            out.append(JobResult("cancelled", _info(job.sandbox or "", False), message="cancelled"))
            continue
        out.append(run_job(job, cancelled=cancelled))
    return out


def probe_worker(requested: str | None = None, full: bool = False,
                 dask_worker: Any = None) -> dict[str, Any]:
    """This worker's sandbox: the backend a job gets, whether a probe jail proved it
    enforced, and with ``full`` every backend's report (``stockade doctor --executor``).

    ``dask_worker`` is the worker ``Client.run`` passes in."""
    if dask_worker is not None:
        name, address = str(dask_worker.name), str(dask_worker.address)
    else:
        name, address = worker_identity()
    out: dict[str, Any] = {"name": name, "address": address, "host": socket.gethostname(),
                           "scratch": str(scratch_base())}
    try:
        backend, enforced, reason = backend_for(requested)
        out.update(backend=backend.name, enforced=enforced, reason=reason)
    except InfraError as exc:
        out.update(backend=None, enforced=False, reason=str(exc))
    if full:
        from stockade import sandbox

        report = sandbox.doctor(os.environ)
        out["backends"] = [{k: b.get(k) for k in ("name", "available", "enforced", "reason")}
                           for b in report["backends"]]
        out["limitations"] = report.get("limitations", [])
    return out
