"""The values an executor works with: one ``Attempt`` in, one ``Outcome`` out.

``RunContext`` is what every attempt of a run shares (run id, sandbox,
environment, clock, store, the registry of running jails); an ``Attempt``
adds the step, the item and its key, the attempt number, the item's folders
and the template context. Step kinds (``runner.kinds``) turn an attempt into
an outcome; executors (``runner.executor``) decide where that happens.

Must not import the engine, the executors or the CLI.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade.errors import StaleOutput, TamperedArtifact, UserError
from stockade.expr import RenderError
from stockade.runner.env import Masker
from stockade.runner.status import AttemptStatus
from stockade.runner.toolchains import Toolchain
from stockade.sandbox.base import Backend, Running
from stockade.spec.model import Step
from stockade.store.base import Store
from stockade.workspace.artifacts import Output
from stockade.workspace.layout import ItemDir

#: What an item's own templates and inputs can raise: the item errors (not
#: retried: it would fail the same way), the run goes on.
ITEM_ERRORS = (RenderError, UserError, StaleOutput, TamperedArtifact)


def error_message(exc: BaseException) -> str:
    """The text of one of ``ITEM_ERRORS`` (a render error keeps it in ``message``)."""
    return str(getattr(exc, "message", None) or exc)


def os_error_text(exc: OSError) -> str:
    """``Permission denied: /path``, or the reason alone when no path is known."""
    reason = exc.strerror or str(exc)
    return f"{reason}: {exc.filename}" if exc.filename else reason


class Jails:
    """The jails running for a run, and the cancel that stops them all.

    A jail is registered *after* it started, so a cancel racing a start could
    miss it; ``launch`` therefore checks for a cancel again once the jail is
    registered and kills it itself. Between the two checks ``cancel`` holds
    the same lock, so every jail is killed by exactly one of them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[object, Running] = {}
        self.cancelled = threading.Event()
        self.kill_grace = 1.0

    def launch(self, key: object, start: Callable[[], Running]) -> Running | None:
        """Start a jail unless the run is cancelled; None if it was."""
        if self.cancelled.is_set():
            return None
        jail = start()
        with self._lock:
            self._running[key] = jail
            cancelled = self.cancelled.is_set()
        if cancelled:
            jail.kill(grace=self.kill_grace)
        return jail

    def finished(self, key: object) -> None:
        with self._lock:
            self._running.pop(key, None)

    def cancel(self, grace: float | None = None) -> None:
        """Stop every running jail (in parallel: each gets its grace period at once)."""
        with self._lock:
            self.cancelled.set()
            jails = list(self._running.values())
        wait = self.kill_grace if grace is None else grace
        threads = [threading.Thread(target=j.kill, kwargs={"grace": wait}, daemon=True)
                   for j in jails]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def __len__(self) -> int:
        with self._lock:
            return len(self._running)


@dataclass(frozen=True)
class PublishSettings:
    """What publish items need to know of the run as a whole."""

    run_started_at: float
    input_fingerprint: str
    allow_stale: bool
    base_dir: Path
    vars: Mapping[str, Any]


@dataclass(frozen=True)
class RunContext:
    """Everything attempts share for the whole run."""

    run_id: str
    workflow: str
    backend: Backend
    none_backend: Backend
    enforced: bool
    host_env: Mapping[str, str]
    secrets_allowed: frozenset[str]
    clock: Callable[[], float]
    functions: Mapping[str, Callable[..., Any]]
    echo: Callable[[str], None]
    interactive: bool
    jails: Jails
    store: Store
    publish: PublishSettings
    #: Masks the values of every secret the workflow declares, in anything recorded.
    masker: Masker
    #: Keys the HMAC of secret values in reuse keys (the root's ``reuse.key``).
    reuse_secret: bytes
    #: ``locate(step_id, path)`` -> "FILE:LINE:COL" of a field of a step.
    locate: Callable[[str, tuple[str | int, ...]], str] = lambda step, path: step
    #: Each ``run:`` step's mounts and image on this machine (``runner.toolchains``).
    toolchains: Mapping[str, Toolchain] = field(default_factory=dict)
    #: Per step id, the step's fixed part of every reuse key (``runner.reuse``):
    #: the sandbox and toolchain do not change during a run.
    key_statics: dict[str, str] = field(default_factory=dict)

    @property
    def cancelled(self) -> bool:
        return self.jails.cancelled.is_set()


