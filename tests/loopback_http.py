"""An HTTP server on host loopback for the network tests.

Answers every GET with one fixed body and records what each request asked
(its path and its headers), so a test can require that a request arrived,
or that none did.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Served:
    port: int
    paths: list[str] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)


@contextmanager
def serve(body: bytes) -> Iterator[Served]:
    """A server answering ``body`` on 127.0.0.1 (any port) until the block ends."""
    served = Served(0)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.paths.append(self.path)
            served.headers.append(str(self.headers))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    served.port = int(srv.server_address[1])
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield served
    finally:
        srv.shutdown()
        srv.server_close()
