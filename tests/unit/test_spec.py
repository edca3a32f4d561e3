"""Loading workflows: a corpus of malformed files, byte-level junk, the DESIGN example."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from stockade.errors import UserError
from stockade.spec import Spec, json_schema, load_workflow
from stockade.spec.paths import interface_mount

CASES = Path(__file__).parent / "cases"
EXPECT = re.compile(r"^# expect: (\d+):(\d+): (.+)$", re.M)

DESIGN_EXAMPLE = """\
name: market-report                # required, [a-z0-9][a-z0-9_-]*
vars:                              # defaults; --var K=V overrides
  report_date: "2026-09-14"
sandbox:
  require: true                    # refuse to start unless the active backend is enforced
secrets: [OPENAI_API_KEY]          # host variables; a step receives one only if it lists it
steps:
  - id: gather                     # [a-z0-9][a-z0-9_-]*, unique
    inputs:                        # the only way anything enters a step's world
      fetch.py: "{{ file('scripts/fetch.py') }}"   # a host file next to the workflow
      date.txt: "{{ vars.report_date }}"
    run: python3 fetch.py date.txt > out/regions.json
  - id: analyse
    needs: [gather]
    for_each: "{{ steps.gather.outputs['regions.json'] | from_json }}"
    inputs:
      region.json: "{{ item }}"
      extract.csv: "{{ steps.gather.outputs['extract.csv'] }}"
    agent:
      model: openai/gpt-4.1-mini
      prompt: Summarise extract.csv for the region in region.json into out/report.md.
      tools: [read_file, list_dir, create_file]
  - id: challenge
    needs: [analyse]
    for_each: "{{ steps.analyse.items }}"
    inputs:
      report.md: "{{ item.outputs['report.md'] }}"
    agent:
      prompt: Try to refute report.md. Answer HOLDS or REFUTED on the first line.
      tools: [read_file]
  - id: survivors                  # a decision step: a rule fixed in the file, no process
    needs: [challenge]
    for_each: "{{ steps.challenge.items }}"
    keep: "{{ item.result.startswith('HOLDS') }}"
  - id: publish
    needs: [survivors]
    publish:
      to: sqlite:///reports.db?table=daily_report
      key: "{{ vars.report_date }}"
      payload: "{{ steps.survivors.result }}"
