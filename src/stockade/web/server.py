"""``stockade ui``: serve the web UI on 127.0.0.1 with uvicorn.

The socket is bound here (loopback only) before uvicorn takes it, so a port in
use is one clear message and ``--port 0`` can say which port it got. Every
request must come from the user who started the server (``web.owner``) and
carry a loopback ``Host`` with this port (``web.guard``).
Must not import the runner's engine or the sandbox.
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import click

from stockade.cli.main import friendly
from stockade.errors import UserError
from stockade.store.base import Store
from stockade.web.app import Settings, make_app
from stockade.web.guard import allowed_host, guarded
from stockade.web.owner import checked_protocol, user_text

__all__ = ["UIServer", "allowed_host", "make_server", "ui"]


class UIServer:
    """uvicorn on an already bound loopback socket; ``serve`` blocks, ``start`` threads."""

    def __init__(self, settings: Settings, sock: socket.socket) -> None:
        import uvicorn

        self.settings = settings
        self.socket = sock
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(guarded(make_app(settings)), log_level="warning",
                                lifespan="off", access_log=False,
                                timeout_graceful_shutdown=1, proxy_headers=False,
                                http=checked_protocol())
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def serve(self) -> None:
        self.server.run(sockets=[self.socket])

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve, name="stockade-ui", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self.socket.close()
        self.settings.store.close()


def bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:port, or a UserError that says what to do."""
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that say
    # so, and without it every keep-alive answer waits out a 40 ms delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"port {port} on 127.0.0.1 is in use; choose another with "
                            "--port N (or --port 0 for any free one)") from None
        raise UserError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None
    return sock


def make_server(store_factory: Callable[[], Store], port: int = 0, *,
                allow_actions: bool = False,
                resume_argv: Callable[..., list[str]] | None = None) -> UIServer:
    """A server on 127.0.0.1 (not started) over the store ``store_factory`` opens."""
    token = secrets.token_urlsafe(24) if allow_actions else ""
    settings = Settings(store_factory(), allow_actions=allow_actions, token=token,
                        resume_argv=resume_argv)
    return UIServer(settings, bind(port))


@click.command()
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="runs folder (default: $STOCKADE_HOME or ./.stockade)")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="port on 127.0.0.1 (0: any free one)")
@click.option("--allow-actions", is_flag=True,
              help="add cancel and resume buttons (guarded by a per-server token)")
@friendly
def ui(root: str | None, port: int, allow_actions: bool) -> None:
    """Serve a local web page on 127.0.0.1 to follow and inspect runs live."""
    from stockade.runner.roots import default_root, open_run_store

    r = (Path(root) if root else default_root(os.environ)).resolve()
    if not os.environ.get("STOCKADE_STORE") and not (r / "stockade.db").exists():
        raise UserError(f"no runs under {r} (set --root or $STOCKADE_HOME)")
    server = make_server(lambda: open_run_store(r, None, os.environ), port,
                         allow_actions=allow_actions)
    actions = " with cancel and resume" if allow_actions else " (read-only)"
    click.echo(f"stockade ui: {server.url}{actions}, for {user_text(os.geteuid())} only "
               "(Ctrl-C to stop)", err=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        server.socket.close()
        server.settings.store.close()
