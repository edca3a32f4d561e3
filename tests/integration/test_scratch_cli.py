"""An attempt's scratch folder (HOME, TMPDIR; under bwrap also /tmp and
/dev/shm) through the real ``stockade run`` on every backend
(``workspace.layout.ScratchPool``): every attempt starts in an empty one
with the mode the engine made it with, whatever the attempt before it left
there or did to it. An enforced jail's folder is removed when its attempt
ends unless the jail was seen wholly gone (its cgroup found empty as its
main process ended): a jail still dying could write into a folder kept for the next
attempt. Without a sandbox, an empty folder is lent again as it is.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pytest

from stockade.sandbox._bwrap_argv import SCRATCH_POINTS
from tests.integration.conftest import Project
from tests.sandbox.lifetime_helpers import ALL_BACKENDS, LAUNCHER_ENV, sandbox_of

pytestmark = pytest.mark.sandbox

#: One at a time (``--jobs 1``), so every attempt borrows the same folder.
#: Each records what it finds, then leaves files behind, or (every other
#: one) leaves its HOME empty but open to everybody.
WORKFLOW = """
name: scratch
steps:
  - id: dirty
    for_each: [0, 1, 2, 3]
    run: |
      { ls -A "$HOME"; ls -A "$TMPDIR"; } > out/found.txt
      stat -c %a "$HOME" > out/mode.txt
      if [ $(( {{ item }} % 2 )) -eq 1 ]; then
        chmod 777 "$HOME"
      else
        echo "item {{ item }}" > "$HOME/left"
        mkdir -p "$TMPDIR/tree/deeper" && echo x > "$TMPDIR/tree/deeper/f"
      fi
  - id: clean
    needs: [dirty]
    for_each: [0, 1]
    run: |
      { ls -A "$HOME"; ls -A "$TMPDIR"; } > out/found.txt
      stat -c %a "$HOME" > out/mode.txt
      stat -c %i "$HOME" > out/inode.txt
"""


def _mount_point_names(root: Path) -> set[str]:
    """What a bwrap jail sees in its HOME beside its own files: bwrap binds
    work/ at its host path, so where that path lies below a place the scratch
    folder is shown at, the path's first folder there is a mount point (a
    read-only tmpfs at /tmp, an empty folder through HOME)."""
    path = str(root)
    return {PurePosixPath(path).relative_to(top).parts[0]
            for top in SCRATCH_POINTS if path.startswith(top + "/")}


def _available(sandbox: str) -> None:
    from stockade.sandbox import get_backend

    avail = get_backend(sandbox).availability()
    if not avail.available:
        pytest.skip(f"{sandbox} is not available here: {avail.reason}")


@pytest.mark.parametrize("name", ALL_BACKENDS)
def test_every_attempt_starts_in_an_empty_scratch_folder(tmp_path_factory: pytest.TempPathFactory,
                                                         name: str) -> None:
    _available(sandbox_of(name))
    project = Project(tmp_path_factory.mktemp("scratch"))
    project.env.update({**LAUNCHER_ENV[name], "STOCKADE_SANDBOX": sandbox_of(name)})
    wf = project.write("wf.yaml", WORKFLOW)
    r = project.run("run", str(wf), "--run-id", "s1", "--jobs", "1")
    assert r.code == 0, r.err
    manifest = json.loads((project.root / "runs" / "s1" / "manifest.json").read_text())
    enforced = manifest["sandbox"]["enforced"]
    assert enforced is (sandbox_of(name) != "none")
    skeleton = _mount_point_names(project.root)
    modes = set()
    for step, n in (("dirty", 4), ("clean", 2)):
        for i in range(n):
            out = project.item("s1", step, i) / "work" / "out"
            found = set((out / "found.txt").read_text().split())
            if sandbox_of(name) == "bwrap":
                found -= skeleton
            assert found == set(), (step, i, found)
            modes.add((out / "mode.txt").read_text().strip())
    assert len(modes) == 1 and "777" not in modes, modes
    scratch = project.root / "runs" / "s1" / ".scratch"
    left = {p.name for p in scratch.iterdir()}
    if enforced:
        # A dirty attempt's folder went with it and only the name came back;
        # a clean one's stays when its jail was seen gone.
        assert left <= {"0"}, left
    else:
        # One attempt at a time borrowed one name, and the second clean
        # attempt got the very folder the first gave back.
        assert left == {"0"}, left
        inodes = {(project.item("s1", "clean", i) / "work" / "out" / "inode.txt").read_text()
                  for i in range(2)}
        assert len(inodes) == 1, inodes


#: One at a time. ``quiet`` leaves nothing running; ``linger`` leaves a
#: process behind that writes into its HOME 0.2 s after the main one ended,
#: while the next item (which looks after 1 s) is running.
LINGER = """
name: linger
steps:
  - id: quiet
    for_each: [0, 1]
    run: |
      ls -A "$HOME" > out/found.txt
      stat -c "%i %w" "$HOME" > out/inode.txt
  - id: linger
    needs: [quiet]
    for_each: [0, 1, 2]
    run: |
      sleep 1
      ls -A "$HOME" > out/found.txt
      ( sleep 0.2; echo late > "$HOME/late" ) > /dev/null 2>&1 &
