"""How times, durations and names are written for people, the same in the CLI and the web UI.

Pure: values in, text out. Standard library only.
"""

from __future__ import annotations

import time


def when(ts: float | None) -> str:
    """A moment in local time, to the second; ``-`` when there is none."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def duration(seconds: float | None, *, fine: bool = False) -> str:
    """``4.2s``, ``3m07s``, ``2h05m``; ``-`` when unknown. ``fine`` shows
    hundredths below ten seconds (an item's attempt, where they tell apart)."""
    if seconds is None:
        return "-"
    if fine and seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def printable(text: str) -> str:
    """``text`` safe for a terminal: each non-printable character escaped as Python does.

    A file name may carry a carriage return, an escape sequence or a bidi
    control (a ``run:`` step can make any name in ``out/``); printed raw it
    would rewrite the line around it. A carriage return is shown as
    ``\\r``, an escape as ``\\x1b``, a bidi override as ``\\u202e``.
    Text that is all printable comes back unchanged; otherwise backslashes
    are doubled too, so an escape cannot be mistaken for the name itself.
    """
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c == "\\":
            out.append("\\\\")
        elif c.isprintable():
            out.append(c)
        else:
            out.append(repr(c)[1:-1])
    return "".join(out)


def lines(text: str) -> list[str]:
    """``text``'s lines, split at newlines only: ``str.splitlines`` also splits
    at a carriage return, and a step's ``\r`` would start a line of its own
    choosing in a report that prefixes each of them."""
    return text.rstrip("\n").split("\n") if text else []
