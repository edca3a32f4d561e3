"""In-jail relay: 127.0.0.1:PORT -> the host egress proxy's unix socket, then exec.

Usage (run by the bwrap backend inside the jail, with ``python3 -I -S``)::

    _relay.py SOCKET PORT -- COMMAND [ARGS...]

The jail has its own empty network namespace (only ``lo``), so HTTP clients
reach the proxy at ``http://127.0.0.1:PORT``. The relay binds the port, forks
a server child and execs the command in the original process, so the command
keeps the jail's main pid; the server dies with the jail's pid namespace.

Standard library only; this file is mounted into jails and imports nothing of
stockade.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _handle(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    t = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    t.start()
    _pump(client, upstream)
    t.join()
    client.close()
    upstream.close()


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_handle, args=(client, path), daemon=True).start()


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: _relay.py SOCKET PORT -- COMMAND...\n")
        sys.exit(2)
    path, port, command = argv[0], int(argv[1]), argv[3:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    if os.fork() == 0:
        try:
            _serve(listener, path)
        finally:
            os._exit(0)
    listener.close()
    try:
        os.execvp(command[0], command)
    except OSError as e:
        sys.stderr.write(f"stockade relay: cannot run {command[0]}: {e.strerror}\n")
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
