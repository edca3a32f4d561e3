"""Start or resume a run: preflight, sandbox, store record, folder, lock, engine.

This is the one place where a loaded workflow meets the machine. The order
matters: everything that can be checked is checked before anything is
created (preflight errors leave no trace); the store record is made before
the run folder (the store is what several roots may share, so it decides
whether an id is taken); the engine's lock is taken before the first item,
so a dead engine's run reads as ``crashed``. Must not import the CLI.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stockade.errors import UserError
from stockade.plan import Plan, build_plan
from stockade.runner import preflight, toolchains
from stockade.runner.attempt import Jails, PublishSettings, RunContext
from stockade.runner.cpus import available_cpus
from stockade.runner.engine import Engine
from stockade.runner.executor import Executor, LocalExecutor
from stockade.runner.given import (
    apply_overrides,
    fingerprint_inputs,
    load_spec,
    secret_masker,
    template_functions,
)
from stockade.runner.manifest import build_manifest
from stockade.runner.prefetch import FolderPrefetch
from stockade.runner.report import Reporter
from stockade.runner.reuse import secret_key
from stockade.runner.roots import executor_url, open_run_store
from stockade.runner.signals import Interrupts, signals_to
from stockade.runner.status import RunStatus
from stockade.runner.summary import RunSummary
from stockade.sandbox.base import Backend
from stockade.spec import Spec
from stockade.store.base import Event, RunExists, RunRecord, Store
from stockade.workspace.artifacts import HostFile, HostTree
from stockade.workspace.ids import check_run_id, uuid7
from stockade.workspace.layout import RunDir, read_json, write_json
from stockade.workspace.runlock import RunLock

if TYPE_CHECKING:  # the Dask side is imported only when a run uses it
    from stockade.runner.dask_executor import DaskExecutor


@dataclass(frozen=True)
class SandboxChoice:
    backend: Backend
    enforced: bool
    limitations: tuple[str, ...]
    line: str
    #: What runs and records show instead of ``backend.name`` (the workers' backend,
    #: when items run on a cluster).
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or self.backend.name


@dataclass(frozen=True)
class RunOptions:
    root: Path
    #: None: the CPUs this process may use (affinity and cgroup quota).
    jobs: int | None = None
    run_id: str | None = None
    overrides: Mapping[str, str] | None = None
    sandbox: str | None = None
    require_sandbox: bool = False
    store_url: str | None = None
    allow_stale: bool = False
    #: Take unchanged items from earlier runs: True (--reuse), False (--no-reuse), None
    #: (the workflow's ``reuse:``).
    reuse: bool | None = None
    #: ``--executor``: ``dask://HOST:PORT`` (None: ``$STOCKADE_EXECUTOR``, else this machine).
    executor: str | None = None
    #: ``--artifacts``: an fsspec URL for large files between engine and workers.
    artifacts: str | None = None


@dataclass(frozen=True)
class RunResult:
    run_id: str
    run_path: Path
    summary: RunSummary
    sandbox: SandboxChoice
    started_at: float = 0.0
    ended_at: float = 0.0


def choose_sandbox(requested: str | None, env: Mapping[str, str]) -> SandboxChoice:
    from stockade import sandbox

    sel = sandbox.select_backend(requested, env)
    return SandboxChoice(sel.backend, sel.report.enforced, tuple(sel.report.limitations),
                         sandbox.start_line(sel))


def _resumable_manifest(run: RunDir) -> dict[str, Any]:
    """The manifest a run began with, holding what resume reads of it; a
    ``UserError`` for one edited, cut short or unreadable."""
    why = None
    try:
        manifest = read_json(run.manifest)
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or f"not JSON: {exc}"
    else:
        wf = manifest.get("workflow") if isinstance(manifest, dict) else None
        if not (isinstance(wf, dict) and isinstance(wf.get("path"), str)
                and isinstance(wf.get("sha256"), str)
                and isinstance(manifest.get("vars"), dict)
                and isinstance(manifest.get("input_fingerprints"), dict)):
            why = "it lacks the workflow's path, sha256, vars or input fingerprints"
    if why is not None:
        raise UserError(f"run {run.run_id!r}: its manifest {run.manifest} is unreadable ({why}); "
                        "resume needs the record the run began with: start a new run")
    return manifest  # type: ignore[no-any-return]


def _check_id(run_id: str | None, new_id: Callable[[], str]) -> str:
    if run_id is None:
        return new_id()
    if not run_id:
        raise UserError("--run-id '': an empty run id is not an id; leave --run-id out to "
                        "have one made")
    if run_id == "last":
        # Every RUN argument reads 'last' as the newest run: this one could not be named.
        raise UserError("--run-id 'last': 'last' names the newest run wherever a run id is "
                        "asked for; choose another id")
    return check_run_id(run_id)


#: Toolchains are paths on this machine, fingerprinted here; a worker's own
#: paths are not checked against them, so a run on Dask refuses them.
_REMOTE_TOOLCHAINS = (
    "steps {steps} declare mounts: or image:, which run on this machine's sandbox only; "
    "run them with --executor local (a toolchain on Dask workers is not supported yet)"
)


def _toolchains(spec: Spec, base: Path, root: Path, choice: SandboxChoice, remote: Any,
                reporter: Reporter) -> dict[str, toolchains.Toolchain]:
    """The steps' toolchains, for a run or a resume; a run on Dask with any is
    refused before a folder is fingerprinted or an image unpacked."""
    if remote is not None:
        steps = toolchains.declared(spec)
        if steps:
            raise UserError(_REMOTE_TOOLCHAINS.format(steps=", ".join(sorted(steps))))
        return {}
    return toolchains.resolve(spec, base, root, type(choice.backend), reporter.echo)


@dataclass
class Prepared:
    """A checked workflow bound to this machine, ready to execute as one run."""

    spec: Spec
    plan: Plan
    run: RunDir
    store: Store
    sandbox: SandboxChoice
    values: dict[str, Any]
    files: dict[str, HostFile]
    trees: dict[str, HostTree]
    env: dict[str, str]
    manifest: dict[str, Any]
    toolchains: dict[str, toolchains.Toolchain] = field(default_factory=dict)
    #: The Dask cluster the items run on (``dask_session.RemoteRun``); None: this machine.
    remote: Any = None
    #: The engine's lock on the run, taken as soon as the run's folder exists
    #: (``run``) or before its status turns back to running (``resume``), so
    #: no reader ever sees a running run whose lock is free (``crashed``).
    lock: RunLock | None = None


@dataclass(frozen=True)
class Hooks:
    """How the caller follows a run: progress, the start line, the clock, a terminal."""

    reporter: Reporter
    on_start: Callable[[str, Path, SandboxChoice], None] | None = None
    clock: Callable[[], float] = time.time
    interactive: bool = False


def start_run(
    workflow_path: Path,
    opts: RunOptions,
    reporter: Reporter,
    *,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    new_id: Callable[[], str] = uuid7,
    on_start: Callable[[str, Path, SandboxChoice], None] | None = None,
    interactive: bool = False,
    on_warning: Callable[[str], None] | None = None,
) -> RunResult:
    """Check everything, then create the run (store record, folder, manifest) and execute it.

    The workflow's warnings (``FILE:LINE:COL: warning: ...``) go to
    ``on_warning`` before anything is created; by default to the reporter.
    """
    env = dict(os.environ if env is None else env)
    hooks = Hooks(reporter, on_start, clock, interactive)
    spec = load_spec(workflow_path)
    plan = build_plan(spec)
    values = apply_overrides(spec, opts.overrides)
    run_id = _check_id(opts.run_id, new_id)
    base = workflow_path.resolve().parent
    preflight.check(spec, base, env, values)
    for warning in spec.warnings:
        (on_warning or reporter.echo)(str(warning))
    files, trees = fingerprint_inputs(spec, base)
    require = spec.workflow.sandbox.require or opts.require_sandbox
    remote = _open_remote(opts.executor, opts, require, env, spec)
    try:
        choice = remote_choice(remote) if remote else choose_sandbox(opts.sandbox, env)
        if require and not choice.enforced and remote is None:
            raise UserError(
                f"this run requires an enforced sandbox, but the active backend is "
                f"{choice.backend.name!r} ({choice.line}); install bubblewrap "
                "(apt-get install bubblewrap) or run `stockade doctor` to see why"
            )
        run = RunDir(opts.root.resolve(), run_id)
        if run.path.exists():
            raise UserError(f"run id {run_id!r} is taken: {run.path} exists; run ids are never "
                            "reused")
        tools = _toolchains(spec, base, run.root, choice, remote, reporter)
        store = open_run_store(run.root, opts.store_url, env)
    except BaseException:
        if remote is not None:
            remote.close()
        raise
    started = clock()
    manifest = build_manifest(spec, plan, run_id, started, values, files, trees,
                              backend=choice.name, enforced=choice.enforced,
                              limitations=choice.limitations,
                              jobs=opts.jobs or available_cpus(), workflow_path=workflow_path)
    if tools:
        manifest["toolchains"] = {sid: tc.to_json() for sid, tc in tools.items()}
    if remote is not None:
        manifest["executor"] = remote.cluster.to_json()
    prepared = Prepared(spec, plan, run, store, choice, values, files, trees, env, manifest,
                        toolchains=tools, remote=remote)
    interrupts = Interrupts()
    # From here on an interrupt ends the run as interrupted, never half-created.
    with signals_to(interrupts):
        _create(prepared, workflow_path)
        if on_start:
            on_start(run_id, run.path, choice)
        return _execute(prepared, opts, hooks, resume=False, interrupts=interrupts)


def _create(p: Prepared, workflow_path: Path) -> None:
    """The store record first (it decides whether the id is taken), then the folder."""
    run_id, m = p.run.run_id, p.manifest
    try:
        p.store.create_run(RunRecord(
            run_id=run_id, workflow=p.spec.workflow.name,
            workflow_path=str(workflow_path.resolve()), workflow_sha256=p.spec.sha256,
            root=str(p.run.root), status=RunStatus.RUNNING, started_at=float(m["started_at"]),
            sandbox=p.sandbox.name, enforced=p.sandbox.enforced,
        ))
    except RunExists as exc:
        p.store.close()
        if p.remote is not None:
            p.remote.close()
        if exc.removed:
            raise UserError(f"run id {run_id!r} was a run's, since deleted; run ids are never "
                            "reused (a sink would take this run's publish for that run's, "
                            "already applied): choose another id") from None
        raise UserError(f"run id {run_id!r} is taken in the run store (another root shares it); "
                        "run ids are never reused") from None
    try:
        p.run.create()
        p.lock = RunLock(p.run.path)
        p.lock.acquire()
    except BaseException:
        p.store.delete_run(run_id)
        p.store.close()
        raise
    write_json(p.run.manifest, secret_masker(p.spec, p.env).value(m))
    p.store.add_event(Event(run_id, float(m["started_at"]), "run_started",
                            {"sandbox": p.sandbox.line}))


def _rerun(workflow_path: Path) -> str:
    """The way on when ``resume`` refuses a changed workflow, as a command to paste."""
    return (f"start a new run with `stockade run {shlex.quote(str(workflow_path))} --reuse` "
            "to rerun only what changed")


def resume_run(
    run_id: str,
    opts: RunOptions,
    reporter: Reporter,
    *,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    on_start: Callable[[str, Path, SandboxChoice], None] | None = None,
    interactive: bool = False,
) -> RunResult:
    """Continue a run: verified items are kept, the rest run again in fresh attempts."""
    env = dict(os.environ if env is None else env)
    hooks = Hooks(reporter, on_start, clock, interactive)
    check_run_id(run_id)
    root = opts.root.resolve()
    run = RunDir(root, run_id)
    if not run.manifest.exists():
        if run.path.is_dir():
            raise UserError(f"run {run_id!r}: its manifest {run.manifest} is gone; resume "
                            "needs the record the run began with: start a new run")
        raise UserError(f"no run {run_id!r} under {root / 'runs'} (see `stockade runs`)")
    manifest = _resumable_manifest(run)
    store = open_run_store(root, opts.store_url, env)
    record = store.get_run(run_id)
    if record is None:
        raise UserError(f"run {run_id!r} has a directory but no record in the store")
    workflow_path = Path(manifest["workflow"]["path"])
    spec = load_spec(workflow_path)
    if spec.sha256 != manifest["workflow"]["sha256"]:
        raise UserError(
            f"{workflow_path} changed since run {run_id} started "
            f"(sha256 {spec.sha256[:12]} != {manifest['workflow']['sha256'][:12]}); "
            "resume runs the workflow it started with: restore the file, or "
            f"{_rerun(workflow_path)}"
        )
    plan = build_plan(spec)
    values = dict(manifest["vars"])
    base = workflow_path.parent
    preflight.check(spec, base, env, values)
    files, trees = fingerprint_inputs(spec, base)
    for key, digest in manifest["input_fingerprints"].items():
        kind, rel = key.split(":", 1)
        now = files.get(rel) if kind == "file" else trees.get(rel)
        if now is not None and now.sha256 != digest:
            raise UserError(f"{kind}({rel!r}) changed since run {run_id} started; "
                            f"{_rerun(workflow_path)}")
    from stockade.runner.dask_session import resume_url

    url = resume_url(opts.executor, manifest)
    require = spec.workflow.sandbox.require
    remote = _open_remote(url, opts, require, env, spec)
    if remote is not None:
        choice = remote_choice(remote)
    else:
        recorded = manifest["sandbox"]["backend"]
        choice = choose_sandbox(opts.sandbox or (None if "executor" in manifest else recorded),
                                env)
        if require and not choice.enforced:
            raise UserError(f"this run requires an enforced sandbox, but {choice.line}")
    try:
        tools = _toolchains(spec, base, root, choice, remote, reporter)
        moved = toolchains.changed(manifest.get("toolchains") or {}, tools)
        if moved:
            raise UserError(f"{'; '.join(moved)} changed since run {run_id} started; "
                            f"{_rerun(workflow_path)}")
    except BaseException:
        if remote is not None:
            remote.close()
        raise
    prepared = Prepared(spec, plan, run, store, choice, values, files, trees, env, manifest,
                        toolchains=tools, remote=remote)
    interrupts = Interrupts()
    with signals_to(interrupts):
        prepared.lock = RunLock(run.path)
        try:
            prepared.lock.acquire()
        except BaseException:
            store.close()
            if remote is not None:
                remote.close()
            raise
        store.update_run(run_id, status=RunStatus.RUNNING, ended_at=None)
        store.add_event(Event(run_id, clock(), "run_resumed", {"sandbox": choice.line}))
        if on_start:
            on_start(run_id, run.path, choice)
        return _execute(prepared, opts, hooks, resume=True, interrupts=interrupts)


# -- items on a Dask cluster (runner.dask_session holds the rest) ----------------------


def _open_remote(option: str | None, opts: RunOptions, require: bool,
                 env: Mapping[str, str], spec: Spec) -> Any:
    """The run's cluster when ``--executor``/``$STOCKADE_EXECUTOR`` names one, else None."""
    url = executor_url(option, env)
    if url is None:
        if opts.artifacts:
            raise UserError("--artifacts moves files between the engine and Dask workers; "
                            "it needs --executor dask://HOST:PORT")
        return None
    if problems := preflight.remote_problems(spec, url):
        raise UserError(problems=problems)
    from stockade.runner.dask_session import open_cluster

    return open_cluster(url, opts.sandbox, require, opts.artifacts)


