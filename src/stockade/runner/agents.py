"""Run an ``agent:`` item: the tool loop in the jail, the broker on the host.

The loop, tools, write guard and broker live in ``stockade.agent``; this module
wires an agent session to the sandbox and the item's directories. Must not
import the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stockade.agent import AgentJob, start_agent
from stockade.expr import compile_template, render
from stockade.runner.env import Masker
from stockade.runner.item import (
    AttemptContext,
    AttemptOutcome,
    finish_process,
    located,
    resources_of,
    run_jail,
)
from stockade.sandbox.base import Backend
from stockade.sandbox.policy import Policy
from stockade.spec.model import Step
from stockade.workspace.layout import ItemDir


def run_agent_attempt(
    ac: AttemptContext, step: Step, index: int, n: int, idir: ItemDir, adir: Path,
    tctx: Mapping[str, Any], env: dict[str, str], backend: Backend, masker: Masker,
    started: float,
) -> AttemptOutcome:
    assert step.agent is not None
    provider = step.agent.model.split("/", 1)[0].upper()
    if not ac.host_env.get(f"{provider}_API_KEY") and not ac.host_env.get(f"{provider}_BASE_URL"):
        # Fail before a jail starts, with what to set, instead of an
        # authentication error from the provider after the first turn.
        return AttemptOutcome(
            "errored", n, started_at=started, retryable=False,
            message=(f"{ac.locate(step.id, ('agent', 'model'))}: {step.agent.model} needs "
                     f"{provider}_API_KEY in the engine's environment (or {provider}_BASE_URL "
                     "for a compatible server that needs no key); the key stays on the host"),
        )
    with located(ac, step.id, "agent", "prompt"):
        prompt = str(render(compile_template(step.agent.prompt), tctx, functions=ac.functions))
    config = step.agent.model_copy(update={"prompt": prompt})
    job = AgentJob(
        run_id=ac.run_id, step=step.id, item=index, attempt=n, config=config,
        work_dir=idir.work, meta_dir=adir, timeout=step.timeout,
        host_env=ac.host_env, echo=ac.echo, interactive=ac.interactive,
    )
    with start_agent(job) as session:
        launch = session.launch
        policy = Policy(
            argv=tuple(launch.argv), work_dir=idir.work, scratch_dir=idir.scratch,
            env={**env, **launch.env}, mounts=tuple(launch.mounts), network="none",
            resources=resources_of(step), pass_fds=launch.pass_fds,
        )
        code, timed_out = run_jail(ac, backend, policy, step, index, adir, masker)
        result = session.finish(code)
        # A coding step hands its edits downstream as a unified diff, unless
        # the agent itself wrote a file by that name.
        if result.ok and result.diff and not (idir.out / "changes.diff").exists():
            (idir.out / "changes.diff").write_text(result.diff, encoding="utf-8")
    outcome = finish_process(idir, adir, n, started, code, timed_out, step, ac)
    if outcome.status == "succeeded" and not result.ok:
        outcome = AttemptOutcome("failed", n, message=result.message, exit_code=code,
                                 started_at=started)
    elif not result.ok and result.message:
        outcome.message = f"{outcome.message}; {result.message}".strip("; ")
    if outcome.status == "succeeded":
        outcome.result = result.result
    return outcome
