"""Hand a coding step's diff to a host checkout (``stockade apply``).

``plan_apply`` finds the diff the agent session wrote
(``meta/<n>/changes.diff``), checks that each section names only its
own file, fits the paths to the checkout, resolves every target inside it
and refuses targets the step's prompt did not name. ``execute`` applies the
plan with ``git apply`` (checked first) and then compares ``git diff
--name-only`` plus new untracked files with the targets: any other file that
changed fails it. Refusals are ``ApplyRefused`` (exit 1), bad input
``UserError`` (exit 2); the CLI only parses, confirms and prints.

Must not import the runner or the CLI.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from stockade.agent import guard
from stockade.errors import StockadeError, UserError
from stockade.workspace.layout import ItemDir


class ApplyRefused(StockadeError):
    """The diff must not be applied (or did something it should not); nothing is hidden."""

    exit_code = 1

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
        raise UserError(f"git {' '.join(args)} failed in {dest}: {r.stderr.strip()}")
    return r.stdout


def changed_names(dest: Path) -> set[str]:
    """Modified tracked files and new untracked files, relative to ``dest``."""
    names = _git(dest, "diff", "--name-only", "--relative").splitlines()
    names += _git(dest, "ls-files", "--others", "--exclude-standard").splitlines()
    return {n for n in names if n}


def attempt_with_diff(idir: ItemDir) -> Path | None:
    """The newest attempt that handed out a diff."""
    for n in range(idir.last_attempt(), 0, -1):
        if (idir.attempt_dir(n) / "changes.diff").is_file():
            return idir.attempt_dir(n)
    return None


@dataclass(frozen=True)
class Target:
    rel: str
    host: Path
    new: bool


@dataclass(frozen=True)
class ApplyPlan:
    dest: Path
    files: list[FileDiff]
    level: int
    targets: list[Target]

    @property
    def empty(self) -> bool:
        return not self.files


def plan_apply(idir: ItemDir, label: str, dest: Path) -> ApplyPlan:
    """Everything checked that can be checked before anything is written."""
    adir = attempt_with_diff(idir)
    if adir is None:
        raise UserError(f"no agent diff under {idir.meta} (is {label} an agent step?)")
    outcome_file = adir / "outcome.json"
    if outcome_file.is_file():
        outcome = json.loads(outcome_file.read_text())
        if not outcome.get("ok"):
            raise ApplyRefused(f"{label} attempt {adir.name} failed ({outcome.get('message')}); "
                               "refusing its diff")
    prompt = json.loads((adir / "agent.json").read_text())["prompt"]
    files = split_diff((adir / "changes.diff").read_text())
    problems = check_sections(files)
    if problems:
        raise ApplyRefused("the diff is malformed; nothing applied: " + "; ".join(problems))
    dest = dest.resolve()
    if not files:
        return ApplyPlan(dest, [], 0, [])
    try:
        _git(dest, "rev-parse", "--is-inside-work-tree")
    except UserError:
        raise UserError(f"{dest} is not a git work tree") from None
    level = choose_strip(files, dest)
    if level is None:
        raise ApplyRefused(f"the diff's files do not fit {dest}: "
                           + ", ".join(f.path for f in files))
    named = guard.mentions(prompt)
    targets: list[Target] = []
    refused: list[str] = []
    for f in files:
        rel = guard.normalise(f.path.split("/", level)[level] if level else f.path)
        targets.append(Target(rel, guard.resolve_inside(dest, rel), f.new))
        if not (guard.named_in(f.path, named) or rel in named):
            refused.append(rel)
    if refused:
        raise ApplyRefused("refusing targets the prompt did not name: " + ", ".join(refused))
    return ApplyPlan(dest, files, level, targets)


def execute(plan: ApplyPlan) -> None:
    """Apply the plan; refuse (nothing applied) if git would not, fail on extra changes."""
    dest = plan.dest
    before = changed_names(dest)
    prefix = _git(dest, "rev-parse", "--show-prefix").strip()
    top = Path(_git(dest, "rev-parse", "--show-toplevel").strip())
    patch_text = "".join(rewrite(f, plan.level) for f in plan.files)
    args = ["apply", "--whitespace=nowarn"] + ([f"--directory={prefix.rstrip('/')}"] if prefix
                                                else [])
    check = subprocess.run(["git", *args, "--check", "-"], cwd=top, input=patch_text,
                           capture_output=True, text=True)
    if check.returncode != 0:
        raise ApplyRefused("git apply --check refused the diff; nothing applied:\n"
                           + check.stderr.strip())
    done = subprocess.run(["git", *args, "-"], cwd=top, input=patch_text, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise ApplyRefused(f"git apply failed:\n{done.stderr.strip()}")
    extra = extra_names(before, changed_names(dest), [t.rel for t in plan.targets])
    if extra:
        raise ApplyRefused("files changed that the diff did not name: " + ", ".join(extra))
