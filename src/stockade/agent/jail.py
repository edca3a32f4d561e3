"""The jailed half of an agent step: ``python -m stockade.agent.jail CONFIG``.

Reads its config (prompt, tools, writes, max_turns, broker socket) from a
read-only file outside ``work/``, drives ``agent_loop`` against the broker over
the unix socket and runs the tools in the work directory (its cwd). It holds no
key and has no network; everything it says to the model goes through the
broker, which records it.

Standard library only (stdlib ``http.client`` over ``AF_UNIX``): the jail must
start fast and must not import httpx, pydantic or the engine.
"""

from __future__ import annotations

import http.client
import json
import os
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

#: ``sun_path`` holds 108 bytes; longer socket paths go through /proc/self/fd.
_SUN_PATH_MAX = 100


def connect_unix(path: str, timeout: float | None = None) -> socket.socket:
    """Connect to a unix socket, even one whose path is longer than sun_path."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    if len(path.encode()) <= _SUN_PATH_MAX:
        sock.connect(path)
        return sock
    dfd = os.open(os.path.dirname(path), os.O_PATH)
    try:
        sock.connect(f"/proc/self/fd/{dfd}/{os.path.basename(path)}")
    finally:
        os.close(dfd)
    return sock


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("broker")
        self._path = path

    def connect(self) -> None:
        self.sock = connect_unix(self._path)


class BrokerClient:
    """JSON over HTTP/1.1 to the host broker; one keep-alive connection."""

    def __init__(self, socket_path: str) -> None:
        self._conn = _UnixConnection(socket_path)

    def post(self, route: str, payload: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps(payload).encode()
        for attempt in (1, 2):
            try:
                self._conn.request("POST", route, body, {"content-type": "application/json"})
                resp = self._conn.getresponse()
                data = resp.read()
                break
            except (ConnectionError, http.client.HTTPException):
                self._conn.close()
                if attempt == 2:
                    raise
        value = json.loads(data)
        if not isinstance(value, dict):
            raise ValueError("broker answered with a non-object")
        return value

    # -- as the loop's model ------------------------------------------------

    def model(self, req: ModelRequest) -> ModelReply:
        answer = self.post("/model", {"messages": list(req.messages), "tools": list(req.tools)})
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


def run(config: dict[str, Any], root: Path) -> Finished:
    client = BrokerClient(config["socket"])
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

    loop = agent_loop(config["prompt"], tuple(config["tools"]), tuple(config["writes"]), int(config["max_turns"]))
    fin = drive(loop, client.model, tool)
    client.post("/finish", {"ok": fin.ok, "result": fin.result, "message": fin.message, "turns": fin.turns})
    return fin


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m stockade.agent.jail CONFIG", file=sys.stderr)
        return 2
    config = json.loads(Path(args[0]).read_text())
    fin = run(config, Path.cwd())
    if fin.ok:
        print(fin.result, flush=True)
        return 0
    print(f"agent failed: {fin.message}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
