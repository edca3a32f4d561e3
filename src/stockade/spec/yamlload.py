"""Bytes of a workflow file -> plain Python data plus the position of every node.

Uses ruamel.yaml's composer (node graph with marks) and builds the values
itself, so duplicate keys, aliases, merge keys, tags, tabs, bad UTF-8 and
binary junk all become Problems at the right line and column instead of
exceptions. Pure: no file I/O (the caller passes bytes).

Must not import workspace, sandbox, runner, agent, publish, store, web or cli.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from stockade.errors import Problem

#: Larger than any sensible workflow; keeps parse time bounded.
MAX_BYTES = 1024 * 1024
MAX_NODES = 200_000

Path = tuple[str | int, ...]
_TAG = "tag:yaml.org,2002:"


@dataclass
class Loaded:
    data: Any = None
    positions: dict[Path, tuple[int, int]] = field(default_factory=dict)
    key_positions: dict[Path, tuple[int, int]] = field(default_factory=dict)
    styles: dict[Path, str | None] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    #: The file as text (UTF-8, without a byte-order mark), once it decoded.
    text: str = ""


def _pos(node: Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _decode(data: bytes, filename: str, out: Loaded) -> str | None:
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        col = len(before) - (before.rfind(b"\n") + 1) + 1
        out.problems.append(Problem(filename, line, col,
                                    f"not valid UTF-8 (byte 0x{data[exc.start]:02x}); a workflow is a UTF-8 YAML text file"))
        return None
    bad = re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffe\uffff]", text)
    if bad is not None:
        head = text[: bad.start()]
        line = head.count("\n") + 1
        col = bad.start() - (head.rfind("\n") + 1) + 1
        out.problems.append(Problem(filename, line, col,
                                    f"control character U+{ord(bad.group()):04X}: this looks like binary data, not a YAML workflow"))
        return None
    return text


#: Flow collections nest no deeper than this; ruamel slows down sharply on deep nesting.
MAX_FLOW_DEPTH = 64


def _too_deep(text: str, filename: str) -> Problem | None:
    """A cheap bracket count (quotes ignored, so it over-counts, never under-counts)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "[{":
            depth += 1
            if depth > MAX_FLOW_DEPTH:
                head = text[:i]
                line = head.count("\n") + 1
                col = i - (head.rfind("\n") + 1) + 1
                return Problem(filename, line, col,
                               f"brackets nested more than {MAX_FLOW_DEPTH} deep; a workflow does not need this")
        elif ch in "]}" and depth:
            depth -= 1
    return None


def _yaml_problem(filename: str, exc: YAMLError, text: str) -> Problem:
    if not isinstance(exc, MarkedYAMLError):
        return Problem(filename, 1, 1, f"YAML syntax: {exc}")
    mark = exc.problem_mark or exc.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
    message = exc.problem or exc.context or "invalid YAML"
    if "\\t" in message or "\t" in message:
        return Problem(filename, line, col,
                       "YAML syntax: tab character: YAML indents with spaces only")
    if (exc.context == "while scanning a quoted scalar" and exc.context_mark is not None
            and "end of stream" in (exc.problem or "")):
        m = exc.context_mark
        return Problem(filename, m.line + 1, m.column + 1,
                       "YAML syntax: this quote is never closed (the file ends inside it)")
    if exc.context and exc.problem:
        message = f"{exc.problem} ({exc.context})"
    lines = text.splitlines()
    at = lines[line - 1] if 0 < line <= len(lines) else ""
    key = _KEY_START.match(at)
    if key and at[key.end():].startswith("{{"):
        return Problem(filename, line, key.end() + 1, UNQUOTED_TEMPLATE)
    hint = _syntax_hint(exc.problem or "", at, key, col)
    return Problem(filename, line, col, f"YAML syntax: {message}" + (f"; {hint}" if hint else ""))


#: ``key: `` (or ``- key: ``) at the start of a line: where the line's value begins.
_KEY_START = re.compile(r"\s*(?:-\s+)?[A-Za-z0-9_.-]+:(?:\s+|$)")


#: A ``{{ }}`` template as a value's first characters, without quotes.
UNQUOTED_TEMPLATE = ("a value that starts with {{ must be in quotes (\"{{ ... }}\"): without "
                     "them YAML reads { as the start of a mapping")


def _syntax_hint(problem: str, line: str, key: re.Match[str] | None, col: int) -> str:
    """What most likely went wrong, from the parser's complaint, the line it
    points at and where that line's value starts (``key``); empty when no
    common mistake fits."""
    value = line[key.end():] if key else ""
    if "cannot start any token" in problem and value[:1] in ("`", "@", "%"):
        return f"a value that starts with {value[0]} must be in quotes"
    if "mapping values are not allowed" in problem:
        if key and col > key.end():
            return ("a value that holds ': ' (a colon and a space) must be in quotes, or "
                    "written as a block (run: | and the command on the next lines)")
        return "check this line's indentation against the lines above it"
    if problem.startswith(("expected <block end>", "did not find expected")):
        return "check this line's indentation against the lines above it"
    return ""


