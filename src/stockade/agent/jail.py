"""The jailed half of an agent step: the tool loop against the broker connection.

Started by ``stockade.agent.boot`` with the already-connected broker socket
(inherited at fd 3, see ``ship``) and the item's config (prompt, tools,
writes, max_turns) that came over it. Drives ``agent_loop`` against the broker
(which keeps the conversation: the jail sends only its tool results) and
runs the tools in the work directory (its cwd). It holds no key, has no
network and names no socket: everything it says to the model goes through
that one connection, which the broker records.

Standard library only (a minimal HTTP/1.1 client over the socket): the jail
must start fast and must not import httpx, pydantic or the engine.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

from stockade.agent.fs import Workspace
from stockade.agent.loop import (
    Finished,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolResult,
    agent_loop,
    drive,
)


class BrokerClient:
    """JSON over HTTP/1.1 to the host broker on the jail's one connection.

    A dozen lines instead of ``http.client``: that module pulls in ``email``
    and ``ssl`` and would double the jail's import time.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = b""

    def _exchange(self, route: str, body: bytes) -> bytes:
        head = f"POST {route} HTTP/1.1\r\nHost: broker\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        self._sock.sendall(head.encode() + body)
        while b"\r\n\r\n" not in self._buf:
            self._recv()
        header, _, self._buf = self._buf.partition(b"\r\n\r\n")
        status_line, *lines = header.decode("latin-1").split("\r\n")
        if status_line.split(" ")[1:2] != ["200"]:
            raise ConnectionError(f"broker answered {status_line!r}")
        length = next((int(v) for k, _, v in (ln.partition(":") for ln in lines) if k.strip().lower() == "content-length"), None)
        if length is None:
            raise ConnectionError("broker answer without content-length")
        while len(self._buf) < length:
            self._recv()
        data, self._buf = self._buf[:length], self._buf[length:]
        return data

    def _recv(self) -> None:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        self._buf += chunk

    def post(self, route: str, payload: dict[str, Any]) -> dict[str, Any]:
        # No retry: a call whose answer was lost may have happened (a model
        # call counted, a write approved); the loop ends instead.
        data = self._exchange(route, json.dumps(payload).encode())
        value = json.loads(data)
        if not isinstance(value, dict):
            raise ValueError("broker answered with a non-object")
        return value

    # -- as the loop's model ------------------------------------------------

    def model(self, req: ModelRequest) -> ModelReply:
        answer = self.post("/model", {"results": list(req.results)})
        if not answer.get("ok"):
            return ModelReply(error=str(answer.get("error") or "the broker refused the model call"))
        calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in answer.get("tool_calls", []))
        return ModelReply(text=str(answer.get("text") or ""), tool_calls=calls)

    # -- as the workspace's write gate ----------------------------------------

    def intent(self, tool: str, path: str) -> str | None:
        answer = self.post("/write/intent", {"tool": tool, "path": path})
        return None if answer.get("ok") else str(answer.get("error") or "write refused by the host")

    def done(self, tool: str, path: str, sha256: str) -> None:
        self.post("/write/done", {"tool": tool, "path": path, "sha256": sha256})


def run(config: dict[str, Any], root: Path, client: BrokerClient) -> Finished:
    ws = Workspace(
        root=root,
        allowed=tuple(config["tools"]),
        writes=tuple(config["writes"]),
        prompt=config["prompt"],
        gate=client,
    )

    def tool(call: ToolCall) -> ToolResult:
        result = ws.call(call)
        status = "rejected" if result.is_error else "ok"
        print(f"tool {call.name} {status}", file=sys.stderr, flush=True)
        return result

    loop = agent_loop(int(config["max_turns"]))
    fin = drive(loop, client.model, tool)
    client.post("/finish", {"ok": fin.ok, "result": fin.result, "message": fin.message, "turns": fin.turns})
    return fin


def serve(sock: socket.socket, config: dict[str, Any]) -> int:
    """Run the item's loop over ``sock``; the exit status of the jail."""
    try:
        fin = run(config, Path.cwd(), BrokerClient(sock))
    except OSError as e:
        print(f"agent: lost the model broker: {e}", file=sys.stderr, flush=True)
        return 3
    if fin.ok:
        print(fin.result, flush=True)
        return 0
    print(f"agent failed: {fin.message}", file=sys.stderr, flush=True)
    return 1
