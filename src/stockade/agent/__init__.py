"""Agent steps: a jailed LLM tool loop whose writes go only where the operator asked.

The runner calls ``start_agent(job)``; the returned ``AgentSession`` starts the
host broker and names what to run in the jail (``launch``, with the jail's
end of the broker connection in ``pass_fds``); after the jail
exits, ``finish(exit_code)`` runs the name-list gate and returns an
``AgentOutcome``.

This module stays light: the jail imports ``stockade.agent.jail`` (and so this
package) at every agent start, so nothing here may import httpx, pydantic or
the rest of the engine at import time. ``start_agent`` and ``AgentSession``
are loaded on first use.

Must not import httpx or pydantic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stockade.agent.session import AgentSession, start_agent
    from stockade.sandbox.policy import ExtraMount
    from stockade.spec.model import Agent


@dataclass(frozen=True)
class AgentJob:
    run_id: str
    step: str
    item: int
    attempt: int
    #: ``.model .prompt (rendered) .tools .writes .max_turns .approve``
    config: Agent
    #: the item's fresh work/ with its inputs; the jail's cwd
    work_dir: Path
    #: this attempt's engine-owned record dir, never mounted
    meta_dir: Path
    #: the step timeout: the broker refuses model calls after it
    timeout: float | None
    #: the engine's environment: *_API_KEY and *_BASE_URL are read from here only
    host_env: Mapping[str, str]
    #: progress output ("WRITE TARGET: out/x.md")
    echo: Callable[[str], None]
    #: a terminal is attached, so ``approve: ask`` can ask
    interactive: bool
    #: the step's declared ``outputs`` (relative to out/): a text-only answer without them fails
    outputs: tuple[str, ...] = ()
    #: more values to mask in every record (the run's declared secrets)
    secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentLaunch:
    #: names no runtime path and carries no config: both come over the broker fd
    argv: tuple[str, ...]
    mounts: tuple[ExtraMount, ...]
    #: extra variables for the jail; never a key
    env: Mapping[str, str]
    #: ``Policy.pass_fds``: the jail's end of the broker connection (open
    #: while the session is)
    pass_fds: tuple[int, ...] = ()


@dataclass(frozen=True)
class AgentOutcome:
    ok: bool
    #: the final assistant message (``steps.X.result``)
    result: str
    #: why it failed, for a human; "" when ok
    message: str
    #: work-relative paths written through the tools
    writes: tuple[str, ...]
    #: changed files NOT written through the tools (the name-list gate)
    extra_paths: tuple[str, ...]
    #: unified diff of what the tools changed against the inputs (also meta/changes.diff)
    diff: str = ""
    #: tokens spent by this attempt: input, output, cached, reasoning, model_calls
    usage: Mapping[str, int] = field(default_factory=dict)
    #: False when running the item again would end the same way (a refused request, a refusal)
    retryable: bool = True


def __getattr__(name: str) -> Any:
    if name in ("AgentSession", "start_agent"):
        from stockade.agent import session

        return getattr(session, name)
    raise AttributeError(name)


__all__ = ["AgentJob", "AgentLaunch", "AgentOutcome", "AgentSession", "start_agent"]
