"""One attempt of one item: materialise inputs, start the jail, collect outputs.

Runs in a worker thread. Every ordinary ending is an ``AttemptOutcome`` value;
only broken infrastructure raises. Must not import the CLI.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from stockade.errors import InfraError, StaleOutput, TamperedArtifact, UserError
from stockade.expr import RenderError, compile_template, render, render_value
from stockade.runner.env import Masker, build_env
from stockade.sandbox.base import Backend, Running
from stockade.sandbox.policy import ExtraMount, NetworkMode, Policy, Resources
from stockade.spec.model import Step
from stockade.workspace.artifacts import (
    Materialised,
    Output,
    OutputRefused,
    collect_outputs,
    materialise,
    to_json_value,
)
from stockade.workspace.layout import ItemDir, write_record

#: Results larger than this are cut in the store (the full stdout stays in meta/).
MAX_RESULT = 4 << 20


@dataclass
class AttemptOutcome:
    status: str  # succeeded | failed | errored | fenced
    attempt: int
    result: Any = None
    message: str = ""
    outputs: list[Output] = field(default_factory=list)
    exit_code: int | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    retryable: bool = True
    #: The rendered ``run:`` command, secrets masked (kept in provenance.json).
    command: str | None = None


@dataclass(frozen=True)
class AttemptContext:
    """Everything an attempt needs that is the same for the whole run."""

    run_id: str
    backend: Backend
    enforced: bool
    host_env: Mapping[str, str]
    secrets_allowed: frozenset[str]
    clock: Callable[[], float]
    functions: Mapping[str, Callable[..., Any]]
    echo: Callable[[str], None]
    interactive: bool
    none_backend: Backend
    cancelled: threading.Event
    running: dict[tuple[str, int], Running]
    running_lock: threading.Lock
    #: ``locate(step_id, path)`` -> "FILE:LINE:COL" of a field of a step.
    locate: Callable[[str, tuple[str | int, ...]], str] = lambda step, path: step


def parse_size(value: int | str | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, int):
        return value
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = value.strip().upper().removesuffix("B").removesuffix("I")
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)


def resources_of(step: Step) -> Resources:
    r = step.resources
    return Resources(
        memory_bytes=parse_size(r.memory),
        cpu_seconds=r.cpu_seconds,
        processes=r.processes,
        file_size_bytes=parse_size(r.file_size),
    )


class _Pump(threading.Thread):
    """Copies a pipe to a file, masking secrets across chunk boundaries."""

    def __init__(self, fd: int, sink: IO[bytes], masker: Masker) -> None:
        super().__init__(daemon=True)
        self.fd, self.sink, self.masker = fd, sink, masker
        self.keep = max(len(v.encode()) for v in masker.values) - 1

    def run(self) -> None:
        pending = b""
        with os.fdopen(self.fd, "rb", buffering=0) as src:
            while chunk := src.read(65536):
                pending = self.masker.data(pending + chunk)
                if len(pending) > self.keep:
                    cut = len(pending) - self.keep
                    self.sink.write(pending[:cut])
                    pending = pending[cut:]
        self.sink.write(self.masker.data(pending))
        self.sink.flush()


#: What an item's own templates and inputs can raise: the item errors (not
#: retried), the run goes on.
ITEM_ERRORS = (RenderError, UserError, StaleOutput, TamperedArtifact)


def error_message(exc: BaseException) -> str:
    """The text of one of ``ITEM_ERRORS`` (a render error keeps it in ``message``)."""
    return str(getattr(exc, "message", None) or exc)


@contextmanager
def located(ac: AttemptContext, step: str, *path: str | int) -> Iterator[None]:
    """Name the file position of the field being rendered in any error it raises."""
    try:
        yield
    except ITEM_ERRORS as exc:
        raise UserError(f"{ac.locate(step, path)}: {error_message(exc)}") from exc


def template_refs(value: Any) -> list[str]:
    """The values a declared input was computed from, for ``stockade why``."""
    if isinstance(value, str):
        return list(compile_template(value).refs)
    if isinstance(value, dict):
        return [r for v in value.values() for r in template_refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in template_refs(v)]
    return []


def render_inputs(ac: AttemptContext, step: Step, ctx: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in step.inputs.items():
        with located(ac, step.id, "inputs", name):
            out[name] = render_value(value, ctx, functions=ac.functions)
    return out


def run_attempt(
    ac: AttemptContext,
    step: Step,
    index: int,
    idir: ItemDir,
    tctx: Mapping[str, Any],
    *,
    agent_factory: Callable[..., Any] | None = None,
) -> AttemptOutcome:
    """Run one fresh attempt of a ``run:`` or ``agent:`` item."""
    n = idir.begin_attempt()
    adir = idir.attempt_dir(n)
    started = ac.clock()
    outcome = AttemptOutcome("errored", n, started_at=started)
    masker = Masker(ac.host_env[s] for s in step.secrets if s in ac.host_env)
    inputs: list[Materialised] = []
    shown: str | None = None
    try:
        rendered = render_inputs(ac, step, tctx)
        for name, value in rendered.items():
            with located(ac, step.id, "inputs", name):
                m = materialise(idir.work, name, value, ac.run_id)
            refs = template_refs(step.inputs[name])
            inputs.append(replace(m, source={**m.source, "refs": refs}) if refs else m)
        with located(ac, step.id, "env"):
            step_env = {
                k: v if isinstance(v, str) else str(to_json_value(v))
                for k, v in render_value(dict(step.env), tctx, functions=ac.functions).items()
            }
        env = build_env(
            ac.host_env,
            step_env=step_env,
            secrets=[s for s in step.secrets if s in ac.secrets_allowed],
            stockade_vars={
                "STOCKADE_RUN_ID": ac.run_id, "STOCKADE_STEP": step.id,
                "STOCKADE_ITEM": str(index), "STOCKADE_ATTEMPT": str(n),
            },
        )
        backend = ac.backend if step.isolate else ac.none_backend
        if step.agent is not None:
            if agent_factory is None:
                raise InfraError("agent steps are not available in this build")
            outcome = agent_factory(ac, step, index, n, idir, adir, tctx, env, backend, masker, started)
        else:
            assert step.run is not None
            with located(ac, step.id, "run"):
                command = render(compile_template(step.run), tctx, functions=ac.functions,
                                 shell=True)
            shown = masker.text(str(command))
            policy = Policy(
                argv=("/bin/sh", "-c", str(command)),
                work_dir=idir.work,
                scratch_dir=idir.scratch,
                env=env,
                network=network_mode(step),
                resources=resources_of(step),
            )
            code, timed_out = run_jail(ac, backend, policy, step, index, adir, masker)
            outcome = finish_process(idir, adir, n, started, code, timed_out, step, ac)
    except ITEM_ERRORS as exc:
        outcome = AttemptOutcome("errored", n, message=masker.text(error_message(exc)),
                                 started_at=started,
                                 retryable=False)
    except InfraError as exc:
        outcome = AttemptOutcome("errored", n, message=str(exc), started_at=started)
    except OSError as exc:
        outcome = AttemptOutcome("errored", n, message=f"{exc.strerror}: {exc.filename}",
                                 started_at=started)
    finally:
        idir.end_attempt()
    outcome.ended_at = ac.clock()
    outcome.command = shown
    write_provenance(ac, step, index, adir, outcome, inputs, backend_name(ac, step))
    return outcome


def backend_name(ac: AttemptContext, step: Step) -> str:
    return ac.backend.name if step.isolate else ac.none_backend.name


def network_mode(step: Step) -> NetworkMode:
    if step.network == "open":
        return "open"
    if isinstance(step.network, list):
        return "proxy"
    return "none"


def run_jail(
    ac: AttemptContext,
    backend: Backend,
    policy: Policy,
    step: Step,
    index: int,
    adir: Path,
    masker: Masker,
    mounts: tuple[ExtraMount, ...] = (),
) -> tuple[int | None, bool]:
    """Start the jail, stream its output to ``meta/``, enforce the timeout."""
    if mounts:
        policy = Policy(**{**policy.__dict__, "mounts": policy.mounts + mounts})
    proxy = None
    if policy.network == "proxy":
        # Only steps with an allowlist pay for these imports.
        from stockade.sandbox import EgressProxy
        from stockade.sandbox.proxy import credential_headers

        assert isinstance(step.network, list)
        policy.scratch_dir.mkdir(parents=True, exist_ok=True)
        proxy = EgressProxy(step.network, adir / "network.jsonl", policy.scratch_dir)
        proxy.start()
        policy = Policy(
            **{**policy.__dict__, "proxy_socket": proxy.socket_path, "proxy_token": proxy.token}
        )
        # The step may print its proxy URL (curl -v shows the Basic form).
        masker = Masker([*masker.values, *credential_headers(proxy.token)])
    try:
        with open(adir / "stdout", "wb") as out, open(adir / "stderr", "wb") as err:
            pumps: list[_Pump] = []
            if masker:
                fds = []
                for sink in (out, err):
                    r, w = os.pipe()
                    pumps.append(_Pump(r, sink, masker))
                    fds.append(w)
                stdout: IO[bytes] | int = fds[0]
                stderr: IO[bytes] | int = fds[1]
            else:
                stdout, stderr = out, err
            if ac.cancelled.is_set():
                return None, False
            jail = backend.start(policy, stdout=stdout, stderr=stderr)
            for p in pumps:
                p.start()
            if pumps:
                os.close(fds[0])
                os.close(fds[1])
            with ac.running_lock:
                ac.running[(step.id, index)] = jail
            try:
                code = jail.wait(step.timeout)
                timed_out = code is None
                if timed_out:
                    jail.kill(grace=2.0)
                    code = jail.wait(10)
            finally:
                with ac.running_lock:
                    ac.running.pop((step.id, index), None)
            for p in pumps:
                p.join(30)
            return code, timed_out
    finally:
        if proxy is not None:
            proxy.close()


def read_result(adir: Path) -> str:
    with open(adir / "stdout", "rb") as f:
        data = f.read(MAX_RESULT + 1)
    text = data[:MAX_RESULT].decode("utf-8", errors="replace")
    return text[:-1] if text.endswith("\n") else text


def finish_process(
    idir: ItemDir,
    adir: Path,
    n: int,
    started: float,
    code: int | None,
    timed_out: bool,
    step: Step,
    ac: AttemptContext,
) -> AttemptOutcome:
    if ac.cancelled.is_set() and (code is None or code != 0):
        return AttemptOutcome("errored", n, message="interrupted", exit_code=code,
                              started_at=started, retryable=False)
    if timed_out:
        return AttemptOutcome("failed", n, message=f"timed out after {step.timeout:g}s",
                              exit_code=code, started_at=started)
    if code != 0:
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        return AttemptOutcome("failed", n, message=how, exit_code=code, started_at=started)
    try:
        outputs = collect_outputs(idir.out)
    except OutputRefused as exc:
        return AttemptOutcome("failed", n, message=str(exc), exit_code=code, started_at=started)
    return AttemptOutcome("succeeded", n, result=read_result(adir), outputs=outputs,
                          exit_code=0, started_at=started)


def write_provenance(
    ac: AttemptContext,
    step: Step,
    index: int,
    adir: Path,
    outcome: AttemptOutcome,
    inputs: list[Materialised],
    backend: str,
) -> None:
    """The per-attempt record every output's provenance points at."""
    enforced = ac.enforced and step.isolate
    record = {
        "run_id": ac.run_id,
        "step": step.id,
        "item": index,
        "attempt": outcome.attempt,
        "status": outcome.status,
        "message": outcome.message,
        "exit_code": outcome.exit_code,
        "command": outcome.command,
        "started_at": outcome.started_at,
        "ended_at": outcome.ended_at,
        "sandbox": {"backend": backend, "enforced": enforced, "isolate": step.isolate},
        "inputs": [
            {"name": m.name, "sha256": m.sha256, "size": m.size, "source": m.source} for m in inputs
        ],
        "outputs": [
            {
                "name": o.name, "sha256": o.sha256, "size": o.size, "run_id": ac.run_id,
                "step": step.id, "item": index, "attempt": outcome.attempt,
                "sandbox": backend, "enforced": enforced,
            }
            for o in outcome.outputs
        ],
    }
    write_record(adir / "provenance.json", record)
