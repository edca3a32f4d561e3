"""The web UI's pages, files, event streams and actions, as one Starlette app.

Pages are rendered on the server (Jinja2, autoescaped: keys, messages and logs
are the workflow's text, never markup) with the small JSON their script needs;
``/live/...`` streams carry only what changed. Every request must name this
server by a loopback ``Host`` (``web.guard``); actions also need the per-server
token and a same-origin ``Origin``. Must not import the engine, the sandbox or
the CLI.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from stockade._show import when
from stockade.errors import UserError
from stockade.runner.history import manifest_warnings, read_manifest
from stockade.runner.runs import resolve_run, state
from stockade.runner.status import RunStatus
from stockade.store.base import RunRecord, Store
from stockade.web import actions, detail, items, live, model
from stockade.web.format import dur, environment, pretty, script_json
from stockade.web.params import BadParam, paging, single, whole
from stockade.workspace.beneath import Refused, Walker, sha256_fd

#: Seconds between two looks at the store for one event stream.
TICK = 0.5
#: A comment line this often keeps proxies and the browser from closing an idle stream.
KEEPALIVE = 15.0
PAGE_SIZES = (50, 100, 200, 500)
FILTERS = (*items.FILTERS, *items.DERIVED)
#: Security headers on every page: nothing from elsewhere, no framing, no sniffing.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


@dataclass
class Settings:
    store: Store
    allow_actions: bool = False
    token: str = ""
    #: The command that resumes a run (``stockade`` with the server's root).
    resume_argv: Callable[[RunRecord], list[str]] | None = None


# -- the app ---------------------------------------------------------------------------


class UI:
    """Request handlers over one store; the caches live as long as the server."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.store = settings.store
        self.folds = model.Folds(self.store)
        self.reuse = model.Reuse(self.store)
        self.rows = model.RunRows(self.store)
        self.final = model.FinalCache()
        self.env = environment()
        for name in ("runs.html", "run.html", "step.html", "item.html", "error.html"):
            self.env.get_template(name)  # compiled now, not on someone's first look

    # -- helpers ---------------------------------------------------------------

    def page(self, template: str, **ctx: Any) -> HTMLResponse:
        ctx.setdefault("token", self.s.token if self.s.allow_actions else "")
        ctx.setdefault("crumbs", [])
        ctx["data_json"] = script_json(ctx.pop("data", {}))
        html = self.env.get_template(template).render(**ctx)
        return HTMLResponse(html, headers=HEADERS)

    def error(self, status: int, message: str) -> HTMLResponse:
        html = self.env.get_template("error.html").render(
            status=status, message=message, crumbs=[], token="", title="error")
        return HTMLResponse(html, status_code=status, headers=HEADERS)

    def run_of(self, text: str) -> RunRecord:
        return resolve_run(self.store, text)

    # -- pages -----------------------------------------------------------------

    def runs_page(self, request: Request) -> Response:
        status = single(request.query_params, "status") or None
        workflow = single(request.query_params, "workflow") or None
        rows = [r.to_json() for r in self.rows.rows(status=status, workflow=workflow)]
        live_url = "/live/runs?" + "&".join(
            f"{k}={quote(v)}" for k, v in (("status", status), ("workflow", workflow)) if v)
        return self.page("runs.html", title="runs", page="runs", rows=rows, status=status or "",
                         workflow=workflow or "", workflows=model.workflows(self.store),
                         statuses=[str(s) for s in RunStatus], live=live_url,
                         data={"rows": rows})

    def run_page(self, request: Request) -> Response:
        text = request.path_params["run"]
        try:
            record = self.run_of(text)
        except UserError as exc:
            return self.error(404, str(exc))
        if record.run_id != text:
            return RedirectResponse(f"/runs/{quote(record.run_id)}", status_code=307)
        manifest = read_manifest(record)
        steps, st = model.step_views(self.store, record, self.folds, manifest=manifest,
                                     reused=self.reuse.cached(record.run_id), cache=self.final)
        fold = self.folds.get(record.run_id)
        fails = live.failures(self.store, self.folds, record, steps)
        run = live.run_json(record, st)
        return self.page(
            "run.html", title=record.run_id, page="run", record=record, status=str(st),
            run=run, steps=[s.to_json() for s in steps], usage=fold.usage, failures=fails,
            resumes=fold.resumes,
            vars_json=json.dumps(manifest.get("vars") or {}, indent=2, ensure_ascii=False),
            warnings=manifest_warnings(manifest),
            sandbox=manifest.get("sandbox") or {"backend": record.sandbox,
                                                "enforced": record.enforced},
            manifest=manifest, live=f"/live/runs/{quote(record.run_id)}",
            crumbs=[(record.run_id, "")],
            data={"run_id": record.run_id, "run": run,
                  "steps": [s.to_json() for s in steps], "started_at": record.started_at,
                  "failures": [f["url"] for f in fails]})

    def step_page(self, request: Request) -> Response:
        try:
            record = self.run_of(request.path_params["run"])
        except UserError as exc:
            return self.error(404, str(exc))
        step = request.path_params["step"]
        page, limit, filt = paging(request.query_params, PAGE_SIZES, 100, FILTERS)
        steps, st = model.step_views(self.store, record, self.folds,
                                     reused=self.reuse.cached(record.run_id), cache=self.final)
        view = next((s for s in steps if s.id == step), None)
        if view is None:
            known = ", ".join(s.id for s in steps) or "none"
            return self.error(404, f"run {record.run_id} has no step {step!r} (steps: {known})")
        tallies = self.final.get("tallies", record, st,
                                 lambda: self.store.recorded_tallies(record))
        sp = items.step_page(self.store, self.folds, record, step, page=page, limit=limit,
                             filter=filt, tallies=tallies)
        base = f"/runs/{quote(record.run_id)}/{quote(step)}"
        rows = [r.to_json() for r in sp.rows]
        # Formatted here, not by template filters: a 500-row page stays a few milliseconds.
        shown = [{**r, "href": f"{base}/{quote(r['key'], safe='')}", "when": when(r["started_at"])
                  if r["started_at"] else "-",
                  "dur": dur(r["ended_at"] - r["started_at"]) if r["started_at"] and r["ended_at"]
                  else "-"} for r in rows]
        return self.page(
            "step.html", title=f"{step} · {record.run_id}", page="step", record=record,
            run=live.run_json(record, st), step=view.to_json(), sp=sp, rows=shown, base=base,
            filters=["", "done", "running", "pending", "failed", "retried", "skipped",
                     "interrupted"],
            page_sizes=PAGE_SIZES,
            live=f"/live{base}?page={sp.page + 1}&limit={sp.limit}&filter={quote(filt)}",
            crumbs=[(record.run_id, f"/runs/{quote(record.run_id)}"), (step, "")],
            data={"run_id": record.run_id, "step": step, "base": base, "rows": rows,
                  "started_at": record.started_at, "counts": view.to_json()})

    def item_page(self, request: Request) -> Response:
        try:
            record = self.run_of(request.path_params["run"])
        except UserError as exc:
            return self.error(404, str(exc))
        step, key = request.path_params["step"], request.path_params["key"]
        loc = items.locate(self.store, self.folds, record, step, key)
        if loc is None:
            return self.error(404, f"run {record.run_id} has no item {step}/{key}")
        st = state(record)
        livenow = st is RunStatus.RUNNING
        atts = items.attempts_of(self.store, record, loc, livenow)
        idir = items.idir_of(record, loc)
        asked = whole(request.query_params, "attempt", 0, 0)
        if asked and all(a.number != asked for a in atts):
            return self.error(404, f"{step}/{loc.key} has no attempt {asked} (its attempts: "
                                   f"{', '.join(str(a.number) for a in atts) or 'none yet'})")
        chosen = asked or (loc.record.attempt if loc.record and loc.record.attempt else
                           (atts[-1].number if atts else 0))
        kind = items.kind(record, step)
        base = detail.item_url(record.run_id, step, loc.key)
        prov = detail.provenance_of(self.store, record, step, loc.index, chosen)
        adir = idir.attempt_dir(chosen) if chosen else None
        shown = [a for a in atts if a.number == chosen] or atts[-1:]
        logs = {}
        offsets = []
        for a in atts[-5:]:
            for stream in ("stdout", "stderr"):
                data, start, sz = items.read_log(record, step, loc.index, a.number, stream)
                logs[f"{a.number}:{stream}"] = {"text": data.decode("utf-8", errors="replace"),
                                                "start": start, "size": sz}
                offsets.append(f"{a.number}:{stream}:{sz}")
        status = loc.record.status if loc.record else items.unfinished_row(
            record, self.folds.get(record.run_id), step, loc.index,
            {loc.index} if livenow and atts else set()).status
        rec = loc.record
        chain = detail.chain_graph(self.store, record, rec, kind) if rec else \
            {"nodes": [], "edges": [], "note": "the chain is drawn when the item has finished"}
        ctx = dict(
            title=f"{step}/{loc.key} · {record.run_id}", page="item", record=record,
            run=live.run_json(record, st), step=step, loc=loc, rec=rec, status=status, kind=kind,
            attempts=atts, chosen=chosen, shown=shown, logs=logs, base=base,
            inputs=detail.inputs_of(prov, base, chosen),
            outputs=detail.outputs_of(rec, prov, chosen, base) if chosen else [],
            provenance=prov, chain=chain,
            transcript=detail.transcript(adir) if adir and kind == "agent" else None,
            publish=detail.publish_outcome(self.store, record, rec, chosen)
            if kind == "publish" else None,
            value_json=pretty(rec.value) if rec else "",
            result_json=pretty(rec.result) if rec else "",
            live=f"/live{base}?logs={','.join(offsets)}&finished={1 if rec else 0}",
            crumbs=[(record.run_id, f"/runs/{quote(record.run_id)}"),
                    (step, f"/runs/{quote(record.run_id)}/{quote(step)}"), (loc.key, "")],
            data={"run_id": record.run_id, "base": base, "chain": chain,
                  "started_at": record.started_at},
        )
        return self.page("item.html", **ctx)

    # -- files -----------------------------------------------------------------

    def file(self, request: Request) -> Response:
        try:
            record = self.run_of(request.path_params["run"])
        except UserError as exc:
            return PlainTextResponse(str(exc) + "\n", 404)
        step, key = request.path_params["step"], request.path_params["key"]
        which, name = request.path_params["which"], request.path_params["name"]
        loc = items.locate(self.store, self.folds, record, step, key)
        if loc is None:
            return PlainTextResponse(f"no item {step}/{key}\n", 404)
        idir = items.idir_of(record, loc)
        attempt = whole(request.query_params, "attempt", -1, 0)
        if attempt < 0:
            attempt = loc.record.attempt if loc.record else 0
        prov = detail.provenance_of(self.store, record, step, loc.index, attempt)
        if which == "out":
            listed = {o["name"]: o["sha256"]
                      for o in detail.outputs_of(loc.record, prov, attempt, "")}
            folder = detail.out_dir(idir, attempt)
        elif which == "in":
            listed = {i.name: i.sha256 for i in (prov.inputs if prov else ())
                      if i.kind not in ("tree",)}
            folder = detail.work_dir(idir, attempt)
        else:
            return PlainTextResponse("files/out/NAME or files/in/NAME\n", 404)
        if name not in listed:
            return PlainTextResponse(
                f"{step}/{loc.key} attempt {attempt} has no {'output' if which == 'out' else 'input'}"
                f" {name!r}\n", 404)
        return _send_verified(folder, name, listed[name])

    def log(self, request: Request) -> Response:
        try:
            record = self.run_of(request.path_params["run"])
        except UserError as exc:
            return PlainTextResponse(str(exc) + "\n", 404)
        step, key = request.path_params["step"], request.path_params["key"]
        stream = request.path_params["stream"]
        loc = items.locate(self.store, self.folds, record, step, key)
        if loc is None or stream not in ("stdout", "stderr"):
            return PlainTextResponse("no such log\n", 404)
        idir = items.idir_of(record, loc)
        n = int(request.path_params["attempt"])
        path = idir.stdout(n) if stream == "stdout" else idir.stderr(n)
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by the iterator
        except FileNotFoundError:
            # Captures are made on the first byte: an attempt that began and
            # wrote nothing has an empty log, not a missing one.
            if n in idir.attempt_numbers():
                return PlainTextResponse("", headers={**HEADERS, "Content-Disposition": "inline"})
            return PlainTextResponse(f"no {stream} for attempt {request.path_params['attempt']}\n",
                                     404)
        except OSError:
            return PlainTextResponse(f"no {stream} for attempt {request.path_params['attempt']}\n",
                                     404)
        return StreamingResponse(_chunks(f.fileno(), f.close), media_type="text/plain; charset=utf-8",
                                 headers={**HEADERS, "Content-Disposition": "inline"})

    # -- JSON ------------------------------------------------------------------

    def api_runs(self, request: Request) -> Response:
        return JSONResponse([r.to_json() for r in self.rows.rows(limit=200)], headers=HEADERS)

    def api_run(self, request: Request) -> Response:
        try:
            record = self.run_of(request.path_params["run"])
        except UserError as exc:
            return JSONResponse({"error": str(exc)}, 404)
        steps, st = model.step_views(self.store, record, self.folds)
        fold = self.folds.get(record.run_id)
        return JSONResponse({"run": {**record.__dict__, **live.run_json(record, st)},
                             "usage": fold.usage, "steps": [s.to_json() for s in steps]},
                            headers=HEADERS)

    def api_timeline(self, request: Request) -> Response:
        try:
            record = self.run_of(request.path_params["run"])
        except UserError as exc:
            return JSONResponse({"error": str(exc)}, 404)
        def compute() -> str:
            steps, _ = model.step_views(self.store, record, self.folds, cache=self.final)
            return json.dumps(model.timeline(self.store, record, steps), separators=(",", ":"))

        body = self.final.get("timeline", record, state(record), compute)
        return Response(body, media_type="application/json", headers=HEADERS)

    # -- event streams ---------------------------------------------------------

    def stream(self, request: Request, tick: Callable[[], dict[str, Any] | None]) -> Response:
        async def events() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            quiet = 0.0
            while True:
                patch = await anyio.to_thread.run_sync(tick)
                if patch:
                    quiet = 0.0
                    yield f"event: patch\ndata: {json.dumps(patch, default=str)}\n\n"
                elif quiet >= KEEPALIVE:
                    quiet = 0.0
                    yield ": keepalive\n\n"
                await anyio.sleep(TICK)
                quiet += TICK

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store",
                                          "X-Accel-Buffering": "no"})

    # The streams' first tick sends the whole small state (the page applies it as it
    # would any change), so nothing that changed between drawing and connecting is lost.

    async def live_runs(self, request: Request) -> Response:
        q = request.query_params
        ticker = live.RunsTicker(self.rows, single(q, "status") or None,
                                 single(q, "workflow") or None)
        return self.stream(request, ticker.tick)

    async def live_run(self, request: Request) -> Response:
        ticker = live.RunTicker(self.store, self.folds, self.reuse, request.path_params["run"],
                                self.final)
        return self.stream(request, ticker.tick)

    async def live_step(self, request: Request) -> Response:
        # Numbered from 1, as the page's own URL.
        page, limit, filt = paging(request.query_params, PAGE_SIZES, 100, FILTERS)
        ticker = live.StepTicker(self.store, self.folds, request.path_params["run"],
                                 request.path_params["step"], page, limit, filt, self.final)
        return self.stream(request, ticker.tick)

    async def live_item(self, request: Request) -> Response:
        q = request.query_params
        ticker = live.ItemTicker(self.store, self.folds, request.path_params["run"],
                                 request.path_params["step"], request.path_params["key"])
        ticker.prime(live.parse_offsets(single(q, "logs")), single(q, "finished") == "1")
        return self.stream(request, ticker.tick)

    def bad_param(self, request: Request, exc: Exception) -> Response:
        if request.url.path.startswith(("/live/", "/api/")) or "/files/" in request.url.path:
            return PlainTextResponse(f"{exc}\n", 400, headers=HEADERS)
        return self.error(400, str(exc))

    # -- actions ---------------------------------------------------------------

    def cancel(self, request: Request) -> Response:
        return actions.cancel(self.s, request)

    def resume(self, request: Request) -> Response:
        return actions.resume(self.s, request)


