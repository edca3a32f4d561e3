"""What ``run:`` and ``agent:`` attempts share: inputs in, a jail, outputs out.

``prepare`` renders and materialises the declared inputs and builds the
environment; ``run_jail`` starts the jail, streams its output (secrets
masked) into the attempt's records and enforces the timeout; ``finish``
turns the exit status into an ``Outcome`` that names what went wrong (the
resource limit that killed it, the declared outputs that are missing, the
last lines of stderr); ``write_provenance`` keeps the per-attempt record
every output points at.

Runs on an executor's worker thread. Must not import the engine or the CLI.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shutil
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stockade.errors import InfraError
from stockade.expr import compile_template, render_value
from stockade.runner.attempt import ITEM_ERRORS, Attempt, Outcome, broken
from stockade.runner.captures import JailOutput, read_capture
from stockade.runner.env import Masker, build_env
from stockade.runner.records import attach
from stockade.runner.status import AttemptStatus
from stockade.sandbox.base import Backend, InputSharing, jail_left_nothing
from stockade.sandbox.policy import ExtraMount, NetworkMode, Policy, Resources
from stockade.spec.model import Step
from stockade.spec.sizes import format_size, parse_size
from stockade.workspace.artifacts import (
    Materialised,
    Output,
    OutputRefused,
    collect_outputs,
    materialise,
    to_json_value,
)

#: Results larger than this are cut in the store (the full stdout stays in meta/).
MAX_RESULT = 4 << 20
#: How much of a failed item's stderr its message quotes.
TAIL_LINES = 5
TAIL_BYTES = 4096


def resources_of(step: Step) -> Resources:
    r = step.resources
    return Resources(
        memory_bytes=parse_size(r.memory),
        cpu_seconds=r.cpu_seconds,
        processes=r.processes,
        file_size_bytes=parse_size(r.file_size),
    )


def network_mode(step: Step) -> NetworkMode:
    if step.network == "open":
        return "open"
    if isinstance(step.network, list):
        return "proxy"
    return "none"


def template_refs(value: Any) -> list[str]:
    """The values a declared input was computed from, for ``stockade why``."""
    if isinstance(value, str):
        return list(compile_template(value).refs)
    if isinstance(value, dict):
        return [r for v in value.values() for r in template_refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in template_refs(v)]
    return []


@dataclass(frozen=True)
class Prepared:
    """An attempt's world, ready for a jail."""

    inputs: list[Materialised]
    env: dict[str, str]
    backend: Backend
    masker: Masker


def item_masker(attempt: Attempt) -> Masker:
    """Masks the secrets this step receives (and every other declared one)."""
    return attempt.run.masker


def render_inputs(attempt: Attempt) -> dict[str, Any]:
    """The declared inputs' values (artifacts, host files, text, data), not yet written."""
    step, ctx, fns = attempt.step, attempt.context, attempt.run.functions
    out = {}
    for name, template in step.inputs.items():
        with attempt.located("inputs", name):
            out[name] = render_value(template, ctx, functions=fns)
    return out


def step_environment(attempt: Attempt) -> dict[str, str]:
    """The whole environment of the step's process, minus HOME and TMPDIR."""
    step, ctx, fns = attempt.step, attempt.context, attempt.run.functions
    step_env = {}
    if step.env:
        with attempt.located("env"):
            step_env = {
                k: v if isinstance(v, str) else str(to_json_value(v))
                for k, v in render_value(dict(step.env), ctx, functions=fns).items()
            }
    env = build_env(
        attempt.run.host_env,
        step_env=step_env,
        secrets=[s for s in step.secrets if s in attempt.run.secrets_allowed],
        stockade_vars={
            "STOCKADE_RUN_ID": attempt.run.run_id, "STOCKADE_STEP": step.id,
            "STOCKADE_ITEM": str(attempt.item.index), "STOCKADE_ITEM_KEY": attempt.item.key,
            "STOCKADE_ATTEMPT": str(attempt.number),
        },
    )
    toolchain = attempt.run.toolchains.get(step.id)
    if toolchain:
        # The mounts' bin/ first (an image's own PATH instead of the host's).
        env["PATH"] = toolchain.path_for(env["PATH"])
    return env


