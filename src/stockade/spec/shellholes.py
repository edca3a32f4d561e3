"""Find ``{{ }}`` holes that a ``run:`` script puts inside shell quotes.

Every value rendered into ``run:`` is already shell-quoted, so a hole
written inside ``"..."`` or ``'...'`` goes wrong as soon as a value needs
quoting: ``echo "{{ item }}"`` prints ``'a b'`` for the item ``a b``, and
``'{{ item }}'`` splits it into two words. The values that need no quoting
(``abc``, ``2026-12-03``) come through either way, which is why such a
script passes its first tests and fails on the first item with a space.
``validate`` and ``run`` warn about these holes (``quoting_warnings``).

The scan follows the shell's quoting as far as that needs: quotes,
backslashes, ``$'...'``, comments, ``$( )`` and backquotes, and the bodies
of here-documents, which it skips (quotes mean nothing there). Where it
loses track (quotes left open at the end), it reports nothing: a warning
that is wrong would teach people to ignore the right ones.

Pure: text in, offsets and problems out.

Must not import workspace, sandbox, runner, agent, publish, store, web or cli.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from stockade.errors import Problem

_HOLE = re.compile(r"\{\{.*?\}\}", re.S)
# Characters that end a word: a ``#`` after one starts a comment, and one
# ends a here-document's delimiter.
_BREAK = frozenset(" \t\n;&|()<>")


class QuotedHole(NamedTuple):
    """A hole at ``start`` (offset of its ``{{``) inside ``quote`` (``"`` or ``'``).

    A named tuple: this module is imported on the way to a run's first item,
    where a frozen dataclass costs about 1 ms to define and a tuple 0.2.
    """

    start: int
    text: str
    quote: str
    #: The hole is all there is between its quotes (``"{{ item }}"``).
    alone: bool = False


def quoted_holes(script: str) -> list[QuotedHole]:
    """Every hole of ``script`` that sits inside double or single quotes."""
    found: list[QuotedHole] = []
    # Each frame: [kind, depth]. kind: "" (plain), "(" (inside $( )), "`",
    # '"', "'" or "$'"; depth counts parentheses inside a "(" frame.
    stack: list[list[Any]] = [["", 0]]
    heredocs: list[tuple[str, bool]] = []
    i, n = 0, len(script)
    while i < n:
        kind = stack[-1][0]
        c = script[i]
        if c == "{" and script.startswith("{{", i):
            m = _HOLE.match(script, i)
            if m is not None:
                if kind in ('"', "'", "$'"):
                    quote = "'" if kind == "$'" else kind
                    alone = script[i - 1:i] == quote and script[m.end():m.end() + 1] == quote
                    found.append(QuotedHole(i, m.group(), quote, alone))
                i = m.end()
                continue
        if kind in ("'", "$'"):
            # Only $'...' knows backslashes; '...' ends at the next quote.
            if c == "'":
                stack.pop()
            i += 2 if c == "\\" and kind == "$'" else 1
            continue
        if c == "\\":
            i += 2
            continue
        if c == "$" and script.startswith("$(", i):
            stack.append(["(", 1])
            i += 2
            continue
        if c == "`":
            if kind == "`":
                stack.pop()
            else:
                stack.append(["`", 0])
            i += 1
            continue
        if kind == '"':
            if c == '"':
                stack.pop()
            i += 1
            continue
        # Plain text: the top level, or inside $( ) or backquotes.
        if c == "'":
            stack.append(["'", 0])
        elif c == '"':
            stack.append(['"', 0])
        elif c == "$" and script.startswith("$'", i):
            stack.append(["$'", 0])
            i += 1
        elif c == "#" and (i == 0 or script[i - 1] in _BREAK):
            end = script.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c == "(" and kind == "(":
            stack[-1][1] += 1
        elif c == ")" and kind == "(":
            stack[-1][1] -= 1
            if stack[-1][1] == 0:
                stack.pop()
        elif c == "<" and script.startswith("<<<", i):
            i += 3  # a here-string: a word follows, not a body
            continue
        elif c == "<" and script.startswith("<<", i):
            i, heredoc = _heredoc_word(script, i + 2)
            if heredoc is not None:
                heredocs.append(heredoc)
            continue
        elif c == "\n" and heredocs:
            i = _skip_bodies(script, i + 1, heredocs)
            heredocs = []
            if i < 0:
                return []
            continue
        i += 1
    if len(stack) != 1 or heredocs:
        return []
    return found


def _heredoc_word(script: str, i: int) -> tuple[int, tuple[str, bool] | None]:
    """The delimiter after ``<<`` at ``i``: (offset after it, (word, strip tabs))."""
    strip = script.startswith("-", i)
    if strip:
        i += 1
    while i < len(script) and script[i] in " \t":
        i += 1
    word: list[str] = []
    quote = ""
    while i < len(script):
        c = script[i]
        if quote:
            if c == quote:
                quote = ""
            else:
                word.append(c)
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
            if i < len(script):
                word.append(script[i])
        elif c in _BREAK:
            break
        else:
            word.append(c)
        i += 1
    if quote or not word:
        return i, None
    return i, ("".join(word), strip)


def _skip_bodies(script: str, i: int, heredocs: list[tuple[str, bool]]) -> int:
    """Offset after the bodies of ``heredocs``, which start at ``i``; -1 if one never ends."""
    for word, strip in heredocs:
        while True:
            if i >= len(script):
                return -1
            end = script.find("\n", i)
            line = script[i:] if end < 0 else script[i:end]
            i = len(script) if end < 0 else end + 1
            if (line.lstrip("\t") if strip else line) == word:
                break
    return i


def _advice(hole: QuotedHole) -> str:
    shown = '"..."' if hole.quote == '"' else "'...'"
    effect = ("would come out as 'a b'" if hole.quote == '"'
              else "would be split into two words")
    q = hole.quote
    fix = ("leave out the quotes around it" if hole.alone else
           f"end the quotes before it and open them again after it ({q}...{q}{hole.text}{q}...{q})")
    return (f"{hole.text} is inside {shown}, but run: already shell-quotes each value, "
            f"so a value such as a b {effect}; {fix}")


def quoting_warnings(
    steps: Any,
    source: str,
    filename: str,
    position: Callable[[tuple[str | int, ...]], tuple[int, int]],
) -> list[Problem]:
    """A warning for each quoted hole in the ``run:`` of ``steps`` (the raw list).

    ``source`` is the file's text: a hole is placed at its own line and
    column when its script line appears there as written (a ``|`` block,
    a plain one-line value); otherwise at the ``run:`` value.
    """
    if not isinstance(steps, list):
        return []
    lines = source.splitlines()
    out: list[Problem] = []
    for index, step in enumerate(steps):
        if not isinstance(step, Mapping) or not isinstance(step.get("run"), str):
            continue
        script: str = step["run"]
        holes = quoted_holes(script)
        if not holes:
            continue
        at = position(("steps", index, "run"))
        label = f"step {step.get('id')!r}" if isinstance(step.get("id"), str) else "a step"
        places = _places(script, [h.start for h in holes], lines, at)
        for hole, (line, col) in zip(holes, places, strict=True):
            out.append(Problem(filename, line, col, f"warning: {label}: {_advice(hole)}"))
    return out


def _places(script: str, offsets: list[int], lines: list[str],
            at: tuple[int, int]) -> Iterator[tuple[int, int]]:
    """Where each offset of ``script`` stands in the file: its script line
    searched for in the lines the value can span, from ``at`` down."""
    row, last = at[0] - 1, min(len(lines), at[0] + script.count("\n") + 2)
    prev = -1
    for offset in offsets:
        start = script.rfind("\n", 0, offset) + 1
        end = script.find("\n", offset)
        text = script[start:] if end < 0 else script[start:end]
        if prev >= 0 and start != prev:
            row += 1  # the next script line is below the last one found
        hit = None
        for r in range(max(row, 0), last):
            col = lines[r].find(text)
            if col >= 0 and (r != at[0] - 1 or col >= at[1] - 1):
                hit, row, prev = (r + 1, col + offset - start + 1), r, start
                break
        yield hit if hit is not None else at
