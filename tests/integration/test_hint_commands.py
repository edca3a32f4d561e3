"""The commands stockade prints for the next step can be pasted into a shell.

An item's key comes from the workflow (``key: "{{ item }}"``) and may hold a
space, a quote, ``$`` or brackets. Each hint (``more: stockade logs ...``,
``logs: ...``, ``(stockade show ...)``, the empty-log pointer) is read back
the way a shell reads it and run; it must answer for the item it named. The
live table on a terminal prints the same keys: rich markup in them is text.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from stockade.cli.main import cli
from stockade.cli.progress import LiveReporter

KEYS = ["a b", "it's", "c[d]", "$HOME", "x;y"]

WORKFLOW = """\
name: hints
steps:
  - id: each
    for_each: KEYS
    key: "{{ item }}"
    on_item_failure: continue
    inputs: {k.txt: "{{ item }}"}
    run: |
      cat k.txt >&2
      echo x > out/one
      echo y > out/two
      test "$(cat k.txt)" != "a b"
""".replace("KEYS", json.dumps(KEYS))


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("hints")
    (base / "wf.yaml").write_text(WORKFLOW)
    return base


def stockade(home: Path, args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, args, env={"STOCKADE_HOME": str(home / "root")})
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def ran(home: Path) -> str:
    code, _, err = stockade(home, ["run", str(home / "wf.yaml"), "--run-id", "h1",
                                   "--sandbox", "none"])
    assert code == 1, err
    return err


def pasted(text: str) -> list[str]:
    """``text`` (what follows ``stockade ``) as bash reads it (quotes, ``$``,
    ``;``), without the optional ``[--flag]`` parts a hint lists."""
    words = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + re.sub(r" \[--[^]]*\]", "", text)],
                           capture_output=True, text=True, env={"HOME": "/nowhere"})
    return words.stdout.split("\0")[:-1]


def test_a_failed_items_more_line_runs_as_printed(home: Path, ran: str) -> None:
    [line] = [ln for ln in ran.splitlines() if "more: stockade logs" in ln]
    code, out, _ = stockade(home, pasted(line.split("more: stockade ", 1)[1]))
    assert (code, out) == (0, "a b")


@pytest.mark.parametrize("key", KEYS)
def test_the_logs_line_of_an_item_runs_as_printed(home: Path, ran: str, key: str) -> None:
    code, out, _ = stockade(home, ["show", "h1", f"each/{key}"])
    assert code == 0, out
    [line] = [ln for ln in out.splitlines() if "logs: stockade logs" in ln]
    code, out, err = stockade(home, pasted(line.split("logs: stockade ", 1)[1]))
    # An item's stdout is empty: stderr says so and names the command for the other stream.
    assert (code, out) == (0, "")
    hint = re.search(r": stockade (logs .*)$", err.strip())
    assert hint, err
    code, out, _ = stockade(home, pasted(hint.group(1)))
    assert (code, out) == (0, key)


def test_the_outputs_pointer_of_a_runs_listing_runs_as_printed(home: Path, ran: str) -> None:
    code, out, _ = stockade(home, ["show", "h1"])
    assert code == 0, out
    pointers = re.findall(r"\(stockade (show [^\n]*)\)$", out, re.MULTILINE)
    named = set()
    for text in pointers:
        code, shown, _ = stockade(home, pasted(text))
        assert code == 0, shown
        named.add(shown.splitlines()[0].split("  (item")[0])
    # The failed item has no outputs to point at.
    assert named == {f"each/{k}" for k in KEYS if k != "a b"}


def test_why_of_a_failed_item_says_so_and_points_at_its_stderr(home: Path, ran: str) -> None:
    code, out, _ = stockade(home, ["why", "h1", "each/a b"])
    assert code == 0
    assert out.splitlines()[1] == ("  failed: nothing it wrote counts as an output; its stderr: "
                                   "stockade logs h1 'each/a b' --stderr")
    code, out, _ = stockade(home, pasted(out.splitlines()[1].split(": stockade ", 1)[1]))
    assert (code, out) == (0, "a b")


def test_why_of_an_item_that_never_ran_says_why(tmp_path: Path) -> None:
    wf = tmp_path / "wf.yaml"
    wf.write_text("name: never\nsteps:\n  - id: bad\n    run: exit 3\n"
                  "  - id: after\n    needs: [bad]\n    run: echo no\n")
    assert stockade(tmp_path, ["run", str(wf), "--run-id", "n1", "--sandbox", "none"])[0] == 1
    assert stockade(tmp_path, ["why", "n1", "after/0"]) == (
        2, "", "after/0 never ran (skipped: bad did not succeed), so it has no outputs and no "
               "provenance\n")


def test_resumes_way_on_names_a_workflow_path_with_a_space(tmp_path: Path) -> None:
    wf = tmp_path / "my flows" / "wf.yaml"
    wf.parent.mkdir()
    wf.write_text(WORKFLOW)
    code, _, err = stockade(tmp_path, ["run", str(wf), "--run-id", "h2", "--sandbox", "none"])
    assert code == 1, err
    wf.write_text(WORKFLOW + "      true\n")
    code, _, err = stockade(tmp_path, ["resume", "h2"])
    assert code == 2
    hint = re.search(r"`stockade (run [^`]*)`", err)
    assert hint, err
    assert pasted(hint.group(1)) == ["run", str(wf), "--reuse"]


@pytest.mark.parametrize("message", ["missing out/[/x].txt", "[bold]loud[/bold]", "[red"])
def test_the_live_table_prints_keys_and_messages_as_text(message: str) -> None:
    reporter = LiveReporter()
    buffer = io.StringIO()
    reporter.console = Console(file=buffer, force_terminal=True, color_system=None, width=200)
    reporter.run_id = "h1"
    reporter.item_retrying("each", "c[d]", 1, 2.0, message)
    reporter.item_finished("each", "c[d]", "failed", 2, message, tail="boom")
    assert buffer.getvalue().splitlines() == [
        f"each/c[d]: attempt 1 failed ({message}); retry in 2.0s",
        f"each/c[d]: failed (attempt 2) {message}",
        "    | boom",
        "    more: stockade logs h1 'each/c[d]' --stderr",
    ]


def test_hints_of_a_run_in_another_root_name_that_root(tmp_path: Path) -> None:
    """With --root, the printed `stockade logs ...` and `stockade show ...`
    answered "no run" as typed: they named no root."""
    (tmp_path / "wf.yaml").write_text(WORKFLOW)
    other = tmp_path / "other root"
    result = CliRunner().invoke(cli, ["run", str(tmp_path / "wf.yaml"), "--run-id", "r1",
                                      "--sandbox", "none", "--root", str(other)],
                                env={"STOCKADE_HOME": str(tmp_path / "default")})
    assert result.exit_code == 1, result.stderr
    [more] = [ln for ln in result.stderr.splitlines() if "more: stockade logs" in ln]
    [details] = [ln for ln in result.stderr.splitlines() if "details: stockade show" in ln]
    for text in (more.split("more: stockade ", 1)[1], details.split("details: stockade ", 1)[1]):
        args = pasted(text)
        assert args[-2:] == ["--root", str(other)], args
        again = CliRunner().invoke(cli, args, env={"STOCKADE_HOME": str(tmp_path / "default")})
        assert again.exit_code == 0, again.stderr
