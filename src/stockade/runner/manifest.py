"""What a run's ``manifest.json`` says when it starts: the workflow, its vars,
the fingerprints of its inputs, the host, the engine and the sandbox.

Written once, before the first item, and read by ``show``, ``resume`` and the
web UI. Must not import the engine, the session or the CLI.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stockade import __version__
from stockade.plan import Plan
from stockade.runner.given import input_fingerprint
from stockade.spec import Spec
from stockade.workspace.artifacts import HostFile, HostTree


def build_manifest(spec: Spec, plan: Plan, run_id: str, started: float, values: dict[str, Any],
                   files: Mapping[str, HostFile], trees: Mapping[str, HostTree], *,
                   backend: str, enforced: bool, limitations: Sequence[str], jobs: int,
                   workflow_path: Path) -> dict[str, Any]:
    """The manifest of a run about to start (secret values are masked by the writer)."""
    from stockade import sandbox

    return {
        "run_id": run_id,
        "started_at": started,
        "workflow": {"name": spec.workflow.name, "path": str(workflow_path.resolve()),
                     "sha256": spec.sha256},
        "vars": values,
        "steps": [{"id": sid, "kind": spec.workflow.step(sid).kind,
                   "needs": list(plan.needs[sid]),
                   "fan_out": spec.workflow.step(sid).for_each is not None}
                  for sid in plan.order],
        "secrets": {"names": list(spec.workflow.secrets)},
        "input_fingerprints": {
            **{f"file:{k}": v.sha256 for k, v in files.items()},
            **{f"tree:{k}": v.sha256 for k, v in trees.items()},
        },
        "input_fingerprint": input_fingerprint(values, files, trees),
        "input_refused": {f"tree:{k}": [{"path": p, "why": w} for p, w in v.refused]
                          for k, v in trees.items() if v.refused},
        "host": {"hostname": os.uname().nodename, "platform": host_platform(),
                 "python": sys.version.split()[0]},
        "engine": {"name": "stockade", "version": __version__},
        "sandbox": {"backend": backend, "enforced": enforced,
                    "limitations": list(limitations), "lifetime": sandbox.lifetime()},
        "jobs": jobs,
        # What validate would have said: the run went ahead, but a reader of
        # its record later should see it too.
        "warnings": [str(w) for w in spec.warnings],
    }


def host_platform() -> str:
    """``platform.platform()``'s answer on Linux (``Linux-6.1.0-x86_64-with-glibc2.36``).

    Built from ``uname(2)`` and ``confstr``, without the processor name:
    ``platform.platform()`` runs ``uname -p`` in a subprocess to learn it (and
    leaves it out when it is "unknown"), a fork and exec on the way to every
    run's first item.
    """
    u = os.uname()
    if u.sysname != "Linux":
        import platform

        return platform.platform()
    try:
        libc = (os.confstr("CS_GNU_LIBC_VERSION") or "").replace(" ", "")
    except (OSError, ValueError):
        libc = ""  # musl has no such name
    return f"{u.sysname}-{u.release}-{u.machine}" + (f"-with-{libc}" if libc else "")
