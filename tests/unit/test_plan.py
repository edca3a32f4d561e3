"""Planning: order, dependents, the information-flow graph, fan-out expansion."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from stockade.errors import UserError
from stockade.plan import Flow, build_plan, expand, format_plan, plan_json
from stockade.spec import Spec, load_workflow
from stockade.spec.model import Workflow


def spec_of(yaml: str) -> Spec:
    return load_workflow(yaml.encode(), "w.yaml")


def steps_yaml(*steps: str) -> str:
    return "name: w\nvars: {d: x, n: 1}\nsecrets: [KEY]\nsteps:\n" + "".join(steps)


DESIGN = """\
name: market-report
vars:
  report_date: "2026-09-14"
secrets: [OPENAI_API_KEY]
steps:
  - id: gather
    inputs:
      fetch.py: "{{ file('scripts/fetch.py') }}"
      date.txt: "{{ vars.report_date }}"
    run: python3 fetch.py date.txt > out/regions.json
  - id: analyse
    needs: [gather]
    secrets: [OPENAI_API_KEY]
    for_each: "{{ steps.gather.outputs['regions.json'] | from_json }}"
    inputs:
      region.json: "{{ item }}"
      extract.csv: "{{ steps.gather.outputs['extract.csv'] }}"
    agent:
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
  - id: survivors
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


@pytest.mark.parametrize(
    ("yaml", "order"),
    [
        (steps_yaml("  - {id: a, run: x}\n", "  - {id: b, run: x}\n", "  - {id: c, run: x}\n"), ("a", "b", "c")),
        # a step may need one defined later: it still runs after it
        (steps_yaml("  - {id: a, needs: [c], run: x}\n", "  - {id: b, run: x}\n", "  - {id: c, run: x}\n"),
         ("b", "c", "a")),
        (steps_yaml("  - {id: z, needs: [y], run: x}\n", "  - {id: y, needs: [x], run: x}\n", "  - {id: x, run: x}\n"),
         ("x", "y", "z")),
        # diamond: independent branches keep file order
        (steps_yaml("  - {id: top, run: x}\n", "  - {id: r, needs: [top], run: x}\n",
                    "  - {id: l, needs: [top], run: x}\n", "  - {id: bottom, needs: [l, r], run: x}\n"),
         ("top", "r", "l", "bottom")),
    ],
)
def test_order_is_topological_and_stable(yaml: str, order: tuple[str, ...]) -> None:
    assert build_plan(spec_of(yaml)).order == order


def test_needs_dependents_downstream_upstream() -> None:
    plan = build_plan(spec_of(DESIGN))
    assert plan.needs["analyse"] == ("gather",)
    assert plan.dependents["gather"] == ("analyse",)
    assert plan.dependents["publish"] == ()
    assert plan.downstream("analyse") == frozenset({"challenge", "survivors", "publish"})
    assert plan.downstream("publish") == frozenset()
    assert plan.upstream("survivors") == frozenset({"gather", "analyse", "challenge"})


def _raw_spec(steps: list[dict[str, Any]]) -> Spec:
    data = {"name": "w", "steps": steps}
    return Spec(workflow=Workflow.model_validate(data), filename="w.yaml", sha256="0" * 64,
                files=(), trees=(), _data=data)


def test_cycle_in_an_unchecked_workflow_is_refused() -> None:
    spec = _raw_spec([{"id": "a", "needs": ["b"], "run": "x"}, {"id": "b", "needs": ["a"], "run": "x"}])
    with pytest.raises(ValueError, match="cycle among: a, b"):
        build_plan(spec)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        ("gather", [
            Flow("file('scripts/fetch.py')", "gather", "inputs.fetch.py"),
            Flow("vars.report_date", "gather", "inputs.date.txt"),
            Flow("literal", "gather", "run"),
        ]),
        ("analyse", [
            Flow("steps.gather.outputs['regions.json']", "analyse", "for_each"),
            Flow("item", "analyse", "inputs.region.json"),
            Flow("steps.gather.outputs['extract.csv']", "analyse", "inputs.extract.csv"),
            Flow("literal", "analyse", "agent.prompt"),
            Flow("secret:OPENAI_API_KEY", "analyse", "env.OPENAI_API_KEY"),
        ]),
        ("challenge", [
            Flow("steps.analyse.items", "challenge", "for_each"),
            Flow("item.outputs['report.md']", "challenge", "inputs.report.md"),
            Flow("literal", "challenge", "agent.prompt"),
        ]),
        ("survivors", [
            Flow("steps.challenge.items", "survivors", "for_each"),
            Flow("item.result", "survivors", "keep"),
        ]),
        ("publish", [
            Flow("literal", "publish", "publish.to"),
            Flow("vars.report_date", "publish", "publish.key"),
            Flow("steps.survivors.result", "publish", "publish.payload"),
        ]),
    ],
)
def test_flows_name_each_value_and_slot(step: str, expected: list[Flow]) -> None:
    plan = build_plan(spec_of(DESIGN))
    assert list(plan.flows_into(step)) == expected


