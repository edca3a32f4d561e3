"""The sandbox probe, started on a thread while ``stockade run`` imports the rest.

Choosing the backend runs a real probe jail (``sandbox.probe``: 40 to 100 ms
on the development VM), and importing the run path (the workflow loader's
pydantic models, Jinja, the store, the engine) takes longer than that before
the session first needs the backend. Started here first, the probe is done,
and cached, by the time the session asks: ``sandbox.probe`` holds its lock
while a probe runs, so one still running is waited for, never repeated.

The caller joins the thread before the session starts (the probe sets a
variable in ``os.environ`` while its jail runs, and the session copies the
environment). Only for runs on this machine: a run on Dask probes its
workers. Every error is left for the session to meet and report where it
always did. The backends are made (their modules imported) before the
thread starts, so the two threads never import the same modules at once.

Must not import the engine, the session, the spec, the plan, pydantic or the CLI.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping

from stockade.errors import InfraError
from stockade.runner.roots import executor_url


def start(sandbox_name: str | None, executor: str | None,
          env: Mapping[str, str]) -> threading.Thread | None:
    """Start probing the backend ``stockade run`` will choose; None when it is not
    worth it here (a remote executor, a name the session will refuse)."""
    if executor_url(executor, env) is not None:
        return None
    from stockade import sandbox

    try:
        # Made (and their modules imported) here, before the thread starts.
        for name in [sandbox_name] if sandbox_name else [*sandbox.preference(), "none"]:
            sandbox.get_backend(name)
    except InfraError:
        return None

    def probe() -> None:
        with contextlib.suppress(Exception):
            sandbox.select_backend(sandbox_name, env)

    thread = threading.Thread(target=probe, name="stockade-probe", daemon=True)
    thread.start()
    return thread