@dataclass(frozen=True)
class ItemRef:
    """An item of a step: its position in the step's ``for_each`` and its key."""

    step: str
    index: int
    key: str

    def __str__(self) -> str:
        return f"{self.step}/{self.key}"


@dataclass(frozen=True)
class Attempt:
    """One attempt of one item, as an executor receives it."""

    run: RunContext
    step: Step
    item: ItemRef
    value: Any
    number: int
    dirs: ItemDir
    #: The template context: ``vars``, ``run``, ``steps`` (the needed ones), ``item``.
    context: Mapping[str, Any]

    @property
    def clock(self) -> Callable[[], float]:
        return self.run.clock

    @property
    def backend(self) -> Backend:
        """The backend its jail runs on: the run's, or ``none`` for ``isolate: false``."""
        return self.run.backend if self.step.isolate else self.run.none_backend

    @property
    def enforced(self) -> bool:
        """Its jail is an enforced sandbox."""
        return self.run.enforced and self.step.isolate

    @property
    def meta(self) -> Path:
        """This attempt's folder of further records (made by the kinds that need one)."""
        return self.dirs.attempt_dir(self.number)

    @property
    def stdout(self) -> Path:
        return self.dirs.stdout(self.number)

    @property
    def stderr(self) -> Path:
        return self.dirs.stderr(self.number)

    def locate(self, *path: str | int) -> str:
        return self.run.locate(self.step.id, path)

    def located(self, *path: str | int) -> _Located:
        """Name the file position of the field being rendered in any error it raises."""
        return _Located(self, path)


class _Located:
    """``Attempt.located``: a plain class, not ``@contextmanager``, whose
    generator cost several microseconds per field per item (a reuse lookup
    renders three fields for each of 10,000 items)."""

    __slots__ = ("attempt", "path")

    def __init__(self, attempt: Attempt, path: tuple[str | int, ...]) -> None:
        self.attempt, self.path = attempt, path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if exc is not None and isinstance(exc, ITEM_ERRORS):
            raise UserError(f"{self.attempt.locate(*self.path)}: {error_message(exc)}") from exc


@dataclass
class Outcome:
    """How an attempt ended. Every ordinary ending is one of these, never an exception."""

    status: AttemptStatus
    attempt: int
    result: Any = None
    message: str = ""
    outputs: list[Output] = field(default_factory=list)
    exit_code: int | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    #: False when running it again would end the same way (templates, refusals).
    retryable: bool = True
    #: The rendered ``run:`` command, secrets masked (kept in provenance).
    command: str | None = None
    #: The last lines of stderr of a failed process, secrets masked.
    stderr_tail: str = ""
    #: Agent token usage, summed over the attempt's model calls.
    usage: Mapping[str, int] = field(default_factory=dict)
    #: The item's reuse key (everything that could change its outputs), when known.
    reuse_key: str | None = None
    #: ``{run_id, step, item, attempt}`` of the earlier item whose outputs were taken.
    reused_from: Mapping[str, Any] | None = None
    #: The attempt's provenance (``workspace.records.Provenance`` as JSON), for the store.
    provenance: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status is AttemptStatus.SUCCEEDED


def after_interrupt(outcome: Outcome) -> Outcome:
    """An outcome as a run that was interrupted records it.

    The signal can reach an item's thread first and break the launch it is
    in (EINTR, a closed pipe or descriptor) before the engine's handler has
    run and the jails are cancelled: an infrastructure error (retryable)
    then was the interrupt, and the attempt was stopped, not broken. A
    refusal (not retryable) is the item's own and stays."""
    if outcome.status is AttemptStatus.ERRORED and outcome.retryable:
        outcome.status, outcome.message, outcome.retryable = \
            AttemptStatus.INTERRUPTED, "", False
    return outcome


def broken(n: int, started: float, exc: BaseException, mask: Callable[[str], str]) -> Outcome:
    """The outcome of an attempt that an exception ended before it ran: an error
    the item caused is a refusal (never retried); any other (an OS or
    infrastructure error) is retryable, and after an interrupt the engine
    reads it as the interrupt (``after_interrupt``)."""
    if isinstance(exc, ITEM_ERRORS):
        return refused(n, started, mask(error_message(exc)))
    text = os_error_text(exc) if isinstance(exc, OSError) else str(exc)
    return Outcome(AttemptStatus.ERRORED, n, message=mask(text), started_at=started)


def refused(n: int, started: float, message: str) -> Outcome:
    """An attempt that could not run as declared and would not run otherwise next time."""
    return Outcome(AttemptStatus.ERRORED, n, message=message, started_at=started, retryable=False)
