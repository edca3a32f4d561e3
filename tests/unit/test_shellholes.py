"""Holes inside shell quotes in ``run:``: the scan by table, the warnings'
positions through ``load_workflow``."""

from __future__ import annotations

import pytest

from stockade.spec import load_workflow
from stockade.spec.shellholes import quoted_holes


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ('echo "{{ item }}"', [("{{ item }}", '"')]),
        ("echo '{{ item }}'", [("{{ item }}", "'")]),
        ("echo {{ item }}", []),
        ("cp {{ item }} out/{{ item }}.txt", []),
        ('echo "name: {{ item }}!"', [("{{ item }}", '"')]),
        ('echo "$(cat {{ item }})"', []),
        ('echo "$(echo "{{ item }}")"', [("{{ item }}", '"')]),
        ("echo `echo {{ a }}` \"{{ b }}\"", [("{{ b }}", '"')]),
        ('echo `echo "{{ a }}"`', [("{{ a }}", '"')]),
        ("echo $'{{ item }}'", [("{{ item }}", "'")]),
        # In $'...' a backslash escapes the quote; in '...' it is a character.
        ("echo $'it\\'s {{ item }}'", [("{{ item }}", "'")]),
        ("echo 'a\\' {{ item }}", []),
        ('echo "$(( 1 + 2 ))" {{ a }} "{{ b }}"', [("{{ b }}", '"')]),
        # Escaped quotes are not quotes.
        ('echo \\"{{ item }}\\"', []),
        ("echo \\'{{ item }}\\'", []),
        # A double quote inside single quotes, and the reverse, opens nothing.
        ("echo '\"' {{ item }} '\"'", []),
        ('echo "it\'s" {{ item }}', []),
        # Comments: quotes there mean nothing, and a # inside a word is no comment.
        ('# "{{ item }}"\necho {{ item }}', []),
        ('echo a#"{{ item }}"', [("{{ item }}", '"')]),
        ('echo ${#x} "{{ item }}"', [("{{ item }}", '"')]),
        # Here-documents: the body is text, whatever its quotes.
        ('cat <<EOF\n"{{ item }}"\nEOF\necho "{{ x }}"', [("{{ x }}", '"')]),
        ("cat <<'EOF' > f\n'{{ item }}'\nEOF", []),
        ("cat <<-END\n\t\"{{ item }}\"\n\tEND\necho '{{ y }}'", [("{{ y }}", "'")]),
        ('cat <<<"{{ item }}"', [("{{ item }}", '"')]),
        # Lost track: quotes left open, a here-document never ended. Say nothing.
        ('echo "{{ item }}" "open', []),
        ('cat <<EOF\n"{{ item }}"', []),
        # A hole whose expression holds quotes and braces is one hole.
        ("echo \"{{ steps.a.outputs['x.txt'] }}\"", [("{{ steps.a.outputs['x.txt'] }}", '"')]),
        ('echo "{{ a }}{{ b }}" {{ c }}', [("{{ a }}", '"'), ("{{ b }}", '"')]),
    ],
)
def test_quoted_holes(script: str, expected: list[tuple[str, str]]) -> None:
    assert [(h.text, h.quote) for h in quoted_holes(script)] == expected


def _warnings(text: str) -> list[str]:
    return [str(w) for w in load_workflow(text.encode(), "wf.yaml").warnings]


def test_warning_at_the_hole_in_a_block() -> None:
    got = _warnings(
        "name: q\n"
        "steps:\n"
        "  - id: a\n"
        "    for_each: [x]\n"
        "    run: |\n"
        "      echo start\n"
        "      echo \"{{ item }}\" > out/r.txt\n"
        "      echo 'at {{ item }}'\n"
        "      echo \"{{ item }}\" > out/r.txt\n"
    )
    assert got == [
        "wf.yaml:7:13: warning: step 'a': {{ item }} is inside \"...\", but run: already "
        "shell-quotes each value, so a value such as a b would come out as 'a b'; leave out "
        "the quotes around it",
        "wf.yaml:8:16: warning: step 'a': {{ item }} is inside '...', but run: already "
        "shell-quotes each value, so a value such as a b would be split into two words; "
        "end the quotes before it and open them again after it ('...'{{ item }}'...')",
        "wf.yaml:9:13: warning: step 'a': {{ item }} is inside \"...\", but run: already "
        "shell-quotes each value, so a value such as a b would come out as 'a b'; leave out "
        "the quotes around it",
    ]


@pytest.mark.parametrize(("script", "alone"), [
    ('echo "{{ item }}"', True),
    ('echo "at {{ item }}"', False),
    ('echo "{{ item }} at"', False),
    ('echo "{{ a }}{{ b }}"', False),
    ("echo '{{ item }}'", True),
])
def test_a_hole_alone_in_its_quotes(script: str, alone: bool) -> None:
    assert [h.alone for h in quoted_holes(script)][:1] == [alone]


@pytest.mark.parametrize(
    ("run", "at"),
    [
        # A plain value on the key's line: the hole itself.
        ('run: echo "{{ vars.who }}"', (5, 16)),
        # Written with YAML escapes, the script's text is not in the file: the value.
        ('run: "echo \\"{{ vars.who }}\\""', (5, 10)),
        # Folded, the lines are joined: the value.
        ('run: >\n      echo\n      "{{ vars.who }}"', (5, 10)),
    ],
)
def test_warning_position(run: str, at: tuple[int, int]) -> None:
    got = _warnings(f"name: q\nvars: {{who: x}}\nsteps:\n  - id: a\n    {run}\n")
    assert len(got) == 1
    assert got[0].startswith(f"wf.yaml:{at[0]}:{at[1]}: warning: step 'a': {{{{ vars.who }}}}")


def test_same_script_elsewhere_is_not_taken_for_the_hole() -> None:
    got = _warnings(
        "name: q\n"
        "steps:\n"
        "  - id: a\n"
        "    run: echo \"{{ run.id }}\"\n"
        "  - id: b\n"
        "    run: echo \"{{ run.id }}\"\n"
    )
    assert [w.split(": warning")[0] for w in got] == ["wf.yaml:4:16", "wf.yaml:6:16"]
    assert "step 'b'" in got[1]


def test_unquoted_holes_and_other_strings_give_no_warning() -> None:
    assert _warnings(
        "name: q\n"
        "vars: {who: '\"{{ not a template here }}\"'}\n"
        "steps:\n"
        "  - id: a\n"
        "    for_each: [x]\n"
        "    inputs: {n.txt: \"{{ item }}\"}\n"
        "    run: cat n.txt {{ item }} > out/r.txt\n"
    ) == []
