"""``--allow-actions``: cancel and resume a run from the web UI.

Each action needs the server's per-run token (the pages carry it; a page
elsewhere cannot read it) and, when the browser sends one, an ``Origin`` that
is this server. Cancel asks the engine to stop exactly as ``stockade cancel``
does; resume starts ``stockade resume`` as a detached process whose output
goes to ``runs/RUN_ID/ui-resume.log``. Must not import the engine, the sandbox
or the CLI.
"""

from __future__ import annotations

import hmac
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stockade.errors import UserError
from stockade.runner.runs import resolve_run, run_path, signal_cancel, state
from stockade.runner.status import RunStatus
from stockade.store.base import RunRecord

if TYPE_CHECKING:
    from stockade.web.app import Settings


def allowed_origin(origin: str, port: int) -> bool:
    return origin.lower() in {f"http://127.0.0.1:{port}", f"http://localhost:{port}",
                              f"http://[::1]:{port}"}


def refused(settings: Settings, request: Request) -> str | None:
    """Why this request may not act, or None."""
    if not settings.allow_actions:
        return "actions are off: start the server with `stockade ui --allow-actions`"
    given = request.headers.get("x-stockade-token", "")
    if not given or not hmac.compare_digest(given.encode(), settings.token.encode()):
        return "missing or wrong action token (reload the page)"
    origin = request.headers.get("origin")
    port = int((request.scope.get("server") or ("", 0))[1] or 0)
    if origin is not None and not allowed_origin(origin, port):
        return f"cross-origin request from {origin} refused"
    return None


def cancel(settings: Settings, request: Request) -> Response:
    why = refused(settings, request)
    if why:
        return JSONResponse({"ok": False, "error": why}, 403)
    try:
        record = resolve_run(settings.store, request.path_params["run"])
        holder = signal_cancel(record)
    except UserError as exc:
        return JSONResponse({"ok": False, "error": str(exc)}, 409)
    return JSONResponse({"ok": True, "message": f"cancelling {record.run_id} (engine pid "
                                                f"{holder.pid})"}, 202)


def resume(settings: Settings, request: Request) -> Response:
    why = refused(settings, request)
    if why:
        return JSONResponse({"ok": False, "error": why}, 403)
    try:
        record = resolve_run(settings.store, request.path_params["run"])
    except UserError as exc:
        return JSONResponse({"ok": False, "error": str(exc)}, 404)
    st = state(record)
    if st is RunStatus.RUNNING:
        return JSONResponse({"ok": False, "error": f"run {record.run_id} is running"}, 409)
    if st is RunStatus.SUCCEEDED:
        return JSONResponse({"ok": False, "error": f"run {record.run_id} succeeded; "
                                                   "nothing to resume"}, 409)
    argv = (settings.resume_argv or default_resume_argv)(record)
    log = run_path(record) / "ui-resume.log"
    folder = Path(record.workflow_path).parent
    with open(log, "ab") as out:
        # Detached: the run outlives this server, and Ctrl-C here never reaches it.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True, cwd=folder if folder.is_dir() else None)
    return JSONResponse({"ok": True, "message": f"resuming {record.run_id} (pid {proc.pid}; "
                                                f"output in {log})"}, 202)


def default_resume_argv(record: RunRecord) -> list[str]:
    return [sys.executable, "-m", "stockade.cli.main", "resume", record.run_id,
            "--root", record.root]
