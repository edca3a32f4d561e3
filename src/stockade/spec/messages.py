"""Pydantic validation errors -> friendly Problems at the offending YAML node.

Pydantic's ``loc`` mixes data keys with union-branch tags; we align it with
the data to find the node, and collapse the errors of a union's branches into
one message. Pure: no I/O.

Must not import workspace, sandbox, runner, agent, publish, store, web or cli.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from stockade.errors import Problem
from stockade.spec.model import (
    MODEL_PATTERN,
    Agent,
    AgentParams,
    Budget,
    Endpoint,
    Publish,
    Resources,
    SandboxSettings,
    Step,
    Thinking,
    Workflow,
)

Pos = tuple[int, int]
DataPath = tuple[str | int, ...]

_MODELS: dict[str, type[BaseModel]] = {
    "agent": Agent, "publish": Publish, "resources": Resources, "sandbox": SandboxSettings,
}
#: Models nested in ``agent:`` (steps, i, agent, KEY[, KEY]).
_AGENT_MODELS: dict[str, type[BaseModel]] = {
    "params": AgentParams, "endpoint": Endpoint, "budget": Budget, "thinking": Thinking,
}


def model_at(path: DataPath) -> type[BaseModel] | None:
    if not path:
        return Workflow
    if len(path) == 2 and path[0] == "steps" and isinstance(path[1], int):
        return Step
    last = path[-1]
    if isinstance(last, str) and last in _MODELS and (last == "sandbox" or len(path) == 3):
        return _MODELS[last]
    if len(path) in (4, 5) and path[2] == "agent" and isinstance(last, str) and last in _AGENT_MODELS:
        return _AGENT_MODELS[last]
    return None


def allowed_keys(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def step_label(data: Any, index: int) -> str:
    steps = data.get("steps") if isinstance(data, dict) else None
    if isinstance(steps, list) and 0 <= index < len(steps):
        step = steps[index]
        if isinstance(step, dict) and isinstance(step.get("id"), str) and step["id"]:
            return f"step {step['id']!r}"
    return f"step {index + 1}"


def field_label(data: Any, path: DataPath) -> str:
    """``timeout of step 'a'``, ``agent.tools[0] of step 'b'``, ``vars.x``, ``name``."""
    if len(path) >= 2 and path[0] == "steps" and isinstance(path[1], int):
        rest = path[2:]
        where = step_label(data, path[1])
        if not rest:
            return where
        return f"{_dotted(rest)} of {where}"
    return _dotted(path) or "the workflow"


def _dotted(path: DataPath) -> str:
    out = ""
    for el in path:
        if isinstance(el, int):
            out += f"[{el}]"
        elif out:
            out += f".{el}"
        else:
            out = el
    return out


_ID_HELP = "lowercase letters, digits, '_' and '-', starting with a letter or digit"
_PATTERN_HELP = {
    r"^[a-z0-9][a-z0-9_-]*$": _ID_HELP,
    r"^[A-Za-z_][A-Za-z0-9_]*$": "letters, digits and '_', not starting with a digit",
    r"^(\*\.)?[A-Za-z0-9.-]+(:[0-9]{1,5})?$": "a host[:port] pattern such as api.example.com:443 or *.example.com",
    MODEL_PATTERN: "provider/model with provider openai, openai-responses, azure or anthropic, "
                   "e.g. openai/gpt-4.1-mini",
    r"^https?://[^\s/]+.*$": "an http:// or https:// URL, e.g. http://127.0.0.1:8000/v1",
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(-preview)?$": "an Azure api-version such as 2024-10-21",
}


#: Fields given in seconds whose name does not say so: a wrongly typed value
#: is told the unit (``tests/unit/test_spec.py`` checks this against the
#: fields ``spec.schema`` describes in seconds).
SECONDS_FIELDS = frozenset({"timeout", "retry_delay", "request_timeout", "lease_ttl", "max_age"})


def _expected(err: Mapping[str, Any]) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    simple: dict[str, str] = {
        "string_type": "a string", "int_type": "a whole number", "int_parsing": "a whole number",
        "int_from_float": "a whole number", "float_type": "a number", "float_parsing": "a number",
        "bool_type": "true or false", "bool_parsing": "true or false", "list_type": "a list",
        "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
        "finite_number": "a finite number",
    }
    if kind in simple:
        return simple[kind]
    if kind == "literal_error":
        return f"one of {ctx.get('expected', '?')}"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern", ""))
        return _PATTERN_HELP.get(pattern, f"a string matching {pattern}")
    if kind == "string_too_short":
        return "a non-empty string"
    if kind == "string_too_long":
        return f"at most {ctx.get('max_length')} characters"
    if kind == "too_short":
        return f"a list with at least {ctx.get('min_length')} entr{'y' if ctx.get('min_length') == 1 else 'ies'}"
    if kind == "greater_than":
        return f"greater than {_num(ctx.get('gt'))}"
    if kind == "greater_than_equal":
        return f"at least {_num(ctx.get('ge'))}"
    if kind == "less_than_equal":
        return f"at most {_num(ctx.get('le'))}"
    if kind == "less_than":
        return f"less than {_num(ctx.get('lt'))}"
    return str(err.get("msg", kind)).removeprefix("Input should be ")


def _num(v: Any) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _has(cur: Any, el: Any) -> bool:
    if isinstance(cur, dict):
        return isinstance(el, str) and el in cur
    return isinstance(cur, list) and isinstance(el, int) and 0 <= el < len(cur)


class _Aligned:
    def __init__(self, err: Mapping[str, Any], data: Any) -> None:
        self.err = err
        path: list[str | int] = []
        cur = data
        self.union: DataPath | None = None
        self.is_key = False
        self.tail: str | None = None  # a missing or unknown key under ``path``
        loc = list(err["loc"])
        if err["type"] == "extra_forbidden" and loc and isinstance(loc[-1], str):
            self.tail = loc.pop()
        for i, el in enumerate(loc):
            if _has(cur, el):
                path.append(el)
                cur = cur[el]
            elif el == "[key]":
                self.is_key = True
            elif i == len(loc) - 1 and isinstance(el, str) and err["type"] == "missing":
                self.tail = el
            elif self.union is None:
                self.union = tuple(path)
        self.path: DataPath = tuple(path)
        self.value = cur


def translate(
    errors: list[Any],
    data: Any,
    filename: str,
    position: Callable[[DataPath], Pos],
    key_position: Callable[[DataPath], Pos],
) -> list[Problem]:
    """One Problem per distinct error, union branches collapsed."""
    aligned = [_Aligned(e, data) for e in errors]
    groups: dict[tuple[DataPath | None, DataPath], list[_Aligned]] = {}
    plain: list[_Aligned] = []
    for a in aligned:
        if a.union is None:
            plain.append(a)
        else:
            groups.setdefault((a.union, a.union), []).append(a)
    problems: list[Problem] = []
    for a in plain:
        problems.append(_problem(a, data, filename, position, key_position))
    for members in groups.values():
        deepest = max(len(m.path) for m in members)
        best = [m for m in members if len(m.path) == deepest]
        if deepest > len(members[0].union or ()):
            for m in best:
                problems.append(_problem(m, data, filename, position, key_position))
            continue
        m = best[0]
        options = []
        for b in best:
            exp = _expected(b.err)
            if exp not in options:
                options.append(exp)
        message = f"{field_label(data, m.path)} must be {' or '.join(options)} (found {describe(m.value)})"
        problems.append(Problem(filename, *position(m.path), message))
    return problems


def _problem(
    a: _Aligned,
    data: Any,
    filename: str,
    position: Callable[[DataPath], Pos],
    key_position: Callable[[DataPath], Pos],
) -> Problem:
    err, path = a.err, a.path
    kind = err["type"]
    if kind == "extra_forbidden" and a.tail is not None:
        model = model_at(path)
        keys = allowed_keys(model) if model else []
        where = "at the top level" if not path else f"in {field_label(data, path)}"
        hint = difflib.get_close_matches(a.tail, keys, n=1)
        did = f"; did you mean {hint[0]!r}?" if hint else ""
        message = f"unknown key {a.tail!r} {where}{did} (allowed: {', '.join(keys)})"
        return Problem(filename, *key_position((*path, a.tail)), message)
    if kind == "missing" and a.tail is not None:
        if not path:
            return Problem(filename, *position(path), f"missing required key {a.tail!r} at the top level")
        at = key_position(path) if path and isinstance(path[-1], str) else position(path)
        return Problem(filename, *at, f"{field_label(data, path)} is missing required key {a.tail!r}")
    if a.is_key:
        label = field_label(data, path[:-1])
        return Problem(filename, *key_position(path),
                       f"key {path[-1]!r} in {label} must be {_expected(err)}")
    if kind == "value_error":
        message = str(err["msg"]).removeprefix("Value error, ")
        at = position(path)
        if "(found" in message and isinstance(a.value, dict):
            present = [k for k in ("run", "agent", "keep", "publish") if k in a.value]
            if len(present) > 1:
                at = key_position((*path, present[1]))
        elif message.startswith("keep:"):
            at = key_position((*path, "keep"))
        elif message.startswith(("mounts:", "image:")) and isinstance(a.value, dict):
            at = key_position((*path, message.split(":", 1)[0]))
        return Problem(filename, *at, f"{field_label(data, path)}: {message}")
    if kind in ("string_pattern_mismatch", "string_too_long") and path and path[-1] in ("id", "name"):
        what = "step id" if path[-1] == "id" else "workflow name"
        return Problem(filename, *position(path),
                       f"{what} {describe(a.value)} must be {_expected(err)}")
    expected = _expected(err)
    if expected in ("a number", "a whole number") and path and path[-1] in SECONDS_FIELDS:
        # timeout: 10m is a natural thing to write; the unit is the fix.
        expected += " of seconds"
    message = f"{field_label(data, path)} must be {expected} (found {describe(a.value)})"
    return Problem(filename, *position(path), message)
