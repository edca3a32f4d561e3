"""Compile and render ``{{ }}`` template expressions.

A template is literal text with ``{{ expression }}`` holes; ``{% %}`` and
``{# #}`` are refused. Each hole is compiled separately so a whole-value
template returns its native value and a text template can quote each hole
for the shell. Imports nothing of stockade but ``stockade.errors`` and this
package.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jinja2 import Undefined, nodes
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError, UndefinedError

from stockade.errors import StockadeError
from stockade.expr._analyse import AnalysisError, Findings, analyse
from stockade.expr._caps import MAX_OUTPUT, MAX_SOURCE, CapExceeded
from stockade.expr._env import (
    ALLOWED_KEY,
    BUILTIN_FUNCTIONS,
    ENV,
    FunctionRefused,
    Readable,
    new_weigher,
    reset_weigher,
    to_json,
    type_name,
)


class ExprError(Exception):
    """A template that cannot be compiled (syntax, a refused construct)."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset


class RenderError(Exception):
    """A template failed while rendering (undefined name, wrong type, a cap)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


_Part = str | Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class Template:
    """A compiled template and everything it references."""

    source: str
    is_template: bool
    whole: bool
    steps_used: frozenset[str]
    vars_used: frozenset[str]
    uses_item: bool
    uses_run: bool
    files: tuple[str, ...]
    trees: tuple[str, ...]
    refs: tuple[str, ...]
    _parts: tuple[_Part, ...] = field(default=(), repr=False, compare=False)
    #: The one name a whole template is, as in ``{{ item }}`` (else None):
    #: rendered by a lookup, without Jinja.
    _bare: str | None = field(default=None, repr=False, compare=False)


def _line_offset(source: str, lineno: int | None) -> int | None:
    if lineno is None:
        return None
    lines = source.split("\n")
    return sum(len(line) + 1 for line in lines[: max(lineno - 1, 0)])


#: A Jinja statement (``{% if ... %}``, ``{%- for``) or comment (``{# ... #}``):
#: refused, where a shell's ``${#name}`` or ``printf '{%s}'`` is text.
_JINJA_TAG = re.compile(
    r"\{%-?\s*(?:if|elif|else|endif|for|endfor|set|endset|macro|endmacro|raw|endraw|block"
    r"|endblock|include|import|from|extends|with|endwith|filter|endfilter|call|endcall"
    r"|autoescape|endautoescape|do|break|continue)\b|\{#.*?#\}", re.DOTALL)


def _check_tags(source: str) -> None:
    tag = _JINJA_TAG.search(source)
    if tag is not None:
        raise ExprError(f"only {{{{ }}}} expressions are allowed (found {tag.group()[:2]!r}); "
                        "a shell's {# or {% is text, a Jinja statement or comment is not",
                        tag.start())
    try:
        offset = 0
        for _lineno, kind, value in ENV.lex(source):
            if kind in ("block_begin", "comment_begin", "raw_begin", "linestatement_begin", "linecomment_begin"):
                at = source.find(value, offset)
                raise ExprError("only {{ }} expressions are allowed (found " + repr(value) + ")",
                                at if at >= 0 else None)
            found = source.find(value, offset)
            if found >= 0 and value:
                offset = found + len(value)
    except TemplateSyntaxError as exc:
        raise ExprError(f"invalid template: {exc.message}", _line_offset(source, exc.lineno)) from None


_PATH_NODES = (nodes.Name, nodes.Getattr, nodes.Getitem, nodes.Const)


def _compile_expr(expr: nodes.Expr) -> Callable[[dict[str, Any]], Any]:
    # A bare path (``steps.x.items``) returns context data, which holds no
    # Undefined; only values the expression builds need the deep scan.
    deep = not all(isinstance(n, _PATH_NODES) for n in (expr, *expr.find_all(nodes.Node)))
    body = [nodes.Assign(nodes.Name("result", "store"), expr, lineno=expr.lineno or 1)]
    tmpl = ENV.from_string(nodes.Template(body, lineno=1))

    def evaluate(values: dict[str, Any]) -> Any:
        # ``values`` is built afresh by each render and ENV has no globals:
        # shared, so Jinja does not copy it again.
        # Built directly: ``Template.new_context`` would also copy the names
        # of its (empty) globals, a ChainMap walked in Python, on every render.
        ctx = ENV.context_class(ENV, values, tmpl.name, tmpl.blocks)
        for _ in tmpl.root_render_func(ctx):
            pass
        value = ctx.vars["result"]
        if isinstance(value, Undefined):
            value._fail_with_undefined_error()
        if deep:
            _check_defined(value)
        return value

    return evaluate


@functools.lru_cache(maxsize=4096)
def compile_template(source: str) -> Template:
    """Compile ``source``; raises ExprError. Cached on the source string."""
    if not isinstance(source, str):
        raise ExprError(f"a template must be a string, got {type_name(source)}")
    if len(source) > MAX_SOURCE:
        raise ExprError(f"template is {len(source):,} characters long (limit {MAX_SOURCE:,})", 0)
    if "{{" not in source and not _JINJA_TAG.search(source) and "\x00" not in source:
        return Template(source, False, False, frozenset(), frozenset(), False, False, (), (), (), (source,))
    _check_tags(source)
    found = Findings()
    parts: list[_Part] = []
    holes = 0
    last_hole: nodes.Node | None = None
    try:
        tree = ENV.parse(source)
        for out in tree.body:
            if not isinstance(out, nodes.Output):
                raise ExprError("only {{ }} expressions are allowed", _line_offset(source, out.lineno))
            for node in out.nodes:
                if isinstance(node, nodes.TemplateData):
                    parts.append(node.data)
                    continue
                holes += 1
                last_hole = node
                parts.append(_compile_expr(analyse(node, found)))
    except ExprError:
        raise
    except AnalysisError as exc:
        raise ExprError(exc.message, _line_offset(source, exc.lineno)) from None
    except TemplateSyntaxError as exc:
        raise ExprError(f"invalid template: {exc.message}", _line_offset(source, exc.lineno)) from None
    except TemplateError as exc:
        raise ExprError(f"invalid template: {exc.message or exc}", None) from None
    except (RecursionError, MemoryError, SyntaxError):
        raise ExprError("template expression is too deeply nested", None) from None
    if holes == 0:
        text = "".join(p for p in parts if isinstance(p, str))
        return Template(source, False, False, frozenset(), frozenset(), False, False, (), (), (), (text,))
    exprs = [p for p in parts if not isinstance(p, str)]
    whole = len(exprs) == 1 and all(p.strip() == "" for p in parts if isinstance(p, str))
    bare = None
    if whole:
        parts = list(exprs)
        if isinstance(last_hole, nodes.Name) and last_hole.ctx == "load":
            bare = last_hole.name
    return Template(
        source=source,
        is_template=True,
        whole=whole,
        steps_used=frozenset(found.steps),
        vars_used=frozenset(found.vars),
        uses_item=found.uses_item,
        uses_run=found.uses_run,
        files=tuple(found.files),
        trees=tuple(found.trees),
        refs=tuple(found.refs),
        _parts=tuple(parts),
        _bare=bare,
    )


def _check_defined(value: Any) -> None:
    """Fail on an Undefined anywhere in a (list/dict) result."""
    stack = [value]
    seen = 0
    while stack:
        cur = stack.pop()
        if isinstance(cur, Undefined):
            cur._fail_with_undefined_error()
        if isinstance(cur, (list, tuple)):
            stack.extend(cur)
        elif isinstance(cur, dict):
            stack.extend(cur.values())
        seen += 1
        if seen > 1_000_000:
            return


def _text(value: Any) -> str:
    """How a value reads inside a text template."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        raise RenderError("the expression gave null, which has no text; use `| default('')` if empty is meant")
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, Readable):
        text = value.read_text()
        if len(text) > MAX_OUTPUT:
            raise CapExceeded(f"a file of {len(text):,} characters inside text (limit {MAX_OUTPUT:,})")
        return text
    if isinstance(value, (list, tuple, dict)) or hasattr(value, "__stockade_json__"):
        return to_json(value)
    raise RenderError(f"cannot render {type_name(value)} as text")


