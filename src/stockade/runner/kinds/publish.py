"""The ``publish:`` kind: render key, payload and lease, hand them to the sink.

The fencing, leases and idempotency live in ``stockade.publish``; this module
only turns an attempt into a ``PublishRequest`` and the answer into an
``Outcome``. A refusal (bad sink URL, stale run, foreign artifact, empty
key, a payload that is not JSON) is not retried: it would be refused again.
Must not import the engine, the executors or the CLI.
"""

from __future__ import annotations

from typing import Any, ClassVar

from stockade.errors import InfraError
from stockade.expr import compile_template, render, render_value
from stockade.publish import PublishRequest, publish
from stockade.runner.attempt import ITEM_ERRORS, Attempt, Outcome, error_message, refused
from stockade.runner.records import attach
from stockade.runner.status import AttemptStatus
from stockade.workspace.artifacts import payload_value


def artifact_refs(value: Any) -> list[dict[str, Any]]:
    """The engine artifacts a payload carries (for ``stockade why`` of a publish item)."""
    out: list[dict[str, Any]] = []
    if isinstance(value, dict):
        ref = value.get("$artifact")
        if isinstance(ref, dict):
            out.append(dict(ref))
        for v in value.values():
            out.extend(artifact_refs(v))
    elif isinstance(value, list):
        for v in value:
            out.extend(artifact_refs(v))
    return out


def default_lease(workflow: str, step: str) -> str:
    return f"{workflow}.{step}"


class Publish:
    name: ClassVar[str] = "publish"
    inline: ClassVar[bool] = False

    def action(self, attempt: Attempt) -> None:
        """Never reused: no action to key."""

    def run(self, attempt: Attempt) -> Outcome:
        run, step = attempt.run, attempt.step
        cfg = step.publish
        assert cfg is not None
        n = attempt.number
        started = attempt.clock()
        ctx, fns = attempt.context, run.functions
        try:
            with attempt.located("publish", "to"):
                to = str(render(compile_template(cfg.to), ctx, functions=fns))
            with attempt.located("publish", "key"):
                key = str(render(compile_template(cfg.key), ctx, functions=fns))
            with attempt.located("publish", "payload"):
                payload = payload_value(render_value(cfg.payload, ctx, functions=fns))
            lease = default_lease(run.workflow, step.id)
            if cfg.lease is not None:
                with attempt.located("publish", "lease"):
                    # Only vars and run: a lease names a series, not an item.
                    lease_ctx = {"vars": ctx.get("vars", {}), "run": ctx.get("run", {})}
                    lease = str(render(compile_template(cfg.lease), lease_ctx, functions=fns))
                if not lease:
                    raise InfraError("publish.lease rendered to an empty string")
        except ITEM_ERRORS as exc:
            out = refused(n, started, run.masker.text(error_message(exc)))
            out.ended_at = attempt.clock()
            return out
        except InfraError as exc:
            out = refused(n, started, f"{attempt.locate('publish', 'lease')}: {exc}")
            out.ended_at = attempt.clock()
            return out
        settings = run.publish
        req = PublishRequest(
            run_id=run.run_id, step=step.id, item=attempt.item.index, attempt=n, to=to,
            base_dir=settings.base_dir, key=key, payload=payload, lease=lease,
            lease_ttl=cfg.lease_ttl, max_age=cfg.max_age,
            run_started_at=settings.run_started_at, allow_stale=settings.allow_stale,
            input_fingerprint=settings.input_fingerprint,
        )
        try:
            res = publish(req, run.store, clock=attempt.clock)
        except InfraError as exc:
            return Outcome(AttemptStatus.ERRORED, n, message=run.masker.text(str(exc)),
                           started_at=started, ended_at=attempt.clock())
        # publish() already records each warning as a structured event.
        for warning in res.warnings:
            run.echo(f"warning: {attempt.item}: {warning}")
        publish_record = {
            "to": to, "key": key, "lease": lease, "status": res.status, "token": res.token,
            "winner_token": res.winner_token, "already_applied": res.already_applied,
            "message": res.message, "warnings": list(res.warnings),
            "idempotency_key": req.idempotency_key, "payload_artifacts": artifact_refs(payload),
        }
        outcome = Outcome(
            AttemptStatus(res.status), n, result={"key": key, "token": res.token},
            message=run.masker.text(res.message), started_at=started, ended_at=attempt.clock(),
            retryable=res.status == "failed" and res.retryable,
        )
        return attach(attempt, outcome, [], {"publish": publish_record})
