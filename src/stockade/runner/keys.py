"""Item keys: how each item of a fan-out is named in ``STEP/KEY``.

Pure: no I/O. The engine renders a step's ``key:`` template per item and
passes the results here; without one, the elements themselves decide.
Must not import the engine or the CLI.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from stockade.errors import UserError
from stockade.runner.views import ItemView

#: A key a person can type in ``STEP/KEY`` (the default keys of string or number items).
SAFE_KEY = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
MAX_KEY = 200


def item_keys(values: list[Any], explicit: list[str] | None) -> list[str]:
    """Keys for a step's items: rendered ``key:`` values, the values themselves, or indexes.

    Without ``key:``, another step's items keep their keys (so keys survive a
    ``keep:``), string and number elements are their own keys when all are
    unique and path-safe, and anything else is keyed by its index.
    """
    if explicit is not None:
        return explicit
    if values and all(isinstance(v, ItemView) for v in values):
        upstream = [v.key for v in values]
        if len(set(upstream)) == len(upstream):
            return upstream
    simple = [str(v) for v in values
              if isinstance(v, str | int | float) and not isinstance(v, bool)]
    if len(simple) == len(values) and all(SAFE_KEY.match(k) for k in simple) \
            and len(set(simple)) == len(simple) and not any(k.startswith("#") for k in simple):
        return simple
    return [str(i) for i in range(len(values))]


def check_key(key: Any) -> str:
    if not isinstance(key, str | int) or isinstance(key, bool):
        raise UserError(f"key must render a string or a number, got {type(key).__name__}")
    text = str(key)
    if not text or len(text) > MAX_KEY or "/" in text or text.startswith("#") \
            or any(ord(c) < 32 for c in text) or text in (".", ".."):
        raise UserError(f"key {text!r} cannot name an item: use 1 to {MAX_KEY} characters "
                        "without '/', control characters or a leading '#'")
    return text


def key_problem(keys: Sequence[str], masked: Callable[[str], str]) -> str | None:
    """Why ``keys`` cannot name a step's items, or None.

    Keys are recorded and shown everywhere, so one that ``masked`` changes
    (it holds a secret value) would leak it; two alike would make
    ``STEP/KEY`` name two items (only rendered ``key:`` values can repeat:
    ``item_keys`` falls back to indexes)."""
    if any(masked(k) != k for k in keys):
        return "an item key contains a secret value; give the step a key: that does not"
    repeated = sorted(k for k, n in Counter(keys).items() if n > 1)
    if repeated:
        return f"keys must be unique within the step; repeated: {', '.join(repeated[:5])}"
    return None
