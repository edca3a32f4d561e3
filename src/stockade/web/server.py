"""``stockade ui``: a local, read-only web page to browse runs live.

A small ``http.server`` bound to loopback by default: ``/`` is one HTML page that
polls ``/api/runs`` and ``/api/runs/<id>`` every second. It reads the store and
the run folders and never writes. Must not import the runner's engine or the
sandbox.
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

import click

from stockade.cli.main import friendly
from stockade.errors import UserError
from stockade.runner.runs import state
from stockade.store.base import Store

_RUN = re.compile(r"^/api/runs/([A-Za-z0-9_][A-Za-z0-9._-]{0,127})$")


def allowed_host(header: str | None, port: int) -> bool:
    """Only the loopback names, with this server's port: a DNS-rebound page is refused."""
    if not header:
        return False
    return header.strip().lower() in {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}


def _handler(store_factory: Callable[[], Store]) -> type[BaseHTTPRequestHandler]:
    local = threading.local()

    def store() -> Store:
        if not hasattr(local, "store"):
            local.store = store_factory()
        s: Store = local.store
        return s

    class Handler(BaseHTTPRequestHandler):
        server_version = "stockade-ui"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, value: Any, status: int = 200) -> None:
            self._send(status, json.dumps(value, default=str).encode(), "application/json")

        def do_GET(self) -> None:
            port = int(self.server.server_address[1])  # type: ignore[index]
            if not allowed_host(self.headers.get("Host"), port):
                self._json({"error": "this server answers only to 127.0.0.1, localhost or [::1] "
                                     f"on port {port}"}, 421)
                return
            path = self.path.split("?", 1)[0]
            if path == "/":
                page = resources.files("stockade.web").joinpath("index.html").read_bytes()
                self._send(200, page, "text/html; charset=utf-8")
            elif path == "/api/runs":
                self._json([{**r.__dict__, "status": str(state(r))}
                            for r in store().list_runs(200)])
            elif m := _RUN.match(path):
                run = store().get_run(m.group(1))
                if run is None:
                    self._json({"error": "no such run"}, 404)
                    return
                items = [
                    {**i.__dict__, "outputs": [o.__dict__ for o in i.outputs]}
                    for i in store().items(run.run_id)
                ]
                events = [e.__dict__ for e in store().events(run.run_id)][-200:]
                self._json({"run": {**run.__dict__, "status": str(state(run))}, "items": items,
                            "events": events})
            else:
                self._json({"error": "not found"}, 404)

    return Handler


def make_server(store_factory: Callable[[], Store], host: str, port: int) -> ThreadingHTTPServer:
    return ThreadingHTTPServer((host, port), _handler(store_factory))


@click.command()
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="runs folder (default: $STOCKADE_HOME or ./.stockade)")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@friendly
def ui(root: str | None, port: int) -> None:
    """Serve a local web page on 127.0.0.1 to browse runs live (read-only)."""
    from stockade.runner.session import default_root, open_run_store

    r = (Path(root) if root else default_root(os.environ)).resolve()
    if not os.environ.get("STOCKADE_STORE") and not (r / "stockade.db").exists():
        raise UserError(f"no runs under {r} (set --root or $STOCKADE_HOME)")
    try:
        server = make_server(lambda: open_run_store(r, None, os.environ), "127.0.0.1", port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"port {port} on 127.0.0.1 is in use; choose another with "
                            "--port N (or --port 0 for any free one)") from None
        raise UserError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None
    click.echo(f"stockade ui: http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C to stop)",
               err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
