"""The web UI's first check: every request must name this server by a loopback ``Host``.

A page elsewhere that rebinds its own DNS name to 127.0.0.1 reaches the
server with its own name in ``Host``; ``HostGuard`` answers such a request
421 before any handler runs, so neither pages nor actions can be read or
triggered through a rebound name. Other users of this machine are kept out
before that, by ``web.owner``. Imports nothing of stockade but
``stockade.web.owner``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


def allowed_host(header: str | None, port: int) -> bool:
    """Only the loopback names, with this server's port: a DNS-rebound page is refused."""
    if not header:
        return False
    return header.strip().lower() in {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}


class HostGuard:
    """Refuses (421) every request whose ``Host`` is not this server's loopback name."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        hosts = [v.decode("latin-1") for k, v in scope["headers"] if k == b"host"]
        server = scope.get("server") or ("", 0)
        port = int(server[1] or 0)
        if len(hosts) != 1 or not allowed_host(hosts[0], port):
            body = (f"this server answers only to 127.0.0.1:{port}, localhost:{port} or "
                    f"[::1]:{port}\n").encode()
            await send({"type": "http.response.start", "status": 421,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


def guarded(app: ASGIApp) -> ASGIApp:
    """``app`` behind the owner check (``web.owner``: only the server's own user), then
    the ``Host`` check."""
    from stockade.web.owner import OwnerGuard

    return OwnerGuard(HostGuard(app))
