"""Apply a unified diff to one file's text, in memory; make diffs for hand-out.

Strict on purpose: a diff whose ``---``/``+++`` headers name another file, that
touches several files, creates or deletes a file, or whose context does not
match is rejected whole, so a failed patch changes nothing.

Imports only the standard library.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

#: ``@@ -12,3 +12,4 @@``; a bare ``@@`` (no numbers, as models sometimes
#: write) is accepted when its context occurs exactly once.
_HUNK = re.compile(r"^@@(?: -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@)?")
_NO_EOL = "\\ No newline at end of file"


class PatchRejected(ValueError):
    """The diff cannot be applied; nothing was changed."""


@dataclass
class _Hunk:
    old_start: int
    old: list[str]
    new: list[str]
    old_eol: bool = True
    new_eol: bool = True


def _header_path(line: str) -> str:
    name = line[4:].split("\t", 1)[0].strip()
    if name.startswith(("a/", "b/")):
        name = name[2:]
    return name


def _check_header(name: str, path: str) -> None:
    if name == "/dev/null":
        raise PatchRejected("apply_patch edits an existing file; use create_file for a new one (and no deletions)")
    if name != path and not path.endswith("/" + name):
        raise PatchRejected(f"the diff's header names {name!r} but the call's path is {path!r}; nothing was changed")


def parse(diff: str, path: str) -> list[_Hunk]:
    hunks: list[_Hunk] = []
    headers = 0
    lines = diff.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            headers += 1
            if headers > 1:
                raise PatchRejected("the diff touches more than one file; send one apply_patch per file")
            _check_header(_header_path(line), path)
            _check_header(_header_path(lines[i + 1]), path)
            i += 2
            continue
        m = _HUNK.match(line)
        if not m:
            if hunks or line.startswith(("@@", "+", "-")):
                raise PatchRejected(f"line {i + 1} of the diff is not part of a hunk: {line[:80]!r}")
            i += 1  # preamble such as "diff --git" or "index ..."
            continue
        hunk = _Hunk(int(m.group(1)) if m.group(1) is not None else -1, [], [])
        i += 1
        last = ""
        # The @@ counts are not trusted: models often get them wrong. The
        # body runs to the next hunk or header, and the context must match.
        while i < len(lines) and not _HUNK.match(lines[i]) and not _is_header(lines, i):
            body = lines[i]
            if body == _NO_EOL:
                if last in (" ", "-"):
                    hunk.old_eol = False
                if last in (" ", "+"):
                    hunk.new_eol = False
                i += 1
                continue
            tag, text = (body[:1] or " "), body[1:]
            if tag == " ":
                hunk.old.append(text)
                hunk.new.append(text)
            elif tag == "-":
                hunk.old.append(text)
            elif tag == "+":
                hunk.new.append(text)
            else:
                raise PatchRejected(f"line {i + 1} of the diff has no ' ', '-' or '+' prefix: {body[:80]!r}")
            last = tag
            i += 1
        # Bare blank lines closing a hunk are usually the diff's own trailing
        # newlines (or context whose space an editor stripped): drop them.
        j = i - 1
        while j >= 0 and lines[j] == "" and hunk.old and hunk.new and hunk.old[-1] == "" and hunk.new[-1] == "":
            hunk.old.pop()
            hunk.new.pop()
            j -= 1
        if not hunk.old and not hunk.new:
            raise PatchRejected(f"hunk at line {hunk.old_start} is empty")
        hunks.append(hunk)
    if not hunks:
        raise PatchRejected("the diff has no @@ hunks")
    return hunks


def _is_header(lines: list[str], i: int) -> bool:
    return lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")


def _count(lines: list[str], block: list[str], lo: int) -> int:
    n = len(block)
    return sum(1 for start in range(lo, len(lines) - n + 1) if lines[start : start + n] == block)


def _find(lines: list[str], block: list[str], want: int, lo: int) -> int:
    """Where ``block`` occurs at or after ``lo``, nearest to ``want``; -1 if nowhere."""
    n = len(block)
    best = -1
    for start in range(lo, len(lines) - n + 1):
        if lines[start : start + n] == block and (best < 0 or abs(start - want) < abs(best - want)):
            best = start
    return best


def apply(text: str, diff: str, path: str) -> str:
    """The new text of ``path`` after ``diff``, or ``PatchRejected``."""
    hunks = parse(diff, path)
    lines = text.split("\n")
    eol = text.endswith("\n")
    if eol:
        lines.pop()
    out: list[str] = []
    pos = 0
    for h in hunks:
        if h.old_start < 0 and h.old and _count(lines, h.old, pos) > 1:
            raise PatchRejected("a hunk without line numbers matches several places; add @@ -N,M +N,M @@ line numbers")
        want = max(h.old_start - 1, 0) if h.old else max(h.old_start, 0)
        at = _find(lines, h.old, want, pos) if h.old else min(max(want, pos), len(lines))
        if at < 0:
            raise PatchRejected(
                f"hunk @@ -{h.old_start} does not match the file's current text; read the file and resend. Nothing was changed"
            )
        out.extend(lines[pos:at])
        out.extend(h.new)
        pos = at + len(h.old)
        if pos == len(lines) and not (h.old_eol and h.new_eol):
            eol = h.new_eol
    out.extend(lines[pos:])
    if not out:
        return ""
    return "\n".join(out) + ("\n" if eol else "")


def unified(path: str, before: bytes | None, after: bytes | None) -> str:
    """A git-style diff of one file (``None`` means absent); ``""`` if unchanged or binary."""
    if before == after:
        return ""
    try:
        a = (before or b"").decode()
        b = (after or b"").decode()
    except UnicodeDecodeError:
        return f"Binary files a/{path} and b/{path} differ\n"
    old_name = f"a/{path}" if before is not None else "/dev/null"
    new_name = f"b/{path}" if after is not None else "/dev/null"
    head = f"diff --git a/{path} b/{path}\n"
    if before is None:
        head += "new file mode 100644\n"
    elif after is None:
        head += "deleted file mode 100644\n"
    body: list[str] = []
    for line in difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True), old_name, new_name):
        body.append(line)
        if not line.endswith("\n"):
            body.append("\n" + _NO_EOL + "\n")
    return head + "".join(body)
