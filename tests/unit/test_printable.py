"""How a name reaches a terminal: non-printable characters escaped, others as they are."""

from __future__ import annotations

import pytest

from stockade._show import printable


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("out/report.md", "out/report.md"),
        ("out/caf\u00e9 \u6587.md", "out/caf\u00e9 \u6587.md"),
        ("a\\b", "a\\b"),  # all printable: left alone
        ("out/a\rb", "out/a\\rb"),
        ("out/a\nb", "out/a\\nb"),
        ("out/a\tb", "out/a\\tb"),
        ("out/c\x1b[2Kd", "out/c\\x1b[2Kd"),
        ("out/\x7f\x9b", "out/\\x7f\\x9b"),
        ("out/\u202egpj.sh", "out/\\u202egpj.sh"),
        ("out/a\u200bb", "out/a\\u200bb"),
        ("a\\x1b\r", "a\\\\x1b\\r"),  # a backslash beside an escape is doubled
    ],
)
def test_printable(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert printable(text).isprintable()
