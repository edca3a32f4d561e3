"""Size and work caps for template evaluation, and the capped operations.

Every operation that can make a value much bigger than its operands (``*``,
``**``, ``+``, ``%``, ``~``, ``join``, ``replace``, ``sum``, serialising) is
checked *before* it runs, against an estimate of the result's serialised size,
so a hostile template fails in microseconds instead of eating memory.

Imports nothing of stockade.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

#: Largest string or serialised collection an operation may produce.
MAX_SIZE = 1_000_000
#: Most elements a list/tuple produced by an operation may hold.
MAX_ITEMS = 100_000
#: Largest integer (in bits) arithmetic may produce.
MAX_INT_BITS = 16_384
#: Largest rendered string (a whole template may return a bigger input value as is).
MAX_OUTPUT = 16 * 1024 * 1024
#: Largest template source.
MAX_SOURCE = 100_000


class CapExceeded(Exception):
    """A template tried to build a value beyond a cap."""


class Weigher:
    """Estimates the serialised size of values, memoised by identity.

    One instance lives for one render, so each distinct object is weighed once
    and a chain of operations costs no more than the values it creates.
    """

    def __init__(self) -> None:
        self._memo: dict[int, tuple[Any, int]] = {}

    def weight(self, value: Any, limit: int = MAX_OUTPUT) -> int:
        if isinstance(value, str):
            return len(value) + 2
        if isinstance(value, bool) or value is None:
            return 5
        if isinstance(value, int):
            return value.bit_length() // 3 + 2
        if isinstance(value, float):
            return 24
        if not isinstance(value, (list, tuple, dict)):
            return 16
        hit = self._memo.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        total = 2
        # Iterative so deeply nested data cannot exhaust the Python stack.
        stack: list[Any] = [value]
        while stack:
            cur = stack.pop()
            if isinstance(cur, dict):
                children: Iterable[Any] = [x for kv in cur.items() for x in kv]
            elif isinstance(cur, (list, tuple)):
                children = cur
            else:
                total += self.weight(cur)
                continue
            for child in children:
                if isinstance(child, (list, tuple, dict)):
                    memo = self._memo.get(id(child))
                    if memo is not None and memo[0] is child:
                        total += memo[1] + 2
                    else:
                        stack.append(child)
                        total += 2
                else:
                    total += self.weight(child) + 2
                if total > limit:
                    return total
        self._memo[id(value)] = (value, total)
        return total


def _is_seq(value: Any) -> bool:
    return isinstance(value, (str, list, tuple))


def _len_check(kind: str, size: int, items: int | None = None) -> None:
    if size > MAX_SIZE:
        raise CapExceeded(f"{kind} would produce about {size:,} characters (limit {MAX_SIZE:,})")
    if items is not None and items > MAX_ITEMS:
        raise CapExceeded(f"{kind} would produce {items:,} elements (limit {MAX_ITEMS:,})")


def _int_check(kind: str, bits: float) -> None:
    if bits > MAX_INT_BITS:
        raise CapExceeded(f"{kind} would produce an integer of about {int(bits):,} bits (limit {MAX_INT_BITS:,})")


def check_binop(w: Weigher, op: str, left: Any, right: Any) -> None:
    """Raise CapExceeded if ``left op right`` would exceed a cap."""
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            if _is_seq(seq) and isinstance(n, int) and not isinstance(n, bool):
                if n <= 0:
                    return
                count = len(seq) * n
                _len_check("'*'", w.weight(seq) * n, None if isinstance(seq, str) else count)
                return
        if isinstance(left, int) and isinstance(right, int):
            _int_check("'*'", left.bit_length() + right.bit_length())
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            _int_check("'**'", left.bit_length() * right)
        if isinstance(left, (int, float)) and isinstance(right, (int, float)) and abs(right) > 1e6 and abs(left) > 1:
            raise CapExceeded("'**' exponent too large")
    elif op == "+":
        if _is_seq(left) and _is_seq(right):
            items = None if isinstance(left, str) else len(left) + len(right)
            _len_check("'+'", w.weight(left) + w.weight(right), items)
    elif op == "%" and isinstance(left, str):
        _len_check("'%'", len(left) + format_width(left) + w.weight(right))


_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]")


def format_width(fmt: str) -> int:
    """Upper bound on the padding a ``%`` format string adds; ``*`` widths are refused."""
    total = 0
    for m in _SPEC.finditer(fmt):
        width, prec = m.group(1), m.group(2)
        if width == "*" or prec == "*":
            raise CapExceeded("'%' with '*' widths is not allowed in templates")
        total += max(int(width or 0), int(prec or 0))
        if total > MAX_SIZE:
            raise CapExceeded(f"'%' format widths add more than {MAX_SIZE:,} characters")
    return total


def capped_join(w: Weigher, parts: Iterable[Any], sep: str = "") -> str:
    items = list(parts)
    if len(items) > MAX_ITEMS:
        raise CapExceeded(f"join over {len(items):,} elements (limit {MAX_ITEMS:,})")
    size = len(sep) * len(items)
    texts: list[str] = []
    for it in items:
        size += w.weight(it)
        _len_check("join", size)
        texts.append(it if isinstance(it, str) else str(it))
    return sep.join(texts)


def capped_replace(s: str, old: str, new: str, count: int = -1) -> str:
    n = s.count(old) if old else len(s) + 1
    if count >= 0:
        n = min(n, count)
    _len_check("replace", len(s) + n * max(len(new) - len(old), 0))
    return s.replace(old, new, count)


def capped_sum(w: Weigher, values: Iterable[Any], start: Any = 0) -> Any:
    total = start
    for v in values:
        if not isinstance(v, (int, float)) or isinstance(total, (list, tuple, str)):
            check_binop(w, "+", total, v)
        total = total + v
    return total


def check_size(w: Weigher, value: Any, what: str) -> None:
    if w.weight(value, MAX_OUTPUT) > MAX_OUTPUT:
        raise CapExceeded(f"{what} would be larger than {MAX_OUTPUT:,} characters")