"""


def problems_of(data: bytes, name: str = "w.yaml") -> list[str]:
    with pytest.raises(UserError) as info:
        load_workflow(data, name)
    lines = str(info.value).splitlines()
    assert lines == [str(p) for p in info.value.problems]
    return lines


CASE_FILES = sorted(CASES.glob("*.yaml"))


def test_corpus_is_large_enough() -> None:
    assert len(CASE_FILES) >= 30


@pytest.mark.parametrize("path", CASE_FILES, ids=[p.stem for p in CASE_FILES])
def test_malformed_corpus(path: Path) -> None:
    data = path.read_bytes()
    expected = EXPECT.findall(data.decode())
    assert expected, f"{path.name} has no '# expect: LINE:COL: message' line"
    got = problems_of(data, path.name)
    for line, col, message in expected:
        prefix = f"{path.name}:{line}:{col}: "
        assert any(g.startswith(prefix) and message in g for g in got), (
            f"expected {prefix}...{message}\n got:\n" + "\n".join(got)
        )
    # every problem is printed as FILE:LINE:COL: message
    for g in got:
        assert re.match(rf"^{re.escape(path.name)}:\d+:\d+: \S", g), g


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "w.yaml:1:1: the file is empty"),
        (b"# only a comment\n\n", "w.yaml:1:1: the file is empty"),
        (b"   \n", "w.yaml:1:1: the file is empty"),
        (b"name: w\nsteps: \xff\xfe\n", "w.yaml:2:8: not valid UTF-8"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "w.yaml:1:1: not valid UTF-8"),
        (b"name: w\x00\nsteps: []", "w.yaml:1:8: control character U+0000"),
        (b"\x7fELF\x02\x01\x01", "w.yaml:1:1: control character U+007F"),
        (b"just a scalar", "w.yaml:1:1: the top level must be a mapping with name: and steps: (found the single value 'just a scalar')"),
        (b"42", "w.yaml:1:1: the top level must be a mapping"),
        (b"x" * (1024 * 1024 + 1), "w.yaml:1:1: file is 1,048,577 bytes"),
        (b"name: w\nsteps:\n  - id: a\n    run: !!binary aGk=\n", "w.yaml:4:10: YAML type !!binary is not supported"),
        (b"name: w\nsteps:\n  - id: a\n    run: !shell echo\n", "w.yaml:4:10: YAML tags such as !shell are not supported"),
        (b"name: w\n<<: {steps: []}\n", "w.yaml:2:1: merge keys (<<) are not supported"),
        (b"name: w\nsteps:\n  - {id: a, run: 'x', id: b}\n", "w.yaml:3:23: duplicate key 'id'"),
        (b"name: w\nsteps:\n  - id: a\n    run: 'unterminated\n", "YAML syntax"),
        (b"name: w\nsteps:\n  - ? [a]\n    : x\n", "w.yaml:3:7: a key must be a plain name"),
    ],
)
def test_byte_level_junk_gives_problems(data: bytes, expected: str) -> None:
    got = problems_of(data)
    assert any(g.startswith(expected) or (":" not in expected and expected in g) for g in got), got


QUOTE_IT = ('a value that starts with {{ must be in quotes ("{{ ... }}"): without them YAML '
            "reads { as the start of a mapping")
INDENT = "check this line's indentation against the lines above it"
COLON = ("a value that holds ': ' (a colon and a space) must be in quotes, or written as a "
         "block (run: | and the command on the next lines)")
STEP = "name: w\nsteps:\n  - id: a\n"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # A template as a value's first characters: YAML reads a flow mapping.
        ("    for_each: {{ vars.x }}\n    run: ls\n", f"w.yaml:4:15: {QUOTE_IT}"),
        ("    run: {{ vars.x }}\n", f"w.yaml:4:10: {QUOTE_IT}"),
        ("    run: {{ vars.x }} && ls\n", f"w.yaml:4:10: {QUOTE_IT}"),
        ("    inputs:\n      a.txt: {{ vars.x }}\n    run: ls\n", f"w.yaml:5:14: {QUOTE_IT}"),
        ("    inputs: {a.txt: {{ vars.x }}}\n    run: ls\n", f"w.yaml:4:21: {QUOTE_IT}"),
        ("    for_each:\n      - {{ vars.x }}\n    run: ls\n", f"w.yaml:5:9: {QUOTE_IT}"),
        # A colon and a space inside a plain value.
        ("    run: echo '{\"total\": 3}' > out/r.json\n", f"w.yaml:4:24: YAML syntax: mapping "
         f"values are not allowed here; {COLON}"),
        ("    run: echo note: done\n", f"w.yaml:4:19: YAML syntax: mapping values are not "
         f"allowed here; {COLON}"),
        # A key indented deeper or shallower than its neighbours.
        ("     run: ls\n", f"w.yaml:4:9: YAML syntax: mapping values are not allowed here; "
         f"{INDENT}"),
        ("  run: ls\n", f"w.yaml:4:3: YAML syntax: expected <block end>, but found '?' "
         f"(while parsing a block collection); {INDENT}"),
        # Characters YAML reserves at the start of a plain value.
        ("    run: `date`\n", "w.yaml:4:10: YAML syntax: found character '`' that cannot start "
         "any token (while scanning for the next token); a value that starts with ` must be "
         "in quotes"),
        ("    run: @here\n", "w.yaml:4:10: YAML syntax: found character '@' that cannot "
         "start any token (while scanning for the next token); a value that starts with @ "
         "must be in quotes"),
        # A quote left open points at where it opened, not at the end of the file.
        ("    run: \"ls\n    retries: 2\n", "w.yaml:4:10: YAML syntax: this quote is never "
         "closed (the file ends inside it)"),
        ("    run: echo [1, 2: b: c\n", f"w.yaml:4:20: YAML syntax: mapping values are not "
         f"allowed here; {COLON}"),
        # No hint where none fits.
        ("    run: [a, b\n", "w.yaml:5:1: YAML syntax: expected ',' or ']', but got "
         "'<stream end>' (while parsing a flow sequence)"),
    ],
)
def test_common_yaml_slips_say_what_to_change(body: str, expected: str) -> None:
    assert problems_of((STEP + body).encode()) == [expected]


@pytest.mark.parametrize("body", [
    '    run: "{{ vars.x }}"\n',
    "    run: echo {{ vars.x }}\n",
    "    run: 'echo a: b'\n",
    "    run: |\n      echo a: b\n",
    "    run: echo a:b\n",
])
def test_quoted_templates_and_colons_in_blocks_load(body: str) -> None:
    load_workflow(("vars: {x: ls}\n" + STEP + body).encode(), "w.yaml")


def test_alias_bomb_is_refused_quickly() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 30):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    start = time.process_time()  # CPU time: other load does not count
    got = problems_of(("\n".join(lines) + "\n").encode())
    assert time.process_time() - start < 5
    assert got[0].startswith("w.yaml:2:") and "aliases" in got[0]


def test_deep_nesting_is_a_problem_not_a_crash() -> None:
    data = b"name: w\nsteps: " + b"[" * 5000 + b"]" * 5000 + b"\n"
    start = time.process_time()  # CPU time: other load does not count
    got = problems_of(data)
    assert time.process_time() - start < 2
    assert got == ["w.yaml:2:72: brackets nested more than 64 deep; a workflow does not need this"]
    indented = "name: w\n" + "".join(" " * i + f"k{i}:\n" for i in range(600))
    assert problems_of(indented.encode())


def test_problems_sorted_and_all_reported() -> None:
    got = problems_of((CASES / "40_many_problems.yaml").read_bytes(), "m.yaml")
    assert len(got) >= 4
    positions = [tuple(int(x) for x in g.split(":")[1:3]) for g in got]
    assert positions == sorted(positions)


def test_design_example_loads_clean() -> None:
    spec = load_workflow(DESIGN_EXAMPLE.encode(), "design.yaml")
    assert isinstance(spec, Spec)
    wf = spec.workflow
    assert [s.id for s in wf.steps] == ["gather", "analyse", "challenge", "survivors", "publish"]
    assert [s.kind for s in wf.steps] == ["run", "agent", "agent", "keep", "publish"]
    assert spec.files == ("scripts/fetch.py",)
    assert spec.trees == ()
    assert len(spec.sha256) == 64
    assert spec.position("steps", 1, "for_each") == (15, 15)
    assert spec.position("steps", 1, "nonexistent") == spec.position("steps", 1)
    assert spec.position("steps", 3) == (31, 5)
    keep = spec.template("steps", 3, "keep")
    assert keep.whole and keep.uses_item and keep.refs == ("item.result",)
    assert spec.template("steps", 0, "inputs", "date.txt").vars_used == frozenset({"report_date"})


@pytest.mark.parametrize(
    ("yaml", "check"),
    [
        # unquoted dates stay the text the user wrote
        ("name: w\nvars: {d: 2026-09-14}\nsteps: [{id: a, run: 'echo {{ vars.d }}'}]\n",
         lambda s: s.workflow.vars["d"] == "2026-09-14"),
        ("name: w\nsteps: [{id: a, for_each: [1, 2], run: 'echo {{ item }}'}]\n",
         lambda s: s.workflow.steps[0].for_each == [1, 2]),
        ("name: w\nsteps: [{id: a, run: x, timeout: 1.5, retries: 2, network: open}]\n",
         lambda s: s.workflow.steps[0].timeout == 1.5 and s.workflow.steps[0].network == "open"),
        ("name: w\nsteps:\n  - id: a\n    run: |\n      echo {{ vars.x }}\n      echo two\nvars: {x: 1}\n",
         lambda s: s.workflow.steps[0].run == "echo {{ vars.x }}\necho two\n"),
        ("name: w\nsteps: [{id: a, inputs: {t: \"{{ tree('repo') }}\", f: \"{{ file('b') }}{{ file('a') }}\"}, run: x}]\n",
         lambda s: s.trees == ("repo",) and s.files == ("a", "b")),
        ("\ufeffname: w\nsteps: [{id: a, run: x}]\n", lambda s: s.workflow.name == "w"),
        # every agent setting of DESIGN.md's "Agent steps"
        ("name: w\nsteps:\n  - id: a\n    outputs: [r.md]\n    agent:\n      model: anthropic/claude-sonnet-4-5\n"
         "      prompt: hi\n      tools: [create_file]\n      request_timeout: 30\n"
         "      params: {max_tokens: 9000, reasoning_effort: high, tool_choice: auto,"
         " thinking: {type: enabled, budget_tokens: 4096}}\n"
         "      endpoint: {base_url: 'https://llm.example/v1', api_key_env: TEAM_KEY}\n"
         "      budget: {tokens: 200000}\n",
         lambda s: (a := s.workflow.steps[0].agent) is not None and a.request_timeout == 30
         and a.params.thinking is not None and a.params.thinking.budget_tokens == 4096
         and a.endpoint is not None and a.endpoint.api_key_env == "TEAM_KEY"
         and a.budget is not None and a.budget.tokens == 200000),
        ("name: w\nsteps: [{id: a, agent: {model: azure/my-dep, prompt: hi, endpoint: {api_version: 2025-01-01-preview}}},"
         " {id: b, agent: {model: openai-responses/o3, prompt: hi}}]\n",
         lambda s: s.workflow.steps[0].agent is not None and s.workflow.steps[0].agent.request_timeout == 600),
        # a fan-out step's files are read through its items; a single step's directly
        ("name: w\nsteps:\n  - {id: fan, for_each: [1, 2], run: x, outputs: [v.txt]}\n"
         "  - {id: one, run: x, outputs: [v.txt]}\n"
         "  - id: b\n    needs: [fan, one]\n    for_each: \"{{ steps.fan.items }}\"\n"
         "    inputs: {v.txt: \"{{ item.outputs['v.txt'] }}\", w.txt: \"{{ steps.one.outputs['v.txt'] }}\"}\n"
         "    run: cat v.txt w.txt\n",
         lambda s: s.template("steps", 2, "inputs", "w.txt").refs == ("steps.one.outputs['v.txt']",)),
        # spaces around a for_each expression keep it whole (its value stays a list)
        ("name: w\nsteps:\n  - {id: a, for_each: [1, 2], run: x}\n"
         "  - {id: b, needs: [a], for_each: '  {{ steps.a.items }} ', run: x}\n",
         lambda s: s.template("steps", 1, "for_each").whole),
    ],
)
def test_valid_variants(yaml: str, check: Any) -> None:
    assert check(load_workflow(yaml.encode(), "ok.yaml"))


def test_every_field_in_seconds_is_told_its_unit() -> None:
    from stockade.spec.messages import SECONDS_FIELDS
    from stockade.spec.schema import DESCRIPTIONS

    # "Seconds" as a word of the text (not cpu_seconds, a field whose name says it).
    described = {name for fields in DESCRIPTIONS.values() for name, text in fields.items()
                 if re.search(r"(?<![\w])seconds?\b", text, re.IGNORECASE)}
    assert described == SECONDS_FIELDS
    wf = ("name: w\nsteps:\n  - {id: a, run: x, timeout: 1m, retry_delay: 2s}\n"
          "  - {id: b, agent: {prompt: hi, request_timeout: 1h}}\n"
          "  - {id: c, publish: {to: 'file:///tmp/x', key: k, payload: x, lease_ttl: 5m}}\n")
    got = problems_of(wf.encode())
    assert len(got) == 4 and all("must be a number of seconds (found" in g for g in got), got


def _validate(instance: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "$") -> list[str]:
    """A small structural JSON Schema checker: enough to prove the example fits."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return _validate(instance, root["$defs"][name], root, path)
    errors: list[str] = []
    if "anyOf" in schema:
        branches = [_validate(instance, s, root, path) for s in schema["anyOf"]]
        if all(branches):
            errors.append(f"{path}: matches no anyOf branch")
    if "oneOf" in schema:
        ok = [s for s in schema["oneOf"] if not _validate(instance, s, root, path)]
        if len(ok) != 1:
            errors.append(f"{path}: matches {len(ok)} oneOf branches")
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    t = schema.get("type")
    if t in kinds and not isinstance(instance, kinds[t]):
        return [*errors, f"{path}: not {t}"]
    if t in ("integer", "number") and (isinstance(instance, bool) or not isinstance(instance, (int, float))):
        return [*errors, f"{path}: not {t}"]
    if "enum" in schema and instance not in schema["enum"]:
        errors.append(f"{path}: not in enum")
    if "const" in schema and instance != schema["const"]:
        errors.append(f"{path}: not const")
    if isinstance(instance, str) and "pattern" in schema and not re.search(schema["pattern"], instance):
        errors.append(f"{path}: does not match {schema['pattern']}")
    if isinstance(instance, dict):
        for req in schema.get("required", []):
            if req not in instance:
                errors.append(f"{path}: missing {req}")
        props = schema.get("properties", {})
        for k, v in instance.items():
            if k in props:
                errors.extend(_validate(v, props[k], root, f"{path}.{k}"))
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: unexpected {k}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors.extend(_validate(v, schema["additionalProperties"], root, f"{path}.{k}"))
    if isinstance(instance, list) and "items" in schema:
        for i, v in enumerate(instance):
            errors.extend(_validate(v, schema["items"], root, f"{path}[{i}]"))
    return errors