def _shell(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(shlex.quote(_text(v)) for v in value)
    return shlex.quote(_text(value))


def render(
    t: Template,
    ctx: Mapping[str, Any],
    *,
    functions: Mapping[str, Callable[..., Any]] = {},
    shell: bool = False,
) -> Any:
    """Render a compiled template against ``ctx`` (keys: vars, run, steps, item).

    A whole-value template returns the value itself (a list stays a list, an
    artifact stays an artifact) unless ``shell`` is set; otherwise the result is
    a string, each hole shell-quoted when ``shell`` is set.
    """
    if not t.is_template:
        return t.source
    bare = _bare_data(t, functions)
    if bare is not None and not shell and bare in ctx:
        return ctx[bare]
    values: dict[str, Any] = dict(ctx)
    values.update(_globals(functions))
    return _render_values(t, values, shell)


def renderer(
    t: Template,
    ctx: Mapping[str, Any],
    name: str,
    *,
    functions: Mapping[str, Callable[..., Any]] = {},
) -> Callable[[Any], Any]:
    """``lambda v: render(t, {**ctx, name: v}, functions=functions)``, for many values.

    A ``keep:`` renders one rule for each of 100,000 items whose contexts
    differ only in ``item``: the names a template sees are gathered once here,
    not copied for every item. Each call still weighs its values with a
    weigher of its own (whose memo, shared, would keep every earlier item
    alive) and raises what ``render`` would.
    """
    if not t.is_template:
        return lambda value: t.source
    g = _globals(functions)
    bare = _bare_data(t, functions)
    if bare == name:
        return lambda value: value
    if bare is not None and bare in ctx:
        found = ctx[bare]
        return lambda value: found
    values: dict[str, Any] = dict(ctx)
    values.update(g)
    if name in g:
        # A function of that name wins over the value, as in ``render``.
        return lambda value: _render_values(t, values, False)

    def one(value: Any) -> Any:
        # Jinja reads ``values`` as its context's parent and never writes
        # to it: only this name changes from one call to the next.
        values[name] = value
        return _render_values(t, values, False)

    return one


def _bare_data(t: Template, functions: Mapping[str, Callable[..., Any]]) -> str | None:
    """The name a ``{{ name }}`` template reads from the context itself, as
    Jinja would resolve it (context data holds no Undefined); None for other
    templates, or when a function of that name wins."""
    if t._bare is None or t._bare in functions or t._bare in BUILTIN_FUNCTIONS:
        return None
    return t._bare


def _render_values(t: Template, values: dict[str, Any], shell: bool) -> Any:
    token = new_weigher()
    try:
        if t.whole and not shell:
            fn = t._parts[0]
            assert not isinstance(fn, str)
            return fn(values)
        out: list[str] = []
        size = 0
        for part in t._parts:
            if isinstance(part, str):
                piece = part
            else:
                value = part(values)
                piece = _shell(value) if shell else _text(value)
            size += len(piece)
            if size > MAX_OUTPUT:
                raise CapExceeded(f"rendered text is larger than {MAX_OUTPUT:,} characters")
            out.append(piece)
        return "".join(out)
    except (StockadeError, RenderError):
        raise
    except UndefinedError as exc:
        raise RenderError(_undefined_message(exc)) from None
    except SecurityError as exc:
        raise RenderError(f"not allowed: {exc}") from None
    except CapExceeded as exc:
        raise RenderError(f"limit exceeded: {exc}") from None
    except RecursionError:
        raise RenderError("value nested too deeply") from None
    except MemoryError:
        raise RenderError("out of memory while rendering") from None
    except FunctionRefused as exc:
        raise RenderError(str(exc)) from None
    except Exception as exc:  # a template is user input: any failure is theirs to fix
        raise RenderError(f"{type(exc).__name__}: {exc}") from None
    finally:
        reset_weigher(token)


#: The functions a template may call and the ids the sandbox allows, per
#: ``functions`` mapping: a run renders thousands of templates with the same one.
_GLOBALS: dict[int, tuple[Mapping[str, Callable[..., Any]], dict[str, Any]]] = {}


def _globals(functions: Mapping[str, Callable[..., Any]]) -> dict[str, Any]:
    hit = _GLOBALS.get(id(functions))
    # The mapping itself is kept in the entry, so its id cannot be reused by
    # another while cached; a mapping changed since is recomputed.
    if hit is not None and hit[0] is functions and len(hit[1]) == len(functions) + len(
            BUILTIN_FUNCTIONS) + 1 and all(hit[1].get(k) is v for k, v in functions.items()):
        return hit[1]
    values: dict[str, Any] = {**BUILTIN_FUNCTIONS, **functions}
    values[ALLOWED_KEY] = frozenset(id(f) for f in values.values())
    if len(_GLOBALS) > 64:
        _GLOBALS.clear()
    _GLOBALS[id(functions)] = (functions, values)
    return values


def _undefined_message(exc: UndefinedError) -> str:
    msg = str(exc.message or exc)
    return msg if "undefined" in msg or "no key" in msg else f"undefined: {msg}"


def render_value(
    value: Any,
    ctx: Mapping[str, Any],
    *,
    functions: Mapping[str, Callable[..., Any]] = {},
    shell: bool = False,
) -> Any:
    """Render every string inside ``value`` (lists and dicts recursively)."""
    if isinstance(value, str):
        try:
            t = compile_template(value)
        except ExprError as exc:
            raise RenderError(exc.message) from None
        return render(t, ctx, functions=functions, shell=shell)
    if isinstance(value, list):
        return [render_value(v, ctx, functions=functions, shell=shell) for v in value]
    if isinstance(value, tuple):
        return tuple(render_value(v, ctx, functions=functions, shell=shell) for v in value)
    if isinstance(value, dict):
        return {k: render_value(v, ctx, functions=functions, shell=shell) for k, v in value.items()}
    return value
