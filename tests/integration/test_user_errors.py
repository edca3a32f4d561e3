"""Bad input through the real CLI: one actionable message, exit 2, no traceback,
and nothing executed or written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import Project

POSITIONED = re.compile(r"^\S+:\d+:\d+: .+", re.MULTILINE)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "empty"),
        (b"- a\n- b\n", "mapping"),
        (b"\xff\xfe\x00garbage\x00\x01", "UTF-8"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00>\x00", ""),
        (b"name: x\nsteps:\n  - id: a\n    run: echo\n    colour: blue\n", "colour"),
        (b"name: x\nname: y\nsteps: []\n", "duplicate"),
        (b"name: x\nsteps:\n  - id: a\n    run: echo\n    agent: {prompt: hi}\n", "exactly one"),
        (b"name: x\nsteps:\n  - id: a\n    run: echo {{ steps.b.result }}\n", "b"),
        (b"name: x\nsteps:\n  - id: a\n    run: echo {% for x in y %}{% endfor %}\n", "{{ }}"),
        (b"name: x\nsteps:\n  - id: a\n    needs: [a]\n    run: echo\n", "itself"),
        (b"name: x\nsteps:\n  - id: a\n    run: echo {{ vars.nope }}\n", "nope"),
        (b"name: x\nsteps:\n  - id: a\n    keep: '{{ true }}'\n", "for_each"),
        (b"name: x\nsteps:\n  - id: a\n    timeout: -1\n    run: echo\n", "timeout"),
        (b"name: x\nsteps:\n  - id: a\n    agent: {prompt: hi, tools: [create_file], writes: []}\n",
         "agent.writes of step 'a' is empty"),
        (b"name: x\nsteps: [\n", ""),
        (b"\tname: x\n", ""),
    ],
)
def test_malformed_workflow_exits_2_with_positions(project: Project, content: bytes, needle: str) -> None:
    wf = project.path / "wf.yaml"
    wf.write_bytes(content)
    for cmd in (("validate", str(wf)), ("run", str(wf)), ("plan", str(wf))):
        r = project.run(*cmd)
        assert r.code == 2, (cmd, r.err)
        assert "Traceback" not in r.err
        assert POSITIONED.search(r.err), r.err
        assert needle in r.err
    assert not (project.root / "runs").exists()


def test_validate_reports_all_problems_at_once(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: Bad_Name
        steps:
          - id: a
            run: echo
            colour: blue
          - id: a
            needs: [missing]
            run: echo
    """)
    r = project.run("validate", str(wf))
    assert r.code == 2
    lines = POSITIONED.findall(r.err)
    assert len(lines) >= 4, r.err
    assert all(line.startswith(f"{wf}:") for line in lines)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("run", "missing.yaml"), "no such file"),
        (("run", "."), "directory"),
        (("run", "wf.yaml", "--var", "undeclared=1"), "not declared"),
        (("run", "wf.yaml", "--var", "novalue"), "KEY=VALUE"),
        (("run", "wf.yaml", "--var", "count=ten"), "expected a number"),
        (("run", "wf.yaml", "--var", "count=1", "--var", "count=2"),
         "--var count is given twice ('1', then '2'): give it once"),
        (("resume", "no-such-run"), "no run"),
        (("show", "no-such-run"), "no run"),
        (("logs", "no-such-run", "a/0"), "no run"),
    ],
)
def test_bad_arguments_exit_2(project: Project, args: tuple[str, ...], needle: str) -> None:
    project.write("wf.yaml", "name: ok\nvars: {count: 3}\nsteps:\n  - id: a\n    run: echo\n")
    r = project.run(*args)
    assert r.code == 2, r.err
    assert needle in r.err
    assert "Traceback" not in r.err


