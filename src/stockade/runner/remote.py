"""The engine side of a remote attempt: an ``Attempt`` into a ``Job``, a ``JobResult`` into an ``Outcome``.

``build`` does on the engine what a local attempt does before its jail
starts: a fresh attempt folder, the inputs rendered and materialised into
the item's ``work/`` in the run tree (so provenance records the same inputs
with the same hashes), the environment, the rendered command or agent
settings, and packs it all into a ``Job``. ``complete`` takes what the
worker returned: captures and records into ``meta/`` (secrets masked by the
engine, which alone knows every one), each output written into ``out/``
only once its bytes hash to what the worker said, then the same ``finish``
and provenance as a local attempt, which also names the worker.

Must not import the engine, the executors, the CLI or dask.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stockade.errors import InfraError
from stockade.runner.attempt import ITEM_ERRORS, Attempt, Outcome, broken, os_error_text, refused
from stockade.runner.env import build_env
from stockade.runner.jobs import AgentSpec, Blob, BlobMismatch, Job, JobResult, blob_of
from stockade.runner.kinds.process import finish, network_mode, prepare, resources_of
from stockade.runner.records import attach
from stockade.runner.reuse import key_for
from stockade.runner.status import AttemptStatus
from stockade.runner.transfer import content, discard, pack, unpack
from stockade.workspace.artifacts import Materialised

#: Model calls one agent attempt may make through the gateway, per turn (tries, fallbacks).
CALLS_PER_TURN = 12


@dataclass(frozen=True)
class RemoteSettings:
    """What every remote job of a run shares."""

    #: ``--sandbox``: the backend workers must use (None: each worker's best).
    sandbox: str | None
    require_enforced: bool
    #: ``--artifacts`` base URL (None: everything by content).
    artifacts: str | None
    #: The model gateway for agent items (None: the run has none).
    gateway: Any = None
    echo: Callable[[str], None] = print
    ask: Callable[[str], bool] | None = None


@dataclass
class Pending:
    """An attempt sent away: what ``complete`` needs when its result comes back."""

    attempt: Attempt
    job: Job
    started: float
    inputs: list[Materialised]
    env: dict[str, str]
    action: Any
    grant: str | None = None


def job_id(attempt: Attempt) -> str:
    return f"{attempt.run.run_id}/{attempt.step.id}/{attempt.item.index}/{attempt.number}"


def _job_env(attempt: Attempt, env: Mapping[str, str]) -> dict[str, str]:
    """The step's own variables: the worker adds its PATH, LANG, TZ... around them."""
    host = build_env(attempt.run.host_env, step_env={}, secrets=(), stockade_vars={})
    return {k: v for k, v in env.items() if host.get(k) != v or k.startswith("STOCKADE_")}


def _pack_work(work: Path, artifacts: str | None, run_id: str) -> tuple[tuple[Blob, ...],
                                                                       tuple[str, ...]]:
    files: list[Blob] = []
    folders: list[str] = []
    for dirpath, dirnames, filenames in os.walk(work, followlinks=False):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, work)
        for d in dirnames:
            folders.append(d if rel_dir == "." else f"{rel_dir}/{d}")
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            files.append(pack(work / rel, rel, artifacts, f"{run_id}/inputs"))
    return tuple(files), tuple(folders)


def _failed(attempt: Attempt, started: float, inputs: list[Materialised],
            exc: BaseException) -> Outcome:
    outcome = broken(attempt.number, started, exc, attempt.run.masker.text)
    attempt.dirs.end_attempt()
    outcome.ended_at = attempt.clock()
    return attach(attempt, outcome, inputs)


def build(attempt: Attempt, settings: RemoteSettings) -> Pending | Outcome:
    """The job of a ``run:`` or ``agent:`` attempt, or the outcome that ends it at once."""
    from stockade.runner.kinds.agent import AgentKind, endpoint_problem
    from stockade.runner.kinds.shell import Shell

    started = attempt.clock()
    attempt.dirs.begin_attempt(attempt.number)
    inputs: list[Materialised] = []
    step, run = attempt.step, attempt.run
    try:
        grant = None
        agent = None
        if step.kind == "agent":
            problem = endpoint_problem(attempt)
            if problem:
                attempt.dirs.end_attempt()
                outcome = refused(attempt.number, started, problem)
                outcome.ended_at = attempt.clock()
                return attach(attempt, outcome, inputs)
        # No jail runs on the engine: the work tree is read here and shipped
        # by content, so a large input is an engine-owned read-only hard link
        # (never bwrap's empty placeholder, whose bytes come from a bind).
        world = prepare(attempt, inputs, sharing="link")
        command: str | None = None
        action: Any
        if step.kind == "run":
            command = action = Shell().action(attempt)
        else:
            action = AgentKind().action(attempt)
            agent = _agent_spec(attempt, action, world.env, settings)
            grant = agent.grant
        files, folders = _pack_work(attempt.dirs.work, settings.artifacts, run.run_id)
        job = Job(
            id=job_id(attempt), kind="run" if step.kind == "run" else "agent",
            attempt=attempt.number, command=command, env=_job_env(attempt, world.env),
            files=files, folders=folders, network=network_mode(step),
            allow=tuple(step.network) if isinstance(step.network, list) else (),
            resources=resources_of(step), timeout=step.timeout, sandbox=settings.sandbox,
            isolate=step.isolate, require_enforced=settings.require_enforced,
            artifacts=settings.artifacts, agent=agent,
        )
    except (*ITEM_ERRORS, InfraError, OSError, BlobMismatch) as exc:
        return _failed(attempt, started, inputs, exc)
    return Pending(attempt, job, started, inputs, world.env, action, grant)


