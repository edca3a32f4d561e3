"""The agent's tools: their strict JSON schemas and the validation of a call.

Write tools take no defaults: every field is required, unknown or alias keys
(``file``, ``target``) are rejected and never guessed from. Only the read-only
tools have optional fields. Validation is pure and happens before any tool
touches the file system; a rejected call becomes an error string for the model.

Imports only the standard library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

READ_TOOLS = ("read_file", "list_dir")
WRITE_TOOLS = ("create_file", "apply_patch")
ALL_TOOLS = READ_TOOLS + WRITE_TOOLS

#: Largest slice ``read_file`` returns in one call (characters).
MAX_READ = 200_000


@dataclass(frozen=True)
class Field:
    name: str
    kind: type
    required: bool
    description: str
    minimum: int | None = None


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    fields: tuple[Field, ...]

    @property
    def writes(self) -> bool:
        return self.name in WRITE_TOOLS


TOOLS: dict[str, Tool] = {
    "read_file": Tool(
        "read_file",
        "Read a text file in the work directory. Returns at most `limit` characters starting at `offset`.",
        (
            Field("path", str, True, "File path relative to the work directory."),
            Field("offset", int, False, "Character offset to start at (null for 0).", 0),
            Field("limit", int, False, f"Maximum characters to return (null for {MAX_READ}).", 1),
        ),
    ),
    "list_dir": Tool(
        "list_dir",
        "List a directory in the work directory; directories end with '/'.",
        (Field("path", str, False, "Directory relative to the work directory (null for '.')."),),
    ),
    "create_file": Tool(
        "create_file",
        "Create a NEW file with the given content. Fails if the file exists. Both fields are required.",
        (
            Field("path", str, True, "New file path relative to the work directory, inside the allowed writes."),
            Field("content", str, True, "The complete file content."),
        ),
    ),
    "apply_patch": Tool(
        "apply_patch",
        "Apply a unified diff to ONE existing file that the request names. Both fields are required.",
        (
            Field("path", str, True, "Existing file path relative to the work directory, as named in the request."),
            Field("diff", str, True, "A unified diff (---/+++ headers optional, @@ hunks required) for that file only."),
        ),
    ),
}


def _json_type(kind: type) -> str:
    return "integer" if kind is int else "string"


def json_schema(tool: Tool) -> dict[str, Any]:
    """The parameters schema, in the form strict modes accept.

    Strict modes want every property listed in ``required``; an optional
    read field is therefore expressed as nullable, and null means "default".
    """
    props: dict[str, Any] = {}
    for f in tool.fields:
        t = _json_type(f.kind)
        prop: dict[str, Any] = {"type": t if f.required else [t, "null"], "description": f.description}
        props[f.name] = prop
    return {
        "type": "object",
        "properties": props,
        "required": [f.name for f in tool.fields],
        "additionalProperties": False,
    }


def openai_tools(names: list[str] | tuple[str, ...], *, strict: bool = True) -> list[dict[str, Any]]:
    """Chat completions ``tools``."""
    out = []
    for n in names:
        fn: dict[str, Any] = {
            "name": TOOLS[n].name,
            "description": TOOLS[n].description,
            "parameters": json_schema(TOOLS[n]),
        }
        if strict:
            fn["strict"] = True
        out.append({"type": "function", "function": fn})
    return out


def responses_tools(names: list[str] | tuple[str, ...], *, strict: bool = True) -> list[dict[str, Any]]:
    """Responses API ``tools`` (flat function tools; ``strict`` is required there)."""
    return [
        {
            "type": "function",
            "name": TOOLS[n].name,
            "description": TOOLS[n].description,
            "parameters": json_schema(TOOLS[n]),
            "strict": strict,
        }
        for n in names
    ]


def anthropic_tools(names: list[str] | tuple[str, ...], *, strict: bool = True) -> list[dict[str, Any]]:
    """Messages ``tools``; ``strict`` only where the model takes it (Claude 4.5 and later)."""
    out = []
    for n in names:
        tool: dict[str, Any] = {
            "name": TOOLS[n].name,
            "description": TOOLS[n].description,
            "input_schema": json_schema(TOOLS[n]),
        }
        if strict:
            tool["strict"] = True
        out.append(tool)
    return out


class CallRejected(ValueError):
    """A tool call that does nothing; the message goes back to the model."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise CallRejected(f"argument {k!r} is given twice")
        out[k] = v
    return out


def parse_arguments(raw: str) -> dict[str, Any]:
    """Parse a call's JSON arguments; duplicate keys are an error, not last-wins."""
    try:
        value = json.loads(raw or "{}", object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise CallRejected(f"arguments are not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise CallRejected("arguments must be a JSON object")
    return value


def validate(name: str, arguments: dict[str, Any], allowed: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """The call's arguments with read defaults filled, or ``CallRejected``.

    Write tools: every field present, a non-null value of the right type,
    nothing else. Read tools: missing or null optional fields take defaults.
    """
    if name not in allowed or name not in TOOLS:
        raise CallRejected(f"unknown tool {name!r}; this step allows {list(allowed)}")
    tool = TOOLS[name]
    known = {f.name for f in tool.fields}
    extra = sorted(set(arguments) - known)
    if extra:
        raise CallRejected(
            f"{name}: unknown argument(s) {extra}; allowed are {sorted(known)}. Nothing was done."
        )
    out: dict[str, Any] = {}
    for f in tool.fields:
        present = f.name in arguments and arguments[f.name] is not None
        if not present:
            if f.required or tool.writes:
                raise CallRejected(f"{name}: required argument {f.name!r} is missing. Nothing was done.")
            out[f.name] = None
            continue
        value = arguments[f.name]
        if f.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise CallRejected(f"{name}: argument {f.name!r} must be an integer")
        if f.kind is str and not isinstance(value, str):
            raise CallRejected(f"{name}: argument {f.name!r} must be a string")
        if f.minimum is not None and value < f.minimum:
            raise CallRejected(f"{name}: argument {f.name!r} must be >= {f.minimum}")
        out[f.name] = value
    return out