def test_json_schema_describes_the_format() -> None:
    schema = json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] and schema["description"]
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"name", "steps"}
    step = schema["$defs"]["Step"]
    assert step["additionalProperties"] is False
    assert {"run", "agent", "keep", "publish", "for_each", "needs"} <= set(step["properties"])
    spec = load_workflow(DESIGN_EXAMPLE.encode(), "design.yaml")
    assert _validate(spec.raw(), schema, schema) == []


@pytest.mark.parametrize(
    ("instance", "fragment"),
    [
        ({"name": "w"}, "missing steps"),
        ({"name": "w", "steps": [{"id": "a", "run": "x", "bogus": 1}]}, "unexpected bogus"),
        ({"name": "w", "steps": [{"id": "a", "run": "x", "keep": "y"}]}, "oneOf"),
        ({"name": "W!", "steps": [{"id": "a", "run": "x"}]}, "does not match"),
    ],
)
def test_json_schema_rejects_what_the_loader_rejects(instance: dict[str, Any], fragment: str) -> None:
    schema = json_schema()
    errors = _validate(instance, schema, schema)
    assert any(fragment in e for e in errors), errors


_TOKENS = [b"{{", b"}}", b"[", b"]", b"{", b"}", b":", b"-", b"\n", b"  ", b"\t", b"'", b'"',
           b"&a", b"*a", b"!!", b"needs: [x]", b"id: ", b"item", b"steps.", b"vars.", b"~", b"|",
           b"#", b"\xff", b"\x00", b"null", b"-1", b"keep: ", b"for_each: ", b"{%"]


