"""Build a step's environment from an allowlist; nothing is inherited.

Also masks secret values in anything the engine writes. Must not import the
sandbox backends, the store or the CLI.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from stockade.sandbox.policy import ENV_ALLOWLIST

MASK = "********"


def build_env(
    host_env: Mapping[str, str],
    *,
    step_env: Mapping[str, str],
    secrets: Iterable[str],
    stockade_vars: Mapping[str, str],
) -> dict[str, str]:
    """The whole environment of a step, minus HOME and TMPDIR (the backend sets those)."""
    env = {k: host_env[k] for k in ENV_ALLOWLIST if k in host_env and k not in ("HOME", "TMPDIR")}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    env.update(step_env)
    for name in secrets:
        if name in host_env:
            env[name] = host_env[name]
    env.update(stockade_vars)
    return env


class Masker:
    """Replaces secret values in text and bytes before they are written anywhere."""

    def __init__(self, values: Iterable[str]) -> None:
        # Longest first, so a secret that contains another is masked whole.
        self.values = sorted({v for v in values if len(v) >= 4}, key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self.values)

    def text(self, s: str) -> str:
        for v in self.values:
            s = s.replace(v, MASK)
        return s

    def data(self, b: bytes) -> bytes:
        for v in self.values:
            b = b.replace(v.encode(), MASK.encode())
        return b

    def value(self, v: Any) -> Any:
        """A JSON-like value with every string in it (keys too) masked.

        Masks values, never serialised text: a secret such as ``null`` or
        ``true`` must not rewrite the JSON syntax around it.
        """
        if not self.values:
            return v
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {self.text(k) if isinstance(k, str) else k: self.value(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [self.value(x) for x in v]
        return v
