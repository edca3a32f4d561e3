"""Run ids: UUIDv7 by default, or a caller's id checked for safety.

Imports nothing of stockade but ``stockade.errors``.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable

from stockade.errors import UserError

_RUN_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


def uuid7(now: Callable[[], float] = time.time, rand: Callable[[int], bytes] = os.urandom) -> str:
    """A time-ordered UUID (RFC 9562 version 7), so run ids sort by start time."""
    ms = int(now() * 1000) & ((1 << 48) - 1)
    tail = int.from_bytes(rand(10), "big")
    rand_a = tail >> 68 & 0xFFF
    rand_b = tail & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return str(uuid.UUID(int=value))


def check_run_id(run_id: str) -> str:
    """Accept letters, digits and ``._-``, at most 128 characters, no leading dot or dash."""
    if not _RUN_ID.match(run_id) or run_id in (".", ".."):
        raise UserError(
            f"invalid run id {run_id!r}: use letters, digits, '.', '_' and '-', "
            "at most 128 characters, not starting with '.' or '-'"
        )
    return run_id
