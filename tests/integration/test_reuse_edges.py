"""Reuse across runs at its edges, through the real CLI: what the jail is told about
its item, steps the engine cannot see into, why an item ran again, the flags and
types that turn reuse on, and logs of reused items."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.integration.conftest import Project

PER_ITEM = """
name: envkey
reuse: true
vars: {items: ["x y", "p q"]}
steps:
  - id: per
    for_each: "{{ vars.items }}"
    inputs: {v.txt: "{{ item }}"}
    run: echo "value=$(cat v.txt) key=$STOCKADE_ITEM_KEY index=$STOCKADE_ITEM"
  - id: one
    run: echo "$STOCKADE_STEP"
  - id: two
    needs: [one]
    run: echo "$STOCKADE_STEP"
  - id: rid
    run: echo "$STOCKADE_RUN_ID attempt $STOCKADE_ATTEMPT"
"""


def _items(project: Project, run_id: str, step: str) -> list[dict[str, Any]]:
    r = project.run("show", run_id, step, "--json")
    assert r.code == 0, r.err
    return list(r.json()["items"])


def _origin(item: dict[str, Any]) -> str | None:
    return (item["reused_from"] or {}).get("run_id")


def test_an_items_key_index_and_step_enter_its_reuse_key(project: Project) -> None:
    wf = project.write("wf.yaml", PER_ITEM)
    assert project.run("run", str(wf), "--run-id", "k1").code == 0
    swapped = 'items=["p q", "x y"]'
    r = project.run("run", str(wf), "--run-id", "k2", "--var", swapped)
    assert r.code == 0, r.err
    per = _items(project, "k2", "per")
    # Each value now has the other index (and key): its item runs again and
    # says so, instead of handing on the earlier run's index.
    assert [i["result"] for i in per] == ["value=p q key=0 index=0",
                                          "value=x y key=1 index=1"]
    assert [_origin(i) for i in per] == [None, None]
    # Two steps with the same command are not taken for each other.
    assert [i["result"] for i in _items(project, "k2", "one")] == ["one"]
    assert [i["result"] for i in _items(project, "k2", "two")] == ["two"]
    # The run id and attempt are not in the key (else nothing would be reused):
    # such a command is reused with the values of the run that made it.
    r = project.run("run", str(wf), "--run-id", "k3", "--var", swapped)
    assert r.code == 0, r.err
    assert [_origin(i) for i in _items(project, "k3", "per")] == ["k2", "k2"]
    assert [i["result"] for i in _items(project, "k3", "rid")] == ["k1 attempt 1"]


def test_steps_the_engine_cannot_see_into_are_not_reused_unless_they_opt_in(
        project: Project, tmp_path: Path) -> None:
    data = tmp_path / "hostdata.txt"
    data.write_text("first\n")
    wf = project.write("wf.yaml", f"""
        name: host
        reuse: true
        steps:
          - id: peek
            isolate: false
            run: cat {data}
          - id: opted
            isolate: false
            reuse: true
            run: cat {data}
          - id: net
            network: open
            run: echo net
          - id: plain
            run: echo plain
    """)
    r = project.run("run", str(wf), "--run-id", "h1")
    assert r.code == 0, r.err
    data.write_text("second\n")
    r = project.run("run", str(wf), "--run-id", "h2")
    assert r.code == 0, r.err
    peek, opted, net, plain = (_items(project, "h2", s)[0]
                               for s in ("peek", "opted", "net", "plain"))
    assert (peek["result"], _origin(peek)) == ("second", None)
    assert _origin(net) is None
    # An explicit reuse: true is the user's word that the step reads nothing else.
    assert (opted["result"], _origin(opted)) == ("first", "h1")
    assert _origin(plain) == "h1"
    notes = [line for line in r.err.splitlines() if "not reused" in line]
    assert len(notes) == 2, r.err
    assert any("peek: not reused" in n and "isolate: false" in n for n in notes), notes
    assert any("net: not reused" in n and "network: open" in n for n in notes), notes
    # No note without reuse.
    r = project.run("run", str(wf), "--run-id", "h3", "--no-reuse")
    assert r.code == 0 and "not reused" not in r.err


REASONS = """
name: why
reuse: true
vars: {nums: [1, 2, 3]}
steps:
  - id: sq
    for_each: "{{ vars.nums }}"
    inputs: {n.txt: "{{ item }}"}
    run: echo $(( $(cat n.txt) * $(cat n.txt) )) > out/x.txt
  - id: host
    isolate: false
    run: echo host
