"""Resource sizes as the workflow writes them: bytes, or a number with K, M or G.

Pure: no I/O. ``parse_size`` raises ``ValueError`` with a message a person can
act on; the spec checker turns it into a ``FILE:LINE:COL`` problem, so a bad
size never reaches run time.

Must not import workspace, sandbox, runner, agent, publish, store, web or cli.
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
#: Beyond this a limit means nothing (rlimits are 64-bit).
MAX_SIZE = 1 << 62


def parse_size(value: int | str | None) -> int | None:
    """``512``, ``"512K"``, ``"1.5G"``, ``"64MiB"`` -> bytes; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size: use a number of bytes or a number with K, M or G")
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE.match(value)
        if m is None:
            raise ValueError(
                f"{value!r} is not a size: use a number of bytes or a number with K, M or G "
                "(for example 512M or 2G)"
            )
        n = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if n <= 0:
        raise ValueError(f"{value!r} is not a size: it must be more than 0 bytes")
    if n > MAX_SIZE:
        raise ValueError(f"{value!r} is too large for a limit")
    return n


def format_size(value: int | str) -> str:
    """A size as the user wrote it, or bytes in the largest exact unit."""
    if isinstance(value, str):
        return value.strip()
    for unit in ("T", "G", "M", "K"):
        if value >= _UNITS[unit] and value % _UNITS[unit] == 0:
            return f"{value // _UNITS[unit]}{unit}"
    return f"{value} bytes"
