"""How the web UI's templates show times, durations, sizes, token counts and JSON.

Pure: values in, text out. Must not import the rest of stockade.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

import jinja2


def when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


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
