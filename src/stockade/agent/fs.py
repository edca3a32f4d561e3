"""The tools' effects on the work directory, run inside the jail.

``Workspace.call`` validates a tool call (``stockade.agent.tools``), checks the
target (``stockade.agent.guard``), computes the new content in memory, asks the
host for permission through ``WriteGate.intent`` (which echoes ``WRITE TARGET``
and records it), writes, and reports the sha256 through ``WriteGate.done``.
Any rejection returns an error result and leaves the file system untouched.

Standard library only (and the standard-library-only modules beside it): it runs
in the jail. Must not import httpx or pydantic.
"""

from __future__ import annotations

import errno
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from stockade.agent import guard, patch, tools
from stockade.agent.loop import ToolCall, ToolResult

MAX_LIST = 1000


class WriteGate(Protocol):
    def intent(self, tool: str, path: str) -> str | None:
        """Ask before writing ``path``; an error string refuses the write."""
        ...

    def done(self, tool: str, path: str, sha256: str) -> None: ...


@dataclass
class Workspace:
    root: Path
    allowed: tuple[str, ...]
    writes: tuple[str, ...]
    prompt: str
    gate: WriteGate

    def call(self, call: ToolCall) -> ToolResult:
        try:
            args = tools.validate(call.name, tools.parse_arguments(call.arguments), self.allowed)
            handler = getattr(self, "_" + call.name)
            content: str = handler(**args)
            return ToolResult(content)
        except (tools.CallRejected, guard.PathRejected, patch.PatchRejected) as e:
            return ToolResult(f"error: {e}", is_error=True)
        except OSError as e:
            return ToolResult(f"error: {call.name} failed: {os.strerror(e.errno or 0) or e}", is_error=True)

    # -- read-only ----------------------------------------------------------

    def _read_file(self, path: str, offset: int | None, limit: int | None) -> str:
        rel = guard.normalise(path)
        host = guard.resolve_inside(self.root, rel)
        if not host.is_file():
            raise guard.PathRejected(f"no such file: {rel!r}")
        data = host.read_bytes()
        try:
            text = data.decode()
        except UnicodeDecodeError:
            return f"error: {rel!r} is not UTF-8 text ({len(data)} bytes)"
        start = offset or 0
        end = start + min(limit or tools.MAX_READ, tools.MAX_READ)
        chunk = text[start:end]
        if end < len(text):
            chunk += f"\n[... {len(text) - end} more characters; call read_file with offset={end}]"
        return chunk

    def _list_dir(self, path: str | None) -> str:
        rel = guard.normalise(path if path is not None else ".", allow_root=True)
        host = guard.resolve_inside(self.root, rel)
        if not host.is_dir():
            raise guard.PathRejected(f"no such directory: {rel!r}")
        names = sorted(e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in os.scandir(host))
        if len(names) > MAX_LIST:
            names = [*names[:MAX_LIST], f"[... {len(names) - MAX_LIST} more]"]
        return "\n".join(names) if names else "(empty)"

    # -- writes -------------------------------------------------------------

    def _target(self, path: str, *, mention: bool) -> str:
        rel = guard.check_write_target(path, writes=self.writes, prompt=self.prompt if mention else None)
        guard.check_length(self.root, rel)
        if not guard.is_symlink_free(self.root, rel):
            raise guard.PathRejected(f"path {rel!r} goes through a symlink; nothing was written")
        guard.resolve_inside(self.root, rel)
        return rel

    def _ask(self, tool: str, rel: str) -> None:
        refusal = self.gate.intent(tool, rel)
        if refusal:
            raise guard.PathRejected(refusal)

    def _create_file(self, path: str, content: str) -> str:
        rel = self._target(path, mention=False)
        host = self.root / rel
        if os.path.lexists(host):
            raise guard.PathRejected(f"{rel!r} already exists; create_file makes new files only. Nothing was written")
        data = content.encode()
        self._ask("create_file", rel)
        self._mkdirs(rel)
        fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        digest = hashlib.sha256(data).hexdigest()
        self.gate.done("create_file", rel, digest)
        return f"created {rel} ({len(data)} bytes, sha256 {digest})"

    def _apply_patch(self, path: str, diff: str) -> str:
        rel = self._target(path, mention=True)
        host = self.root / rel
        if not host.is_file() or host.is_symlink():
            raise guard.PathRejected(f"{rel!r} is not an existing file; apply_patch edits existing files only")
        try:
            old = host.read_bytes().decode()
        except UnicodeDecodeError:
            raise guard.PathRejected(f"{rel!r} is not UTF-8 text") from None
        new = patch.apply(old, diff, rel).encode()
        self._ask("apply_patch", rel)
        fd = os.open(host, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        with os.fdopen(fd, "wb") as f:
            f.write(new)
        digest = hashlib.sha256(new).hexdigest()
        self.gate.done("apply_patch", rel, digest)
        return f"patched {rel} ({len(new)} bytes, sha256 {digest})"

    def _mkdirs(self, rel: str) -> None:
        cur = self.root
        for part in rel.split("/")[:-1]:
            cur = cur / part
            try:
                os.mkdir(cur)
            except OSError as e:
                if e.errno != errno.EEXIST or cur.is_symlink() or not cur.is_dir():
                    raise
