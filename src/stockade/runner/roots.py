"""Where the runs are: the root folder, the run store it names, and the
cluster (if any) its items run on.

Every read-only command (``runs``, ``show``, ``logs``, the web UI) starts
here, so this module stays light (importing the spec, the plan or the
sandbox costs more than answering ``runs``).

Must not import the spec, the plan, the sandbox or the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from stockade.store.base import Store


def default_root(env: Mapping[str, str]) -> Path:
    """``$STOCKADE_HOME``, else ``./.stockade``."""
    return Path(env.get("STOCKADE_HOME") or ".stockade")


def open_run_store(root: Path, url: str | None, env: Mapping[str, str]) -> Store:
    """The store at ``url`` (``--store``), else ``$STOCKADE_STORE``, else the root's SQLite."""
    from stockade.store import open_store

    return open_store(url or env.get("STOCKADE_STORE"), root)


#: Where items run when ``--executor`` is not given.
EXECUTOR_ENV = "STOCKADE_EXECUTOR"


def executor_url(option: str | None, env: Mapping[str, str]) -> str | None:
    """``--executor``, else ``$STOCKADE_EXECUTOR``; None when that is unset,
    empty or ``local`` (this machine). Read here, not in the Dask module, so
    a local run does not pay for importing Dask (about 20 ms)."""
    url = option or env.get(EXECUTOR_ENV) or None
    return None if url in (None, "", "local") else url