def _chunks(fd: int, close: Callable[[], None]) -> Iterator[bytes]:
    try:
        while chunk := os.read(fd, 1 << 20):
            yield chunk
    finally:
        close()


def _send_verified(folder: Path, name: str, sha256: str) -> Response:
    """The file ``name`` below ``folder`` (never through a link), if it still hashes to
    what was recorded; otherwise a 409 that says so."""
    try:
        root = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return PlainTextResponse(f"{name}: its folder is gone ({exc.strerror})\n", 410)
    try:
        with Walker(root) as w:
            fd, _st = w.open_file(name)
    except Refused as exc:
        os.close(root)
        return PlainTextResponse(f"refused: {exc.why}\n", 409)
    except OSError as exc:
        os.close(root)
        return PlainTextResponse(f"{name}: {exc.strerror}\n", 410)
    os.close(root)
    digest, length = sha256_fd(fd)
    if digest != sha256:
        os.close(fd)
        return PlainTextResponse(
            f"{name} changed since it was recorded (sha256 now {digest}, recorded {sha256}); "
            "not served\n", 409)
    os.lseek(fd, 0, os.SEEK_SET)
    filename = quote(name.rsplit("/", 1)[-1])
    return StreamingResponse(
        _chunks(fd, lambda: os.close(fd)), media_type="application/octet-stream",
        headers={**HEADERS, "Content-Disposition": f"attachment; filename*=UTF-8''{filename}",
                 "Content-Length": str(length), "X-Stockade-Sha256": digest})


def make_app(settings: Settings) -> Starlette:
    ui = UI(settings)
    static = StaticFiles(directory=str(resources.files("stockade.web") / "static"))
    key = "/runs/{run}/{step}/{key}"
    routes = [
        Route("/", ui.runs_page),
        Route("/api/runs", ui.api_runs),
        Route("/api/runs/{run}", ui.api_run),
        Route("/api/runs/{run}/timeline", ui.api_timeline),
        Route("/live/runs", ui.live_runs),
        Route("/live/runs/{run}", ui.live_run),
        Route("/live/runs/{run}/{step}", ui.live_step),
        Route("/live" + key, ui.live_item),
        Route("/actions/cancel/{run}", ui.cancel, methods=["POST"]),
        Route("/actions/resume/{run}", ui.resume, methods=["POST"]),
        Route("/runs/{run}", ui.run_page),
        Route("/runs/{run}/{step}", ui.step_page),
        Route(key, ui.item_page),
        Route(key + "/files/{which}/{name:path}", ui.file),
        Route(key + "/log/{attempt:int}/{stream}", ui.log),
        Mount("/static", static, name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={BadParam: ui.bad_param})
    app.state.ui = ui
    return app
