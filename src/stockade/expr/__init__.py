"""Template expressions: ``{{ }}`` over vars, run, steps and item.

Sandboxed Jinja2 with StrictUndefined, key-first lookup on mappings, capped
operators and an allowlist of filters, tests, functions and ``str`` methods.
Pure: no file or network I/O; imports nothing of stockade but ``errors``.

Text rendering rules: a string is itself, a Readable is its ``read_text()``,
a bool is ``true``/``false``, a number is ``str()``, a list or mapping is
compact JSON, and ``null`` is an error (use ``| default('')``). With
``shell=True`` every hole is ``shlex.quote``d (a list: each element quoted,
joined by spaces) and a whole-value template renders as text too.
"""

from stockade.expr._caps import MAX_INT_BITS, MAX_ITEMS, MAX_OUTPUT, MAX_SIZE, MAX_SOURCE
from stockade.expr._env import FILTERS, STR_METHODS, TESTS, Readable, from_json, lines, to_json
from stockade.expr.template import (
    ExprError,
    RenderError,
    Template,
    compile_template,
    render,
    render_value,
)

__all__ = [
    "FILTERS",
    "MAX_INT_BITS",
    "MAX_ITEMS",
    "MAX_OUTPUT",
    "MAX_SIZE",
    "MAX_SOURCE",
    "STR_METHODS",
    "TESTS",
    "ExprError",
    "Readable",
    "RenderError",
    "Template",
    "compile_template",
    "from_json",
    "lines",
    "render",
    "render_value",
    "to_json",
]