@pytest.mark.parametrize("seed", range(4))
def test_mutated_workflows_never_raise_anything_but_user_error(seed: int) -> None:
    import random

    rnd = random.Random(seed)
    base = DESIGN_EXAMPLE.encode()
    for _ in range(60):
        data = bytearray(base)
        for _ in range(rnd.randint(1, 4)):
            pos = rnd.randrange(len(data) + 1)
            op = rnd.random()
            if op < 0.4:
                data[pos:pos] = rnd.choice(_TOKENS)
            elif op < 0.7:
                del data[pos:pos + rnd.randint(1, 20)]
            else:
                j = rnd.randrange(len(data) + 1)
                data[pos:pos] = data[j:j + rnd.randint(1, 40)]
        try:
            load_workflow(bytes(data), "f.yaml")
        except UserError as exc:
            assert exc.problems
            assert all(p.line >= 1 and p.col >= 1 and p.message for p in exc.problems)


@pytest.mark.parametrize(("path", "top"), [
    ("/proc", "/proc"), ("/proc/1/root", "/proc"), ("/sys", "/sys"), ("/dev/shm", "/dev"),
    ("/run", "/run"), ("/run/user/0", "/run"),
    ("/procedures", None), ("/devices", None), ("/opt/run", None), ("/usr/lib/python3", None),
    ("/", None),  # refused on its own, as the whole host
])
def test_kernel_and_service_interfaces_are_not_mounts(path: str, top: str | None) -> None:
    got = interface_mount(path)
    assert (got[0] if got else None) == top
