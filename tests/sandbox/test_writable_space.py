"""bwrap's writable space is on disk, not in RAM: ``/tmp``, HOME and
``/dev/shm`` are the item's disk scratch folder, bubblewrap's own tmpfs ``/``
and ``/dev`` are read-only, ``resources.file_size`` stops a big file in each,
and a memory cgroup bounds even a tmpfs.

Positive controls run the old layout (``bwrap_argv(memory_tmp=True)``: tmpfs
``/tmp`` and HOME, writable ``/`` and ``/dev``): without a memory cgroup,
400 MiB land in RAM there.
"""

from __future__ import annotations

import functools
import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.sandbox import Resources, _bwrap_argv, _lifetime, bwrap
from stockade.sandbox.bwrap import BwrapBackend
from tests.sandbox.conftest import World, available_backend, world_at
from tests.sandbox.lifetime_helpers import pinned_lifetime

pytestmark = pytest.mark.sandbox

MiB = 1 << 20
#: Writes 400 MiB to $1 and reports how it went and what filesystem took it.
BIG_WRITE = (
    'head -c 419430400 /dev/zero > "$1"; echo "rc=$?"; '
    'echo "fs=$(stat -f -c %T "$(dirname "$1")")"; echo "size=$(stat -c %s "$1" 2>/dev/null)"'
)


@pytest.fixture(params=["bwrap", "bwrap-helper"])
def backend(request: pytest.FixtureRequest) -> BwrapBackend:
    """Overrides conftest's: bwrap only (landlock never had a tmpfs)."""
    b = available_backend(request, request.param)
    assert isinstance(b, BwrapBackend)
    return b


@pytest.fixture
def old_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bwrap, "bwrap_argv", functools.partial(bwrap.bwrap_argv, memory_tmp=True))


@pytest.fixture
def no_memory_cgroup(monkeypatch: pytest.MonkeyPatch) -> Iterator[_lifetime.Lifetime]:
    yield from pinned_lifetime("pgroup", monkeypatch)


def _scratch(world: World) -> list[str]:
    scratch = world.base / "scratch"
    return sorted(p.name for p in scratch.iterdir()) if scratch.exists() else []


def test_tmp_home_and_shm_are_the_items_scratch(world: World) -> None:
    token = secrets.token_hex(8)
    r = world.run(
        'echo "$2" > /tmp/t; cat "$HOME/t" /dev/shm/t; echo "tmpdir=$TMPDIR home=$HOME"',
        "sh", token,
    )
    assert r.out.splitlines() == [token, token, "tmpdir=/tmp home=/home/stockade"], r.both
    assert (world.base / "scratch" / "t").read_text() == f"{token}\n"


@pytest.mark.parametrize("target", ["/tmp/big", "/dev/shm/big"])
def test_400_mib_under_a_64m_limit_go_to_disk(world: World, target: str) -> None:
    r = world.run(BIG_WRITE, target, resources=Resources(memory_bytes=64 * MiB), timeout=120)
    assert "rc=" in r.out, r.both  # the jail ran
    if "rc=0" in r.out:
        # It went through: into the host scratch folder on disk, not a tmpfs.
        assert "fs=tmpfs" not in r.out, r.both
        assert (world.base / "scratch" / "big").stat().st_size == 400 * MiB
    # else: the write failed, which bounds it as well.


@pytest.mark.parametrize("target", ["/big", "/dev/big"])
def test_bubblewraps_own_tmpfs_is_read_only(world: World, target: str) -> None:
    r = world.run(BIG_WRITE, target)
    assert "rc=" in r.out and "rc=0" not in r.out, r.both
    assert "Read-only file system" in r.err, r.both


@pytest.mark.parametrize("target", ["/big", "/dev/big", "/tmp/big"])
def test_positive_control_the_old_layout_takes_400_mib_in_ram(
    world: World, target: str, old_layout: None, no_memory_cgroup: _lifetime.Lifetime
) -> None:
    r = world.run(BIG_WRITE, target, resources=Resources(memory_bytes=64 * MiB), timeout=120)
    assert "rc=0" in r.out and "fs=tmpfs" in r.out and f"size={400 * MiB}" in r.out, r.both
    assert "big" not in _scratch(world)


def test_a_memory_cgroup_bounds_even_a_tmpfs(world: World, old_layout: None) -> None:
    if _lifetime.get().memory_controller() is None:
        pytest.skip("no memory cgroup controller here")
    r = world.run(BIG_WRITE, "/tmp/big", resources=Resources(memory_bytes=64 * MiB), timeout=120)
    # The jail is OOM-killed or the write fails: 400 MiB never sit in RAM.
    assert f"size={400 * MiB}" not in r.out, r.both


@pytest.mark.parametrize("target", ["/tmp/big", "/dev/shm/big", "/home/stockade/big"])
def test_file_size_stops_a_big_file_in_each(world: World, target: str) -> None:
    r = world.run(BIG_WRITE, target, resources=Resources(file_size_bytes=MiB))
    assert "rc=" in r.out and "rc=0" not in r.out, r.both
    assert (world.base / "scratch" / "big").stat().st_size <= MiB


@pytest.fixture
def world_in_tmp(backend: BwrapBackend, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """A world whose work/ lies below the host's /tmp, as a run in a ``mktemp -d``
    folder has it (whatever ``TMPDIR`` says)."""
    base = Path(tempfile.mkdtemp(prefix="stockade-cover-", dir="/tmp"))
    yield from world_at(backend, base, monkeypatch)


#: Tries to store a file at each place of work/'s chain of mount points, and
#: at the top of that chain through HOME (the same folder, without the cover).
COVER_PROBE = (
    'for d in "$1" "$2"; do touch "$d/note" 2>/dev/null && echo "wrote $d"; done; '
    'mkdir "$1/new" 2>/dev/null && echo "made $1/new"; '
    'echo "fs=$(stat -f -c %T "$1")"; pwd; echo done'
)


def test_work_below_tmp_gets_its_mount_points_in_memory_read_only(world_in_tmp: World) -> None:
    w = world_in_tmp
    cover = _bwrap_argv.scratch_covers(w.policy(["true"]))
    top = w.base.name
    assert cover == [f"/tmp/{top}"]
    r = w.run(COVER_PROBE, cover[0], str(w.item))
    assert r.status == 0, r.both
    assert "wrote" not in r.out and "made" not in r.out, r.both  # read-only
    assert "fs=tmpfs" in r.out, r.both
    assert r.out.splitlines()[-2:] == [str(w.work), "done"], r.both  # work/ at its host path
    # On disk only the cover's own mount point, empty: no chain of folders.
    scratch = w.base / "scratch"
    assert os.listdir(scratch) == [top]
    assert os.listdir(scratch / top) == []
    assert bwrap.scratch_mount_points(w.policy(["true"])) == {top}


def test_positive_control_without_the_cover_the_chain_is_made_in_the_scratch(
    world_in_tmp: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world_in_tmp
    monkeypatch.setattr(_bwrap_argv, "scratch_covers", lambda policy: [])
    r = w.run(COVER_PROBE, f"/tmp/{w.base.name}", str(w.item))
    assert r.status == 0, r.both
    assert f"made /tmp/{w.base.name}/new" in r.out, r.both  # writable, on disk
    chain = w.base / "scratch" / w.item.relative_to("/tmp") / "work"
    assert chain.is_dir(), sorted(str(p) for p in (w.base / "scratch").rglob("*"))