@pytest.mark.parametrize(
    ("step_yaml", "expected"),
    [
        ("  - id: a\n    env: {FOO: '{{ vars.d }}', BAR: plain}\n    run: 'echo $FOO {{ run.id }}'\n",
         [("vars.d", "env.FOO"), ("literal", "env.BAR"), ("run.id", "run")]),
        ("  - id: a\n    for_each: [1, 2]\n    run: 'echo {{ item }}'\n",
         [("item", "run"), ("literal", "for_each")]),
        # A literal list of text is one flow too, not one per element.
        ("  - id: a\n    for_each: [x, y, z]\n    key: '{{ item }}'\n    run: 'echo {{ item }}'\n",
         [("item", "key"), ("item", "run"), ("literal", "for_each")]),
        ("  - id: a\n    inputs:\n      cfg.json: {k: '{{ vars.n }}', l: ['{{ vars.d }}']}\n    run: x\n",
         [("vars.n", "inputs.cfg.json.k"), ("vars.d", "inputs.cfg.json.l[0]"), ("literal", "run")]),
        ("  - id: a\n    secrets: [KEY]\n    run: x\n", [("literal", "run"), ("secret:KEY", "env.KEY")]),
        ("  - id: a\n    run: '{{ vars.d }} {{ vars.d }}'\n", [("vars.d", "run")]),
    ],
)
def test_flow_slots(step_yaml: str, expected: list[tuple[str, str]]) -> None:
    plan = build_plan(spec_of(steps_yaml(step_yaml)))
    assert [(f.source, f.slot) for f in plan.flows] == expected


def test_format_plan_shows_steps_flows_and_what_is_unseen() -> None:
    spec = spec_of(DESIGN)
    text = format_plan(spec, build_plan(spec))
    assert "1. gather [run]" in text
    assert "4. survivors [keep]" in text
    assert "items: one per element of steps.gather.outputs['regions.json'] | from_json" in text
    assert "inputs.date.txt <- vars.report_date" in text
    assert "keep     <- item.result" in text
    survivors = text.split("4. survivors")[1].split("5. publish")[0]
    assert "sees nothing of: gather, analyse" in survivors
    gather = text.split("1. gather")[1].split("2. analyse")[0]
    assert "sees nothing of" not in gather


def test_format_plan_counts_one_step_as_one() -> None:
    spec = spec_of(steps_yaml("  - id: a\n    run: x\n"))
    assert format_plan(spec, build_plan(spec)).startswith("workflow w: 1 step (")


def test_plan_json_is_json_and_complete() -> None:
    spec = spec_of(DESIGN)
    doc = plan_json(spec, build_plan(spec))
    assert json.loads(json.dumps(doc)) == doc
    assert doc["order"] == ["gather", "analyse", "challenge", "survivors", "publish"]
    by_id = {s["id"]: s for s in doc["steps"]}
    assert by_id["survivors"]["kind"] == "keep"
    assert by_id["survivors"]["sees_nothing_of"] == ["gather", "analyse"]
    assert by_id["analyse"]["secrets"] == ["OPENAI_API_KEY"]
    assert {"source": "item.result", "step": "survivors", "slot": "keep"} in doc["flows"]
    assert doc["files"] == ["scripts/fetch.py"]


def test_plan_does_not_depend_on_item_counts() -> None:
    # planning never expands for_each: a list of 10,000 items plans like a list of one
    def plan_for(n: int) -> Any:
        items = "[" + ", ".join(["1"] * n) + "]"
        return build_plan(spec_of(steps_yaml(f"  - id: a\n    for_each: {items}\n    run: 'echo {{{{ item }}}}'\n")))

    assert plan_for(10_000).flows == plan_for(1).flows


@dataclass(frozen=True)
class File:
    def read_text(self) -> str:
        return "[]"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([1, 2, 3], [1, 2, 3]),
        ([], []),
        ((1, 2), [1, 2]),
        ([{"a": 1}], [{"a": 1}]),
    ],
)
def test_expand_lists(value: Any, expected: list[Any]) -> None:
    assert expand(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a\nb", "got a string; to make one item per line use `| lines`"),
        ({"a": 1}, "got a mapping with 1 keys"),
        (None, "got null"),
        (True, "got a boolean (true)"),
        (3, "got a number (3)"),
        (2.5, "got a number (2.5)"),
        (File(), "got a file (File)"),
        ({1, 2}, "got set"),
    ],
)
def test_expand_refuses_everything_else(value: Any, message: str) -> None:
    with pytest.raises(UserError) as info:
        expand(value)
    assert message in str(info.value)


def test_expand_keeps_the_same_list() -> None:
    items = [1, 2]
    assert expand(items) is items
