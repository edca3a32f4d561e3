"""A root engine's jails: never uid 0, whatever the run folder's permissions.

Each jail runs as a uid of its own from the jail range (``_uids``), from a
world-readable run folder and from a private one (0700, as ``mktemp -d``
and pytest's ``tmp_path`` make it). Folders above the jail's paths that only
root may search are bridged (landlock: a private mount namespace in the
launcher's child; bwrap: bridge points), never chmod'ed. Runs only as root.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.sandbox import Backend, ExtraMount, Resources, _uids
from tests.sandbox.conftest import World, make_world

pytestmark = pytest.mark.sandbox

PRIVATE_FILES = ("/proc/timer_list", "/proc/slabinfo")  # mode 0400, root


def _private_chain(path: Path) -> bool:
    """Some folder above ``path`` is closed to others."""
    return any(not os.stat(p).st_mode & stat.S_IXOTH for p in path.parents)


@pytest.fixture(params=("open", "private"))
def placed(request: pytest.FixtureRequest, backend: Backend, tmp_path: Path) -> Iterator[World]:
    """A run tree in a world-readable folder, or below a 0700 one."""
    if request.param == "private":
        holder = tmp_path / "private run"
        holder.mkdir(mode=0o700)
        base = holder / "base"
        base.mkdir()
    else:
        base = Path(tempfile.mkdtemp(prefix="stockade-open-run-"))
    w = make_world(backend, base)
    assert _private_chain(w.work) is (request.param == "private")
    try:
        yield w
    finally:
        w.host_tmp.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)


def _shims(tmp_path: Path) -> Path:
    """A PATH folder only root may enter (like pyenv's shims under /root),
    holding a python3 the jail must never run."""
    holder = tmp_path / "rootonly"
    holder.mkdir(mode=0o700)
    shims = holder / "shims"
    shims.mkdir()
    shim = shims / "python3"
    shim.write_text("#!/bin/sh\necho shim-ran\nexit 3\n")
    shim.chmod(0o755)
    return shims


def _in_range(uid: int) -> bool:
    pool = _uids.jail_uids()
    return pool.first <= uid <= pool.last


def test_jail_runs_as_its_own_uid(placed: World, tmp_path: Path) -> None:
    marker = secrets.token_hex(8)
    shims = _shims(tmp_path)
    r = placed.run(
        'id -u; id -ru; id -g; id -rg; id -G; echo "PATH=$PATH"; '
        f"head -c 40 {' '.join(PRIVATE_FILES)}; "
        "bash -c true; "
        'python3 -c "import sys; print(\'py-\' + sys.argv[1][::-1])" "$1"; echo "py=$?"',
        marker[::-1],
        env={"PATH": f"{shims}:/usr/local/bin:/usr/bin:/bin"},
    )
    assert f"py-{marker}" in r.out and "py=0" in r.out, r.both
    ids = r.out.splitlines()[:5]
    uid = int(ids[0])
    assert ids == [str(uid)] * 5, r.out  # uid, real uid, gid, real gid, the only group
    assert uid not in (0, 65534) and _in_range(uid), uid
    assert "Timer List" not in r.out and "slabinfo" not in r.out, r.out
    assert "cannot set" not in r.both  # bash dropping a euid it should not have
    assert "shim-ran" not in r.both
    path = next(ln for ln in r.out.splitlines() if ln.startswith("PATH="))[5:].split(":")
    assert str(shims) not in path and "/usr/bin" in path


def test_control_root_reads_what_the_jail_cannot(none_world: World) -> None:
    """Positive control: the checks above see a root process for what it is."""
    r = none_world.run(f"id -u; head -c 40 {' '.join(PRIVATE_FILES)}")
    assert r.out.splitlines()[0] == "0"
    assert "Timer List" in r.out and "slabinfo" in r.out


def test_work_is_handed_back_to_the_engine(placed: World) -> None:
    r = placed.run("id -u; mkdir -p out/d; echo made > out/d/r.txt; chmod 6755 out/d/r.txt")
    assert r.status == 0, r.both
    jail = int(r.out.split()[0])
    for p in (placed.work, placed.work / "out", placed.work / "out" / "d"):
        st = os.lstat(p)
        assert (st.st_uid, st.st_gid) == (0, 0), p
    made = os.stat(placed.work / "out" / "d" / "r.txt")
    assert (made.st_uid, made.st_gid) == (0, 0) and made.st_mode & 0o6000 == 0
    assert jail != 0


def test_work_in_a_private_folder_still_runs_confined(placed: World) -> None:
    w = placed
    r = w.run(
        "cat input.txt; echo made > out/r.txt; "
        f"cat {w.neighbour}/work/notes.md ../meta/attempt-1.json {w.host_tmp}; "
        f"ls {w.runs}/r1/analyse; echo x > {w.runs}/escape; echo end"
    )
    assert "my own input" in r.out and "end" in r.out, r.both
    assert (w.work / "out" / "r.txt").read_text() == "made\n"
    assert w.canary not in r.both
    assert not (w.runs / "escape").exists()


def test_mount_below_a_root_only_folder(placed: World, tmp_path: Path) -> None:
    private = tmp_path / "private tools"
    private.mkdir(mode=0o700)
    tools = private / "tools"
    tools.mkdir(mode=0o755)
    (tools / "tool.sh").write_text('echo "tool-ran-$1"\n')
    (private / "secret.txt").write_text(f"{placed.canary}\n")
    (private / "secret.txt").chmod(0o644)
    marker = secrets.token_hex(6)
    r = placed.run(
        f'sh "{tools}/tool.sh" "$1"; ls -a "{private}"; cat "{private}/secret.txt"; '
        f'echo x > "{tools}/w"; echo end',
        marker,
        mounts=(ExtraMount(tools, str(tools)),),
    )
    assert f"tool-ran-{marker}" in r.out and "end" in r.out, r.both
    assert placed.canary not in r.both
    assert not (tools / "w").exists()  # read-only mount
    # The host's permissions and mount table are as they were.
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
    assert str(private) not in Path("/proc/self/mountinfo").read_text()


def test_fork_bomb_contained_below_a_root_only_directory(placed: World) -> None:
    r = placed.py(
        "import os, time\nn = 0\nwhile n < 300:\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(2)\n"
        "        os._exit(0)\n    n += 1\nprint('forked', n)\n",
        resources=Resources(processes=20),
    )
    # Each jail has a uid no other process has (landlock: RLIMIT_NPROC counts
    # only its own processes); bwrap's also counts in its own user namespace.
    assert int(r.out.split()[1]) < 25, r.out

