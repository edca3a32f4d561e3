"""Reuse across runs through the real CLI: what is reused, what reruns, what never is."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from tests.integration.conftest import Project

THREE = """
name: three
{extra}
steps:
  - id: split
    inputs: {{split.py: "{{{{ file('split.py') }}}}"}}
    run: python3 split.py
  - id: square
    needs: [split]
    for_each: "{{{{ steps.split.outputs['nums.json'] | from_json }}}}"
    inputs: {{n.txt: "{{{{ item }}}}", sq.py: "{{{{ file('sq.py') }}}}"}}
    run: python3 sq.py
  - id: total
    needs: [square]
    inputs:
      parts.json: "{{{{ steps.square.result }}}}"
      total.py: "{{{{ file('total.py') }}}}"
    run: python3 total.py
"""


def _project(project: Project, nums: list[int], *, extra: str = "") -> Path:
    project.write("split.py", f"""
        import json
        json.dump({nums!r}, open("out/nums.json", "w"))
    """)
    project.write("sq.py", """
        n = int(open("n.txt").read())
        open("out/sq.txt", "w").write(str(n * n))
        print(n * n)
    """)
    project.write("total.py", """
        import json
        print(sum(int(x) for x in json.load(open("parts.json"))))
    """)
    return project.write("wf.yaml", THREE.format(extra=extra))


def _reused(project: Project, run_id: str) -> dict[str, list[str | None]]:
    show = project.run("show", run_id, "--json").json()
    return {s["id"]: [(i["reused_from"] or {}).get("run_id") for i in s["items"]]
            for s in show["steps"]}


def test_a_second_run_reuses_everything_and_provenance_names_the_first(project: Project) -> None:
    wf = _project(project, [1, 2, 3])
    assert project.run("run", str(wf), "--run-id", "r1").code == 0
    r = project.run("run", str(wf), "--run-id", "r2", "--reuse")
    assert r.code == 0, r.err
    assert "5 reused" in r.err
    assert _reused(project, "r2") == {"split": ["r1"], "square": ["r1"] * 3, "total": ["r1"]}
    assert project.run("logs", "r1", "total").out == "14\n"
    why = project.run("why", "r2", "square/2", "--json").json()
    assert why["reused_from"]["run_id"] == "r1"
    assert why["outputs"][0]["reused_from"]["run_id"] == "r1"
    # The reused outputs are in this run, byte for byte, and consumable downstream.
    for i, n in enumerate((1, 2, 3)):
        assert (project.item("r2", "square", i) / "work/out/sq.txt").read_text() == str(n * n)
    # Without --reuse (and without reuse: in the file) everything runs.
    assert project.run("run", str(wf), "--run-id", "r3").code == 0
    assert all(v is None for vs in _reused(project, "r3").values() for v in vs)


def test_an_edited_script_reruns_only_its_step(project: Project) -> None:
    wf = _project(project, [1, 2, 3])
    assert project.run("run", str(wf), "--run-id", "e1").code == 0
    project.write("total.py", """
        import json
        print("total", sum(int(x) for x in json.load(open("parts.json"))))
    """)
    r = project.run("run", str(wf), "--run-id", "e2", "--reuse")
    assert r.code == 0, r.err
    assert _reused(project, "e2") == {"split": ["e1"], "square": ["e1"] * 3, "total": [None]}
    assert project.run("logs", "e2", "total").out == "total 14\n"


def test_a_changed_input_reruns_its_item_and_its_dependents(project: Project) -> None:
    wf = _project(project, [1, 2, 3])
    assert project.run("run", str(wf), "--run-id", "i1").code == 0
    _project(project, [1, 2, 4])
    r = project.run("run", str(wf), "--run-id", "i2", "--reuse")
    assert r.code == 0, r.err
    # split's script changed; items 1 and 2 have the same input as before.
    assert _reused(project, "i2") == {"split": [None], "square": ["i1", "i1", None],
                                      "total": [None]}
    assert project.run("logs", "i2", "total").out == "21\n"


def test_a_tampered_earlier_output_is_never_reused(project: Project) -> None:
    wf = _project(project, [1, 2, 3])
    assert project.run("run", str(wf), "--run-id", "t1").code == 0
    target = project.item("t1", "square", 1) / "work/out/sq.txt"
    os.chmod(target, 0o644)
    target.write_text("5")
    r = project.run("run", str(wf), "--run-id", "t2", "--reuse")
    assert r.code == 0, r.err
    got = _reused(project, "t2")
    assert got["square"] == ["t1", None, "t1"]
    assert (project.item("t2", "square", 1) / "work/out/sq.txt").read_text() == "4"
    # The rerun made the same result, so the join's inputs are as before: reused.
    assert got["total"] == ["t1"]


def test_when_the_newest_earlier_item_is_tampered_an_older_one_is_taken(
        project: Project) -> None:
    wf = _project(project, [1, 2, 3])
    assert project.run("run", str(wf), "--run-id", "o1").code == 0
    assert project.run("run", str(wf), "--run-id", "o2", "--no-reuse").code == 0
    target = project.item("o2", "square", 1) / "work/out/sq.txt"
    os.chmod(target, 0o644)
    target.write_text("5")
    r = project.run("run", str(wf), "--run-id", "o3", "--reuse")
    assert r.code == 0, r.err
    got = _reused(project, "o3")
    assert got["square"] == ["o2", "o1", "o2"]
    assert (project.item("o3", "square", 1) / "work/out/sq.txt").read_text() == "4"


def test_top_level_reuse_is_the_default_and_no_reuse_turns_it_off(project: Project) -> None:
    wf = _project(project, [2], extra="reuse: true")
    assert project.run("run", str(wf), "--run-id", "d1").code == 0
    assert project.run("run", str(wf), "--run-id", "d2").code == 0
    assert _reused(project, "d2")["total"] == ["d1"]
    assert project.run("run", str(wf), "--run-id", "d3", "--no-reuse").code == 0
    assert _reused(project, "d3")["total"] == [None]


def test_agent_steps_are_not_reused_by_default_and_publish_never(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: kinds
        steps:
          - id: make
            run: echo 7
          - id: opted
            reuse: false
            run: echo 8
          - id: pub
            needs: [make]
            publish:
              to: sqlite:///out.db?table=t
              key: k
              payload: "{{ steps.make.result }}"
    """)
    assert project.run("run", str(wf), "--run-id", "k1").code == 0
    assert project.run("run", str(wf), "--run-id", "k2", "--reuse").code == 0
    got = _reused(project, "k2")
    assert got == {"make": ["k1"], "opted": [None], "pub": [None]}
    bad = project.write("bad.yaml", """
        name: bad
        steps:
          - id: pub
            reuse: true
            publish: {to: "sqlite:///out.db?table=t", key: k, payload: 1}
    """)
    r = project.run("validate", str(bad))
    assert r.code == 2 and "never taken from an earlier run" in r.err
    from stockade.runner.reuse import not_reused_because
    from stockade.spec.model import Step

    agent = Step.model_validate({"id": "a", "agent": {"prompt": "x"}})
    assert not_reused_because(agent) == "reuse is off for agent: steps unless the step says " \
        "reuse: true"
    assert not_reused_because(agent.model_copy(update={"reuse": True})) is None


