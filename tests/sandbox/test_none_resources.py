"""``resources`` apply under the ``none`` backend too (also what
``isolate: false`` steps run on), with both launchers: rlimits set in the
child before exec, the jail's cgroup for memory and processes where one
exists; ``unapplied`` names what cannot be applied.

Each limit has a positive control: the same step without it goes through.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from stockade.sandbox import Backend, Resources, _lifetime
from tests.sandbox.conftest import World
from tests.sandbox.lifetime_helpers import pick_backend, pinned_lifetime

pytestmark = pytest.mark.sandbox

MiB = 1 << 20
ALLOCATE = (
    "import sys\ntry:\n    b = bytearray(1 << 30)\n    print('allocated')\n"
    "except MemoryError:\n    print('refused')\n    sys.exit(3)\n"
)
FORK_BOMB = (
    "import os, time\n"
    "n = 0\n"
    "while n < 500:\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        print('refused')\n"
    "        break\n"
    "    if pid == 0:\n"
    "        time.sleep(3)\n"
    "        os._exit(0)\n"
    "    n += 1\n"
    "print('forked', n)\n"
)


@pytest.fixture(params=["none", "none-helper"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Overrides conftest's: the none backend with each launcher."""
    return pick_backend(request, request.param)


@pytest.fixture
def no_cgroup(monkeypatch: pytest.MonkeyPatch) -> Iterator[_lifetime.Lifetime]:
    yield from pinned_lifetime("pgroup", monkeypatch)


@pytest.mark.parametrize("limited", [True, False])
def test_file_size(world: World, limited: bool) -> None:
    r = world.run(
        "head -c 5000000 /dev/zero > big",
        resources=Resources(file_size_bytes=1024) if limited else None,
    )
    size = (world.work / "big").stat().st_size
    if limited:
        assert r.status == 128 + 25, r.both  # the shell's child died of SIGXFSZ
        assert size <= 1024
    else:
        assert r.status == 0 and size == 5000000, r.both


@pytest.mark.parametrize("limited", [True, False])
def test_memory(world: World, limited: bool) -> None:
    r = world.py(ALLOCATE, resources=Resources(memory_bytes=256 * MiB) if limited else None)
    if limited:
        assert r.status == 3 and "refused" in r.out, r.both
    else:
        assert r.status == 0 and "allocated" in r.out, r.both


def test_cpu_seconds_stop_a_busy_loop(world: World) -> None:
    r = world.run("while :; do :; done", resources=Resources(cpu_seconds=1), timeout=30)
    assert r.status is not None and r.status != 0, r.both


def test_no_core_dumps_and_normal_work_passes(world: World) -> None:
    r = world.run(
        "ulimit -c; echo hi > out/a && sh -c 'echo child' && cat out/a",
        resources=Resources(memory_bytes=512 * MiB, cpu_seconds=10, processes=50,
                            file_size_bytes=MiB),
    )  # fmt: skip
    assert r.status == 0 and r.out.split() == ["0", "child", "hi"], r.both


def test_a_fork_bomb_is_contained_by_the_pids_cgroup(world: World) -> None:
    if _lifetime.get().pids_controller() is None:
        pytest.skip("no pids cgroup controller here")
    r = world.py(FORK_BOMB, resources=Resources(processes=20), timeout=60)
    assert "refused" in r.out, r.both
    assert int(r.out.split("forked")[1].split()[0]) < 25
    assert world.backend.unapplied(Resources(processes=20)) == ()


def test_without_a_cgroup_what_is_not_applied_is_said(
    world: World, no_cgroup: _lifetime.Lifetime
) -> None:
    said = world.backend.unapplied(Resources(processes=20, memory_bytes=MiB, file_size_bytes=1))
    assert any("resources.memory limits each process's address space only" in s for s in said)
    if os.geteuid() == 0:
        # Root is exempt from RLIMIT_NPROC: the bomb is not contained, and said so.
        assert any("resources.processes is not enforced" in s for s in said)
    else:
        r = world.py(FORK_BOMB, resources=Resources(processes=20), timeout=60)
        assert "refused" in r.out, r.both
