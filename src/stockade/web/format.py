"""How the web UI's templates show times, durations, sizes, token counts and JSON.

Pure: values in, text out. Times and durations are written as the CLI
writes them (``stockade._show``). Must not import the runner, the store or
the CLI.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import jinja2

from stockade._show import duration, when


def dur(seconds: float | None) -> str:
    return duration(seconds, fine=True)


def size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def tokens(usage: dict[str, int] | None) -> str:
    if not usage:
        return "-"
    total = sum(v for k, v in usage.items() if k.endswith("_tokens"))
    return f"{total:,}" if total else "-"


def script_json(value: Any) -> str:
    """JSON safe inside a <script> element (no ``</script>``, no HTML comments)."""
    return json.dumps(value, default=str).replace("<", "\\u003c").replace(">", "\\u003e") \
        .replace("&", "\\u0026")


def environment() -> jinja2.Environment:
    """The pages' Jinja environment: autoescaped, with the filters above."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("stockade.web", "templates"),
        autoescape=True, trim_blocks=True, lstrip_blocks=True,
        undefined=jinja2.ChainableUndefined,
    )
    env.filters.update(when=when, dur=dur, size=size, tokens=tokens,
                       q=lambda s: quote(str(s), safe=""), short=lambda h: str(h)[:12])
    return env


def pretty(value: Any, limit: int = 20_000) -> str:
    """A value as indented JSON (a string as itself), cut at ``limit`` characters."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"