def prepare(attempt: Attempt, inputs: list[Materialised],
            sharing: InputSharing | None = None) -> Prepared:
    """Render and write the declared inputs into the fresh ``work/``; build the environment.

    ``inputs`` is filled as inputs are written, so provenance records what
    entered the jail even when a later input fails. ``sharing`` overrides
    how large inputs enter ``work/`` (default: as the backend allows).
    """
    step, backend = attempt.step, attempt.backend
    if attempt.run.host_env.get("STOCKADE_SHARE_INPUTS") == "0":
        sharing = "copy"  # always a copy, to compare against in benchmarks
    elif sharing is None:
        sharing = backend.input_sharing()
    for name, template in step.inputs.items():
        with attempt.located("inputs", name):
            value = render_value(template, attempt.context, functions=attempt.run.functions)
            m = materialise(attempt.dirs.work, name, value, attempt.run.run_id, sharing=sharing)
        refs = template_refs(template)
        inputs.append(replace(m, source={**m.source, "refs": refs}) if refs else m)
    env = step_environment(attempt)
    return Prepared(inputs, env, backend, item_masker(attempt))


def with_world(attempt: Attempt, backend: Backend, policy: Policy,
               inputs: Sequence[Materialised]) -> Policy:
    """The policy with the step's toolchain (mounts, image) and its shared inputs."""
    toolchain = attempt.run.toolchains.get(attempt.step.id)
    if toolchain and attempt.step.isolate:
        policy = replace(
            policy, mounts=policy.mounts + toolchain.mounts_for(backend.mount_namespace),
            image_root=Path(toolchain.image.rootfs) if toolchain.image is not None else None,
        )
    shared = tuple(ExtraMount(m.bind_source, str(policy.work_dir / m.name))
                   for m in inputs if m.bind_source is not None)
    return replace(policy, shared_inputs=shared) if shared else policy


def in_jail(attempt: Attempt, body: Callable[[list[Materialised]], Outcome]) -> Outcome:
    """Run a process kind's ``body`` in a fresh attempt; every ending becomes an Outcome.

    Creates the attempt's folders, translates the errors an item can cause
    into outcomes (never retried) and infrastructure errors into retryable
    ones, and writes the provenance record whatever happened.
    """
    started = attempt.clock()
    attempt.dirs.begin_attempt(attempt.number)
    masker = attempt.run.masker
    inputs: list[Materialised] = []
    try:
        outcome = body(inputs)
    except (*ITEM_ERRORS, InfraError, OSError) as exc:
        outcome = broken(attempt.number, started, exc, masker.text)
    finally:
        # No sandbox to keep apart from the next attempt: its scratch may stay.
        attempt.dirs.end_attempt(keep_scratch=not attempt.enforced)
    outcome.started_at = outcome.started_at or started
    outcome.ended_at = attempt.clock()
    return attach(attempt, outcome, inputs)


def run_jail(
    attempt: Attempt,
    backend: Backend,
    policy: Policy,
    masker: Masker,
    mounts: tuple[ExtraMount, ...] = (),
    *,
    inputs: Sequence[Materialised] = (),
) -> tuple[int | None, bool]:
    """Start the jail, capture its output in ``meta/``, enforce the timeout.

    The step's toolchain and the ``inputs`` shared by a bind join the policy here.

    stdout and stderr are read by this thread while it waits (``JailOutput``),
    masked, into ``meta/<n>.out`` and ``meta/<n>.err``, each made only once
    the attempt writes to it: a silent item makes no inode for either. Returns ``(exit status,
    timed out)``; the status is None when the run was cancelled before the
    jail started.
    """
    step = attempt.step
    if mounts:
        policy = replace(policy, mounts=policy.mounts + mounts)
    policy = with_world(attempt, backend, policy, inputs)
    proxy = None
    if policy.network == "proxy":
        # Only steps with an allowlist pay for these imports.
        from stockade.sandbox.proxy import EgressProxy, credential_headers

        assert isinstance(step.network, list)
        policy.scratch_dir.mkdir(parents=True, exist_ok=True)
        proxy = EgressProxy(step.network, attempt.dirs.meta / f"{attempt.number}.network.jsonl",
                            policy.scratch_dir, mask=attempt.run.masker.text)
        proxy.start()
        policy = replace(policy, proxy_socket=proxy.socket_path, proxy_token=proxy.token)
        # The step may print its proxy URL (curl -v shows the Basic form).
        masker = Masker([*masker.values, *credential_headers(proxy.token)])
    jails = attempt.run.jails
    key = (step.id, attempt.item.index)
    output = JailOutput()
    try:
        out_fd = output.open(attempt.stdout, masker)
        try:
            err_fd = output.open(attempt.stderr, masker)
            try:
                jail = jails.launch(key, lambda: backend.start(policy, stdout=out_fd,
                                                               stderr=err_fd))
            finally:
                os.close(err_fd)
        finally:
            os.close(out_fd)
        if jail is None:
            code, timed_out = None, False
        else:
            try:
                code = output.wait(jail, step.timeout)
                timed_out = code is None
                if timed_out:
                    jail.kill(grace=2.0)
                    code = jail.wait(10)
                elif jail_left_nothing(jail):
                    attempt.dirs.jail_gone(backend.scratch_mount_points(policy))
            finally:
                jails.finished(key)
            # The jail is gone: the pipes end as soon as the kernel closed its files.
            output.drain(30)
        return code, timed_out
    finally:
        output.close()
        if proxy is not None:
            proxy.close()