def remote_choice(remote: Any) -> SandboxChoice:
    """The run's sandbox as the workers have it (the engine itself jails nothing)."""
    from stockade.sandbox import BACKEND_NAMES, get_backend

    cluster = remote.cluster
    # The workers' backend (made, never started, here) names what they apply.
    backend = get_backend(cluster.backend if cluster.backend in BACKEND_NAMES else "none")
    return SandboxChoice(backend, cluster.enforced, (), cluster.line(), label=cluster.backend)


def _on_broken(executor: DaskExecutor, engine: Engine, reporter: Reporter) -> None:
    """A cluster gone for good stops the run as interrupted (resumable), saying why."""

    def broken() -> None:
        reporter.echo(f"error: {executor.broken}")
        engine.interrupt()

    executor.on_broken = broken


def _execute(p: Prepared, opts: RunOptions, hooks: Hooks, *, resume: bool,
             interrupts: Interrupts) -> RunResult:
    """Run the engine under the engine lock (the caller installed the signal handling)."""
    from stockade.sandbox.none import NoneBackend

    spec, run, store, clock = p.spec, p.run, p.store, hooks.clock
    base = Path(spec.filename).resolve().parent
    for tree in p.trees.values():
        if (refused := tree.refusal_message()) is not None:
            hooks.reporter.echo(f"warning: {refused}")
    index = {s.id: i for i, s in enumerate(spec.workflow.steps)}

    def locate(step: str, path: tuple[str | int, ...]) -> str:
        line, col = spec.position("steps", index[step], *path)
        return f"{spec.filename}:{line}:{col}"

    masker = secret_masker(spec, p.env)
    context = RunContext(
        run_id=run.run_id, workflow=spec.workflow.name, backend=p.sandbox.backend,
        none_backend=NoneBackend(), enforced=p.sandbox.enforced, host_env=p.env,
        secrets_allowed=frozenset(spec.workflow.secrets), clock=clock,
        functions=template_functions(base, p.files, p.trees), echo=hooks.reporter.echo,
        interactive=hooks.interactive, jails=Jails(), store=store,
        publish=PublishSettings(
            run_started_at=float(p.manifest["started_at"]),
            input_fingerprint=str(p.manifest.get("input_fingerprint", "")),
            allow_stale=opts.allow_stale, base_dir=base, vars=p.values,
        ),
        masker=masker, locate=locate, reuse_secret=secret_key(run.root),
        toolchains=p.toolchains,
    )
    executor: Executor
    dask: DaskExecutor | None = None
    if p.remote is not None:
        from stockade.runner.dask_session import make_executor

        executor = dask = make_executor(p.remote, opts.jobs,
                                 any(s.kind == "agent" for s in spec.workflow.steps),
                                 hooks.reporter.echo, hooks.interactive, p.env)
    else:
        executor = LocalExecutor(opts.jobs or available_cpus())
    # Both callers took the lock as soon as the run's folder existed.
    lock = p.lock
    if lock is None:
        raise RuntimeError("the run's lock must be taken before its engine starts")
    started = float(p.manifest["started_at"])
    try:
        reuse = spec.workflow.reuse if opts.reuse is None else opts.reuse
        # Folders made ahead of each item's turn, on this machine's disk, for
        # the steps whose folder refused the spread flag (``Engine._expand``):
        # a Dask worker makes its items' own.
        prefetch = FolderPrefetch(run, ahead=2 * executor.slots) if dask is None else None
        engine = Engine(spec=spec, plan=p.plan, run=run, context=context, executor=executor,
                        vars=p.values, reporter=hooks.reporter, resume=resume, reuse=reuse,
                        prefetch=prefetch)
        interrupts.attach(engine.interrupt)
        if dask is not None:
            _on_broken(dask, engine, hooks.reporter)
        try:
            summary = engine.execute()
        finally:
            executor.close()
            p.sandbox.backend.close()
            if p.remote is not None:
                from stockade.runner.dask_session import record_workers

                if dask is not None:
                    record_workers(run, p.remote, dask)
                p.remote.close()
        ended = clock()
        store.update_run(run.run_id, status=summary.status, ended_at=ended)
        store.add_event(Event(run.run_id, ended, "run_finished",
                              {"status": str(summary.status)}))
        if spec.workflow.notify:
            from stockade.runner.notify import notify_all

            notify_all(spec, run.run_id, summary, started, ended, p.env, store,
                       hooks.reporter.echo, masker)
    finally:
        lock.release()
        store.close()
    return RunResult(run.run_id, run.path, summary, p.sandbox, started, ended)