"""


def test_why_an_item_ran_again_is_recorded_and_shown(project: Project) -> None:
    wf = project.write("wf.yaml", REASONS)
    assert project.run("run", str(wf), "--run-id", "w1").code == 0
    # Nothing is said when reuse is off.
    assert project.run("run", str(wf), "--run-id", "w0", "--no-reuse").code == 0
    assert all(i["not_reused"] is None for i in _items(project, "w0", "sq"))
    # The newest earlier item with sq/2's key (w0's) is tampered with, the older one is gone.
    target = project.item("w0", "sq", 1) / "work/out/x.txt"
    os.chmod(target, 0o644)
    target.write_text("5\n")
    older = project.item("w1", "sq", 1) / "work/out/x.txt"
    os.chmod(older, 0o644)
    older.unlink()
    r = project.run("run", str(wf), "--run-id", "w2", "--var", "nums=[1, 2, 4]")
    assert r.code == 0, r.err
    sq = _items(project, "w2", "sq")
    assert _origin(sq[0]) is not None and sq[0]["not_reused"] is None
    assert _origin(sq[1]) is None and _origin(sq[2]) is None
    assert sq[1]["not_reused"] == ("an earlier item matched (run w0, sq/#1) but its out/x.txt "
                                   "no longer matches the sha256 recorded when it was made")
    assert sq[2]["not_reused"].startswith("no earlier item")
    # The run said so when it passed the earlier item over (items are named
    # by their values: 1, 2, 4).
    assert any("sq/2: not reused: an earlier item matched" in line and "out/x.txt" in line
               for line in r.err.splitlines()), r.err
    host = _items(project, "w2", "host")[0]
    assert "isolate: false" in host["not_reused"]
    shown = project.run("show", "w2", "sq/2")
    assert shown.code == 0 and "not reused: " in shown.out and "out/x.txt" in shown.out
    one = project.run("show", "w2", "sq/2", "--json").json()
    assert one["item"]["not_reused"] == sq[1]["not_reused"]
    why = project.run("why", "w2", "sq/4")
    assert why.code == 0 and "not reused: no earlier item" in why.out
    assert project.run("why", "w2", "sq/4", "--json").json()["not_reused"].startswith(
        "no earlier item")
    assert "not reused" not in project.run("show", "w2", "sq/1").out


def test_reuse_and_no_reuse_together_are_refused(project: Project) -> None:
    wf = project.write("wf.yaml", "name: f\nsteps:\n  - id: a\n    run: echo 1\n")
    for flags in (("--reuse", "--no-reuse"), ("--no-reuse", "--reuse")):
        r = project.run("run", str(wf), *flags)
        assert r.code == 2, r.err
        assert len(r.err.strip().splitlines()) == 1 and "--reuse" in r.err, r.err
    assert not (project.root / "runs").exists() or not any((project.root / "runs").iterdir())


def test_the_workflows_booleans_are_yaml_booleans(project: Project) -> None:
    for i, (text, where) in enumerate([
        ('name: b\nreuse: "yes"\nsteps:\n  - id: a\n    run: echo 1\n', "2:8: reuse"),
        ("name: b\nsteps:\n  - id: a\n    reuse: 1\n    run: echo 1\n",
         "4:12: reuse of step 'a'"),
        ("name: b\nsteps:\n  - id: a\n    reuse: 0\n    run: echo 1\n",
         "4:12: reuse of step 'a'"),
        ("name: b\nsteps:\n  - id: a\n    isolate: 'no'\n    run: echo 1\n",
         "4:14: isolate of step 'a'"),
        ("name: b\nsandbox: {require: 1}\nsteps:\n  - id: a\n    run: echo 1\n",
         "2:20: sandbox.require"),
    ]):
        wf = project.write(f"b{i}.yaml", text)
        r = project.run("validate", str(wf))
        assert r.code == 2, r.err
        assert r.err.startswith(f"{wf}:{where} must be true or false"), r.err
    ok = project.write("ok.yaml", "name: b\nreuse: true\nsteps:\n  - id: a\n"
                                  "    reuse: false\n    isolate: true\n    run: echo 1\n")
    assert project.run("validate", str(ok)).code == 0


def test_logs_say_attempts_count_from_one_and_when_the_origin_run_is_gone(
        project: Project) -> None:
    wf = project.write("wf.yaml", "name: l\nsteps:\n  - id: a\n    run: echo hi\n")
    assert project.run("run", str(wf), "--run-id", "l1").code == 0
    for n in ("0", "-1"):
        r = project.run("logs", "l1", "a", "--attempt", n)
        assert r.code == 2 and "numbered from 1" in r.err, r.err
        assert len(r.err.strip().splitlines()) == 1
    assert project.run("run", str(wf), "--run-id", "l2", "--reuse").code == 0
    r = project.run("logs", "l2", "a")
    assert r.code == 2 and "stockade logs l1 a" in r.err, r.err
    assert project.run("rm", "l1").code == 0
    r = project.run("logs", "l2", "a")
    assert r.code == 2, r.err
    assert "removed" in r.err and "stockade logs l1" not in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1
    assert (project.item("l2", "a") / "work/out").is_dir()
    assert json.loads(project.run("show", "l2", "a", "--json").out)["item"]["reused_from"]