"""


@pytest.mark.parametrize("name", ["bwrap", "bwrap-helper", "landlock", "landlock-python"])
def test_an_enforced_jail_that_left_nothing_running_keeps_its_scratch_folder(
    tmp_path_factory: pytest.TempPathFactory, name: str,
) -> None:  # fmt: skip
    # landlock jails' cgroups are found empty when their main process ends
    # (what they leave in their process group goes with it); bwrap's once
    # its pid namespace is gone, a moment after bwrap (cgroup v2 waits for
    # it). So the folder is lent again as it is, with bwrap's mount point
    # for work/ in it (pytest's folders are below /tmp); a jail seen
    # otherwise is covered by tests/sandbox/test_lifetime.py and
    # tests/unit/test_workspace.py.
    sandbox = sandbox_of(name)
    _available(sandbox)
    project = Project(tmp_path_factory.mktemp("linger"))
    project.env.update({**LAUNCHER_ENV[name], "STOCKADE_SANDBOX": sandbox})
    wf = project.write("wf.yaml", LINGER)
    r = project.run("run", str(wf), "--run-id", "l1", "--jobs", "1")
    assert r.code == 0, r.err
    manifest = json.loads((project.root / "runs" / "l1" / "manifest.json").read_text())
    wanted = ("cgroup2",) if sandbox == "bwrap" else ("cgroup2", "cgroup1")
    if manifest["sandbox"]["lifetime"]["mechanism"] not in wanted:
        pytest.fail(f"this test needs a cgroup to see a jail gone: {manifest['sandbox']}")
    skeleton = _mount_point_names(project.root)

    def out(step: str, i: int, name: str) -> str:
        text = (project.item("l1", step, i) / "work" / "out" / name).read_text()
        if name == "found.txt" and sandbox == "bwrap":
            return " ".join(sorted(set(text.split()) - skeleton))
        return text.strip()

    # The same folder (inode and birth time: ext4 gives a folder made anew
    # the inode just freed), not removed and made again.
    assert out("quiet", 0, "inode.txt") == out("quiet", 1, "inode.txt")
    # What an item left running ended with it: it never wrote into a folder
    # the next item borrowed. (Three things stop that write here: the kill of
    # the jail's process group as its main process is reaped, the cgroup's
    # end, and for a root engine the folder handed back to the engine; the
    # lingering process closes its stdout and stderr, so the attempt does not
    # wait for it.)
    assert all(out(step, i, "found.txt") == "" for step, n in (("quiet", 2), ("linger", 3))
               for i in range(n))
