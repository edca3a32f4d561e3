"""Jobs: an attempt of a ``run:`` or ``agent:`` item as plain data another machine can run.

A remote executor splits a process kind in two. The engine side
(``runner.remote``) renders the action, materialises the inputs into the
item's ``work/`` in the run tree as a local attempt would, and packs them
into a ``Job``: every file's content (or an ``--artifacts`` URL) with its
sha256, the command or the agent's settings, the step's environment, the
policy's settings and the timeout. The worker side (``runner.worker``) runs
it in that machine's own jail and returns a ``JobResult``: exit status,
captures, records, outputs by content with their hashes, and the worker's
name and backend. Only the engine writes the run tree, the store and
provenance.

Everything here is a frozen dataclass of builtins (and the step's pydantic
``Agent`` settings), so it pickles by value: Dask ships it as it is.

Must not import the engine, the executors, the CLI or dask.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from stockade.sandbox.policy import NetworkMode, Resources

#: Files at most this large travel inside the job or the result; larger ones go
#: through ``--artifacts`` when it is set (else by content too).
INLINE_MAX = 1 << 20
#: What an attempt's stdout or stderr may bring back (the rest is cut, and said so).
CAPTURE_MAX = 64 << 20


@dataclass(frozen=True)
class Blob:
    """One file: its path (relative to ``work/``, ``out/`` or ``meta/``), hash and content.

    Exactly one of ``data`` (by content) and ``url`` (an fsspec URL under
    ``--artifacts``) is set. The receiver hashes what arrived and refuses a
    mismatch before anything uses it.
    """

    path: str
    sha256: str
    size: int
    mode: int = 0o644
    data: bytes | None = None
    url: str | None = None


@dataclass(frozen=True)
class AgentSpec:
    """What the worker needs to run an agent item's session (never a key)."""

    #: The step's ``agent:`` settings with the prompt rendered (``spec.model.Agent``).
    config: Any
    #: Base URLs, API version and a placeholder for the key variable: the
    #: worker's broker builds the same requests as the engine's would; the
    #: engine's gateway replaces the placeholder with the real key.
    env: Mapping[str, str]
    gateway: str
    grant: str
    token: str
    interactive: bool
    outputs: tuple[str, ...]
    #: The step's own secret values (it receives them anyway): masked in records.
    secrets: tuple[str, ...]
    run_id: str
    step: str
    item: int


@dataclass(frozen=True)
class Job:
    """One attempt of one item, ready to run anywhere stockade is installed."""

    #: ``run_id/step/item/attempt``: also the task's key on the cluster.
    id: str
    kind: Literal["run", "agent"]
    attempt: int
    #: The rendered ``run:`` command (``/bin/sh -c``); None for agents.
    command: str | None
    #: The step's ``env``, its secrets and the ``STOCKADE_*`` variables; the
    #: worker adds its own PATH, LANG, TZ... (the allowlist) around them.
    env: Mapping[str, str]
    #: ``work/`` as the engine materialised it: inputs (and the empty ``out/``).
    files: tuple[Blob, ...]
    folders: tuple[str, ...]
    network: NetworkMode
    allow: tuple[str, ...]
    resources: Resources
    timeout: float | None
    #: The backend the operator asked for (``--sandbox``), else the worker's best.
    sandbox: str | None
    isolate: bool
    #: ``sandbox.require`` or ``--require-sandbox``: refuse unless enforced.
    require_enforced: bool
    #: ``--artifacts`` base URL for large outputs and captures (None: by content).
    artifacts: str | None = None
    agent: AgentSpec | None = None


@dataclass(frozen=True)
class WorkerInfo:
    """Where an attempt ran, as provenance and the manifest record it."""

    name: str
    address: str
    host: str
    backend: str
    enforced: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "host": self.host,
                "backend": self.backend, "enforced": self.enforced}


@dataclass(frozen=True)
class AgentResult:
    """``agent.AgentOutcome`` as data (the worker's session verdict)."""

    ok: bool
    result: str
    message: str
    diff: str
    usage: Mapping[str, int]
    retryable: bool


ResultStatus = Literal["ran", "refused", "cancelled", "error"]


@dataclass(frozen=True)
class JobResult:
    """How a job ended on the worker; ``ran`` means the jail started and ended."""

    status: ResultStatus
    worker: WorkerInfo
    message: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    stdout: Blob | None = None
    stderr: Blob | None = None
    #: Files of ``out/`` (collected only after exit 0), paths relative to ``out/``.
    outputs: tuple[Blob, ...] = ()
    #: ``out/`` held something that is not handed downstream (``OutputRefused``).
    output_error: str = ""
    #: Records for the attempt's ``meta/``: agent transcripts, network logs;
    #: paths relative to ``meta/``.
    records: tuple[Blob, ...] = ()
    agent: AgentResult | None = None
    seconds: float = 0.0


class BlobMismatch(Exception):
    """A file did not arrive as it was sent (its sha256 or size differs)."""


def blob_of(path: str, data: bytes, mode: int = 0o644) -> Blob:
    return Blob(path, hashlib.sha256(data).hexdigest(), len(data), mode, data=data)


def check_rel(path: str) -> str:
    """A relative path that stays below its folder (sent by the other side: never trusted)."""
    norm = os.path.normpath(path)
    if not path or path.startswith("/") or norm in (".", "..") or norm.startswith("../") \
            or "\x00" in path or norm != path:
        raise BlobMismatch(f"refused the path {path!r}: not a plain relative path")
    return norm


def walk_files(top: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Regular files below ``top`` (never through a link), relative paths, sorted."""
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, top)
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            yield rel, st


__all__ = [
    "CAPTURE_MAX", "INLINE_MAX", "AgentResult", "AgentSpec", "Blob", "BlobMismatch", "Job",
    "JobResult", "WorkerInfo", "blob_of", "check_rel", "walk_files",
]