def _scalar(node: ScalarNode) -> tuple[Any, str | None]:
    """The value of a scalar and, if it cannot be used, why."""
    tag = str(getattr(node.tag, "value", node.tag))
    text: str = node.value
    if not tag.startswith(_TAG):
        return text, f"YAML tags such as {tag} are not supported"
    kind = tag[len(_TAG):]
    if kind in ("str", "timestamp"):
        # An unquoted date stays the text the user wrote.
        return text, None
    if kind == "null":
        return None, None
    if kind == "bool":
        return text.lower() == "true", None
    if kind == "int":
        t = text.replace("_", "")
        try:
            return int(t, 0), None
        except ValueError:
            try:
                return int(t, 10), None
            except ValueError:
                return text, None
    if kind == "float":
        t = text.replace("_", "").lower()
        if t in (".inf", "+.inf"):
            return float("inf"), None
        if t == "-.inf":
            return float("-inf"), None
        if t == ".nan":
            return float("nan"), None
        try:
            return float(t), None
        except ValueError:
            return text, None
    return text, f"YAML type !!{kind} is not supported"


class _Builder:
    def __init__(self, filename: str, out: Loaded) -> None:
        self.filename = filename
        self.out = out
        self.count = 0

    def problem(self, at: tuple[int, int], message: str) -> None:
        self.out.problems.append(Problem(self.filename, at[0], at[1], message))

    def build(self, node: Node, path: Path) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise _TooBig
        self.out.positions[path] = _pos(node)
        if isinstance(node, ScalarNode):
            self.out.styles[path] = node.style
            value, why = _scalar(node)
            if why:
                self.problem(_pos(node), why)
            return value
        tag = str(getattr(node.tag, "value", node.tag))
        if not tag.startswith(_TAG):
            self.problem(_pos(node), f"YAML tags such as {tag} are not supported")
        if isinstance(node, SequenceNode):
            return [self.build(child, (*path, i)) for i, child in enumerate(node.value)]
        assert isinstance(node, MappingNode)
        if node.flow_style and self.out.text.startswith("{{", node.start_mark.index):
            self.problem(_pos(node), UNQUOTED_TEMPLATE)
            return None
        result: dict[str, Any] = {}
        first_at: dict[str, tuple[int, int]] = {}
        for knode, vnode in node.value:
            kpos = _pos(knode)
            if not isinstance(knode, ScalarNode):
                self.problem(kpos, "a key must be a plain name, not a list or mapping")
                continue
            key = str(knode.value)
            if str(getattr(knode.tag, "value", knode.tag)) == _TAG + "merge" or key == "<<":
                self.problem(kpos, "merge keys (<<) are not supported; write the keys out")
                continue
            if key in first_at:
                line, col = first_at[key]
                self.problem(kpos, f"duplicate key {key!r} (first at line {line}, column {col})")
                continue
            first_at[key] = kpos
            self.out.key_positions[(*path, key)] = kpos
            result[key] = self.build(vnode, (*path, key))
        return result


class _TooBig(Exception):
    pass


def load_yaml(data: bytes, filename: str) -> Loaded:
    """Parse ``data``; problems are collected in ``Loaded.problems`` (never raised)."""
    out = Loaded()
    if len(data) > MAX_BYTES:
        out.problems.append(Problem(filename, 1, 1,
                                    f"file is {len(data):,} bytes; a workflow may be at most {MAX_BYTES:,}"))
        return out
    text = _decode(data, filename, out)
    if text is None:
        return out
    out.text = text
    deep = _too_deep(text, filename)
    if deep is not None:
        out.problems.append(deep)
        return out
    # The safe composer keeps marks without gathering comments (several times faster).
    yaml = YAML(typ="safe", pure=True)
    try:
        # Aliases are refused before anything is built, so an alias bomb costs nothing;
        # without an anchor (&) there can be no alias, so most files skip this pass.
        aliases = [e for e in yaml.parse(text) if isinstance(e, AliasEvent)] if "&" in text else []
        for ev in aliases:
            m = ev.start_mark
            out.problems.append(Problem(filename, m.line + 1, m.column + 1,
                                        f"YAML aliases (*{ev.anchor}) are not supported; write the value out"))
        if aliases:
            return out
        root = yaml.compose(text)
    except YAMLError as exc:
        out.problems.append(_yaml_problem(filename, exc, text))
        return out
    except RecursionError:
        out.problems.append(Problem(filename, 1, 1, "YAML nested too deeply"))
        return out
    if root is None:
        out.problems.append(Problem(filename, 1, 1,
                                    "the file is empty; a workflow needs at least name: and steps:"))
        return out
    try:
        out.data = _Builder(filename, out).build(root, ())
    except _TooBig:
        out.problems.append(Problem(filename, 1, 1, f"more than {MAX_NODES:,} YAML nodes"))
        out.data = None
    except RecursionError:
        out.problems.append(Problem(filename, 1, 1, "YAML nested too deeply"))
        out.data = None
    return out
