"""Static checks over a parsed template expression, and what it references.

Refuses every node, name, filter, test and call not on the allowlists, and
collects the steps, vars, files and value paths an expression reads so the
spec can check them and the plan can draw the information-flow graph.
Imports nothing of stockade but ``stockade.expr``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jinja2 import nodes
from jinja2.visitor import NodeTransformer

from stockade.expr._env import CONCAT_FILTER, FILTERS, FUNCTIONS, HOST_FUNCTIONS, STR_METHODS, TESTS

ROOTS = ("vars", "run", "steps", "item")
_ALLOWED_NODES: tuple[type[nodes.Node], ...] = (
    nodes.Const, nodes.List, nodes.Tuple, nodes.Dict, nodes.Pair, nodes.Keyword,
    nodes.Getattr, nodes.Getitem, nodes.Slice, nodes.Call, nodes.Filter, nodes.Test,
    nodes.CondExpr, nodes.Compare, nodes.Operand, nodes.And, nodes.Or, nodes.Not,
    nodes.Neg, nodes.Pos, nodes.Add, nodes.Sub, nodes.Mul, nodes.Div, nodes.FloorDiv,
    nodes.Mod, nodes.Pow, nodes.Concat, nodes.Name,
)
_NAMES_HELP = (
    "templates can use vars, run, steps, item and the functions "
    "file(), tree(), from_json, to_json, lines"
)


class AnalysisError(Exception):
    def __init__(self, message: str, lineno: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.lineno = lineno


@dataclass
class Findings:
    steps: set[str] = field(default_factory=set)
    vars: set[str] = field(default_factory=set)
    uses_item: bool = False
    uses_run: bool = False
    files: list[str] = field(default_factory=list)
    trees: list[str] = field(default_factory=list)
    refs: list[str] = field(default_factory=list)

    def ref(self, text: str) -> None:
        if text not in self.refs:
            self.refs.append(text)


def _fail(node: nodes.Node, message: str) -> AnalysisError:
    return AnalysisError(message, getattr(node, "lineno", None))


def _chain(node: nodes.Node) -> tuple[nodes.Node, list[nodes.Node]]:
    """Unwind ``a.b['c'][x]`` into its base and the accessors, outermost last."""
    accessors: list[nodes.Node] = []
    while isinstance(node, (nodes.Getattr, nodes.Getitem)):
        accessors.append(node)
        node = node.node
    accessors.reverse()
    return node, accessors


def _const_key(acc: nodes.Node) -> str | int | None:
    if isinstance(acc, nodes.Getattr):
        return acc.attr
    assert isinstance(acc, nodes.Getitem)
    if isinstance(acc.arg, nodes.Const) and isinstance(acc.arg.value, (str, int)) and not isinstance(acc.arg.value, bool):
        return acc.arg.value
    return None


def _fmt(acc: nodes.Node, key: str | int) -> str:
    if isinstance(acc, nodes.Getattr):
        return f".{key}"
    return f"[{key!r}]"


class Analyser:
    def __init__(self) -> None:
        self.found = Findings()

    def visit(self, node: nodes.Node) -> None:
        if not isinstance(node, _ALLOWED_NODES):
            raise _fail(node, f"{type(node).__name__.lower()} is not allowed in a template expression")
        if isinstance(node, (nodes.Getattr, nodes.Getitem)):
            self._access(node)
        elif isinstance(node, nodes.Name):
            self._name(node)
        elif isinstance(node, nodes.Call):
            self._call(node)
        elif isinstance(node, nodes.Filter):
            self._filter(node)
        elif isinstance(node, nodes.Test):
            if node.name not in TESTS:
                raise _fail(node, f"test {node.name!r} is not allowed (allowed: {', '.join(sorted(TESTS))})")
            self._args(node)
            self.visit(node.node)
        else:
            for child in node.iter_child_nodes():
                self.visit(child)

    def _args(self, node: nodes.Call | nodes.Filter | nodes.Test) -> None:
        if node.dyn_args is not None or node.dyn_kwargs is not None:
            raise _fail(node, "*args and **kwargs are not allowed in templates")
        for a in node.args:
            self.visit(a)
        for k in node.kwargs:
            self.visit(k.value)

    def _name(self, node: nodes.Name) -> None:
        name = node.name
        if name in FUNCTIONS:
            raise _fail(node, f"{name} is a function; call it as {name}(...)")
        if name not in ROOTS:
            raise _fail(node, f"unknown name {name!r}; {_NAMES_HELP}")
        if name in ("steps", "vars"):
            raise _fail(node, f"{name} must be followed by a literal name, as in {name}.x or {name}['x']")
        if name == "item":
            self.found.uses_item = True
        else:
            self.found.uses_run = True
        self.found.ref(name)

    def _access(self, node: nodes.Getattr | nodes.Getitem) -> None:
        base, accessors = _chain(node)
        for acc in accessors:
            if isinstance(acc, nodes.Getattr) and acc.attr.startswith("_"):
                raise _fail(acc, f"attribute {acc.attr!r} is private; use ['{acc.attr}'] for a key")
        if not (isinstance(base, nodes.Name) and base.name in ROOTS):
            self.visit(base)
            self._dynamic_keys(accessors)
            return
        root = base.name
        keys: list[tuple[nodes.Node, str | int]] = []
        for acc in accessors:
            key = _const_key(acc)
            if key is None:
                break
            keys.append((acc, key))
        # A path that continues with a computed key is shown as ``[...]``.
        more = "[...]" if len(keys) < len(accessors) else ""
        if root in ("steps", "vars"):
            if not keys or not isinstance(keys[0][1], str):
                raise _fail(node, f"{root} must be followed by a literal name, as in {root}.x or {root}['x']")
            first = keys[0][1]
            assert isinstance(first, str)
            (self.found.steps if root == "steps" else self.found.vars).add(first)
            text = f"{root}.{first}" + "".join(_fmt(a, k) for a, k in keys[1:])
        else:
            if root == "item":
                self.found.uses_item = True
            else:
                self.found.uses_run = True
            text = root + "".join(_fmt(a, k) for a, k in keys)
        self.found.ref(text + more)
        self._dynamic_keys(accessors)

    def _dynamic_keys(self, accessors: list[nodes.Node]) -> None:
        """Computed keys and slices are ordinary expressions to check."""
        for acc in accessors:
            if isinstance(acc, nodes.Getitem) and _const_key(acc) is None:
                self.visit(acc.arg)

    def _call(self, node: nodes.Call) -> None:
        target = node.node
        if isinstance(target, nodes.Name):
            fn = target.name
            if fn not in FUNCTIONS:
                raise _fail(node, f"unknown function {fn!r}; {_NAMES_HELP}")
            if fn in HOST_FUNCTIONS:
                if node.kwargs or node.dyn_args or node.dyn_kwargs or len(node.args) != 1 or not (
                    isinstance(node.args[0], nodes.Const) and isinstance(node.args[0].value, str)
                ):
                    raise _fail(node, f"{fn}() takes one literal path, as in {fn}('scripts/x.py')")
                path = node.args[0].value
                bucket = self.found.files if fn == "file" else self.found.trees
                if path not in bucket:
                    bucket.append(path)
                self.found.ref(f"{fn}({path!r})")
                return
            self._args(node)
            return
        if isinstance(target, nodes.Getattr):
            if target.attr not in STR_METHODS:
                raise _fail(node, f"method {target.attr!r} is not allowed (allowed: {', '.join(sorted(STR_METHODS))})")
            self._args(node)
            self.visit(target.node)
            return
        raise _fail(node, "only file(), tree(), from_json(), to_json(), lines() and str methods can be called")

    def _filter(self, node: nodes.Filter) -> None:
        if node.name not in FILTERS:
            raise _fail(node, f"filter {node.name!r} is not allowed (allowed: {', '.join(sorted(FILTERS))})")
        if node.name in ("map", "select", "reject", "selectattr", "rejectattr"):
            # Their first argument names a filter or test to apply: check it too.
            first = node.args[0] if node.args else None
            if isinstance(first, nodes.Const) and isinstance(first.value, str):
                pool = FILTERS if node.name == "map" else TESTS
                if node.name in ("selectattr", "rejectattr"):
                    second = node.args[1] if len(node.args) > 1 else None
                    first = second if isinstance(second, nodes.Const) else None
                    pool = TESTS
                if first is not None and isinstance(first.value, str) and first.value not in pool:
                    raise _fail(node, f"{node.name}: {first.value!r} is not an allowed filter or test")
            elif first is not None and node.name != "map":
                raise _fail(node, f"{node.name} needs a literal test name")
            for k in node.kwargs:
                if k.key == "attribute" and not isinstance(k.value, nodes.Const):
                    raise _fail(node, f"{node.name}: attribute= must be a literal")
        self._args(node)
        if node.node is not None:
            self.visit(node.node)


class _ConcatRewriter(NodeTransformer):
    """``a ~ b`` becomes a capped filter call so concatenation cannot blow up."""

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        parts = [self.visit(n) for n in node.nodes]
        return nodes.Filter(parts[0], CONCAT_FILTER, parts[1:], [], None, None, lineno=node.lineno)


def analyse(expr: nodes.Expr, found: Findings) -> nodes.Expr:
    a = Analyser()
    a.found = found
    a.visit(expr)
    out = _ConcatRewriter().visit(expr)
    assert isinstance(out, nodes.Expr)
    return out
