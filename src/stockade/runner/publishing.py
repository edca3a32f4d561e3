"""Run a ``publish:`` item: render key and payload, hand them to the sink.

The fencing, leases and idempotency live in ``stockade.publish``; this module
only turns a step into a ``PublishRequest`` and the answer into an attempt
outcome. Must not import the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stockade.errors import InfraError
from stockade.expr import compile_template, render, render_value
from stockade.publish import PublishRequest, publish
from stockade.runner.item import ITEM_ERRORS, AttemptOutcome, error_message, located
from stockade.spec.model import Step
from stockade.workspace.artifacts import payload_value
from stockade.workspace.layout import ItemDir, write_json

if TYPE_CHECKING:
    from stockade.runner.engine import Engine


def publish_item(
    engine: Engine, step: Step, index: int, idir: ItemDir, tctx: Mapping[str, Any], *,
    manifest: Mapping[str, Any], allow_stale: bool, base: Path,
) -> AttemptOutcome:
    """One attempt of a publish item (the engine retries by calling again)."""
    ac = engine.ac
    cfg = step.publish
    assert cfg is not None
    n = idir.begin_attempt()
    started = ac.clock()
    try:
        fns = ac.functions
        with located(ac, step.id, "publish", "to"):
            to = str(render(compile_template(cfg.to), tctx, functions=fns))
        with located(ac, step.id, "publish", "key"):
            key = str(render(compile_template(cfg.key), tctx, functions=fns))
        with located(ac, step.id, "publish", "payload"):
            payload = payload_value(render_value(cfg.payload, tctx, functions=fns))
    except ITEM_ERRORS as exc:
        return AttemptOutcome("errored", n, message=error_message(exc),
                              started_at=started, ended_at=ac.clock(), retryable=False)
    finally:
        idir.end_attempt()
    req = PublishRequest(
        run_id=ac.run_id, step=step.id, item=index, attempt=n, to=to, base_dir=base,
        key=key, payload=payload,
        lease=cfg.lease or f"{engine.spec.workflow.name}.{step.id}",
        lease_ttl=cfg.lease_ttl, max_age=cfg.max_age,
        run_started_at=float(manifest["started_at"]), allow_stale=allow_stale,
        input_fingerprint=str(manifest.get("input_fingerprint", "")),
    )
    try:
        out = publish(req, engine.store, clock=ac.clock)
    except InfraError as exc:
        return AttemptOutcome("errored", n, message=str(exc), started_at=started,
                              ended_at=ac.clock())
    # publish() already records each warning as a structured event.
    for warning in out.warnings:
        ac.echo(f"warning: {step.id}/{index}: {warning}")
    write_json(idir.attempt_dir(n) / "publish.json", {
        "to": to, "key": key, "lease": req.lease, "status": out.status, "token": out.token,
        "winner_token": out.winner_token, "already_applied": out.already_applied,
        "message": out.message, "warnings": list(out.warnings),
        "idempotency_key": f"{ac.run_id}/{step.id}/{index}",
    })
    return AttemptOutcome(
        out.status, n, result={"key": key, "token": out.token}, message=out.message,
        started_at=started, ended_at=ac.clock(), retryable=out.status == "failed" and out.retryable,
    )
