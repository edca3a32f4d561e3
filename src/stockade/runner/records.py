"""An attempt's provenance record, built from the ``Attempt`` and its ``Outcome``.

The type lives in ``workspace.records``; the record travels on the outcome
(``Outcome.provenance``) to the engine, which stores it with the attempt in
the run store (one transaction with the item's completion). Every string
goes through the run's masker. Must not import the engine, the executors or
the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stockade.runner.attempt import Attempt, Outcome
from stockade.workspace.artifacts import Materialised
from stockade.workspace.records import InputRecord, OutputRecord, Provenance, SandboxUse


def provenance(attempt: Attempt, outcome: Outcome, inputs: Sequence[Materialised],
               worker: Mapping[str, Any] | None = None) -> Provenance:
    """``worker``: where a remote executor ran it (its backend is the one recorded)."""
    step, run = attempt.step, attempt.run
    backend, enforced = attempt.backend.name, attempt.enforced
    if worker is not None:
        backend, enforced = str(worker["backend"]), bool(worker["enforced"]) and step.isolate
    mask = run.masker
    return Provenance(
        run_id=run.run_id, step=step.id, item=attempt.item.index, key=attempt.item.key,
        attempt=outcome.attempt, status=str(outcome.status), message=mask.text(outcome.message),
        exit_code=outcome.exit_code,
        command=None if outcome.command is None else mask.text(outcome.command),
        started_at=outcome.started_at, ended_at=outcome.ended_at,
        sandbox=SandboxUse(backend, enforced, step.isolate),
        inputs=tuple(InputRecord(mask.text(m.name), m.sha256, m.size, mask.value(m.source))
                     for m in inputs),
        outputs=tuple(
            OutputRecord(name=o.name, sha256=o.sha256, size=o.size, run_id=run.run_id,
                         step=step.id, item=attempt.item.index, key=attempt.item.key,
                         attempt=outcome.attempt, sandbox=backend, enforced=enforced)
            for o in outcome.outputs
        ),
        worker=worker,
    )


def attach(attempt: Attempt, outcome: Outcome, inputs: Sequence[Materialised],
           extra: dict[str, Any] | None = None,
           worker: Mapping[str, Any] | None = None) -> Outcome:
    """Put the attempt's provenance on its outcome (the engine stores it)."""
    record = provenance(attempt, outcome, inputs, worker).to_json()
    if extra:
        record.update(attempt.run.masker.value(extra))
    outcome.provenance = record
    return outcome
