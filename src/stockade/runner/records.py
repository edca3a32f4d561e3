"""Write an attempt's records into the item's ``meta/`` (provenance, completion).

The types live in ``workspace.records``; this module fills them from an
``Attempt`` and its ``Outcome``. Every string goes through the run's masker.
Must not import the engine, the executors or the CLI.
"""

from __future__ import annotations

from collections.abc import Sequence

from stockade.runner.attempt import Attempt, Outcome
from stockade.workspace.artifacts import Materialised
from stockade.workspace.records import (
    Completion,
    InputRecord,
    OutputRecord,
    Provenance,
    SandboxUse,
    hashes,
)
from stockade.workspace.records import write_completion as _write_completion
from stockade.workspace.records import write_provenance as _write_provenance


def provenance(attempt: Attempt, outcome: Outcome, inputs: Sequence[Materialised]) -> Provenance:
    step, run = attempt.step, attempt.run
    backend = run.backend.name if step.isolate else run.none_backend.name
    enforced = run.enforced and step.isolate
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
    )


def write_provenance(attempt: Attempt, outcome: Outcome, inputs: Sequence[Materialised]) -> None:
    """The per-attempt record every output's provenance points at."""
    _write_provenance(attempt.meta / "provenance.json", provenance(attempt, outcome, inputs))


def write_completion(attempt: Attempt, outcome: Outcome) -> None:
    """The item's completion record, written after every attempt of a process kind.

    Resume trusts an item only when the store and this file agree, so a crash
    between the two reruns the item rather than trusting half a record.
    """
    _write_completion(attempt.dirs.completion, Completion(
        run_id=attempt.run.run_id, step=attempt.step.id, item=attempt.item.index,
        key=attempt.item.key, status=str(outcome.status), attempt=outcome.attempt,
        outputs=hashes(outcome.outputs),
    ))
