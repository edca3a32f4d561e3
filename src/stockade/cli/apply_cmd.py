"""``stockade apply RUN_ID STEP/ITEM --to DIR``: hand a coding step's diff to a checkout.

Finds the diff the agent session wrote (``meta/attempts/<n>/changes.diff``),
resolves every target inside ``DIR``, prints each one, refuses targets the
step's prompt did not name, asks for confirmation (``--yes`` skips), applies
with ``git apply``, then checks ``git diff --name-only`` (plus new untracked
files) against the targets and fails on any extra.

Exit status: 0 applied, 1 refused/failed/extra paths, 2 bad input.
Imports the agent's pure guard only; never the runner.

Must not import the runner.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from stockade.agent import guard
from stockade.workspace.layout import ItemDir, RunDir

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

_GIT_HEADER = re.compile(r"^diff --git a/(.+) b/(.+)$")


@dataclass(frozen=True)
class FileDiff:
    path: str  # work-relative
    text: str
    new: bool


def split_diff(diff: str) -> list[FileDiff]:
    """One entry per ``diff --git`` section, in order."""
    out: list[FileDiff] = []
    cur: list[str] = []
    path = ""
    for line in diff.splitlines(keepends=True):
        m = _GIT_HEADER.match(line.rstrip("\n"))
        if m:
            if cur:
                out.append(FileDiff(path, "".join(cur), "new file mode" in "".join(cur[:3])))
            path, cur = m.group(1), [line]
        elif cur:
            cur.append(line)
    if cur:
        out.append(FileDiff(path, "".join(cur), "new file mode" in "".join(cur[:3])))
    return out


def check_sections(files: list[FileDiff]) -> list[str]:
    """Problems with sections whose ``---``/``+++`` lines name a file other than their own.

    The session writes one ``diff --git`` section per file; a section that
    smuggles a second file in would be applied by git without being listed.
    """
    problems: list[str] = []
    for f in files:
        for line in f.text.splitlines():
            if line.startswith(("--- ", "+++ ")) and not line.startswith(("--- /dev/null", "+++ /dev/null")):
                named = line[4:].split("\t", 1)[0]
                if named[2:] != f.path or named[:2] not in ("a/", "b/"):
                    problems.append(f"section for {f.path} also names {named}")
    return problems


def extra_names(before: set[str], after: set[str], targets: list[str]) -> list[str]:
    """Files that changed during the apply and are not its targets."""
    return sorted((after - before) - set(targets))


def choose_strip(files: list[FileDiff], dest: Path) -> int | None:
    """0 when the work paths fit ``dest`` as they are, 1 when they sit in one input folder.

    A coding step gets its checkout as an input folder (``repo/...``), so its
    diff names ``repo/billing/utils.py`` while the checkout has ``billing/utils.py``.
    """

    def fits(level: int) -> bool:
        for f in files:
            parts = f.path.split("/")
            if len(parts) <= level:
                return False
            target = dest.joinpath(*parts[level:])
            if f.new == os.path.lexists(target):
                return False
        return True

    if fits(0):
        return 0
    heads = {f.path.split("/", 1)[0] for f in files}
    if len(heads) == 1 and fits(1):
        return 1
    return None


def rewrite(f: FileDiff, level: int) -> str:
    if level == 0:
        return f.text
    stripped = f.path.split("/", level)[level]
    out: list[str] = []
    for line in f.text.splitlines(keepends=True):
        if line.startswith("diff --git "):
            line = f"diff --git a/{stripped} b/{stripped}\n"
        elif line.startswith("--- a/") or line.startswith("+++ b/"):
            line = line[:6] + stripped + "\n"
        out.append(line)
    return "".join(out)


def _git(dest: Path, *args: str) -> str:
    r = subprocess.run(["git", *args], cwd=dest, capture_output=True, text=True)
    if r.returncode != 0:
        raise click.ClickException(f"git {' '.join(args)} failed in {dest}: {r.stderr.strip()}")
    return r.stdout


def changed_names(dest: Path) -> set[str]:
    """Modified tracked files and new untracked files, relative to ``dest``."""
    names = _git(dest, "diff", "--name-only", "--relative").splitlines()
    names += _git(dest, "ls-files", "--others", "--exclude-standard").splitlines()
    return {n for n in names if n}


def _attempt_dir(idir: ItemDir) -> Path | None:
    """The newest attempt that handed out a diff."""
    for n in range(idir.last_attempt(), 0, -1):
        if (idir.attempt_dir(n) / "changes.diff").is_file():
            return idir.attempt_dir(n)
    return None


def _fail(code: int, message: str) -> None:
    click.echo(f"stockade apply: {message}", err=True)
    sys.exit(code)


@click.command("apply")
@click.argument("run_id")
@click.argument("step_item", metavar="STEP/ITEM")
@click.option("--to", "dest", required=True, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="the host checkout (a git work tree) to apply the diff to")
@click.option("--yes", is_flag=True, help="do not ask for confirmation (automation)")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="runs folder (default: $STOCKADE_HOME or ./.stockade)")
def apply(run_id: str, step_item: str, dest: Path, yes: bool, root: Path | None) -> None:
    """Apply the diff an agent step handed out to a git checkout."""
    root = root or Path(os.environ.get("STOCKADE_HOME") or ".stockade")
    step, _, item = step_item.partition("/")
    item = item or "0"
    if not step or not item.isdigit():
        _fail(EXIT_BAD_INPUT, f"expected STEP/ITEM such as 'fix/0', got {step_item!r}")
    idir = RunDir(root, run_id).item(step, int(item))
    adir = _attempt_dir(idir)
    if adir is None:
        _fail(EXIT_BAD_INPUT, f"no agent diff under {idir.meta} (is {step_item} an agent step of run {run_id}?)")
    assert adir is not None
    outcome_file = adir / "outcome.json"
    if outcome_file.is_file():
        outcome = json.loads(outcome_file.read_text())
        if not outcome.get("ok"):
            _fail(EXIT_FAILED, f"{step_item} attempt {adir.name} failed ({outcome.get('message')}); refusing its diff")
    prompt = json.loads((adir / "agent.json").read_text())["prompt"]
    files = split_diff((adir / "changes.diff").read_text())
    problems = check_sections(files)
    if problems:
        _fail(EXIT_FAILED, "the diff is malformed; nothing applied: " + "; ".join(problems))
    if not files:
        click.echo(f"{step_item} changed nothing; nothing to apply.")
        return
    dest = dest.resolve()
    try:
        _git(dest, "rev-parse", "--is-inside-work-tree")
    except click.ClickException:
        _fail(EXIT_BAD_INPUT, f"{dest} is not a git work tree")
    level = choose_strip(files, dest)
    if level is None:
        _fail(EXIT_FAILED, f"the diff's files do not fit {dest}: " + ", ".join(f.path for f in files))
    assert level is not None
    named = guard.mentions(prompt)
    targets: list[str] = []
    refused: list[str] = []
    for f in files:
        rel = guard.normalise(f.path.split("/", level)[level] if level else f.path)
        host = guard.resolve_inside(dest, rel)
        click.echo(f"TARGET: {host}{'  (new file)' if f.new else ''}")
        if not (guard.named_in(f.path, named) or rel in named):
            refused.append(rel)
        targets.append(rel)
    if refused:
        _fail(EXIT_FAILED, "refusing targets the prompt did not name: " + ", ".join(refused))
    if not yes and not click.confirm(f"Apply {len(targets)} change(s) to {dest}?", default=False):
        _fail(EXIT_FAILED, "not confirmed; nothing applied")
    before = changed_names(dest)
    prefix = _git(dest, "rev-parse", "--show-prefix").strip()
    top = Path(_git(dest, "rev-parse", "--show-toplevel").strip())
    patch_text = "".join(rewrite(f, level) for f in files)
    args = ["apply", "--whitespace=nowarn"] + ([f"--directory={prefix.rstrip('/')}"] if prefix else [])
    check = subprocess.run(["git", *args, "--check", "-"], cwd=top, input=patch_text, capture_output=True, text=True)
    if check.returncode != 0:
        _fail(EXIT_FAILED, f"git apply --check refused the diff; nothing applied:\n{check.stderr.strip()}")
    done = subprocess.run(["git", *args, "-"], cwd=top, input=patch_text, capture_output=True, text=True)
    if done.returncode != 0:
        _fail(EXIT_FAILED, f"git apply failed:\n{done.stderr.strip()}")
    after = changed_names(dest)
    extra = extra_names(before, after, targets)
    if extra:
        _fail(EXIT_FAILED, "files changed that the diff did not name: " + ", ".join(extra))
    for t in targets:
        click.echo(f"applied: {t}")
