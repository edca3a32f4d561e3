"""Template expressions: ``{{ }}`` over vars, run, steps and item.

Sandboxed Jinja2 with StrictUndefined, key-first lookup on mappings, capped
operators and an allowlist of filters, tests, functions and ``str`` methods.
Pure: no file or network I/O; imports nothing of stockade but ``stockade.errors``.

Text rendering rules: a string is itself, a Readable is its ``read_text()``,
a bool is ``true``/``false``, a number is ``str()``, a list or mapping is
compact JSON, and ``null`` is an error (use ``| default('')``). With
``shell=True`` every hole is ``shlex.quote``d (a list: each element quoted,
joined by spaces) and a whole-value template renders as text too.

Allowed: the roots ``vars run steps item``; ``file('rel')`` and
``tree('rel')`` (literal paths only, supplied by the engine at render time);
``from_json to_json lines`` as functions or filters; the filters in
``FILTERS`` (length count lower upper trim capitalize title default/d first
last int float abs round min max sort unique reverse map select reject
selectattr rejectattr bool join replace sum list string keys values items);
the tests in ``TESTS``; the ``str`` methods in ``STR_METHODS``. Everything
else (``{% %}``, ``range``, ``lipsum``, ``cycler``, ``namespace``, dunder
or ``_private`` attributes, ``str.format``) is refused at compile time.
Caps: ``MAX_SIZE`` characters (and ``MAX_ITEMS`` elements) per built value,
``MAX_INT_BITS`` per integer, ``MAX_OUTPUT`` per rendered text, checked
before the operation runs. Note Jinja's ``**`` is left-associative, so
``9**9**9`` is ``(9**9)**9`` (small); ``9**(9**9)`` is refused.
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
    renderer,
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
    "renderer",
    "to_json",
]
