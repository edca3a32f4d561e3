"""The web UI's query parameters, read strictly: one line to act on, never a 500.

A URL is typed, pasted and edited by hand: a number too big for the store
(``page=99999999999999999999`` overflowed SQLite's integer), digits that are
not ASCII (``int("²")`` raises), a parameter given twice, or text where a
number goes. Numbers are clamped into their range (a page past the end shows
the last page: ``items.last_page_at_most``); anything else is a ``BadParam``
the handlers answer 400 with. Imports nothing of stockade.
"""

from __future__ import annotations

import re

from starlette.datastructures import QueryParams

#: Bigger than any page, attempt or page size, and small enough for SQLite.
HUGE = 2**31 - 1
_WHOLE = re.compile(r"[+-]?[0-9]+")


class BadParam(ValueError):
    """A query parameter the page cannot use; its text is the message to show."""


def single(q: QueryParams, name: str) -> str:
    """The parameter's one value ('' when absent); given twice is an error."""
    values = q.getlist(name)
    if len(values) > 1:
        raise BadParam(f"{name} is given {len(values)} times in the URL: give it once")
    return values[0] if values else ""


def whole(q: QueryParams, name: str, default: int, lo: int = 0, hi: int = HUGE) -> int:
    """A whole number clamped into ``lo..hi``; ``default`` when absent or empty."""
    text = single(q, name).strip()
    if not text:
        return default
    if not _WHOLE.fullmatch(text):
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise BadParam(f"{name}={shown!r} is not a whole number")
    digits = text.lstrip("+-")
    # int() of thousands of digits is refused (and slow): anything this long is huge.
    value = HUGE if len(digits) > 12 else int(digits)
    return max(lo, min(hi, -value if text.startswith("-") else value))


def page_size(q: QueryParams, sizes: tuple[int, ...], default: int) -> int:
    """``limit``: the largest allowed size not above the one asked (the smallest at least)."""
    asked = whole(q, "limit", default, 0)
    return max([s for s in sizes if s <= asked] or [min(sizes)])


def paging(q: QueryParams, sizes: tuple[int, ...], default: int,
           filters: tuple[str, ...]) -> tuple[int, int, str]:
    """A step page's (page from 0, page size, filter) from ``page``, ``limit``, ``filter``."""
    filt = single(q, "filter")
    if filt and filt not in filters:
        raise BadParam(f"unknown filter {filt!r}: use one of {', '.join(filters)}")
    return whole(q, "page", 1, 1) - 1, page_size(q, sizes, default), filt
