"""The one sandboxed Jinja2 environment templates run in.

Key-first lookup on mappings, capped operators, an allowlist of filters,
tests and ``str`` methods, and the built-in functions ``from_json``,
``to_json`` and ``lines``. Imports nothing of stockade but ``stockade.refs`` (the
engine's ``$`` forms, which ``to_json`` keeps plain data from posing as).
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any, Protocol, runtime_checkable

from jinja2 import StrictUndefined, Undefined
from jinja2 import filters as jf
from jinja2 import tests as jt
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from stockade.expr._caps import (
    MAX_ITEMS,
    MAX_OUTPUT,
    CapExceeded,
    Weigher,
    capped_join,
    capped_replace,
    capped_sum,
    check_binop,
    check_size,
)
from stockade.refs import escape_data


@runtime_checkable
class Readable(Protocol):
    """Artifacts and host files: something whose text a template may read."""

    def read_text(self) -> str: ...


#: The weigher of the render in progress (templates render synchronously).
_weigher: ContextVar[Weigher] = ContextVar("stockade_expr_weigher")


def weigher() -> Weigher:
    w = _weigher.get(None)
    if w is None:
        w = Weigher()
        _weigher.set(w)
    return w


def new_weigher() -> object:
    return _weigher.set(Weigher())


def reset_weigher(token: object) -> None:
    _weigher.reset(token)  # type: ignore[arg-type]


class FunctionRefused(ValueError):
    """A template function refused its argument; the message names the
    function and what is wrong, so it is shown without a class name."""


def _text_of(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Readable):
        text = value.read_text()
        if len(text) > MAX_OUTPUT:
            raise CapExceeded(f"{what}: input of {len(text):,} characters (limit {MAX_OUTPUT:,})")
        return text
    raise FunctionRefused(f"{what} needs text or a file, got {type_name(value)}")


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Readable):
        return f"a file ({type(value).__name__})"
    return f"a {type(value).__name__}"


def from_json(value: Any) -> Any:
    """Parse JSON from a string or a Readable (artifact, host file).

    The result is plain data: a ``{"$artifact": ...}`` in it is a mapping
    like any other, never a reference (``to_json`` and the engine escape its
    key when they write it, a publish payload refuses it).
    """
    text = _text_of(value, "from_json")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FunctionRefused(f"from_json: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise FunctionRefused("from_json: JSON nested too deeply") from None


def _json_default(obj: Any) -> Any:
    hook = getattr(obj, "__stockade_json__", None)
    if callable(hook):
        return hook()
    if isinstance(obj, Undefined):
        obj._fail_with_undefined_error()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    raise FunctionRefused(f"to_json: cannot serialise {type_name(obj)}")


def to_json(value: Any) -> str:
    """Compact JSON with sorted keys; objects serialise through ``__stockade_json__``.

    Plain data's ``$artifact``/``$file``/``$tree`` keys are escaped
    (``$$artifact``): in JSON the engine writes, those keys are its own.
    """
    check_size(weigher(), value, "to_json")
    try:
        text = json.dumps(escape_data(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          default=_json_default, allow_nan=False)
    except RecursionError:
        raise FunctionRefused("to_json: value nested too deeply") from None
    if len(text) > MAX_OUTPUT:
        raise CapExceeded(f"to_json: {len(text):,} characters (limit {MAX_OUTPUT:,})")
    return text


def lines(value: Any) -> list[str]:
    """The lines of a string or file, without line ends and without a trailing empty line."""
    return _text_of(value, "lines").splitlines()


BUILTIN_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "from_json": from_json,
    "to_json": to_json,
    "lines": lines,
}
#: Functions supplied at render time by the engine (they read declared host paths).
HOST_FUNCTIONS = ("file", "tree")
FUNCTIONS = frozenset(BUILTIN_FUNCTIONS) | frozenset(HOST_FUNCTIONS)

#: ``str`` methods a template may call; the rest (``format``, ``center``, ...) are refused.
STR_METHODS = frozenset({
    "startswith", "endswith", "strip", "lstrip", "rstrip", "lower", "upper", "title",
    "capitalize", "split", "rsplit", "splitlines", "replace", "count", "find", "rfind",
    "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "removeprefix",
    "removesuffix", "partition", "rpartition", "join",
})


def _f_join(value: Iterable[Any], d: str = "", attribute: str | int | None = None) -> str:
    if attribute is not None:
        value = [ENV.getitem(v, attribute) for v in value]
    return capped_join(weigher(), value, d)


def _f_replace(s: Any, old: str, new: str, count: int | None = None) -> str:
    return capped_replace(str(s), old, new, -1 if count is None else count)


def _f_sum(values: Iterable[Any], attribute: str | int | None = None, start: Any = 0) -> Any:
    if attribute is not None:
        values = [ENV.getitem(v, attribute) for v in values]
    return capped_sum(weigher(), values, start)


def _f_list(value: Any) -> list[Any]:
    if isinstance(value, Mapping):
        value = value.keys()
    out: list[Any] = []
    for v in value:
        out.append(v)
        if len(out) > MAX_ITEMS * 10:
            raise CapExceeded(f"list of more than {MAX_ITEMS * 10:,} elements")
    return out


def _f_string(value: Any) -> str:
    if isinstance(value, str):
        return value
    check_size(weigher(), value, "string")
    return str(value)


def _keys(value: Mapping[Any, Any]) -> list[Any]:
    return list(value.keys())


def _values(value: Mapping[Any, Any]) -> list[Any]:
    return list(value.values())


def _items(value: Mapping[Any, Any]) -> list[list[Any]]:
    return [[k, v] for k, v in value.items()]


#: Filters: a short list of Jinja's own (all bounded by their input) plus ours.
FILTERS: dict[str, Callable[..., Any]] = {
    "length": len, "count": len,
    "lower": jf.do_lower, "upper": jf.do_upper, "trim": jf.do_trim,
    "capitalize": jf.do_capitalize, "title": jf.do_title,
    "default": jf.do_default, "d": jf.do_default,
    "first": jf.do_first, "last": jf.do_last,
    "int": jf.do_int, "float": jf.do_float, "abs": abs, "round": jf.do_round,
    "min": jf.do_min, "max": jf.do_max, "sort": jf.do_sort, "unique": jf.do_unique,
    "reverse": jf.do_reverse, "map": jf.do_map, "select": jf.do_select,
    "reject": jf.do_reject, "selectattr": jf.do_selectattr, "rejectattr": jf.do_rejectattr,
    "bool": bool,
    "join": _f_join, "replace": _f_replace, "sum": _f_sum, "list": _f_list,
    "string": _f_string, "keys": _keys, "values": _values, "items": _items,
    **BUILTIN_FUNCTIONS,
}

TESTS: dict[str, Callable[..., Any]] = {
    name: jt.TESTS[name]  # type: ignore[misc]
    for name in (
        "defined", "undefined", "none", "boolean", "true", "false", "integer", "float",
        "number", "string", "mapping", "sequence", "iterable", "eq", "ne", "lt", "le",
        "gt", "ge", "in", "even", "odd", "divisibleby", "lower", "upper", "sameas",
        "==", "!=", "<", "<=", ">", ">=", "equalto", "greaterthan", "lessthan",
    )
    if name in jt.TESTS
}

#: Internal filter the analyser substitutes for ``~`` so concatenation is capped too.
CONCAT_FILTER = "__stockade_concat__"


def _concat(first: Any, *rest: Any) -> str:
    return capped_join(weigher(), [_f_string(x) for x in (first, *rest)])


class _Undefined(StrictUndefined):
    __slots__ = ()


def _missing_key_hint(obj: Mapping[Any, Any], name: Any) -> str:
    keys = [str(k) for k in list(obj.keys())[:12]]
    more = ", ..." if len(obj) > 12 else ""
    have = f"; it has {', '.join(repr(k) for k in keys)}{more}" if keys else "; it is empty"
    return f"no key {name!r}{have}"


class StockadeEnvironment(ImmutableSandboxedEnvironment):
    """Key-first on mappings, capped operators, allowlisted calls."""

    intercepted_binops = frozenset({"*", "**", "+", "%", "//", "/", "-"})

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Mapping):
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                return self.undefined(hint=_missing_key_hint(obj, attribute), obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if isinstance(obj, Mapping):
            try:
                return obj[argument]
            except (KeyError, TypeError):
                return self.undefined(hint=_missing_key_hint(obj, argument), obj=obj, name=argument)
        return super().getitem(obj, argument)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        check_binop(weigher(), operator, left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(__obj, Undefined):
            __obj._fail_with_undefined_error()
        if isinstance(__obj, types.BuiltinMethodType) and isinstance(__obj.__self__, str):
            name = __obj.__name__
            if name not in STR_METHODS:
                raise SecurityError(f"calling str.{name}() is not allowed in templates")
            if name == "replace":
                return capped_replace(__obj.__self__, *args, **kwargs)
            if name == "join":
                if len(args) != 1 or kwargs:
                    raise TypeError("str.join() takes exactly one argument")
                return capped_join(weigher(), args[0], __obj.__self__)
            return __obj(*args, **kwargs)
        allowed = __context.get(ALLOWED_KEY)
        if isinstance(allowed, frozenset) and id(__obj) in allowed:
            return __obj(*args, **kwargs)
        raise SecurityError(f"calling {type_name(__obj)} is not allowed in templates")


#: Context key holding the ids of callables this render may call (not nameable in templates).
ALLOWED_KEY = "__stockade_allowed__"

#: Jinja's statement and comment tags are no part of stockade's templates.
#: With delimiters no one writes, ``{%`` and ``{#`` are text, as a shell
#: command needs them (``${#name}``, ``printf '{%s}'``); ``template`` refuses
#: what reads as a Jinja tag all the same.
BLOCK_START, COMMENT_START = "\x00{%", "\x00{#"

ENV = StockadeEnvironment(
    block_start_string=BLOCK_START,
    block_end_string="%}\x00",
    comment_start_string=COMMENT_START,
    comment_end_string="#}\x00",
    undefined=_Undefined,
    autoescape=False,
    keep_trailing_newline=True,
    cache_size=0,
)
ENV.globals.clear()
ENV.filters.clear()
ENV.filters.update(FILTERS)
ENV.filters[CONCAT_FILTER] = _concat
ENV.tests.clear()
ENV.tests.update(TESTS)