def _agent_spec(attempt: Attempt, action: Mapping[str, Any], env: Mapping[str, str],
                settings: RemoteSettings) -> AgentSpec:
    from stockade.agent import endpoints
    from stockade.runner.gateway import worker_env

    step, run = attempt.step, attempt.run
    agent = step.agent
    assert agent is not None
    if settings.gateway is None:
        raise InfraError("agent steps on remote workers need the engine's model gateway")
    provider, _, model = agent.model.partition("/")
    endpoint = endpoints.step_endpoint(agent.endpoint)
    interactive = run.interactive and agent.approve == "ask"
    gid, token = settings.gateway.grant(
        provider, model, endpoint, run.host_env, max_calls=agent.max_turns * CALLS_PER_TURN,
        echo=run.echo, ask=settings.ask if interactive else None)
    own = tuple(env[s] for s in step.secrets if s in env)
    update: dict[str, Any] = {"prompt": action["prompt"]}
    if agent.endpoint is not None and agent.endpoint.base_url:
        # The worker names the URL without its credentials (``worker_env``).
        update["endpoint"] = agent.endpoint.model_copy(
            update={"base_url": endpoints.shown(agent.endpoint.base_url)})
    return AgentSpec(
        config=agent.model_copy(update=update),
        env=worker_env(provider, model, endpoint, run.host_env), gateway=settings.gateway.url,
        grant=gid, token=token, interactive=interactive, outputs=tuple(step.outputs),
        secrets=own, run_id=run.run_id, step=step.id, item=attempt.item.index,
    )


def _write(path: Path, data: bytes, mode: int = 0o600) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                 mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _records(attempt: Attempt, result: JobResult) -> None:
    """Captures and records into ``meta/``, masked with every secret of the run."""
    masker = attempt.run.masker
    if result.stdout is not None:
        data = masker.data(content(result.stdout))
        if data:  # made on the first byte, as a local attempt's
            _write(attempt.stdout, data)
    if result.stderr is not None:
        data = masker.data(content(result.stderr))
        if data:
            _write(attempt.stderr, data)
    for blob in result.records:
        data = masker.data(content(blob))
        if blob.path == "network.jsonl":
            _write(attempt.dirs.meta / f"{attempt.number}.network.jsonl", data)
            continue
        attempt.meta.mkdir(mode=0o700, exist_ok=True)
        unpack(blob_of(blob.path, data), attempt.meta, "record")


def complete(p: Pending, result: JobResult | None, settings: RemoteSettings,
             lost: str = "", where: Mapping[str, Any] | None = None) -> Outcome:
    """The outcome of a remote attempt.

    ``result`` None: it never came back; ``lost`` says why and ``where`` names
    the worker it was on, when known.
    """
    from stockade.runner.kinds.agent import settle

    attempt, started = p.attempt, p.started
    masker = attempt.run.masker
    worker = dict(where) if result is None and where else (
        None if result is None else result.worker.to_json())
    if settings.gateway is not None and p.grant is not None:
        settings.gateway.revoke(p.grant)
    try:
        if result is None:
            status = AttemptStatus.INTERRUPTED if attempt.run.cancelled else AttemptStatus.LOST
            outcome = Outcome(status, attempt.number, started_at=started,
                              message=lost or "the attempt's worker went away",
                              retryable=status is AttemptStatus.LOST)
        elif result.status == "refused":
            outcome = refused(attempt.number, started, result.message)
        elif result.status == "error":
            outcome = Outcome(AttemptStatus.ERRORED, attempt.number, started_at=started,
                              message=masker.text(result.message))
        elif result.status == "cancelled":
            outcome = finish(attempt, started, None, False)
            if outcome.status is not AttemptStatus.INTERRUPTED:
                outcome = Outcome(AttemptStatus.LOST, attempt.number, started_at=started,
                                  message="cancelled on its worker")
        else:
            _records(attempt, result)
            if result.output_error and not attempt.run.cancelled:
                outcome = Outcome(AttemptStatus.FAILED, attempt.number,
                                  message=result.output_error, exit_code=result.exit_code,
                                  started_at=started)
            else:
                for blob in result.outputs:
                    # Hashed again here: a byte that changed on the way is refused.
                    unpack(blob, attempt.dirs.out, "output")
                    discard(blob)
                outcome = finish(attempt, started, result.exit_code, result.timed_out)
            if result.agent is not None:
                outcome = settle(attempt, outcome, result.agent, result.exit_code,
                                 result.timed_out)
            if outcome.status is AttemptStatus.SUCCEEDED:
                outcome.reuse_key = key_for(attempt, [(m.name, m.sha256) for m in p.inputs],
                                            p.env, p.action)
    except (BlobMismatch, OSError) as exc:
        why = str(exc) if isinstance(exc, BlobMismatch) else os_error_text(exc)
        outcome = Outcome(AttemptStatus.ERRORED, attempt.number, started_at=started,
                          message=masker.text(f"from worker "
                                              f"{worker['name'] if worker else '?'}: {why}"))
    finally:
        attempt.dirs.end_attempt()
    if p.job.kind == "run":
        outcome.command = masker.text(str(p.action))
    outcome.started_at = outcome.started_at or started
    outcome.ended_at = attempt.clock()
    return attach(attempt, outcome, p.inputs, worker=worker)


__all__ = ["Pending", "RemoteSettings", "build", "complete", "job_id"]
