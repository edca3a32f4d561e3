"""What ``start_run`` and ``resume_run`` do differently when items run on a Dask cluster.

``open_cluster`` connects and surveys the workers before anything of the run
exists (an unreachable scheduler, or ``require`` with no enforced worker,
ends as exit 2 and leaves no trace); ``sandbox_choice`` describes the
workers' sandbox where a local run describes its own; ``make_executor``
starts the model gateway when the workflow has agent steps and builds the
``DaskExecutor``; ``record_workers`` writes into the manifest which worker
ran each attempt (the store's provenance has it per attempt too).

Must not import the engine or the CLI.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from stockade.runner.dask_cluster import Cluster, connect, survey
from stockade.runner.dask_executor import DaskExecutor
from stockade.runner.remote import RemoteSettings
from stockade.runner.roots import EXECUTOR_ENV, executor_url
from stockade.workspace.layout import RunDir, read_json, write_json

GATEWAY_HOST_ENV = "STOCKADE_GATEWAY_HOST"


@dataclass
class RemoteRun:
    """A connected cluster for one run (closed with the executor)."""

    url: str
    client: Any
    cluster: Cluster
    sandbox: str | None
    require: bool
    artifacts: str | None
    gateway: Any = None

    def close(self) -> None:
        if self.gateway is not None:
            self.gateway.close()
        with contextlib.suppress(Exception):
            self.client.close(timeout=10)


def check_artifacts(url: str | None) -> str | None:
    """``--artifacts``: an fsspec URL both sides can reach (never a path of the run tree)."""
    if not url:
        return None
    if "://" not in url:
        from stockade.errors import UserError

        raise UserError(f"--artifacts {url!r}: expected an fsspec URL such as file:///shared "
                        "or s3://bucket/prefix")
    return url.rstrip("/")


def open_cluster(url: str, sandbox: str | None, require: bool,
                 artifacts: str | None) -> RemoteRun:
    client = connect(url)
    try:
        cluster = survey(client, sandbox, require)
    except BaseException:
        with contextlib.suppress(Exception):
            client.close(timeout=10)
        raise
    return RemoteRun(url, client, cluster, sandbox, require, check_artifacts(artifacts))


def gateway_host(client: Any, env: Mapping[str, str]) -> str:
    """The engine's address the workers can reach: ``$STOCKADE_GATEWAY_HOST``, else the
    address this machine uses to reach the scheduler."""
    if env.get(GATEWAY_HOST_ENV):
        return env[GATEWAY_HOST_ENV]
    parsed = urlparse(str(client.scheduler.address))
    host = parsed.hostname or "127.0.0.1"
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, parsed.port or 8786))  # no packet is sent: only a route is chosen
        return str(s.getsockname()[0])


def make_executor(remote: RemoteRun, slots: int | None, has_agents: bool,
                  echo: Callable[[str], None], interactive: bool,
                  env: Mapping[str, str]) -> DaskExecutor:
    if has_agents and remote.gateway is None:
        from stockade.runner.gateway import Gateway

        remote.gateway = Gateway(gateway_host(remote.client, env))
    ask = None
    if interactive:
        from stockade.agent.session import ask_on_tty

        ask = ask_on_tty
    settings = RemoteSettings(sandbox=remote.sandbox, require_enforced=remote.require,
                              artifacts=remote.artifacts, gateway=remote.gateway, echo=echo,
                              ask=ask)
    return DaskExecutor(remote.client, remote.cluster, settings, slots)


def record_workers(run: RunDir, remote: RemoteRun, executor: DaskExecutor) -> None:
    """The manifest's ``executor`` section: the cluster, and the worker of each attempt."""
    try:
        manifest = read_json(run.manifest)
    except (OSError, ValueError):
        return
    section = dict(manifest.get("executor") or {})
    section.update(remote.cluster.to_json())
    attempts = dict(section.get("attempts") or {})
    attempts.update(executor.placements)
    section["attempts"] = dict(sorted(attempts.items()))
    manifest["executor"] = section
    with contextlib.suppress(OSError):
        write_json(run.manifest, manifest)


def resume_url(option: str | None, manifest: Mapping[str, Any]) -> str | None:
    """``resume`` goes back to the run's cluster unless told otherwise (``--executor local``)."""
    if option == "local" or (option is None and os.environ.get(EXECUTOR_ENV) == "local"):
        return None
    url = executor_url(option, os.environ)
    if url is not None:
        return url
    recorded = (manifest.get("executor") or {}).get("scheduler")
    if recorded and str(recorded).startswith("tcp://"):
        return "dask://" + str(recorded)[len("tcp://"):]
    return str(recorded) if recorded else None


__all__ = ["RemoteRun", "check_artifacts", "make_executor", "open_cluster", "record_workers",
           "resume_url"]
