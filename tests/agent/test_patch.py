"""The unified-diff applier: strict, all or nothing; and the hand-out diff."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stockade.agent import patch

SRC = "a\nb\nc\nd\ne\nf\ng\n"


@pytest.mark.parametrize(
    ("text", "diff", "expected"),
    [
        (SRC, "@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n", "a\nb\nC\nd\ne\nf\ng\n"),
        # headers with a/ b/ prefixes and a preamble
        (SRC, "diff --git a/x.py b/x.py\nindex 1..2\n--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,3 @@\n a\n+a2\n b\n", "a\na2\nb\nc\nd\ne\nf\ng\n"),
        # line numbers off: found by context, nearest match
        (SRC, "@@ -40,3 +40,2 @@\n e\n-f\n g\n", "a\nb\nc\nd\ne\ng\n"),
        # two hunks
        (SRC, "@@ -1,1 +1,1 @@\n-a\n+A\n@@ -7,1 +7,1 @@\n-g\n+G\n", "A\nb\nc\nd\ne\nf\nG\n"),
        # no newline at end of the new file
        ("x\n", "@@ -1 +1 @@\n-x\n+y\n\\ No newline at end of file\n", "y"),
        # adding a newline at the end
        ("x", "@@ -1 +1 @@\n-x\n\\ No newline at end of file\n+x\n", "x\n"),
        # wrong @@ counts (models get them wrong): the body decides, context must match
        (SRC, "@@ -2,9 +2,1 @@\n b\n-c\n+C\n", "a\nb\nC\nd\ne\nf\ng\n"),
        # bare @@ and a stripped blank context line
        ("p\n\nq\n", "@@\n p\n\n-q\n+Q\n", "p\n\nQ\n"),
        # trailing blank lines after the diff are not context
        (SRC, "@@ -1 +1 @@\n-a\n+A\n\n\n", "A\nb\nc\nd\ne\nf\ng\n"),
        # insertion into an empty file
        ("", "@@ -0,0 +1,2 @@\n+p\n+q\n", "p\nq\n"),
    ],
)
def test_apply(text: str, diff: str, expected: str) -> None:
    assert patch.apply(text, diff, "x.py") == expected


@pytest.mark.parametrize(
    ("diff", "error"),
    [
        ("--- a/src/app.py\n+++ b/src/app.py\n@@ -1 +1 @@\n-a\n+A\n", "names 'src/app.py'"),
        ("--- /dev/null\n+++ b/x.py\n@@ -0,0 +1 @@\n+a\n", "existing file"),
        ("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+A\n--- a/y.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+A\n", "more than one file"),
        ("@@ -1,2 +1,2 @@\n-zzz\n+A\n b\n", "does not match"),
        ("just text", "no @@ hunks"),
        ("@@ -1,3 +1,3 @@\n", "empty"),
        ("@@\n-a\n+A\n b\n", None),  # bare @@, unique context: fine (see test_apply)
        ("@@ -1 +1 @@\n-a\n+A\n?weird\n", "prefix"),
        ("garbage\n+A\n", "not part of a hunk"),
    ],
)
def test_reject(diff: str, error: str | None) -> None:
    if error is None:
        patch.apply(SRC, diff, "x.py")
        return
    with pytest.raises(patch.PatchRejected, match=error):
        patch.apply(SRC, diff, "x.py")


def test_bare_hunk_must_be_unambiguous() -> None:
    with pytest.raises(patch.PatchRejected, match="several places"):
        patch.apply("x\ny\nx\n", "@@\n-x\n+z\n", "f")


def test_header_may_name_the_file_inside_an_input_folder() -> None:
    diff = "--- a/billing/utils.py\n+++ b/billing/utils.py\n@@ -1 +1 @@\n-a\n+A\n"
    assert patch.apply("a\n", diff, "repo/billing/utils.py") == "A\n"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (b"a\nb\n", b"a\nB\n"),
        (None, b"new\n"),
        (b"x\n", b"x"),
        (b"1\n2\n3\n4\n5\n6\n7\n8\n9\n", b"1\n2\n3\n4\nfive\n6\n7\n8\n9\n"),
    ],
)
def test_unified_applies_with_git(tmp_path: Path, before: bytes | None, after: bytes) -> None:
    """The hand-out diff is a real diff: git apply turns before into after."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    target = tmp_path / "d" / "f.txt"
    target.parent.mkdir()
    if before is not None:
        target.write_bytes(before)
    diff = patch.unified("d/f.txt", before, after)
    (tmp_path / "c.diff").write_text(diff)
    subprocess.run(["git", "apply", "c.diff"], cwd=tmp_path, check=True)
    assert target.read_bytes() == after


def test_unified_round_trips_through_apply() -> None:
    before, after = "a\nb\nc\n", "a\nbb\nc\nd\n"
    diff = patch.unified("x.py", before.encode(), after.encode())
    assert patch.apply(before, diff, "x.py") == after
    assert patch.unified("x.py", b"same", b"same") == ""
