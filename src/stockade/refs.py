"""The engine's JSON forms of references, and how data is kept from posing as one.

When the engine writes a value as JSON (a publish payload, a JSON input, a
``to_json`` text, a record), an artifact becomes
``{"$artifact": {run_id, step, item, attempt, name, sha256, size}, "text": ...}``,
a host file ``{"$file": ..., "sha256": ...}`` and a checkout
``{"$tree": ..., "sha256": ...}``. Only objects the engine made produce these
forms (they carry ``__stockade_json__``); everything else is data: a step's
result, what ``from_json`` parsed, vars, ``for_each`` elements.

Data holding one of those keys is kept from being taken for a reference:

- in a publish payload it is refused (``reserved_key_in`` says where): what a
  sink receives is a claim to third parties, so it fails loudly;
- everywhere else the key is escaped with one more ``$`` (``$artifact`` ->
  ``$$artifact``, ``$$artifact`` -> ``$$$artifact``), so the JSON still
  carries the data, reversibly, and a ``$artifact`` key in JSON the engine
  wrote is always the engine's.

Imports nothing of stockade.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

ARTIFACT = "$artifact"
FILE = "$file"
TREE = "$tree"
RESERVED = frozenset({ARTIFACT, FILE, TREE})

_RESERVED_OR_ESCAPED = re.compile(r"\$+(?:artifact|file|tree)")


def is_engine_object(value: Any) -> bool:
    return callable(getattr(value, "__stockade_json__", None))


def escape_key(key: str) -> str:
    """``$artifact`` -> ``$$artifact`` (and so on for each extra ``$``); other keys as they are."""
    # Most keys hold no ``$``: no regex for them (this runs on every key of
    # every item value the engine records).
    return "$" + key if "$" in key and _RESERVED_OR_ESCAPED.fullmatch(key) else key


def unescape_key(key: str) -> str:
    """The inverse of ``escape_key`` on a key it produced."""
    return key[1:] if key.startswith("$$") and _RESERVED_OR_ESCAPED.fullmatch(key) else key


def escape_data(value: Any) -> Any:
    """``value`` with the reserved keys of its plain mappings escaped.

    Engine objects and other leaves are returned as they are (their own JSON
    form is theirs to write).
    """
    if is_engine_object(value):
        return value
    if isinstance(value, Mapping):
        return {escape_key(k) if isinstance(k, str) else k: escape_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [escape_data(v) for v in value]
    return value


def reserved_key_in(value: Any) -> tuple[str, str] | None:
    """Where plain data inside ``value`` holds a reserved key: ``(path, key)``, or None.

    ``path`` is written as subscripts (``["rows"][0]``); engine objects are not
    looked into.
    """
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, cur = stack.pop()
        if is_engine_object(cur):
            continue
        if isinstance(cur, Mapping):
            for k in cur:
                if k in RESERVED:
                    return path, str(k)
            stack.extend((f"{path}[{json.dumps(str(k), ensure_ascii=False)}]", v)
                         for k, v in reversed(list(cur.items())))
        elif isinstance(cur, list | tuple):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(cur))))
    return None
