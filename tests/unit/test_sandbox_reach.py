"""Bridge plans and the jail's PATH (``stockade.sandbox._reach``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stockade.sandbox._reach import BridgePlan, Root, bridge_plan, jail_path, searchable_by

BLOCKED = {"/root", "/tmp/priv", "/srv/a/closed"}


def searchable(folder: str) -> bool:
    return folder not in BLOCKED


PLAN_CASES = [
    ("all reachable", [("/runs/r/s/0/work", True), ("/runs/.scratch/s/0", True)], None),
    (
        "private run folder",
        [("/tmp/priv/runs/r/s/0/work", True), ("/tmp/priv/runs/r/.scratch/s/0", True)],
        BridgePlan(
            tmpfs=("/tmp/priv",),
            dirs=(
                "/tmp/priv/runs", "/tmp/priv/runs/r", "/tmp/priv/runs/r/.scratch",
                "/tmp/priv/runs/r/s", "/tmp/priv/runs/r/.scratch/s", "/tmp/priv/runs/r/s/0",
                "/tmp/priv/runs/r/.scratch/s/0", "/tmp/priv/runs/r/s/0/work",
            ),
            files=(),
            binds=("/tmp/priv/runs/r/.scratch/s/0", "/tmp/priv/runs/r/s/0/work"),
        ),
    ),
    (
        "a file mount under /root, work reachable",
        [("/runs/w", True), ("/root/tools/cfg.json", False)],
        BridgePlan(("/root",), ("/root/tools",), ("/root/tools/cfg.json",),
                   ("/root/tools/cfg.json",)),
    ),
    (
        "two blocked tops, one path below another bound one",
        [("/srv/a/closed/x", True), ("/tmp/priv/w", True), ("/tmp/priv/w/inner", True)],
        BridgePlan(("/srv/a/closed", "/tmp/priv"), ("/tmp/priv/w", "/srv/a/closed/x"), (),
                   ("/tmp/priv/w", "/srv/a/closed/x")),
    ),
    (
        "the path itself closed: not a bridge's business",
        [("/tmp/priv", True)],
        None,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("name", "paths", "expected"), PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_bridge_plan(name: str, paths: list[tuple[str, bool]], expected: BridgePlan | None) -> None:
    assert bridge_plan(paths, searchable) == expected


def test_bridge_plan_refuses_a_closed_root() -> None:
    with pytest.raises(ValueError):
        bridge_plan([("/w", True)], lambda f: f != "/")


JAIL = 60999


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Host folders as a jail with uid JAIL sees them (tmp_path itself is 0700)."""
    for rel, mode in [
        ("sys", 0o755), ("sys/bin", 0o755), ("sys/local", 0o755), ("sys/local/bin", 0o755),
        ("sys/closed", 0o700), ("sys/closed/bin", 0o755), ("sys/mine", 0o700),
        ("outside", 0o755), ("outside/bin", 0o755),
        ("work", 0o755), ("work/tools", 0o755), ("mnt", 0o755), ("mnt/bin", 0o755),
    ]:  # fmt: skip
        (tmp_path / rel).mkdir()
        (tmp_path / rel).chmod(mode)
    if os.geteuid() == 0:
        os.chown(tmp_path / "sys/mine", JAIL, JAIL)
    os.symlink(tmp_path / "sys/local/bin", tmp_path / "sys/link")
    os.symlink(tmp_path / "outside/bin", tmp_path / "sys/away")
    (tmp_path / "sys/file").write_text("")
    return tmp_path


PATH_CASES = [
    ("kept", "{t}/sys/bin", "{t}/sys/bin"),
    ("missing", "{t}/sys/nope:{t}/sys/bin", "{t}/sys/bin"),
    ("not a folder", "{t}/sys/file", ""),
    ("outside every root", "{t}/outside/bin:/root/.pyenv/shims", ""),
    ("a closed folder on the way", "{t}/sys/closed/bin:{t}/sys/bin", "{t}/sys/bin"),
    ("the jail's own 0700 folder", "{t}/sys/mine", "{t}/sys/mine"),
    ("relative and empty", "bin::.:{t}/sys/bin", "{t}/sys/bin"),
    ("each once, normalised", "{t}/sys/bin/:{t}/sys//bin", "{t}/sys/bin"),
    ("a symlink within the roots", "{t}/sys/link", "{t}/sys/link"),
    ("a symlink out of them", "{t}/sys/away", ""),
    ("work below a private folder (bound)", "{t}/work/tools", "{t}/work/tools"),
    ("a mount seen at another path", "/opt/mnt/bin:{t}/mnt/bin", "/opt/mnt/bin"),
]


@pytest.mark.parametrize(("name", "value", "expected"), PATH_CASES, ids=[c[0] for c in PATH_CASES])
def test_jail_path(tree: Path, name: str, value: str, expected: str) -> None:
    if os.geteuid() != 0 and name == "the jail's own 0700 folder":
        pytest.skip("chown to the jail uid needs root")
    t = str(tree)
    roots = [
        # A system root: every folder from / down counts; tmp_path is 0700,
        # so it is made passable here as a bridge would make it.
        Root(f"{t}/sys", f"{t}/sys", True),
        Root(f"{t}/work", f"{t}/work", True),
        Root("/opt/mnt", f"{t}/mnt", True),
    ]
    assert jail_path(value.format(t=t), roots, searchable_by(JAIL)) == expected.format(t=t)


def test_jail_path_unbound_root_needs_every_folder_from_the_top(tree: Path) -> None:
    # tmp_path's own parents are 0700: without a bind or bridge the jail
    # cannot get there.
    roots = [Root(f"{tree}/sys", f"{tree}/sys", False)]
    assert jail_path(f"{tree}/sys/bin", roots, searchable_by(JAIL)) == ""
    assert jail_path("/usr/bin:/bin", [Root("/usr", "/usr", False), Root("/bin", "/bin", False)],
                     searchable_by(JAIL)) == "/usr/bin:/bin"  # fmt: skip
