"""The engine's records in an item's ``meta/``: one type each for writer and reader.

``Provenance`` (``meta/attempts/<n>/provenance.json``) says what went into an
attempt and what came out, with hashes; ``Completion``
(``meta/completion.json``) is the item's last word, which ``resume`` trusts
only when the store agrees with it. The runner writes them through these
types and ``stockade show``/``why``, the web UI and ``apply`` read them
through the same types, so a field cannot be renamed on one side only.

Must not import the runner, the sandbox or the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stockade.workspace.layout import read_json, write_record


@dataclass(frozen=True)
class SandboxUse:
    backend: str
    enforced: bool
    isolate: bool = True


@dataclass(frozen=True)
class InputRecord:
    """One declared input as it was written into ``work/``.

    ``source`` says where it came from: ``{"kind": "artifact", run_id, step,
    item, attempt, name, sha256, size}``, ``{"kind": "file"|"tree", "path"}``,
    ``{"kind": "text"|"json"}``, plus ``refs``: the template names it was
    computed from.
    """

    name: str
    sha256: str
    size: int
    source: Mapping[str, Any]

    @property
    def kind(self) -> str:
        return str(self.source.get("kind", ""))


@dataclass(frozen=True)
class OutputRecord:
    """One file under ``out/`` (``name`` relative to ``out/``) and the attempt that made it."""

    name: str
    sha256: str
    size: int
    run_id: str
    step: str
    item: int
    attempt: int
    sandbox: str
    enforced: bool
    key: str = ""
    #: Set when the output was taken from an earlier run instead of being made again.
    reused_from: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Provenance:
    run_id: str
    step: str
    item: int
    attempt: int
    status: str
    sandbox: SandboxUse
    key: str = ""
    message: str = ""
    exit_code: int | None = None
    command: str | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    inputs: tuple[InputRecord, ...] = ()
    outputs: tuple[OutputRecord, ...] = ()
    #: ``{run_id, step, item, attempt}`` when the outputs were taken from an earlier run.
    reused_from: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Provenance:
        sb = d.get("sandbox") or {}
        return cls(
            run_id=str(d["run_id"]), step=str(d["step"]), item=int(d["item"]),
            attempt=int(d["attempt"]), status=str(d.get("status", "")),
            sandbox=SandboxUse(str(sb.get("backend", "")), bool(sb.get("enforced", False)),
                               bool(sb.get("isolate", True))),
            key=str(d.get("key", d["item"])), message=str(d.get("message", "")),
            exit_code=d.get("exit_code"), command=d.get("command"),
            started_at=float(d.get("started_at", 0.0)), ended_at=float(d.get("ended_at", 0.0)),
            inputs=tuple(InputRecord(str(i["name"]), str(i["sha256"]), int(i["size"]),
                                     dict(i.get("source") or {})) for i in d.get("inputs", ())),
            outputs=tuple(_output(o, d) for o in d.get("outputs", ())),
            reused_from=d.get("reused_from"),
        )

    def output(self, name: str) -> OutputRecord | None:
        return next((o for o in self.outputs if o.name == name), None)


def _output(o: Mapping[str, Any], parent: Mapping[str, Any]) -> OutputRecord:
    return OutputRecord(
        name=str(o["name"]), sha256=str(o["sha256"]), size=int(o["size"]),
        run_id=str(o.get("run_id", parent["run_id"])), step=str(o.get("step", parent["step"])),
        item=int(o.get("item", parent["item"])), attempt=int(o.get("attempt", parent["attempt"])),
        sandbox=str(o.get("sandbox", "")), enforced=bool(o.get("enforced", False)),
        key=str(o.get("key", parent.get("key", parent["item"]))),
        reused_from=o.get("reused_from"),
    )


def write_provenance(path: Path, record: Provenance) -> None:
    write_record(path, record.to_json())


def read_provenance(path: Path) -> Provenance:
    """Raises OSError, ValueError or KeyError when the record is missing or torn."""
    return Provenance.from_json(read_json(path))


@dataclass(frozen=True)
class FileHash:
    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Completion:
    """An item's last attempt as the worker saw it end."""

    run_id: str
    step: str
    item: int
    status: str
    attempt: int
    key: str = ""
    outputs: tuple[FileHash, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Completion:
        return cls(
            run_id=str(d["run_id"]), step=str(d["step"]), item=int(d["item"]),
            status=str(d["status"]), attempt=int(d["attempt"]), key=str(d.get("key", "")),
            outputs=tuple(FileHash(str(o["name"]), str(o["sha256"]), int(o["size"]))
                          for o in d.get("outputs", ())),
        )


def write_completion(path: Path, record: Completion) -> None:
    write_record(path, record.to_json())


def read_completion(path: Path) -> Completion:
    """Raises OSError, ValueError or KeyError when the record is missing or torn."""
    return Completion.from_json(read_json(path))


def hashes(outputs: Sequence[Any]) -> tuple[FileHash, ...]:
    return tuple(FileHash(o.name, o.sha256, o.size) for o in outputs)
