"""Start or resume a run: directories, manifest, store records, the engine.

This is the one place where a loaded workflow meets the machine: it fingerprints
host inputs, picks the sandbox, opens the store and hands everything to the
``Engine``. Must not import the CLI.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stockade import __version__
from stockade.errors import UserError
from stockade.plan import Plan, build_plan
from stockade.runner.engine import Engine, Reporter, RunSummary
from stockade.runner.item import AttemptContext
from stockade.sandbox.base import Backend
from stockade.spec import Spec, load_workflow
from stockade.store.base import Event, RunRecord, Store
from stockade.workspace.artifacts import HostFile, HostTree, host_file, host_tree
from stockade.workspace.ids import check_run_id, uuid7
from stockade.workspace.layout import RunDir, read_json, write_json


@dataclass(frozen=True)
class SandboxChoice:
    backend: Backend
    enforced: bool
    limitations: tuple[str, ...]
    line: str


@dataclass(frozen=True)
class RunOptions:
    root: Path
    jobs: int = 2
    run_id: str | None = None
    overrides: Mapping[str, str] | None = None
    sandbox: str | None = None
    require_sandbox: bool = False
    store_url: str | None = None
    allow_stale: bool = False


@dataclass(frozen=True)
class RunResult:
    run_id: str
    run_path: Path
    summary: RunSummary
    sandbox: SandboxChoice


def default_root(env: Mapping[str, str]) -> Path:
    return Path(env.get("STOCKADE_HOME") or ".stockade")


def open_run_store(root: Path, url: str | None, env: Mapping[str, str]) -> Store:
    url = url or env.get("STOCKADE_STORE")
    try:
        from stockade.store import open_store
    except ImportError:
        from stockade.store.sqlite import SQLiteStore

        return SQLiteStore(root / "stockade.db")
    return open_store(url, root)


def choose_sandbox(requested: str | None, env: Mapping[str, str]) -> SandboxChoice:
    from stockade import sandbox

    sel = sandbox.select_backend(requested, env)
    return SandboxChoice(sel.backend, sel.report.enforced, tuple(sel.report.limitations),
                         sandbox.start_line(sel))


def _lifetime() -> dict[str, Any]:
    from stockade import sandbox

    return sandbox.lifetime()


def apply_overrides(spec: Spec, overrides: Mapping[str, str] | None) -> dict[str, Any]:
    values = dict(spec.workflow.vars)
    for key, value in (overrides or {}).items():
        if key not in values:
            declared = ", ".join(sorted(values)) or "none"
            raise UserError(f"--var {key}=...: {key!r} is not declared under vars: (declared: {declared})")
        values[key] = _coerce(key, value, values[key])
    return values


def _coerce(key: str, raw: str, default: Any) -> Any:
    """Give an override the type of the declared default (``--var threshold=30`` stays a number)."""
    if isinstance(default, str) or default is None:
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int | float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise UserError(f"--var {key}={raw}: expected a {type(default).__name__} like the declared "
                        f"default {json.dumps(default)}")
    return value


def fingerprint_inputs(spec: Spec, base: Path) -> tuple[dict[str, HostFile], dict[str, HostTree]]:
    files = {rel: host_file(base, rel) for rel in spec.files}
    trees = {rel: host_tree(base, rel) for rel in spec.trees}
    return files, trees


def input_fingerprint(vars: Mapping[str, Any], files: Mapping[str, HostFile],
                      trees: Mapping[str, HostTree]) -> str:
    blob = json.dumps({
        "vars": vars,
        "files": {k: v.sha256 for k, v in files.items()},
        "trees": {k: v.sha256 for k, v in trees.items()},
    }, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def template_functions(base: Path, files: dict[str, HostFile],
                       trees: dict[str, HostTree]) -> dict[str, Callable[..., Any]]:
    lock = threading.Lock()

    def file_fn(rel: str) -> HostFile:
        with lock:
            if rel not in files:
                files[rel] = host_file(base, rel)
            return files[rel]

    def tree_fn(rel: str) -> HostTree:
        with lock:
            if rel not in trees:
                trees[rel] = host_tree(base, rel)
            return trees[rel]

    return {"file": file_fn, "tree": tree_fn}


def load_spec(path: Path) -> Spec:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a workflow file") from None
    except PermissionError:
        raise UserError(f"{path}: permission denied") from None
    return load_workflow(data, str(path))


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
) -> RunResult:
    env = dict(os.environ if env is None else env)
    spec = load_spec(workflow_path)
    plan = build_plan(spec)
    values = apply_overrides(spec, opts.overrides)
    run_id = check_run_id(opts.run_id) if opts.run_id else new_id()
    choice = choose_sandbox(opts.sandbox, env)
    if (spec.workflow.sandbox.require or opts.require_sandbox) and not choice.enforced:
        raise UserError(
            f"this run requires an enforced sandbox, but the active backend is "
            f"{choice.backend.name!r} ({choice.line}); install bubblewrap "
            "(apt-get install bubblewrap) or run `stockade doctor` to see why"
        )
    missing = [s for s in spec.workflow.secrets if s not in env]
    base = workflow_path.resolve().parent
    files, trees = fingerprint_inputs(spec, base)
    root = opts.root.resolve()
    run = RunDir(root, run_id)
    store = open_run_store(root, opts.store_url, env)
    run.create()
    started = clock()
    manifest = {
        "run_id": run_id,
        "started_at": started,
        "workflow": {"name": spec.workflow.name, "path": str(workflow_path.resolve()),
                     "sha256": spec.sha256},
        "vars": values,
        "secrets": {"names": list(spec.workflow.secrets), "missing": missing},
        "input_fingerprints": {
            **{f"file:{k}": v.sha256 for k, v in files.items()},
            **{f"tree:{k}": v.sha256 for k, v in trees.items()},
        },
        "input_fingerprint": input_fingerprint(values, files, trees),
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(),
                 "python": sys.version.split()[0]},
        "engine": {"name": "stockade", "version": __version__},
        "sandbox": {"backend": choice.backend.name, "enforced": choice.enforced,
                    "limitations": list(choice.limitations), "lifetime": _lifetime()},
        "jobs": opts.jobs,
    }
    write_json(run.manifest, manifest)
    store.create_run(RunRecord(
        run_id=run_id, workflow=spec.workflow.name, workflow_path=str(workflow_path.resolve()),
        workflow_sha256=spec.sha256, root=str(root), status="running", started_at=started,
        sandbox=choice.backend.name, enforced=choice.enforced,
    ))
    store.add_event(Event(run_id, started, "run_started", {"sandbox": choice.line}))
    if on_start:
        on_start(run_id, run.path, choice)
    return _execute(spec, plan, run, store, choice, values, files, trees, opts, reporter, env,
                    clock, interactive, resume=False, manifest=manifest)


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
    env = dict(os.environ if env is None else env)
    check_run_id(run_id)
    root = opts.root.resolve()
    run = RunDir(root, run_id)
    if not run.manifest.exists():
        raise UserError(f"no run {run_id!r} under {root / 'runs'} (see `stockade runs`)")
    manifest = read_json(run.manifest)
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
            "resume runs the workflow it started with: restore the file or start a new run"
        )
    plan = build_plan(spec)
    values = dict(manifest["vars"])
    base = workflow_path.parent
    files, trees = fingerprint_inputs(spec, base)
    for key, digest in manifest["input_fingerprints"].items():
        kind, rel = key.split(":", 1)
        now = files.get(rel) if kind == "file" else trees.get(rel)
        if now is not None and now.sha256 != digest:
            raise UserError(f"{kind}({rel!r}) changed since run {run_id} started; start a new run")
    choice = choose_sandbox(opts.sandbox or manifest["sandbox"]["backend"], env)
    if spec.workflow.sandbox.require and not choice.enforced:
        raise UserError(f"this run requires an enforced sandbox, but {choice.line}")
    store.update_run(run_id, status="running", ended_at=None)
    store.add_event(Event(run_id, clock(), "run_resumed", {"sandbox": choice.line}))
    if on_start:
        on_start(run_id, run.path, choice)
    return _execute(spec, plan, run, store, choice, values, files, trees, opts, reporter, env,
                    clock, interactive, resume=True, manifest=manifest)


def _execute(
    spec: Spec, plan: Plan, run: RunDir, store: Store, choice: SandboxChoice,
    values: dict[str, Any], files: dict[str, HostFile], trees: dict[str, HostTree],
    opts: RunOptions, reporter: Reporter, env: dict[str, str], clock: Callable[[], float],
    interactive: bool, *, resume: bool, manifest: dict[str, Any],
) -> RunResult:
    from stockade.sandbox.none import NoneBackend

    base = Path(spec.filename).resolve().parent
    ac = AttemptContext(
        run_id=run.run_id, backend=choice.backend, enforced=choice.enforced,
        host_env=env, secrets_allowed=frozenset(spec.workflow.secrets), clock=clock,
        functions=template_functions(base, files, trees), echo=reporter.echo,
        interactive=interactive, none_backend=NoneBackend(), cancelled=threading.Event(),
        running={}, running_lock=threading.Lock(),
    )
    engine = Engine(
        spec=spec, plan=plan, run=run, store=store, attempt_context=ac, vars=values,
        jobs=opts.jobs, reporter=reporter, resume=resume,
        publisher=_publisher(manifest, opts, base), agent_factory=_agent_factory(),
    )
    try:
        summary = engine.execute()
    finally:
        choice.backend.close()
    store.update_run(run.run_id, status=summary.status, ended_at=clock())
    store.add_event(Event(run.run_id, clock(), "run_finished", {"status": summary.status}))
    store.close()
    return RunResult(run.run_id, run.path, summary, choice)


def _publisher(manifest: dict[str, Any], opts: RunOptions, base: Path) -> Callable[..., Any]:
    def publish(*args: Any) -> Any:
        # Imported on first use: sinks pull in database drivers a shell-only run never needs.
        from stockade.runner.publishing import publish_item

        return publish_item(*args, manifest=manifest, allow_stale=opts.allow_stale, base=base)

    return publish


def _agent_factory() -> Callable[..., Any]:
    def run_agent(*args: Any) -> Any:
        # Imported on first use: the broker pulls in httpx.
        from stockade.runner.agents import run_agent_attempt

        return run_agent_attempt(*args)

    return run_agent