def test_a_changed_secret_value_prevents_reuse_and_is_never_stored(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: sec
        secrets: [TOKEN]
        steps:
          - id: a
            secrets: [TOKEN]
            run: test -n "$TOKEN" && echo ok
    """)
    first, second = "first-secret-value-1234", "second-secret-value-5678"
    assert project.run("run", str(wf), "--run-id", "s1", env={"TOKEN": first}).code == 0
    assert project.run("run", str(wf), "--run-id", "s2", "--reuse",
                       env={"TOKEN": first}).code == 0
    assert _reused(project, "s2") == {"a": ["s1"]}
    assert project.run("run", str(wf), "--run-id", "s3", "--reuse",
                       env={"TOKEN": second}).code == 0
    assert _reused(project, "s3") == {"a": [None]}
    db = (project.root / "stockade.db").read_bytes()
    for value in (first, second):
        assert value.encode() not in db
    keys = sqlite3.connect(project.root / "stockade.db").execute(
        "SELECT DISTINCT key FROM reuse_index").fetchall()
    assert len(keys) == 2
    assert (project.root / "reuse.key").stat().st_mode & 0o077 == 0


def test_resume_after_an_edit_points_to_reuse(project: Project) -> None:
    wf = project.write("wf.yaml", "name: ed\nsteps:\n  - id: a\n    run: exit 1\n")
    assert project.run("run", str(wf), "--run-id", "ed1").code == 1
    wf.write_text("name: ed\nsteps:\n  - id: a\n    run: exit 0\n")
    r = project.run("resume", "ed1")
    assert r.code == 2 and "--reuse" in r.err


def test_reused_run_json_counts_reuse(project: Project) -> None:
    wf = _project(project, [1])
    assert project.run("run", str(wf), "--run-id", "j1").code == 0
    r = project.run("run", str(wf), "--run-id", "j2", "--reuse", "--json")
    assert json.loads(r.out)["reused"] == {"split": 1, "square": 1, "total": 1}
