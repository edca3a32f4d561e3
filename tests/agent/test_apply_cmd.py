"""``stockade apply``: a coding step's diff onto a real git checkout."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from modelserver import Call, ModelServer, calls, say

from stockade.agent.apply import changed_names, extra_names
from stockade.cli.apply_cmd import apply
from stockade.spec.model import Agent
from stockade.store.base import ItemRecord, RunRecord
from stockade.store.sqlite import SQLiteStore
from tests.agent.conftest import run_item

UTILS = "def total(xs):\n    return round(sum(xs), 2)\n"
APP = "print('app')\n"
DIFF = "--- a/billing/utils.py\n+++ b/billing/utils.py\n@@ -1,2 +1,2 @@\n def total(xs):\n-    return round(sum(xs), 2)\n+    return round(sum(xs), 3)\n"
PROMPT = "In billing/utils.py round to 3 places; add a note in NOTES.md."


def _checkout(path: Path) -> Path:
    (path / "billing").mkdir(parents=True)
    (path / "billing" / "utils.py").write_text(UTILS)
    (path / "src").mkdir()
    (path / "src" / "app.py").write_text(APP)
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "base"]):
        subprocess.run(["git", *cmd], cwd=path, check=True)
    return path


@pytest.fixture
def coded(short_tmp: Path) -> Path:
    """A finished coding item: the checkout as input folder repo/, one patch, one new file."""
    script = [
        calls(Call("apply_patch", {"path": "repo/billing/utils.py", "diff": DIFF}),
              Call("create_file", {"path": "repo/NOTES.md", "content": "rounded to 3\n"})),
        say("done"),
    ]
    with ModelServer(script) as srv:
        outcome, _ = run_item(
            short_tmp,
            backend="none",
            agent=Agent(model="openai/coder", prompt=PROMPT, tools=["read_file", "apply_patch", "create_file"],
                        writes=["repo/**"]),
            host_env=srv.env("openai"),
            inputs={"repo/billing/utils.py": UTILS, "repo/src/app.py": APP},
        )
    assert outcome.ok, outcome.message
    assert outcome.writes == ("repo/NOTES.md", "repo/billing/utils.py")
    return short_tmp


def _record(root: Path) -> None:
    """The run store's record of the agent item ``run_item`` left under ``root``."""
    store = SQLiteStore(root / "stockade.db")
    if store.get_run("r1") is None:
        store.create_run(RunRecord("r1", "wf", "wf.yaml", "0" * 64, str(root), "succeeded", 1.0))
        store.complete_item(ItemRecord("r1", "step", 0, "succeeded", 1, key="0"), [])
    store.close()


def _apply(root: Path, dest: Path, *extra: str, input: str | None = None) -> tuple[int, str]:
    _record(root)
    r = CliRunner().invoke(apply, ["r1", "step/0", "--to", str(dest), "--root", str(root), *extra], input=input)
    return r.exit_code, r.output


def test_applies_named_targets(coded: Path, tmp_path: Path) -> None:
    dest = _checkout(tmp_path / "co")
    code, out = _apply(coded, dest, "--yes")
    assert code == 0, out
    assert f"TARGET: {dest / 'billing/utils.py'}" in out and f"TARGET: {dest / 'NOTES.md'}  (new file)" in out
    assert "round(sum(xs), 3)" in (dest / "billing/utils.py").read_text()
    assert (dest / "NOTES.md").read_text() == "rounded to 3\n"
    assert (dest / "src/app.py").read_text() == APP


def test_asks_and_no_means_nothing(coded: Path, tmp_path: Path) -> None:
    dest = _checkout(tmp_path / "co")
    code, out = _apply(coded, dest, input="n\n")
    assert code == 1 and "not confirmed" in out
    assert (dest / "billing/utils.py").read_text() == UTILS and not (dest / "NOTES.md").exists()
    code, out = _apply(coded, dest, input="y\n")
    assert code == 0, out


def test_refuses_targets_the_prompt_did_not_name(coded: Path, tmp_path: Path) -> None:
    dest = _checkout(tmp_path / "co")
    cfg = coded / "runs/r1/step/0/meta/1/agent.json"
    data = json.loads(cfg.read_text())
    data["prompt"] = "In billing/utils.py round to 3 places."
    cfg.write_text(json.dumps(data))
    code, out = _apply(coded, dest, "--yes")
    assert code == 1 and "did not name: NOTES.md" in out
    assert (dest / "billing/utils.py").read_text() == UTILS


def test_refuses_a_hidden_second_file(coded: Path, tmp_path: Path) -> None:
    """A section that smuggles another file (no git header of its own) applies nothing."""
    dest = _checkout(tmp_path / "co")
    diff_file = coded / "runs/r1/step/0/meta/1/changes.diff"
    hidden = "--- a/repo/src/app.py\n+++ b/repo/src/app.py\n@@ -1 +1 @@\n-print('app')\n+print('pwned')\n"
    text = diff_file.read_text()
    diff_file.write_text(text + hidden)
    code, out = _apply(coded, dest, "--yes")
    assert code == 1 and "also names a/repo/src/app.py" in out, out
    assert (dest / "src/app.py").read_text() == APP and (dest / "billing/utils.py").read_text() == UTILS


@pytest.mark.parametrize(
    ("before", "after", "targets", "extra"),
    [
        (set(), {"a.py"}, ["a.py"], []),
        ({"dirty.py"}, {"dirty.py", "a.py"}, ["a.py"], []),
        (set(), {"a.py", "b.py"}, ["a.py"], ["b.py"]),
        (set(), {"new/c.py", "a.py"}, ["a.py"], ["new/c.py"]),
    ],
)
def test_extra_names(before: set[str], after: set[str], targets: list[str], extra: list[str]) -> None:
    assert extra_names(before, after, targets) == extra


def test_extra_check_sees_real_git(tmp_path: Path) -> None:
    dest = _checkout(tmp_path / "co")
    before = changed_names(dest)
    (dest / "billing/utils.py").write_text("x\n")
    (dest / "stray.txt").write_text("y\n")
    assert extra_names(before, changed_names(dest), ["billing/utils.py"]) == ["stray.txt"]


def test_refuses_failed_item_and_missing_run(coded: Path, tmp_path: Path) -> None:
    dest = _checkout(tmp_path / "co")
    out_file = coded / "runs/r1/step/0/meta/1/outcome.json"
    data = json.loads(out_file.read_text())
    out_file.write_text(json.dumps(data | {"ok": False, "message": "files changed without the write tools: x"}))
    code, out = _apply(coded, dest, "--yes")
    assert code == 1 and "refusing its diff" in out
    code, out = CliRunner().invoke(apply, ["nope", "step/0", "--to", str(dest), "--root", str(coded)]).exit_code, ""
    assert code == 2