def read_result(path: Path) -> str:
    try:
        data = read_capture(path, MAX_RESULT + 1)
    except FileNotFoundError:
        return ""  # a masked capture is created on its first byte
    text = data[:MAX_RESULT].decode("utf-8", errors="replace")
    return text[:-1] if text.endswith("\n") else text


def stderr_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last lines of an attempt's stderr capture (already masked)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace").rstrip("\n")
    # Newlines only: a carriage return stays in its line, shown escaped.
    return "\n".join(text.split("\n")[-lines:])


def _signal_of(code: int) -> int | None:
    """The signal that ended the process: ``-N``, or ``128+N`` as shells and bwrap report it."""
    if code < 0:
        return -code
    if 128 < code < 128 + 65:
        return code - 128
    return None


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


#: Text a process prints when an allocation failed (RLIMIT_AS hit).
_NO_MEMORY = ("MemoryError", "Cannot allocate memory", "out of memory", "bad_alloc",
              "memory exhausted", "mmap failed")


def limit_message(step: Step, code: int, tail: str) -> str | None:
    """Name the ``resources:`` limit that ended the process, when the evidence says so."""
    r = step.resources
    sig = _signal_of(code)
    if sig == signal.SIGXFSZ and r.file_size is not None:
        return f"exceeded file_size {format_size(r.file_size)} (killed by SIGXFSZ)"
    if sig == signal.SIGXCPU and r.cpu_seconds is not None:
        return f"exceeded cpu_seconds {r.cpu_seconds} (killed by SIGXCPU)"
    if sig == signal.SIGKILL and r.cpu_seconds is not None and not tail:
        return (f"killed by SIGKILL: the cpu_seconds {r.cpu_seconds} limit is the likely cause "
                "(the kernel sends SIGKILL at the hard limit)")
    if r.memory is not None and any(s in tail for s in _NO_MEMORY):
        return f"exceeded memory {format_size(r.memory)} (an allocation failed)"
    # 127 is the shell's "could not run it"; under a small address space the
    # loader cannot map libc and says so, or (too small for even that) nothing.
    if r.memory is not None and code == 127 and (
            not tail.strip() or "failed to map segment" in tail):
        return (f"exceeded memory {format_size(r.memory)}: too little to load the program "
                "(exit status 127)")
    lowered = tail.lower()
    # bash: "fork: retry: Resource temporarily unavailable"; dash: "Cannot fork".
    if r.processes is not None and "fork" in lowered and (
            "resource temporarily unavailable" in lowered or "cannot fork" in lowered):
        return f"exceeded processes {r.processes} (fork failed)"
    return None


def missing_outputs(step: Step, outputs: list[Output]) -> list[str]:
    """The declared ``outputs`` patterns no produced file matches."""
    names = [o.name for o in outputs]
    return [p for p in step.outputs if not any(fnmatch.fnmatchcase(n, p) for n in names)]


def strayed_hint(work: Path, missing: Sequence[str], inputs: Sequence[Materialised]) -> str:
    """Where declared outputs missing from ``out/`` were written to ``work/``
    instead (the usual slip: ``> x.txt`` for ``> out/x.txt``), a note saying
    so; else "". Only names are compared: ``work/`` is the ended jail's."""
    try:
        names = set(os.listdir(work))
    except OSError:
        return ""
    names -= {"out", *(m.name.split("/", 1)[0] for m in inputs)}
    strayed = [p for p in missing if any(fnmatch.fnmatchcase(n, p) for n in names)]
    if not strayed:
        return ""
    listed = ", ".join(strayed)
    return (f" ({listed} {'is' if len(strayed) == 1 else 'are'} in work/: outputs are what "
            "the step writes under out/)")


def remove_secret_names(out: Path, names: list[str], masker: Masker) -> int:
    """Remove the first entry of each path whose name holds a secret; return how many."""
    gone = set()
    for name in names:
        parts = name.split("/")
        for depth in range(len(parts)):
            if masker.text(parts[depth]) != parts[depth]:
                gone.add("/".join(parts[: depth + 1]))
                break
    for rel in sorted(gone):
        target = out / rel
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
    return len(gone)


