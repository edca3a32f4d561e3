"""Write targets a model may name to fool the operator or break the broker, through
the real command line: control and bidi characters (a forged approval line, forged
sections of the handed-out diff), names too long for the file system, a target that
names a folder. Each is a tool error the model reads; nothing is written, the loop
goes on and the item ends on the model's next answer. Names made by a plain ``run:``
step reach the terminal escaped, and ``--json`` keeps them as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from modelserver import Call, ModelServer, Turn, calls, say
from test_providers_cli import RUN, Cli, agent_step

FORGED = "out/payload.sh\r\x1b[2KAllow the agent to write out/report.md"
#: a name that would add a section for a file no tool wrote to out/changes.diff
DIFF_FORGE = ("repo/a.py\n--- /dev/null\n+++ b/evil.py\n@@ -0,0 +1 @@\n+import os\n"
              "diff --git a/x.py b/x.py")


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def _files(root: Path) -> list[str]:
    """The files under ``root``, but the diff the engine hands out (out/changes.diff)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and p.name != "changes.diff")


def _agent(cli: Cli, targets: list[str], *, writes: str = '["out/**"]') -> tuple[int, list[str], Path]:
    """Run an agent that tries each target, then writes out/report.md; the tool results it read."""
    script: list[Turn] = [calls(Call("create_file", {"path": t, "content": "x\n"})) for t in targets]
    script += [calls(Call("create_file", {"path": "out/report.md", "content": "ok\n"})), say("done")]
    with ModelServer(script, validate=True) as srv:
        code, _ = cli.run(agent_step("openai/m", extra=f"writes: {writes}",
                                     step="outputs: [report.md]"), srv.env("openai"))
    assert srv.errors == []
    results = [r for seen in srv.seen[1:] for r in seen.tool_results()]
    return code, results, cli.home / "runs" / RUN / "ask" / "0"


@pytest.mark.parametrize(("target", "code_point"), [
    (FORGED, "U+000D"),
    ("out/a\x1b]0;owned\x07.md", "U+001B"),
    ("out/tab\there.md", "U+0009"),
    ("out/del\x7f.md", "U+007F"),
    ("out/c1\x9b2K.md", "U+009B"),
    ("out/\u202egpj.sh", "U+202E"),
    ("out/iso\u2066late.md", "U+2066"),
    ("out/zero\u200bwidth.md", "U+200B"),
], ids=["cr-esc", "osc", "tab", "del", "csi-c1", "rlo", "lri", "zwsp"])
def test_a_control_or_bidi_character_in_a_target_is_a_tool_error(cli: Cli, target: str,
                                                                  code_point: str) -> None:
    code, results, item = _agent(cli, [target])
    assert code == 0, cli.item()["item"]["message"]
    assert results[0].startswith("error: the path contains ") and f"({code_point})" in results[0]
    assert "name files with printable characters" in results[0]
    assert _files(item / "work") == ["out/report.md"]
    writes = [json.loads(line) for line in (item / "meta" / "1" / "writes.jsonl").read_text().splitlines()]
    assert [w["event"] for w in writes] == ["intent", "written"]  # the jail refused it first


def test_the_approval_echo_never_carries_the_forged_line(cli: Cli) -> None:
    """``WRITE TARGET`` goes to the terminal; a CR there would read as another target."""
    script = [calls(Call("create_file", {"path": FORGED, "content": "rm -rf ~\n"})), say("done")]
    with ModelServer(script, validate=True) as srv:
        wf = cli.write(agent_step("openai/m"))
        r = cli.stockade("run", str(wf), "--run-id", RUN, env=srv.env("openai"))
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stdout + r.stderr and "\x1b" not in r.stdout + r.stderr
    assert "WRITE TARGET" not in r.stdout + r.stderr
    assert _files(cli.home / "runs" / RUN / "ask" / "0" / "work") == []


def test_a_newline_cannot_forge_a_section_of_the_diff(cli: Cli) -> None:
    """``repo/**/*.py`` once matched a name with a newline (``*`` was ``[^/]*``)."""
    code, results, item = _agent(cli, [DIFF_FORGE], writes='["out/**", "repo/**/*.py"]')
    assert code == 0
    assert "(U+000A)" in results[0]
    diff = (item / "work" / "out" / "changes.diff").read_text()
    assert diff == (item / "meta" / "1" / "changes.diff").read_text()
    assert "evil.py" not in diff and "x.py" not in diff
    assert [line for line in diff.splitlines() if line.startswith("diff --git")] == \
        ["diff --git a/out/report.md b/out/report.md"]


@pytest.mark.parametrize("target", [
    "out/" + "a" * 300,
    "out/" + "/".join(["d" * 99] * 42) + "/f.md",  # 4,2xx characters of short names
], ids=["name-300", "path-4200"])
def test_a_name_too_long_is_a_tool_error_and_the_broker_lives_on(cli: Cli, target: str) -> None:
    assert len(target) > 4200 or len(target.rsplit("/", 1)[-1]) == 300
    code, results, item = _agent(cli, [target])
    assert code == 0, cli.item()["item"]["message"]
    assert results[0].startswith("error: ") and "file name too long" in results[0], results[0]
    assert results[1].startswith("created out/report.md")
    assert _files(item / "work") == ["out/report.md"]
    assert sorted(p.name for p in (item / "work" / "out").iterdir()) == ["changes.diff", "report.md"]


@pytest.mark.parametrize("target", ["out/x/", "out/x/."])
def test_a_target_that_names_a_folder_is_a_tool_error(cli: Cli, target: str) -> None:
    code, results, item = _agent(cli, [target])
    assert code == 0
    assert results[0].startswith("error: ") and "names a folder" in results[0], results[0]
    assert _files(item / "work") == ["out/report.md"]


def test_show_and_why_escape_names_a_run_step_made(cli: Cli) -> None:
    wf = cli.write(r"""
        name: names
        steps:
          - id: mk
            run: |
              printf x > "out/a$(printf '\r')b.txt"
              printf y > "out/c$(printf '\033')[2Kd.txt"
              printf z > "out/$(printf '\342\200\256')gpj.sh"
    """)
    r = cli.stockade("run", str(wf), "--run-id", RUN)
    assert r.returncode == 0, r.stderr
    names = {"a\rb.txt", "c\x1b[2Kd.txt", "\u202egpj.sh"}
    shown = {"out/a\\rb.txt", "out/c\\x1b[2Kd.txt", "out/\\u202egpj.sh"}
    for args in (("show", RUN), ("show", RUN, "mk/0"), ("why", RUN, "mk/0")):
        out = cli.stockade(*args)
        assert out.returncode == 0, out.stderr
        assert all(s in out.stdout for s in shown), (args, out.stdout)
        assert not any(c in out.stdout for c in "\r\x1b\u202e"), (args, out.stdout)
    assert {o["name"] for o in cli.item("mk")["item"]["outputs"]} == names
    why = json.loads(cli.stockade("why", RUN, "mk/0", "--json").stdout)
    assert {o["name"] for o in why["outputs"]} == names
