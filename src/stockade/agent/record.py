"""The agent's records in ``meta/``: append-only JSON lines with every real secret masked.

Masking works on values, never on serialised text: every string in a record
(keys included) has each secret replaced before ``json.dumps``, so a dummy
key such as ``null`` or ``true`` cannot rewrite the JSON around it. Only
real secrets are masked: values of at least ``MIN_SECRET`` characters (no API
key is shorter; masking ``unused`` or ``EMPTY``, which local servers take as
keys, would only garble ordinary text). The same masking applies to what
the broker tells the jail, so no key reaches a jail either.

Standard library only.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

MASK = "***"
MIN_SECRET = 8


class SecretMask:
    """Replaces secret values inside JSON-like values.

    ``secrets`` are candidates found by name (``*_KEY``...): only real ones
    (``MIN_SECRET`` characters or more) are masked. ``declared`` are the
    workflow's own secrets, masked from 4 characters as everywhere else.
    """

    def __init__(self, secrets: Iterable[str], declared: Iterable[str] = ()) -> None:
        values = {s for s in secrets if len(s) >= MIN_SECRET} | {s for s in declared if len(s) >= 4}
        # Longest first, so a secret that contains another is masked whole.
        self.secrets = sorted(values, key=len, reverse=True)

    def text(self, s: str) -> str:
        for v in self.secrets:
            if v in s:
                s = s.replace(v, MASK)
        return s

    def value(self, v: Any) -> Any:
        if not self.secrets:
            return v
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {(self.text(k) if isinstance(k, str) else k): self.value(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [self.value(x) for x in v]
        return v


class Recorder:
    """Append-only JSONL files in ``meta/``."""

    def __init__(self, meta_dir: Path, secrets: Iterable[str], declared: Iterable[str] = (),
                 clock: Callable[[], float] = time.time) -> None:
        self._dir = meta_dir
        self.mask = SecretMask(secrets, declared)
        self._clock = clock
        self._lock = threading.Lock()

    def append(self, name: str, record: dict[str, Any]) -> None:
        line = json.dumps(self.mask.value({"time": round(self._clock(), 3), **record}),
                          ensure_ascii=False, default=str)
        with self._lock, open(self._dir / name, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def mask_headers(h: dict[str, str]) -> dict[str, str]:
    """Headers with credentials replaced whatever their value."""
    return {k: (MASK if k.lower() in ("authorization", "x-api-key", "api-key") else v)
            for k, v in h.items()}
