"""Template expressions: typing, quoting, key-first lookup, refs, hostile input."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

from stockade.expr import (
    ExprError,
    Readable,
    RenderError,
    compile_template,
    render,
    render_value,
)


@dataclass(frozen=True)
class FakeFile:
    """A Readable like an artifact or host file."""

    text: str

    def read_text(self) -> str:
        return self.text

    def __stockade_json__(self) -> dict[str, Any]:
        return {"$file": "f", "n": len(self.text)}


CTX: dict[str, Any] = {
    "vars": {"date": "2026-09-14", "n": "3", "items": "a var named items", "_hidden": "ok"},
    "run": {"id": "r-1"},
    "steps": {
        "gather": {
            "result": "HOLDS ok\n",
            "items": [{"index": 0, "value": "eu", "result": "x", "outputs": {}}],
            "outputs": {"regions.json": FakeFile('["eu", "us"]'), "notes.txt": FakeFile("l1\nl2\n")},
        },
        "my-step": {"result": 7, "items": [], "outputs": {}},
    },
    "item": {"index": 2, "value": "us", "result": "HOLDS: yes", "outputs": {"r.md": FakeFile("# R")}},
}
FUNCS = {"file": lambda p: FakeFile(f"content of {p}"), "tree": lambda p: {"tree": p}}


def r(source: str, *, shell: bool = False, ctx: dict[str, Any] | None = None) -> Any:
    return render(compile_template(source), CTX if ctx is None else ctx, functions=FUNCS, shell=shell)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # a whole-value template keeps its type
        ("{{ steps.gather.items }}", CTX["steps"]["gather"]["items"]),
        ("  {{ [1, 2] }}\n", [1, 2]),
        ("{{ 3 }}", 3),
        ("{{ 1 < 2 }}", True),
        ("{{ {'a': [1]} }}", {"a": [1]}),
        ("{{ item }}", CTX["item"]),
        ("{{ steps.gather.outputs['regions.json'] | from_json }}", ["eu", "us"]),
        ("{{ from_json(steps.gather.outputs['regions.json']) }}", ["eu", "us"]),
        ("{{ steps.gather.outputs['notes.txt'] | lines }}", ["l1", "l2"]),
        ("{{ lines('a\nb\n\n') }}", ["a", "b", ""]),
        ("{{ to_json({'b': 1, 'a': [1, 2]}) }}", '{"a":[1,2],"b":1}'),
        ("{{ {'b': 1, 'a': 'é'} | to_json }}", '{"a":"é","b":1}'),
        ("{{ to_json([item.outputs['r.md']]) }}", '[{"$file":"f","n":3}]'),
        ("{{ item.result.startswith('HOLDS') }}", True),
        ("{{ item.result.split(':')[1].strip() }}", "yes"),
        ("{{ vars.n | int + 1 }}", 4),
        ("{{ vars.missing | default('d') }}", "d"),
        ("{{ vars.date is defined and vars.zzz is undefined }}", True),
        ("{{ [3, 1, 2] | sort | join('-') }}", "1-2-3"),
        ("{{ ['a', 'b'] | map('upper') | list }}", ["A", "B"]),
        ("{{ steps.gather.items | map(attribute='value') | list }}", ["eu"]),
        ("{{ {'k': 1} | items }}", [["k", 1]]),
        ("{{ 'x' if item.index > 1 else 'y' }}", "x"),
        ("{{ vars.date ~ '/' ~ run.id }}", "2026-09-14/r-1"),
        ("{{ 'ab' * 2 }}", "abab"),
        ("{{ 2 ** 10 }}", 1024),
        ("{{ 9**9**9 }}", (9**9) ** 9),  # Jinja's ** is left-associative: small
        ("{{ '%05d' % 42 }}", "00042"),
        ("{{ ','.join(['a', 'b']) }}", "a,b"),
        ("{{ 'a-b'.replace('-', '+') }}", "a+b"),
        ("plain text, no template", "plain text, no template"),
        ("{{ file('scripts/x.py') }}", FakeFile("content of scripts/x.py")),
        ("{{ tree('src') }}", {"tree": "src"}),
        # key-first: a mapping's keys win over dict methods
        ("{{ vars.items }}", "a var named items"),
        ("{{ steps['my-step'].result }}", 7),
        ("{{ vars['_hidden'] }}", "ok"),
        ("{{ item['outputs']['r.md'] | string }}", "FakeFile(text='# R')"),
    ],
)
def test_whole_values_keep_their_type(source: str, expected: Any) -> None:
    assert r(source) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("date={{ vars.date }}", "date=2026-09-14"),
        ("{{ vars.date }} and {{ run.id }}", "2026-09-14 and r-1"),
        ("n={{ 1 + 1 }} ok={{ true }}", "n=2 ok=true"),
        ("list={{ [1, 'a'] }}", 'list=[1,"a"]'),
        ("file: {{ steps.gather.outputs['notes.txt'] }}", "file: l1\nl2\n"),
        ("keep\n{{ vars.date }}\n", "keep\n2026-09-14\n"),  # trailing newline kept
    ],
)
def test_text_templates(source: str, expected: str) -> None:
    assert r(source) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("echo {{ vars.date }}", "echo 2026-09-14"),
        ("echo {{ 'a b' }}", "echo 'a b'"),
        ("echo {{ \"it's\" }}", "echo 'it'\"'\"'s'"),
        ("echo {{ '$(rm -rf /)' }}", "echo '$(rm -rf /)'"),
        ("echo {{ ['a b', 'c', ';'] }}", "echo 'a b' c ';'"),
        ("echo {{ '' }}", "echo ''"),
        ("cat {{ steps.gather.outputs['notes.txt'] }}", "cat 'l1\nl2\n'"),
        ("{{ 'x y' }}", "'x y'"),  # whole templates render as quoted text under shell=True
        ("echo {{ true }} {{ 3 }}", "echo true 3"),
        ("plain $HOME", "plain $HOME"),
        # A shell's own braces are text, not Jinja tags.
        ('echo "${#TOKEN}" {{ 3 }}', 'echo "${#TOKEN}" 3'),
        ("printf '{%s}\\n' {{ 'a b' }}", "printf '{%s}\\n' 'a b'"),
        ("n=${#arr[@]}; echo {#x} {%d}", "n=${#arr[@]}; echo {#x} {%d}"),
    ],
)
def test_shell_quoting(source: str, expected: str) -> None:
    assert r(source, shell=True) == expected


@pytest.mark.parametrize(
    ("source", "fields"),
    [
        ("{{ vars.report_date }}", {"vars_used": {"report_date"}, "refs": ("vars.report_date",), "whole": True}),
        ("{{ steps.gather.outputs['regions.json'] | from_json }}",
         {"steps_used": {"gather"}, "refs": ("steps.gather.outputs['regions.json']",)}),
        ("{{ steps['gather'].items }}", {"steps_used": {"gather"}, "refs": ("steps.gather.items",)}),
        ("{{ steps.a.result }} {{ steps.b.items[0].result }}",
         {"steps_used": {"a", "b"}, "refs": ("steps.a.result", "steps.b.items[0].result"), "whole": False}),
        ("{{ item }}", {"uses_item": True, "refs": ("item",)}),
        ("{{ item.outputs['report.md'] }}", {"uses_item": True, "refs": ("item.outputs['report.md']",)}),
        ("{{ item.result.startswith('HOLDS') }}", {"refs": ("item.result",)}),
        ("{{ run.id }}", {"uses_run": True, "uses_item": False, "refs": ("run.id",)}),
        ("{{ file('scripts/fetch.py') }}", {"files": ("scripts/fetch.py",), "refs": ("file('scripts/fetch.py')",)}),
        ("{{ tree('repo') }} {{ file('a') }} {{ file('a') }}", {"trees": ("repo",), "files": ("a",)}),
        ("{{ vars[steps.x.result] if true else vars.y }}", None),  # dynamic vars key: refused below
        ("no template here", {"is_template": False, "whole": False, "refs": ()}),
        ("{{ steps.x.outputs[vars.name] }}", {"steps_used": {"x"}, "vars_used": {"name"},
                                              "refs": ("steps.x.outputs[...]", "vars.name")}),
    ],
)
def test_refs_and_usage(source: str, fields: dict[str, Any] | None) -> None:
    if fields is None:
        with pytest.raises(ExprError):
            compile_template(source)
        return
    t = compile_template(source)
    assert t.is_template == fields.get("is_template", True)
    for name, want in fields.items():
        got = getattr(t, name)
        assert (set(got) if isinstance(want, set) else got) == want, name


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{% for x in y %}{{ x }}{% endfor %}", "only {{ }} expressions are allowed"),
        ("{% if true %}x{% endif %}", "only {{ }} expressions are allowed"),
        ("a {# comment #}", "only {{ }} expressions are allowed"),
        ("{% raw %}{{ x }}{% endraw %}", "only {{ }} expressions are allowed"),
        ("{%- set x = 1 %}", "only {{ }} expressions are allowed"),
        ("a {#\n two lines #} b", "only {{ }} expressions are allowed"),
        ("a \x00{% if x %}", "only {{ }} expressions are allowed"),
        ("{{ x }}", "unknown name 'x'"),
        ("{{ lipsum() }}", "unknown function 'lipsum'"),
        ("{{ cycler.__init__.__globals__ }}", "private"),
        ("{{ range(10**9) | list }}", "unknown function 'range'"),
        ("{{ namespace() }}", "unknown function 'namespace'"),
        ("{{ self }}", "unknown name 'self'"),
        ("{{ joiner }}", "unknown name 'joiner'"),
        ("{{ vars.__class__.__mro__ }}", "private"),
        ("{{ ''.__class__ }}", "private"),
        ("{{ item._private }}", "private"),
        ("{{ vars.date.format(1) }}", "method 'format' is not allowed"),
        ("{{ vars.date.center(10**9) }}", "method 'center' is not allowed"),
        ("{{ steps.x.items.append(1) }}", "method 'append' is not allowed"),
        ("{{ x | attr('y') }}", "filter 'attr' is not allowed"),
        ("{{ vars.a | indent(10**9) }}", "filter 'indent' is not allowed"),
        ("{{ vars.a is callable }}", "test 'callable' is not allowed"),
        ("{{ steps }}", "steps must be followed by a literal name"),
        ("{{ steps[vars.a].result }}", "steps must be followed by a literal name"),
        ("{{ vars }}", "vars must be followed by a literal name"),
        ("{{ file(vars.a) }}", "file() takes one literal path"),
        ("{{ file }}", "file is a function"),
        ("{{ from_json(*vars.a) }}", "*args"),
        ("{{ vars.a ", "invalid template"),
        ("{{ vars.a.b( }}", "invalid template"),
        ("{{ " + "(" * 400 + "1" + ")" * 400 + " }}", "too deeply nested"),
        ("{{ " + "1+" * 30000 + "1 }}", "too deeply nested"),
        ("x" * 100_001, "limit"),
    ],
)
def test_compile_errors(source: str, message: str) -> None:
    start = time.process_time()  # CPU time: other load does not count
    with pytest.raises(ExprError) as info:
        compile_template(source)
    assert message in info.value.message
    assert time.process_time() - start < 2


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{ 'a' * 10**10 }}", "limit exceeded"),
        ("{{ [1] * 10**9 }}", "limit exceeded"),
        ("{{ (1,) * 10**9 }}", "limit exceeded"),
        ("{{ [[1] * 100000] * 100000 }}", "limit exceeded"),
        ("{{ 9 ** (9 ** 9) }}", "limit exceeded"),
        ("{{ 10 ** 100000 }}", "limit exceeded"),
        ("{{ 2.0 ** 100000 }}", "OverflowError"),
        ("{{ (9**4000) * (9**4000) * (9**4000) }}", "limit exceeded"),
        ("{{ ''.join(['a' * 1000000] * 1000) }}", "limit exceeded"),
        ("{{ ('a' * 900000) ~ ('b' * 900000) }}", "limit exceeded"),
        ("{{ ('a' * 900000) + ('b' * 900000) }}", "limit exceeded"),
        ("{{ ['x' * 900000, 'y' * 900000] | join }}", "limit exceeded"),
        ("{{ ('a' * 100000).replace('a', 'aaaaaaaaaaaaaaaaaaaaaaaaaa') }}", "limit exceeded"),
        ("{{ (['a' * 100000] * 10) | sum(start='') }}", "limit exceeded"),
        ("{{ ([[1] * 1000] * 1000) | sum(start=[]) }}", "limit exceeded"),
        ("{{ '%999999999d' % 1 }}", "limit exceeded"),
        ("{{ '%*d' % (10**9, 1) }}", "limit exceeded"),
        ("{{ ('%999d' * 200000) % ((1,) * 200000) }}", "limit exceeded"),
        ("{{ vars.date['__class__'] }}", "not allowed"),
        ("{{ item.index['__class__'] }}", "not allowed"),
        ("{{ steps.gather.nope }}", "no key 'nope'"),
        ("{{ steps.other.result }}", "no key 'other'"),
        ("{{ vars.zzz }}", "no key 'zzz'"),
        ("x{{ vars.zzz }}", "no key 'zzz'"),
        ("{{ [vars.zzz] }}", "no key 'zzz'"),
        ("{{ steps.gather.items | map(attribute='nope') | list }}", "no key 'nope'"),
        ("{{ vars.date.zzz }}", "zzz"),
        ("a {{ none }} b", "null"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{{ from_json('{bad') }}", "not valid JSON"),
        ("{{ from_json('[' * 100000) }}", "nested too deeply"),
        ("{{ from_json(3) }}", "needs text or a file"),
        ("{{ lines(3) }}", "needs text or a file"),
        ("{{ [vars] | to_json }}", "vars must be followed"),  # compile time, see below
    ],
)
def test_render_errors_are_fast(source: str, message: str) -> None:
    start = time.process_time()  # CPU time: other load does not count
    with pytest.raises((RenderError, ExprError)) as info:
        r(source)
    assert message in info.value.message, info.value.message
    assert time.process_time() - start < 2


@pytest.mark.parametrize(
    ("source", "message"),
    [
        # The template functions' own refusals read as written, without a class name.
        ("{{ from_json('{bad') }}", "from_json: not valid JSON (Expecting property name "
                                    "enclosed in double quotes at line 1 column 2)"),
        ("{{ from_json(3) }}", "from_json needs text or a file, got a number"),
        # Python's own errors keep theirs: the name is the message's first word.
        ("{{ 1 / 0 }}", "ZeroDivisionError: division by zero"),
    ],
)
def test_render_error_messages(source: str, message: str) -> None:
    with pytest.raises(RenderError) as info:
        r(source)
    assert info.value.message == message


def test_unknown_roots_at_render_time_name_the_root() -> None:
    t = compile_template("{{ item.value }}")
    with pytest.raises(RenderError, match="item"):
        render(t, {"vars": {}})


def test_host_function_missing_at_render_time() -> None:
    with pytest.raises(RenderError, match="file"):
        render(compile_template("{{ file('a') }}"), CTX)


class Sneaky:
    """A context object whose method has an allowed str-method name."""

    def __init__(self) -> None:
        self.called = False

    def count(self) -> int:
        self.called = True
        return 1


def test_only_str_methods_and_given_functions_are_callable() -> None:
    with pytest.raises(ExprError, match="can be called"):
        compile_template("{{ vars['f']('x') }}")
    sneaky = Sneaky()
    with pytest.raises(RenderError, match="not allowed"):
        render(compile_template("{{ item.count() }}"), {"item": sneaky})
    assert not sneaky.called


def test_engine_errors_propagate_unchanged() -> None:
    from stockade.errors import StaleOutput

    def stale(_: str) -> Any:
        raise StaleOutput("artifact from run other")

    with pytest.raises(StaleOutput):
        render(compile_template("{{ file('a') }}"), CTX, functions={"file": stale})


def test_render_value_recurses_and_leaves_non_strings() -> None:
    value = {"a": "{{ vars.date }}", "b": [1, "{{ [1, 2] }}", None], "c": True}
    assert render_value(value, CTX) == {"a": "2026-09-14", "b": [1, [1, 2], None], "c": True}
    assert render_value(5, CTX) == 5


def test_compile_is_cached() -> None:
    assert compile_template("{{ vars.date }}") is compile_template("{{ vars.date }}")


def test_readable_protocol() -> None:
    assert isinstance(FakeFile("x"), Readable)
    assert not isinstance("x", Readable)


def test_output_cap_on_text_render() -> None:
    big = FakeFile("x" * (17 * 1024 * 1024))
    with pytest.raises(RenderError, match="limit"):
        render(compile_template("a {{ item }}"), {"item": big})
    # a whole template hands the file itself on: no copy, no cap
    assert render(compile_template("{{ item }}"), {"item": big}) is big


FORGED_TEXT = '{"$artifact": {"run_id": "r-1", "step": "ghost"}, "text": "forged", "$$file": 1}'


def test_from_json_gives_data_and_to_json_escapes_the_engine_keys_in_it() -> None:
    # from_json of a step's output is plain data, however it is shaped ...
    value = r("{{ from_json(item.result) }}", ctx={**CTX, "item": {"result": FORGED_TEXT}})
    assert type(value) is dict and value["$artifact"] == {"run_id": "r-1", "step": "ghost"}
    # ... and JSON the engine writes from it cannot pass for a reference:
    # the reserved keys gain one more "$" (reversibly), engine objects keep theirs.
    text = r("{{ to_json([from_json(item.result), item.outputs['r.md']]) }}",
             ctx={**CTX, "item": {"result": FORGED_TEXT, "outputs": {"r.md": FakeFile("# R")}}})
    assert text == ('[{"$$$file":1,"$$artifact":{"run_id":"r-1","step":"ghost"},"text":"forged"},'
                    '{"$file":"f","n":3}]')
    assert r("x={{ {'$tree': 1, '$ref': 2} }}") == 'x={"$$tree":1,"$ref":2}'  # text holes too


@pytest.mark.parametrize("item", [7, "x", [1, {"a": None}], {"k": [True]}, FakeFile("t"), None])
def test_a_bare_name_renders_as_jinja_would(item: Any) -> None:
    # ``{{ item }}`` is looked up without Jinja; ``{{ item if true else 0 }}``
    # goes through Jinja: both give the very object the context holds.
    ctx = {**CTX, "item": item}
    fast = render(compile_template("{{ item }}"), ctx)
    slow = render(compile_template(" {{ item if true else 0 }}"), ctx)
    assert fast is item and slow is item


def test_a_bare_name_absent_from_the_context_still_fails_by_name() -> None:
    with pytest.raises(RenderError, match="item"):
        render(compile_template("{{ item }}"), {"vars": {}})
    # Shell quoting never takes the shortcut.
    assert render(compile_template("{{ item }}"), {"item": "a b"}, shell=True) == "'a b'"
