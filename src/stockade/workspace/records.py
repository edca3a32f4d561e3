"""An attempt's provenance: one type for the writer and every reader.

``Provenance`` says what went into an attempt and what came out, with
hashes, the sandbox it ran in and, for outputs taken from an earlier run,
where from. The runner builds it and the run store keeps it as JSON with the
attempt's record (``AttemptRecord.provenance``); ``stockade show``/``why``,
the web UI and ``apply`` read it back through ``Provenance.from_json``, so a
field cannot be renamed on one side only.

Must not import the runner, the sandbox or the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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
    #: Where a remote executor ran the attempt: ``{name, address, host, backend,
    #: enforced}`` of the worker; None for attempts on the engine's machine.
    worker: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies recursively and cost more than the
        # rest of an item's bookkeeping.
        out = {
            "run_id": self.run_id, "step": self.step, "item": self.item, "key": self.key,
            "attempt": self.attempt, "status": self.status, "message": self.message,
            "exit_code": self.exit_code, "command": self.command,
            "started_at": self.started_at, "ended_at": self.ended_at,
            "sandbox": {"backend": self.sandbox.backend, "enforced": self.sandbox.enforced,
                        "isolate": self.sandbox.isolate},
            "inputs": [{"name": i.name, "sha256": i.sha256, "size": i.size,
                        "source": dict(i.source)} for i in self.inputs],
            "outputs": [{"name": o.name, "sha256": o.sha256, "size": o.size,
                         "run_id": o.run_id, "step": o.step, "item": o.item, "key": o.key,
                         "attempt": o.attempt, "sandbox": o.sandbox, "enforced": o.enforced,
                         "reused_from": None if o.reused_from is None else dict(o.reused_from)}
                        for o in self.outputs],
            "reused_from": None if self.reused_from is None else dict(self.reused_from),
        }
        if self.worker is not None:
            out["worker"] = dict(self.worker)
        return out

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
            worker=d.get("worker"),
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
