"""The import rules module docstrings state, checked against what each module imports.

A docstring says what its module must not import ("Must not import the
runner, the sandbox or the CLI.") or all it may import ("Standard library
only", "Imports only ``stockade.runner.status``", "Imports nothing of
stockade"). This test reads those sentences, maps their words to modules,
walks every import statement of the module (lazy ones inside functions
included; ``if TYPE_CHECKING:`` blocks excluded) and fails on a breach, or on
a rule it cannot read: the vocabulary below is the one to write rules in.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = SRC / "stockade"

#: Words a "must not import" sentence may use, and the modules they name.
WORDS: dict[str, tuple[str, ...]] = {
    "runner": ("stockade.runner",),
    "the runner": ("stockade.runner",),
    "workspace": ("stockade.workspace",),
    "sandbox": ("stockade.sandbox",),
    "the sandbox": ("stockade.sandbox",),
    "the sandbox backends": ("stockade.sandbox.bwrap", "stockade.sandbox.landlock",
                             "stockade.sandbox.macos", "stockade.sandbox.none"),
    "any sandbox backend": ("stockade.sandbox.bwrap", "stockade.sandbox.landlock",
                            "stockade.sandbox.macos", "stockade.sandbox.none"),
    "store": ("stockade.store",),
    "the store": ("stockade.store",),
    "cli": ("stockade.cli",),
    "the cli": ("stockade.cli",),
    "web": ("stockade.web",),
    "agent": ("stockade.agent",),
    "publish": ("stockade.publish",),
    "the engine": ("stockade.runner.engine",),
    "the session": ("stockade.runner.session",),
    "the spec": ("stockade.spec",),
    "the plan": ("stockade.plan",),
    "the runner's engine": ("stockade.runner.engine",),
    "the executors": ("stockade.runner.executor",),
    "httpx": ("httpx",),
    "pydantic": ("pydantic",),
    "dask": ("dask", "distributed"),
    "the rest of the package": ("stockade",),
    "the rest of stockade": ("stockade",),
}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    if not path.is_relative_to(SRC):
        return "stockade.runner._probe"
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names (TYPE_CHECKING blocks aside)."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in ast.walk(node):
                skip.add(id(child))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.add(mod)
            # ``from stockade.runner import engine`` imports stockade.runner.engine.
            found.update(f"{mod}.{a.name}" for a in node.names)
    return found


def _under(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


_FORBID = re.compile(r"must not import ([^.;:(]*)", re.IGNORECASE)
_NOTHING = re.compile(r"imports nothing (?:of stockade|from the rest of the package)"
                      r"(?: but (.*?))?(?:\.\s|\.$|;|$)", re.IGNORECASE)
_STDLIB = re.compile(r"standard library only|stdlib only|imports only the standard library",
                     re.IGNORECASE)


def _text(doc: str) -> str:
    return " ".join(doc.split())


def forbidden(doc: str) -> list[str]:
    """The module prefixes the docstring forbids; raises on words it cannot read."""
    out: list[str] = []
    for m in _FORBID.finditer(_text(doc)):
        phrase = m.group(1).replace("``", "")
        for word in re.split(r",\s*|\s+or\s+|\s+and\s+", phrase):
            w = word.strip().lower()
            if not w:
                continue
            if w not in WORDS:
                raise AssertionError(f"cannot read {word!r} in the rule {m.group(0)!r}")
            out.extend(WORDS[w])
    return out


def nothing_but(doc: str) -> list[str] | None:
    """"Imports nothing of stockade [but ``a`` and ``b``]": the stockade modules allowed."""
    m = _NOTHING.search(_text(doc))
    if m is None:
        return None
    return re.findall(r"``(stockade[\w.]*)``", m.group(1) or "")


def stdlib_only(doc: str) -> list[str] | None:
    """"Standard library only[, and ``stockade.x``]": the stockade modules also allowed."""
    text = _text(doc)
    m = _STDLIB.search(text)
    if m is None:
        return None
    sentence = re.split(r"\.\s|\.$", text[m.start():], maxsplit=1)[0]
    return re.findall(r"``(stockade\.[\w.]+)``", sentence)


def owner(mod: str, known: set[str]) -> str:
    """The module an import names (``stockade.x.Thing`` -> ``stockade.x``)."""
    while mod and mod not in known:
        mod = mod.rpartition(".")[0]
    return mod


CASES = [p for p in modules() if ast.get_docstring(ast.parse(p.read_text()))]


KNOWN = {module_name(p) for p in modules()}
DOCS = {module_name(p): ast.get_docstring(ast.parse(p.read_text())) or "" for p in modules()}
STDLIB_ONLY = {name for name, doc in DOCS.items() if stdlib_only(doc) is not None}


def check(path: Path, doc: str) -> None:
    name = module_name(path)
    own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = imports(path)
    for prefix in forbidden(doc):
        bad = sorted(m for m in found if _under(m, prefix) and not _under(name, prefix))
        if prefix == "stockade":
            bad = [m for m in bad if not _under(m, name)]
        assert not bad, f"{name} must not import {prefix} but imports {', '.join(bad)}"
    allowed = nothing_but(doc)
    if allowed is not None:
        for m in found:
            if not _under(m, "stockade"):
                continue
            mod = owner(m, KNOWN)
            ok = any(_under(mod, a) for a in allowed) or (
                own_package != "stockade" and _under(mod, own_package))
            assert ok, f"{name} imports nothing of stockade but {allowed}; it imports {mod}"
    extra = stdlib_only(doc)
    if extra is not None:
        for m in found:
            top = m.split(".")[0]
            if top != "stockade":
                assert top in STDLIB, f"{name} is standard library only but imports {m}"
                continue
            mod = owner(m, KNOWN)
            ok = mod in STDLIB_ONLY or any(_under(mod, a) for a in extra) or mod == own_package
            assert ok, f"{name} is standard library only but imports {mod}, which is not"


@pytest.mark.parametrize("path", CASES, ids=[module_name(p) for p in CASES])
def test_module_imports_follow_its_docstring(path: Path) -> None:
    check(path, DOCS.get(module_name(path), ""))


def test_every_module_states_its_rule() -> None:
    """A module's docstring says what it must not import or all it may import."""
    missing = [name for name, doc in DOCS.items()
               if doc and not forbidden(doc) and nothing_but(doc) is None
               and stdlib_only(doc) is None]
    assert not missing, f"modules without an import rule in their docstring: {missing}"


def test_the_rule_reader_catches_a_breach(tmp_path: Path) -> None:
    """Positive control: a module that breaks its own rule is caught."""
    bad = tmp_path / "probe.py"
    bad.write_text("from stockade.cli import main\n")
    with pytest.raises(AssertionError, match=r"must not import stockade\.cli"):
        check(bad, "Probe. Must not import the CLI.")
    with pytest.raises(AssertionError, match="imports nothing of stockade"):
        check(bad, "Probe. Imports nothing of stockade but ``stockade.errors``.")
    check(bad, "Probe. Must not import the engine.")  # a rule it keeps
    third = tmp_path / "third.py"
    third.write_text("import httpx\n")
    with pytest.raises(AssertionError, match="standard library only but imports httpx"):
        check(third, "Probe. Standard library only.")
    with pytest.raises(AssertionError, match="cannot read"):
        check(bad, "Probe. Must not import the moon.")