def test_a_workflow_that_cannot_end_or_is_too_large_is_refused_before_it_is_read(
    project: Project,
) -> None:
    # /dev/zero never ends; a FIFO without a writer used to block the open.
    os.mkfifo(project.path / "fifo.yaml")
    (project.path / "huge.yaml").write_bytes(b"")
    os.truncate(project.path / "huge.yaml", (64 << 20) + 1)
    for args, needle in [
        (("validate", "/dev/zero"), "/dev/zero: not a file but a device or a socket"),
        (("run", "/dev/null"), "/dev/null: not a file but a device or a socket"),
        (("validate", "fifo.yaml"), "fifo.yaml:1:1: the file is empty"),
        (("plan", "huge.yaml"), "huge.yaml: larger than 64 MiB"),
    ]:
        r = project.run(*args, timeout=60)
        assert r.code == 2 and needle in r.err and "Traceback" not in r.err, (args, r.err)
    # A pipe with a writer is read: `stockade validate <(generate)`.
    project.write("wf.yaml", "name: ok\nsteps:\n  - id: a\n    run: echo\n")
    p = subprocess.run(project.cmd("validate", "/dev/stdin"), cwd=project.path, env=project.env,
                       input=(project.path / "wf.yaml").read_text(), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "/dev/stdin: ok (1 step)" in p.stdout, p.stderr


def test_require_sandbox_refuses_with_none_and_runs_nothing(project: Project) -> None:
    marker = project.path / "ran"
    wf = project.write("wf.yaml", f"name: req\nsteps:\n  - id: a\n    run: touch {marker}\n")
    r = project.run("run", str(wf), "--sandbox", "none", "--require-sandbox")
    assert r.code == 2
    assert "requires an enforced sandbox" in r.err
    assert not marker.exists()
    assert not (project.root / "runs").exists()
    wf2 = project.write("wf2.yaml", f"name: req\nsandbox: {{require: true}}\nsteps:\n  - id: a\n    run: touch {marker}\n")
    r = project.run("run", str(wf2), "--sandbox", "none")
    assert r.code == 2
    assert not marker.exists()


def test_schema_is_json_schema_2020_12(project: Project) -> None:
    r = project.run("schema")
    assert r.code == 0
    schema = r.json()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert "steps" in schema["properties"]


def test_runtime_template_errors_name_the_field_position(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: late
        vars: {x: "a"}
        steps:
          - id: big
            run: echo {{ vars.x * 100000000 }}
          - id: notalist
            for_each: "{{ vars.x }}"
            run: echo
          - id: c
            run: echo ok > out/r.txt
          - id: d
            needs: [c]
            inputs:
              r: "{{ steps.c.outputs['missing.txt'] }}"
            run: cat r
    """)
    r = project.run("run", str(wf), "--json")
    assert r.code == 1
    problems = "\n".join(r.json()["problems"])
    assert f"{wf}:6:10: limit exceeded" in problems, problems
    assert f"{wf}:8:15: for_each must give a list" in problems
    assert f"{wf}:15:10: no key 'missing.txt'" in problems
    assert "Traceback" not in r.err


def test_agent_step_without_credentials_says_what_to_set(project: Project) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        project.env.pop(name, None)
    wf = project.write("wf.yaml", """
        name: nokey
        steps:
          - id: ask
            agent:
              model: openai/gpt-4.1-mini
              prompt: Say hello.
    """)
    r = project.run("run", str(wf), "--json")
    # A preflight error: exit 2 before any run folder exists, with FILE:LINE:COL.
    assert r.code == 2, r.err
    assert f"{wf}:6:14: openai/gpt-4.1-mini needs OPENAI_API_KEY in the engine's environment" \
        in r.err
    assert not (project.root / "runs").exists() or not any((project.root / "runs").iterdir())


@pytest.mark.parametrize(("items", "key", "needle"), [
    ("[a, b, c, b]", "{{ item | upper }}", "keys must be unique within the step; repeated: B"),
    ("[{s: x}, {s: y}, {s: x}]", "{{ item.s }}", "keys must be unique within the step; repeated: x"),
    ("[a, b]", "{{ item }}/x", "cannot name an item"),
])
def test_literal_items_with_bad_keys_are_refused_before_the_run(
        project: Project, items: str, key: str, needle: str) -> None:
    wf = project.write("wf.yaml", f"""
        name: keys
        steps:
          - id: first
            run: echo first
          - id: fan
            needs: [first]
            for_each: {items}
            key: "{key}"
            run: echo hi
    """)
    for cmd in (("validate", str(wf)), ("run", str(wf))):
        r = project.run(*cmd)
        assert r.code == 2, (cmd, r.err)
        assert "Traceback" not in r.err
        assert re.search(rf"wf\.yaml:9:\d+: .*{re.escape(needle)}", r.err), r.err
    assert not (project.root / "runs").exists() or not any((project.root / "runs").iterdir())


@pytest.mark.parametrize("key", [
    "{{ item }}",                         # fine
    "{{ item ~ vars.suffix }}",           # reads vars: left to the run
    "{{ item.s }}",                       # does not render on a string: left to the run
])
def test_literal_item_keys_not_known_to_be_bad_are_left_to_the_run(project: Project,
                                                                   key: str) -> None:
    wf = project.write("wf.yaml", f"""
        name: keys
        vars: {{suffix: "-x"}}
        steps:
          - id: fan
            for_each: [a, b]
            key: "{key}"
            run: echo hi
    """)
    assert project.run("validate", str(wf)).code == 0


def _folder(root: Path) -> None:
    (root / "stockade.db").mkdir(parents=True)


def _garbage(root: Path) -> None:
    root.mkdir()
    (root / "stockade.db").write_bytes(b"not a database, just text\n" * 200)


def _runs_is_a_file(root: Path) -> None:
    root.mkdir()
    (root / "runs").write_text("")


@pytest.mark.parametrize(
    ("make", "needle", "commands"),
    [
        (_folder, "stockade.db is a folder, not the run store's database file",
         ("run", "runs", "show", "gc")),
        (_garbage, "stockade.db is not a SQLite database: move it aside",
         ("run", "runs", "show", "gc")),
        (_runs_is_a_file, "runs, where runs go: a file is in the way", ("run",)),
    ],
)
def test_an_unusable_root_is_named_with_what_to_change(
        project: Project, make: Callable[[Path], None], needle: str,
        commands: tuple[str, ...]) -> None:
    """A root whose store or runs folder cannot be used: one message naming
    the path and the options that choose another, exit 2, no traceback; the
    store is left as found and no run is recorded."""
    wf = project.write("wf.yaml", """
        name: x
        steps:
          - id: a
            run: echo hi
    """)
    make(project.root)
    before = sorted((p.relative_to(project.root), p.is_dir() or p.read_bytes())
                    for p in project.root.rglob("*"))
    args = {"run": ("run", str(wf), "--sandbox", "none"), "runs": ("runs",),
            "show": ("show", "last"), "gc": ("gc", "--keep", "0")}
    for command in commands:
        r = project.run(*args[command])
        assert (r.code, r.out) == (2, ""), (command, r.err)
        [line] = r.err.splitlines()
        assert needle in line and str(project.root) in line, line
        assert "--root, $STOCKADE_HOME" in line
    after = sorted((p.relative_to(project.root), p.is_dir() or p.read_bytes())
                   for p in project.root.rglob("*"))
    if make is _runs_is_a_file:
        # The store was made and the run's record taken back out.
        assert project.run("runs").out.strip() == "no runs yet"
        after = [entry for entry in after if not str(entry[0]).startswith("stockade.db")]
    assert after == before


def test_a_root_that_cannot_be_made_is_named(project: Project) -> None:
    wf = project.write("wf.yaml", "name: x\nsteps:\n  - id: a\n    run: echo hi\n")
    r = project.run("run", str(wf), "--sandbox", "none", "--root", "/proc/stockade-root")
    assert (r.code, r.out) == (2, "")
    assert r.err.strip() == (
        "error: cannot make the run store's folder /proc/stockade-root: No such file or "
        "directory; choose another root (--root, $STOCKADE_HOME) or store ($STOCKADE_STORE)")


@pytest.mark.parametrize(
    ("call", "why"),
    [
        ("file('link.txt')", "link.txt is a symlink, not a regular file"),
        ("file('linked/a.txt')", "linked is a symlink, not a folder"),
        ("file('hard.txt')", "hard.txt is a hard link (2 names)"),
        ("tree('linked')", "linked is a symlink, not a folder"),
        # A folder git does not track: validate said ok, the run refused it.
        ("tree('real')", "not in a git checkout; tree() copies the files git tracks there"),
    ],
)
def test_a_host_path_the_run_would_refuse_is_refused_at_its_line(
        project: Project, call: str, why: str) -> None:
    """file() and tree() read through no symlink and no second name; validate
    and run say so at the template's line before anything starts, as for a
    missing file (they used to pass such a path and fail at run start without
    a position)."""
    (project.path / "real").mkdir()
    (project.path / "real" / "a.txt").write_text("a")
    (project.path / "link.txt").symlink_to("real/a.txt")
    (project.path / "linked").symlink_to("real")
    os.link(project.path / "real" / "a.txt", project.path / "hard.txt")
    wf = project.write("wf.yaml", f"""
        name: x
        steps:
          - id: a
            inputs:
              x: "{{{{ {call} }}}}"
            run: cat x
    """)
    for command in ("validate", "run"):
        r = project.run(command, str(wf))
        assert r.code == 2, r.err
        [line] = r.err.splitlines()
        assert line.startswith(f"{wf}:6:") and f"{call}: {why}" in line, line
    assert not (project.root / "runs").exists()


def test_another_runs_outputs_cannot_be_read_through_file_tree_or_mounts(project: Project) -> None:
    """The seed incident's path: yesterday's report taken as today's input by
    its path under the root. A run's outputs reach a step only as
    steps.<id>.outputs of the same run; any root's run folders are refused."""
    first = project.write("report.yaml", "name: daily\nsteps:\n  - id: report\n"
                                         "    run: echo 'numbers 42' > out/report.md\n")
    assert project.run("run", str(first), "--run-id", "yday").code == 0
    # The default root below the workflow's folder, as a user's would be.
    rel_root = os.path.relpath(project.root, project.path)
    other = project.path / "elsewhere"
    shutil.copytree(project.root, other / "old-root", symlinks=True)
    # A folder of the user's named runs/ holding a manifest.json is no root.
    project.write("data/runs/manifest.json", "{}")
    wf = project.write("wf.yaml", f"""
        name: daily
        steps:
          - id: a
            inputs:
              r.md: "{{{{ file('{rel_root}/runs/yday/report/0/work/out/report.md') }}}}"
              t: "{{{{ tree('{rel_root}') }}}}"
              m.json: "{{{{ file('data/runs/manifest.json') }}}}"
            mounts: [{other}/old-root/runs/yday/report]
            run: cat r.md
    """)
    for command in ("validate", "run"):
        r = project.run(command, str(wf))
        assert r.code == 2, r.err
        lines = r.err.splitlines()
        assert len(lines) == 3, lines
        assert lines[0].startswith(f"{wf}:6:") and \
            f"{rel_root} holds stockade's run records" in lines[0], lines
        assert lines[1].startswith(f"{wf}:7:") and f"tree('{rel_root}')" in lines[1], lines
        assert lines[2].startswith(f"{wf}:9:") and \
            f"lies in {other}/old-root/runs/yday, a folder of stockade's run records" in lines[2]
    assert [p.name for p in (project.root / "runs").iterdir()] == ["yday"]


@pytest.mark.parametrize(("content", "why"), [
    (None, "is gone"),
    ("{garbage", "is unreadable (not JSON: "),
    ("[1]", "is unreadable (it lacks the workflow's path"),
    ('{"workflow": {"path": "wf.yaml"}}', "is unreadable (it lacks the workflow's path"),
])
def test_resume_of_a_run_whose_manifest_was_damaged_says_so(
        project: Project, content: str | None, why: str) -> None:
    wf = project.write("wf.yaml", "name: m\nsteps:\n  - id: a\n    run: echo hi\n")
    assert project.run("run", str(wf), "--run-id", "m1").code == 0
    manifest = project.root / "runs" / "m1" / "manifest.json"
    if content is None:
        manifest.unlink()
    else:
        manifest.write_text(content)
    r = project.run("resume", "m1")
    assert r.code == 2 and r.out == "", r.err
    [line] = r.err.splitlines()
    assert line.startswith(f"run 'm1': its manifest {manifest} {why}"), line
    assert line.endswith("resume needs the record the run began with: start a new run")
    shown = project.run("show", "m1")
    assert shown.code == 0 and "a: 1 succeeded" in shown.out, shown.out


def test_a_sink_url_made_from_vars_is_checked_before_the_steps_run(project: Project) -> None:
    """A `publish.to` of vars alone is known at the start: it used to pass
    validate, run every step and then fail the publish (exit 1)."""
    wf = project.write("wf.yaml", """
        name: s
        vars: {u: "ftp://x"}
        steps:
          - id: a
            run: echo hi
          - id: p
            needs: [a]
            publish: {to: "{{ vars.u }}", key: k, payload: x}
    """)
    for args in (("validate", str(wf)), ("run", str(wf)),
                 ("run", str(wf), "--var", "u=sqlite:///r.db")):
        r = project.run(*args)
        assert r.code == 2, r.err
        [line] = r.err.splitlines()
        assert line.startswith(f"{wf}:9:") and "publish.to of step 'p': " in line, line
    assert not (project.root / "runs").exists()
    ok = project.run("run", str(wf), "--var", f"u=file://{project.path / 'sink'}")
    assert ok.code == 0, ok.err
    assert (project.path / "sink" / "k.json").exists()
