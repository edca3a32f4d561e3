"""The ``agent:`` kind: the tool loop in the jail, the broker on the host.

The loop, tools, write guard and broker live in ``stockade.agent``; this module
wires an agent session to the sandbox and the item's directories. Must not
import the engine, the executors or the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from stockade.agent import AgentJob, endpoints, start_agent
from stockade.expr import compile_template, render
from stockade.runner.attempt import Attempt, Outcome, refused
from stockade.runner.kinds.process import finish, in_jail, prepare, resources_of, run_jail
from stockade.runner.reuse import key_for
from stockade.runner.status import AttemptStatus
from stockade.sandbox.policy import Policy
from stockade.workspace.artifacts import Materialised


class AgentKind:
    name: ClassVar[str] = "agent"
    inline: ClassVar[bool] = False

    def run(self, attempt: Attempt) -> Outcome:
        return in_jail(attempt, lambda inputs: self._body(attempt, inputs))

    def action(self, attempt: Attempt) -> dict[str, Any]:
        """The agent settings with the rendered prompt (part of the reuse key)."""
        agent = attempt.step.agent
        assert agent is not None
        with attempt.located("agent", "prompt"):
            prompt = str(render(compile_template(agent.prompt), attempt.context,
                                functions=attempt.run.functions))
        return {**agent.model_dump(mode="json"), "prompt": prompt}

    def _body(self, attempt: Attempt, inputs: list[Materialised]) -> Outcome:
        started = attempt.clock()
        step, run = attempt.step, attempt.run
        assert step.agent is not None
        problem = endpoint_problem(attempt)
        if problem:
            return refused(attempt.number, started, problem)
        world = prepare(attempt, inputs)
        with attempt.located("agent", "prompt"):
            prompt = str(render(compile_template(step.agent.prompt), attempt.context,
                                functions=run.functions))
        config = step.agent.model_copy(update={"prompt": prompt})
        dirs = attempt.dirs
        # Transcripts and write records: the agent's own folder of the attempt.
        attempt.meta.mkdir(mode=0o700, exist_ok=True)
        job = AgentJob(
            run_id=run.run_id, step=step.id, item=attempt.item.index, attempt=attempt.number,
            config=config, work_dir=dirs.work, meta_dir=attempt.meta, timeout=step.timeout,
            host_env=run.host_env, echo=run.echo, interactive=run.interactive,
            outputs=tuple(step.outputs), secrets=tuple(run.masker.values),
        )
        with start_agent(job) as session:
            launch = session.launch
            policy = Policy(
                argv=tuple(launch.argv), work_dir=dirs.work, scratch_dir=dirs.scratch,
                env={**world.env, **launch.env}, mounts=tuple(launch.mounts), network="none",
                resources=resources_of(step), pass_fds=launch.pass_fds,
            )
            code, timed_out = run_jail(attempt, world.backend, policy, world.masker,
                                       inputs=inputs)
            result = session.finish(code)
            # A coding step hands its edits downstream as a unified diff, unless
            # the agent itself wrote a file by that name.
            if result.ok and result.diff and not (dirs.out / "changes.diff").exists():
                (dirs.out / "changes.diff").write_text(result.diff, encoding="utf-8")
        outcome = settle(attempt, finish(attempt, started, code, timed_out), result, code,
                         timed_out)
        if outcome.status is AttemptStatus.SUCCEEDED:
            outcome.reuse_key = key_for(attempt, [(m.name, m.sha256) for m in inputs],
                                        world.env, self.action(attempt))
        return outcome


def endpoint_problem(attempt: Attempt) -> str | None:
    """What the engine's environment lacks for this step's provider, before any jail starts.

    Instead of an authentication error from the provider after the first turn.
    """
    agent = attempt.step.agent
    assert agent is not None
    problems = endpoints.problems(agent.model.split("/", 1)[0],
                                  endpoints.step_endpoint(agent.endpoint), attempt.run.host_env)
    if not problems:
        return None
    field, message = problems[0]
    where = ("agent", "model") if field == "model" else ("agent", "endpoint", field)
    return f"{attempt.locate(*where)}: " + (f"{agent.model} {message}" if field == "model"
                                           else message)


class Verdict(Protocol):
    """The session's verdict (``AgentOutcome``, or the worker's ``AgentResult``)."""

    @property
    def ok(self) -> bool: ...
    @property
    def result(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def usage(self) -> Mapping[str, int]: ...
    @property
    def retryable(self) -> bool: ...


def settle(attempt: Attempt, outcome: Outcome, result: Verdict, code: int | None,
           timed_out: bool) -> Outcome:
    """The attempt's outcome from the jail's ending and the broker's verdict."""
    started = outcome.started_at
    if outcome.status is AttemptStatus.SUCCEEDED and not result.ok:
        outcome = Outcome(AttemptStatus.FAILED, attempt.number, message=result.message,
                          exit_code=code, started_at=started)
    elif not result.ok and result.message and code == 1 and not timed_out:
        # The jail's "agent failed" exit: the broker's verdict says why (a
        # stop reason, a refused request); the exit status adds nothing.
        outcome.message, outcome.stderr_tail = result.message, ""
    elif not result.ok and result.message:
        outcome.message = f"{outcome.message}; {result.message}".strip("; ")
    # Tokens are spent whatever the ending; a request the provider refused
    # (4xx) or a reply that stopped for a reason fails the same way again.
    outcome.usage = dict(result.usage)
    if not result.retryable:
        outcome.retryable = False
    if outcome.status is AttemptStatus.SUCCEEDED:
        outcome.result = result.result
    return outcome
