"""When the engine is root and a step needs a path only root can reach.

Landlock keeps uid 0 but drops every capability (bounding set, securebits
NOROOT, capset); bwrap still runs as nobody, its sources bridged through a
private mount namespace. Both stay confined. Runs only as root.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.sandbox import Backend, ExtraMount, Resources, get_backend
from tests.sandbox.conftest import World, make_world

pytestmark = pytest.mark.sandbox


@pytest.fixture
def rooted(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[World, Path]]:
    backend = get_backend("landlock")
    if not backend.availability().available:
        pytest.skip(f"landlock is not available here: {backend.availability().reason}")
    base = Path(tempfile.mkdtemp(prefix="stockade-llroot-"))
    w = make_world(backend, base)
    private = Path(tempfile.mkdtemp(prefix="stockade-private-"))  # 0700, root only
    (private / "tool.sh").write_text("echo tool-ran\n")
    try:
        yield w, private
    finally:
        import shutil

        w.host_tmp.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def test_uid0_jail_has_no_capabilities_and_stays_confined(rooted: tuple[World, Path]) -> None:
    w, private = rooted
    r = w.run(
        f"sh {private}/tool.sh; id -u; grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; "
        f"cat {w.neighbour}/work/notes.md {w.host_tmp} ../meta/attempt-1.json; "
        f"echo x > {w.runs}/escape; "
        "python3 -c 'import os; os.setresuid(0, 0, 0); print(\"ruid reset\")'; "
        "grep '^Uid' /proc/self/status; "
        "mkdir m; mount -t tmpfs x m; echo rc=$?",
        mounts=(ExtraMount(private, str(private)),),
    )
    assert "tool-ran" in r.out, r.both
    assert "0" in r.out.split()  # euid 0 (id -u), real uid nobody
    caps = [ln.split()[1] for ln in r.out.splitlines() if ln.startswith("Cap")]
    assert caps and all(int(c, 16) == 0 for c in caps), r.out
    assert w.canary not in r.both
    assert not (w.runs / "escape").exists()
    assert "rc=0" not in r.out
    assert "ruid reset" not in r.out
    uid_line = next(ln for ln in r.out.splitlines() if ln.startswith("Uid:"))
    assert uid_line.split()[1] == "65534"  # real uid: what RLIMIT_NPROC counts


@pytest.fixture
def private_world(backend: Backend) -> Iterator[World]:
    """A run tree below a 0700 directory, as pytest's tmp_path or /root/.stockade."""
    base = Path(tempfile.mkdtemp(prefix="stockade-private-run-"))
    w = make_world(backend, base)
    base.chmod(0o700)
    try:
        yield w
    finally:
        import shutil

        w.host_tmp.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)


def test_work_below_a_root_only_directory_still_runs_confined(private_world: World) -> None:
    w = private_world
    r = w.run(
        "cat input.txt; echo made > out/r.txt; id -u; "
        f"cat {w.neighbour}/work/notes.md ../meta/attempt-1.json {w.host_tmp}; "
        f"echo x > {w.runs}/escape; echo end"
    )
    assert "my own input" in r.out and "end" in r.out, r.both
    assert (w.work / "out" / "r.txt").read_text() == "made\n"
    assert w.canary not in r.both
    assert not (w.runs / "escape").exists()


def test_fork_bomb_contained_below_a_root_only_directory(private_world: World) -> None:
    r = private_world.py(
        "import os, time\nn = 0\nwhile n < 300:\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(2)\n"
        "        os._exit(0)\n    n += 1\nprint('forked', n)\n",
        resources=Resources(processes=20),
    )
    # landlock keeps euid 0 here but runs with real uid nobody, which is
    # what RLIMIT_NPROC counts; bwrap runs as nobody in its own user namespace.
    assert int(r.out.split()[1]) < 25, r.out
