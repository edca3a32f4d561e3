"""``load_workflow``: bytes -> a validated ``Spec``, or a UserError with every problem.

Pure: the caller reads the file; nothing here touches the disk or network.

Must not import workspace, sandbox, runner, agent, publish, store, web or cli.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from stockade.errors import Problem, UserError
from stockade.expr import Template, compile_template
from stockade.spec.checks import Checker
from stockade.spec.messages import DataPath, describe, translate
from stockade.spec.model import Workflow
from stockade.spec.shellholes import quoting_warnings
from stockade.spec.yamlload import load_yaml

Pos = tuple[int, int]


@dataclass(frozen=True)
class Spec:
    """A workflow that passed every check, with the positions of its nodes."""

    workflow: Workflow
    filename: str
    sha256: str
    files: tuple[str, ...]
    trees: tuple[str, ...]
    _data: Any = field(default=None, repr=False, compare=False)
    _positions: Mapping[DataPath, Pos] = field(default_factory=dict, repr=False, compare=False)
    _key_positions: Mapping[DataPath, Pos] = field(default_factory=dict, repr=False, compare=False)
    #: Templates compiled while checking, so big files never recompile after the LRU evicts.
    _templates: Mapping[DataPath, Template] = field(default_factory=dict, repr=False, compare=False)
    #: Not errors: the workflow runs, but likely not as meant (``FILE:LINE:COL: warning: ...``).
    warnings: tuple[Problem, ...] = field(default=(), compare=False)

    def position(self, *path: str | int) -> tuple[int, int]:
        """(line, col), 1-based, of the node at ``path``; its nearest known parent if absent."""
        return _nearest(self._positions, tuple(path))

    def key_position(self, *path: str | int) -> tuple[int, int]:
        """(line, col) of the key naming the node at ``path`` (its value's position if none)."""
        p = tuple(path)
        return self._key_positions.get(p) or _nearest(self._positions, p)

    def raw(self, *path: str | int) -> Any:
        """The value at ``path`` as written in the file (templates still as text)."""
        cur = self._data
        for el in path:
            cur = cur[el]
        return cur

    def templates(self) -> Mapping[DataPath, Template]:
        """Every template of the file by its path (compiled while checking)."""
        return self._templates

    def template(self, *path: str | int) -> Template:
        """The compiled template at ``path`` (cached); KeyError/TypeError if there is none."""
        hit = self._templates.get(tuple(path))
        if hit is not None:
            return hit
        value = self.raw(*path)
        if not isinstance(value, str):
            raise TypeError(f"{'.'.join(map(str, path))} is not a string")
        return compile_template(value)


def _nearest(table: Mapping[DataPath, Pos], path: DataPath) -> Pos:
    while path:
        hit = table.get(path)
        if hit is not None:
            return hit
        path = path[:-1]
    return table.get((), (1, 1))


def load_workflow(data: bytes, filename: str) -> Spec:
    """Parse and check a workflow; raises UserError listing every problem, sorted by position."""
    loaded = load_yaml(data, filename)
    if loaded.problems:
        raise _error(loaded.problems)
    raw = loaded.data

    def position(path: DataPath) -> Pos:
        return _nearest(loaded.positions, path)

    def key_position(path: DataPath) -> Pos:
        return loaded.key_positions.get(path) or _nearest(loaded.positions, path)

    if not isinstance(raw, dict):
        kind = "a list" if isinstance(raw, list) else f"the single value {describe(raw)}"
        raise _error([Problem(filename, *position(()),
                              f"the top level must be a mapping with name: and steps: (found {kind})")])
    problems: list[Problem] = []
    workflow: Workflow | None = None
    try:
        workflow = Workflow.model_validate(raw)
    except ValidationError as exc:
        problems.extend(translate(exc.errors(), raw, filename, position, key_position))
    checker = Checker(raw, filename, position, key_position)
    problems.extend(checker.run())
    if problems or workflow is None:
        raise _error(problems)
    files = sorted({f for t in checker.templates.values() for f in t.files})
    trees = sorted({f for t in checker.templates.values() for f in t.trees})
    return Spec(
        workflow=workflow,
        filename=filename,
        sha256=hashlib.sha256(data).hexdigest(),
        files=tuple(files),
        trees=tuple(trees),
        _data=raw,
        _positions=loaded.positions,
        _key_positions=loaded.key_positions,
        _templates=dict(checker.templates),
        warnings=tuple(quoting_warnings(raw.get("steps"), loaded.text, filename, position)),
    )


def _error(problems: list[Problem]) -> UserError:
    unique: list[Problem] = []
    for p in sorted(problems, key=lambda p: (p.line, p.col)):
        if p not in unique:
            unique.append(p)
    return UserError(problems=unique)