#: What a failed rename or unlink of a bind-mounted input reports.
_BUSY = ("Device or resource busy", "Resource busy")


def shared_hint(inputs: Sequence[Materialised], tail: str) -> str:
    """Why a step that moved or removed a bind-shared input failed, and what to do."""
    bound = [m.name for m in inputs if m.bind_source is not None]
    if not bound or not any(b in tail for b in _BUSY):
        return ""
    return (f" (the inputs {', '.join(bound)} are shared read-only, without a copy: a step "
            "cannot move, rename or remove them; copy one with cp to change or hand it on)")


def refused_hint(network_log: Path, limit: int = 3) -> str:
    """The requests the egress proxy refused during an attempt, for the failure
    message: a step that meets a refusal usually sees only "403 Forbidden"."""
    try:
        with open(network_log, "rb") as f:
            lines = f.read(256 * 1024).splitlines()
    except OSError:
        return ""
    refused: dict[str, None] = {}
    for line in lines:
        with contextlib.suppress(ValueError, AttributeError):
            entry = json.loads(line)
            if entry.get("allowed") is False:
                refused[f"{entry.get('host')}:{entry.get('port')} "
                        f"({entry.get('reason', 'refused')})"] = None
    if not refused:
        return ""
    shown = list(refused)[:limit]
    more = (f" and {len(refused) - limit} more (meta/{network_log.name})"
            if len(refused) > limit else "")
    return f"; the network proxy refused {', '.join(shown)}{more}"


def finish(attempt: Attempt, started: float, code: int | None, timed_out: bool,
           inputs: Sequence[Materialised] = ()) -> Outcome:
    """The outcome of a finished process: outputs collected, or why it failed.

    An input hard-linked into ``work/`` that the step moved into ``out/`` is
    accepted as an output (it is engine-owned and read-only).
    """
    n, step = attempt.number, attempt.step
    if attempt.run.cancelled and (code is None or code != 0):
        return Outcome(AttemptStatus.INTERRUPTED, n, exit_code=code,
                       started_at=started, retryable=False)
    # Read only when the attempt failed: a step that meets a refusal sees "403".
    refusals = (refused_hint(attempt.dirs.meta / f"{n}.network.jsonl")
                if isinstance(step.network, list) and (timed_out or code != 0) else "")
    if timed_out:
        return Outcome(AttemptStatus.FAILED, n,
                       message=f"timed out after {step.timeout:g}s{refusals}",
                       exit_code=code, started_at=started, stderr_tail=stderr_tail(attempt.stderr))
    if code != 0:
        tail = stderr_tail(attempt.stderr)
        assert code is not None
        sig = _signal_of(code)
        how = limit_message(step, code, tail)
        if how is None:
            how = (f"killed by {_signal_name(sig)} (exit status {code})" if sig is not None
                   else f"exit status {code}") + shared_hint(inputs, tail)
        return Outcome(AttemptStatus.FAILED, n, message=how + refusals, exit_code=code,
                       started_at=started, stderr_tail=tail)
    try:
        outputs = collect_outputs(attempt.dirs.out,
                                  {m.inode for m in inputs if m.inode is not None})
    except OutputRefused as exc:
        return Outcome(AttemptStatus.FAILED, n, message=str(exc), exit_code=code,
                       started_at=started)
    missing = missing_outputs(step, outputs)
    if missing:
        return Outcome(AttemptStatus.FAILED, n, exit_code=code, started_at=started,
                       message="exited 0 without its declared outputs: missing "
                               + ", ".join(f"out/{m}" for m in missing)
                               + strayed_hint(attempt.dirs.work, missing, inputs))
    unsafe = [o.name for o in outputs if attempt.run.masker.text(o.name) != o.name]
    if unsafe:
        # A name is recorded everywhere (store, provenance, show, the UI), so a
        # secret in one would leak; the entries are removed from the run tree.
        removed = remove_secret_names(attempt.dirs.out, unsafe, attempt.run.masker)
        return Outcome(AttemptStatus.FAILED, n, exit_code=code, started_at=started,
                       retryable=False,
                       message=f"{len(unsafe)} output name(s) contain a secret value; refused "
                               f"and removed {removed} entr{'y' if removed == 1 else 'ies'} "
                               "from out/")
    return Outcome(AttemptStatus.SUCCEEDED, n, result=read_result(attempt.stdout), outputs=outputs,
                   exit_code=0, started_at=started)


__all__ = [
    "MAX_RESULT", "Prepared", "finish", "in_jail", "limit_message", "missing_outputs",
    "network_mode", "prepare", "resources_of", "run_jail", "stderr_tail", "strayed_hint",
]
