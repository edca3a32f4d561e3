"""The broker's write decisions: every write the jail asks for is decided here, on the host.

``WriteDesk.intent`` re-checks the target (``stockade.agent.guard``: the
name, the step's ``writes``, mentions for patches, symlinks, a length the
file system takes, a file unchanged since the snapshot or our last write),
echoes ``WRITE TARGET: path``, records the intent in ``meta/writes.jsonl``
and asks the operator under ``approve: ask``. ``done`` re-hashes what the
jail reports it wrote. A refusal, or any ``OSError`` while looking at the
target, is an error answer the model reads: a name the file system cannot
take must never end the broker, and with it the item.

Must not import the runner, workspace or cli.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade._show import printable
from stockade.agent import guard
from stockade.agent.gate import Snapshot, sha256_file
from stockade.agent.record import Recorder
from stockade.agent.tools import WRITE_TOOLS


def os_reason(e: OSError) -> str:
    """``file name too long``: what an ``OSError`` means, without a traceback or a path."""
    return (os.strerror(e.errno) if e.errno else str(e) or type(e).__name__).lower()


@dataclass
class WriteDesk:
    work_dir: Path
    tools: tuple[str, ...]
    writes: tuple[str, ...]
    prompt: str
    approve: str
    interactive: bool
    snapshot: Snapshot
    recorder: Recorder
    echo: Callable[[str], None]
    ask: Callable[[str], bool]
    #: path -> sha256 reported after the write (and confirmed by re-hashing)
    written: dict[str, str] = field(default_factory=dict)
    #: path -> bytes before the first tool write (None: did not exist)
    before: dict[str, bytes | None] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)

    def _check_target(self, tool: str, raw: Any) -> str:
        if tool not in WRITE_TOOLS or tool not in self.tools:
            raise guard.PathRejected(f"{tool!r} is not a write tool of this step")
        rel = guard.check_write_target(
            raw, writes=self.writes, prompt=self.prompt if tool == "apply_patch" else None
        )
        guard.check_length(self.work_dir, rel)
        if not guard.is_symlink_free(self.work_dir, rel):
            raise guard.PathRejected(f"path {rel!r} goes through a symlink")
        host = guard.resolve_inside(self.work_dir, rel)
        exists = os.path.lexists(host)
        if tool == "create_file" and exists:
            raise guard.PathRejected(f"{rel!r} already exists")
        if tool == "apply_patch" and not host.is_file():
            raise guard.PathRejected(f"{rel!r} is not an existing file")
        # The file must still be what the snapshot or our last write says; a
        # change made some other way must not be laundered by a tool write.
        expected = self.written.get(rel)
        if expected is None:
            entry = self.snapshot.get(rel)
            expected = entry.digest if entry is not None and entry.kind == "file" else None
        current = sha256_file(host) if exists and host.is_file() else None
        if current != expected:
            raise guard.PathRejected(f"{rel!r} was changed outside the write tools; refusing to write it")
        return rel

    def _refuse(self, event: str, tool: str, path: str, why: str) -> dict[str, Any]:
        self.recorder.append("writes.jsonl", {"event": event, "tool": tool, "path": path, "reason": why})
        return {"ok": False, "error": why}

    def intent(self, payload: dict[str, Any]) -> dict[str, Any]:
        tool = str(payload.get("tool"))
        raw = payload.get("path")
        try:
            rel = self._check_target(tool, raw)
            host = self.work_dir / rel
            first = rel not in self.before
            old = host.read_bytes() if first and host.is_file() else None
        except guard.PathRejected as e:
            return self._refuse("rejected", tool, str(raw), str(e))
        except OSError as e:
            return self._refuse("rejected", tool, str(raw),
                                f"{tool} cannot use this path: {os_reason(e)}. Nothing was written")
        self.echo(f"WRITE TARGET: {printable(rel)}")
        self.recorder.append("writes.jsonl", {"event": "intent", "tool": tool, "path": rel})
        if self.approve == "ask":
            if not self.interactive:
                why = f"approve: ask needs a terminal and there is none; the write to {rel} was refused"
                return self._refuse("refused", tool, rel, why)
            if not self.ask(rel):
                return self._refuse("refused", tool, rel, f"the operator refused the write to {rel}")
            self.recorder.append("writes.jsonl", {"event": "approved", "tool": tool, "path": rel})
        if first:
            self.before[rel] = old
        self.pending.add(rel)
        return {"ok": True}

    def done(self, payload: dict[str, Any]) -> dict[str, Any]:
        rel = str(payload.get("path"))
        reported = str(payload.get("sha256"))
        if rel not in self.pending:
            self.problems.append(f"write of {rel} reported without an approved intent")
            return {"ok": False, "error": "no approved intent for this path"}
        self.pending.discard(rel)
        host = self.work_dir / rel
        try:
            actual = sha256_file(host) if host.is_file() and not host.is_symlink() else None
        except OSError:
            actual = None  # reported as a mismatch below, which fails the item
        self.recorder.append(
            "writes.jsonl", {"event": "written", "tool": payload.get("tool"), "path": rel, "sha256": actual, "reported": reported}
        )
        if actual != reported:
            self.problems.append(f"{rel}: sha256 on disk {actual} differs from the one reported {reported}")
        self.written[rel] = actual or ""
        return {"ok": True}
