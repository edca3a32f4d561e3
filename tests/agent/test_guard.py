"""The write guard as a table: normalisation, writes globs, mention coupling, symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stockade.agent import guard


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("out/a.md", "out/a.md"),
        ("out//a.md", "out/a.md"),
        ("./out/a.md", "out/a.md"),
        ("out/./a.md", "out/a.md"),
        ("billing/utils.py", "billing/utils.py"),
    ],
)
def test_normalise_accepts(raw: str, expected: str) -> None:
    assert guard.normalise(raw) == expected


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("/etc/passwd", "absolute"),
        ("~/x", "absolute"),
        ("../secret.env", "traversal"),
        ("out/../../x", "traversal"),
        ("out/../out/a.md", "traversal"),  # even when it would cancel out
        ("", "non-empty"),
        (" out/a.md", "spaces"),
        ("out\\a.md", "backslash"),
        ("out/a\x00.md", "NUL"),
        ("out/payload.sh\rAllow out/report.md", r"control character \(U\+000D\)"),
        ("out/a\nb.md", r"control character \(U\+000A\)"),
        ("out/a\tb.md", r"control character \(U\+0009\)"),
        ("out/a\x1b[2Kb.md", r"control character \(U\+001B\)"),
        ("out/a\x7f.md", r"control character \(U\+007F\)"),
        ("out/a\x85.md", r"control character \(U\+0085\)"),
        ("out/a\x9b.md", r"control character \(U\+009B\)"),
        ("out/\u202egpj.sh", r"bidirectional text control \(U\+202E\)"),
        ("out/\u2067x.md", r"bidirectional text control \(U\+2067\)"),
        ("out/\u200fx.md", r"bidirectional text control \(U\+200F\)"),
        ("out/\u061cx.md", r"bidirectional text control \(U\+061C\)"),
        ("out/a\u200bb.md", r"format character \(U\+200B\)"),
        ("out/\ufeffa.md", r"format character \(U\+FEFF\)"),
        ("out/a\u2028b.md", r"line or paragraph separator \(U\+2028\)"),
        ("out/a\ud800b.md", r"unpaired surrogate \(U\+D800\)"),
        (".", "name a file"),
        (None, "string"),
        (3, "string"),
    ],
)
def test_normalise_rejects(raw: object, why: str) -> None:
    with pytest.raises(guard.PathRejected, match=why):
        guard.normalise(raw)


def test_list_root_allowed_only_when_asked() -> None:
    assert guard.normalise(".", allow_root=True) == "."
    with pytest.raises(guard.PathRejected):
        guard.normalise("..", allow_root=True)


@pytest.mark.parametrize(
    ("path", "writes", "ok"),
    [
        ("out/a.md", ["out/**"], True),
        ("out/deep/er/a.md", ["out/**"], True),
        ("outx/a.md", ["out/**"], False),
        ("a.md", ["out/**"], False),
        ("out/a.md", ["out/*.md"], True),
        ("out/sub/a.md", ["out/*.md"], False),
        ("repo/billing/utils.py", ["repo/**/*.py"], True),
        ("repo/utils.py", ["repo/**/*.py"], True),
        ("repo/utils.txt", ["repo/**/*.py"], False),
        ("out/a.md", [], False),
        ("out/a.md", ["out/a.?d"], True),
        ("out/caf\u00e9.md", ["out/*.md"], True),
        # no wildcard matches a control or format character, nor does a literal one
        ("repo/a\nb.py", ["repo/**/*.py"], False),
        ("repo/a\n/b.py", ["repo/**/*.py"], False),
        ("out/a\rb", ["out/**"], False),
        ("out/a\x1bb", ["out/*"], False),
        ("out/a\x85", ["out/a?"], False),
        ("out/\u202egpj.sh", ["**"], False),
        ("out/a\rb", ["out/a\rb"], False),
    ],
)
def test_writes_globs(path: str, writes: list[str], ok: bool) -> None:
    assert guard.allowed_by(path, writes) is ok


PROMPT = (
    "Extract the helper from billing/utils.py into `billing/tax.py`. See README.md, then (out/report.md). "
    "The bug is at shared/money.py:12; docs in [the guide](docs/guide.md), 'quoted/q.py', \"dq/d.py\"."
)


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("billing/utils.py", True),
        ("billing/tax.py", True),
        ("README.md", True),
        ("out/report.md", True),
        ("shared/money.py", True),
        ("docs/guide.md", True),
        ("quoted/q.py", True),
        ("dq/d.py", True),
        ("repo/billing/utils.py", True),  # inside one input folder (a tree)
        ("src/app.py", False),  # the seed-001 guess
        ("billing/app.py", False),
        ("a/b/billing/utils.py", False),
        ("utils.py", False),
    ],
)
def test_mention_coupling(path: str, named: bool) -> None:
    assert guard.named_in(path, guard.mentions(PROMPT)) is named


@pytest.mark.parametrize(
    ("raw", "writes", "prompt", "error"),
    [
        ("billing/utils.py", ["billing/**"], PROMPT, None),
        ("src/app.py", ["**"], PROMPT, "not named"),
        ("src/app.py", ["billing/**"], PROMPT, "allowed writes"),
        ("out/new.md", ["out/**"], None, None),
        ("../x", ["**"], None, "traversal"),
    ],
)
def test_check_write_target(raw: str, writes: list[str], prompt: str | None, error: str | None) -> None:
    if error is None:
        assert guard.check_write_target(raw, writes=writes, prompt=prompt) == guard.normalise(raw)
    else:
        with pytest.raises(guard.PathRejected, match=error):
            guard.check_write_target(raw, writes=writes, prompt=prompt)


def test_symlink_escape(tmp_path: Path) -> None:
    root = tmp_path / "work"
    (root / "out").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "out" / "link")
    os.symlink("../..", root / "up")
    assert guard.resolve_inside(root, "out/x.md") == root.resolve() / "out/x.md"
    for rel in ("out/link/x.md", "up/x"):
        with pytest.raises(guard.PathRejected, match="outside"):
            guard.resolve_inside(root, rel)
    assert not guard.is_symlink_free(root, "out/link/x.md")
    assert guard.is_symlink_free(root, "out/x.md")
