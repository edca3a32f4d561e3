"""Validate request bodies against the official SDKs' request types, strictly.

The ``openai`` and ``anthropic`` packages (test dependencies, no network)
describe every request body as ``TypedDict``s: ``CompletionCreateParams``,
``ResponseCreateParams``, ``MessageCreateParams``. A pydantic ``TypeAdapter``
of those is lenient where it matters here (unknown keys are ignored,
``Iterable`` fields are validated lazily, never), so this walks the same
types itself: every key must be declared, every required key present, every
value of its annotated type (``Literal``, unions, lists, nested TypedDicts),
recursively. The body the broker sent minus the streaming-only fields is
checked against the non-streaming params of its API.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin


@functools.cache
def _params(provider: str) -> Any:
    if provider in ("openai", "azure"):
        from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming

        return CompletionCreateParamsNonStreaming
    if provider == "openai-responses":
        from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming

        return ResponseCreateParamsNonStreaming
    from anthropic.types.message_create_params import MessageCreateParamsNonStreaming

    return MessageCreateParamsNonStreaming


def validate_request(provider: str, body: Any) -> list[str]:
    """Every way ``body`` departs from the official request type (empty: it conforms)."""
    return check(body, _params(provider), "body")


@functools.cache
def _hints(td: type) -> tuple[dict[str, Any], frozenset[str]]:
    hints = typing.get_type_hints(td, include_extras=True)
    required: set[str] = set()
    plain: dict[str, Any] = {}
    total = getattr(td, "__total__", True)
    for name, tp in hints.items():
        is_req = total
        while True:
            origin = get_origin(tp)
            if origin is Required:
                is_req, tp = True, get_args(tp)[0]
            elif origin is NotRequired:
                is_req, tp = False, get_args(tp)[0]
            elif origin is typing.Annotated:
                tp = get_args(tp)[0]
            else:
                break
        plain[name] = tp
        if is_req:
            required.add(name)
    return plain, frozenset(required)


def _is_typeddict(tp: Any) -> bool:
    import typing_extensions

    return isinstance(tp, type) and (typing.is_typeddict(tp) or typing_extensions.is_typeddict(tp))


def check(value: Any, tp: Any, path: str) -> list[str]:
    """Problems of ``value`` against annotation ``tp`` (``path`` names it in messages)."""
    if tp is Any or tp is object:
        return []
    origin = get_origin(tp)
    if origin is typing.Annotated:
        return check(value, get_args(tp)[0], path)
    if origin in (Union, types.UnionType):
        best: list[str] | None = None
        for alt in get_args(tp):
            errs = check(value, alt, path)
            if not errs:
                return []
            if best is None or len(errs) < len(best):
                best = errs
        return best or [f"{path}: no type of the union fits"]
    if origin is Literal:
        return [] if value in get_args(tp) else [f"{path}: {value!r} is not one of {get_args(tp)}"]
    if tp is type(None):
        return [] if value is None else [f"{path}: expected null, got {type(value).__name__}"]
    if _is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{path}: expected an object ({tp.__name__}), got {type(value).__name__}"]
        fields, required = _hints(tp)
        errs = [f"{path}: unknown field {k!r} for {tp.__name__}" for k in value if k not in fields]
        errs += [f"{path}: missing required field {k!r} of {tp.__name__}" for k in required if k not in value]
        for k, v in value.items():
            if k in fields:
                errs += check(v, fields[k], f"{path}.{k}")
        return errs
    if origin in (list, Sequence, Iterable, typing.Iterable) or origin is getattr(typing, "Sequence", None) \
            or tp in (list,):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        (item,) = get_args(tp) or (Any,)
        out: list[str] = []
        for i, v in enumerate(value):
            out += check(v, item, f"{path}[{i}]")
        return out
    if origin in (dict, Mapping) or tp in (dict,):
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        args = get_args(tp)
        if len(args) == 2:
            out = []
            for k, v in value.items():
                out += check(k, args[0], f"{path} key")
                out += check(v, args[1], f"{path}.{k}")
            return out
        return []
    if tp is str:
        return [] if isinstance(value, str) else [f"{path}: expected a string, got {value!r}"]
    if tp is bool:
        return [] if isinstance(value, bool) else [f"{path}: expected true/false, got {value!r}"]
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected an integer, got {value!r}"]
    if tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected a number, got {value!r}"]
    if isinstance(tp, typing.TypeVar | typing.ForwardRef):
        return []
    if isinstance(tp, type):
        return [] if isinstance(value, tp) else [f"{path}: expected {tp.__name__}, got {type(value).__name__}"]
    return []  # an annotation this walker does not know: accepted, not guessed at
