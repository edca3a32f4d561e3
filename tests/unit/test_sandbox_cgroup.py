"""Finding the engine's cgroups from /proc text (pure), their names, and how a
wait for a cgroup to empty paces itself (on a plain ``cgroup.events`` file,
with an injected clock)."""

from __future__ import annotations

import select
from pathlib import Path
from types import SimpleNamespace

import pytest

from stockade.sandbox import _cgroup
from stockade.sandbox._cgroup import Hierarchy, engine_name, find_hierarchies

# A hybrid machine: v1 controllers plus a controller-less v2 "unified" mount.
HYBRID_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = """\
9:name=systemd:/
8:pids:/
6:freezer:/
4:memory:/process_api/9e0f
1:cpu:/
0::/
"""


def test_hybrid_machine() -> None:
    hs = find_hierarchies(HYBRID_MOUNTS, HYBRID_CGROUP)
    assert hs == {
        "v2": Hierarchy("v2", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/unified"),
        "memory": Hierarchy("memory", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory/process_api/9e0f"),
        "freezer": Hierarchy("freezer", "/sys/fs/cgroup/freezer", "/sys/fs/cgroup/freezer"),
        "pids": Hierarchy("pids", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/pids"),
    }


def test_pure_v2_under_systemd() -> None:
    mounts = "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    own = "0::/user.slice/user-1000.slice/session-3.scope\n"
    assert find_hierarchies(mounts, own) == {
        "v2": Hierarchy(
            "v2", "/sys/fs/cgroup", "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope"
        )
    }


def test_a_mount_of_a_subtree_and_escaped_names() -> None:
    # A container given only its own subtree, mounted at a path with a space.
    mounts = "30 24 0:26 /docker/abc /sys/fs/my\\040cg rw - cgroup2 cgroup2 rw\n"
    assert find_hierarchies(mounts, "0::/docker/abc/inner\n") == {
        "v2": Hierarchy("v2", "/sys/fs/my cg", "/sys/fs/my cg/inner")
    }
    # Our cgroup outside what is mounted: not usable through this mount.
    assert find_hierarchies(mounts, "0::/elsewhere\n") == {}


def test_no_cgroups_at_all() -> None:
    assert find_hierarchies("", "") == {}
    assert find_hierarchies("22 1 0:21 / /proc rw - proc proc rw\n", "0::/\n") == {}


def test_engine_names() -> None:
    assert engine_name(4026531836, 42, 1234) == "stockade-4026531836-42-1234"
    assert engine_name(4026531836, 42, 1234, 2) == "stockade-4026531836-42-1234-2"


class _Clock:
    """``time`` for ``_cgroup``: sleeps advance a fake clock; ``flip`` says
    after how many pauses the cgroup reports itself empty."""

    def __init__(self, events: Path, flip: int) -> None:
        self.now = 1000.0
        self.events = events
        self.flip = flip
        self.sleeps: list[float] = []
        self.polls: list[int] = []

    def monotonic(self) -> float:
        return self.now

    def _pause(self, seconds: float) -> None:
        self.now += seconds
        if len(self.sleeps) + len(self.polls) == self.flip:
            self.events.write_text("populated 0\nfrozen 0\n")

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self._pause(seconds)

    def poller(self) -> object:
        clock = self

        class Poller:
            def register(self, fd: int, mask: int) -> None:
                assert mask == select.POLLPRI

            def poll(self, ms: int) -> list[tuple[int, int]]:
                clock.polls.append(ms)
                clock._pause(ms / 1000)
                return []

        return Poller()


def _pinned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flip: int) -> tuple[_Clock, str]:
    folder = tmp_path / "jail"
    folder.mkdir()
    (folder / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    clock = _Clock(folder / "cgroup.events", flip)
    monkeypatch.setattr(_cgroup, "time", clock)
    # ``_cgroup``'s own view of the module: the process's select.poll stays.
    monkeypatch.setattr(_cgroup, "select", SimpleNamespace(poll=clock.poller,
                                                           POLLPRI=select.POLLPRI))
    return clock, str(folder)


def test_a_jail_that_ends_at_once_is_seen_after_short_pauses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The kernel holds a cgroup file's notification back for up to 20 ms
    # after the last one (the jail's start): the wait reads the file again
    # after short, growing pauses instead of waiting for it.
    clock, folder = _pinned(monkeypatch, tmp_path, flip=3)
    assert _cgroup.empties("v2", folder, 0.1)
    assert clock.sleeps == [0.00025, 0.0005, 0.001]
    assert clock.polls == []


def test_past_the_notification_interval_the_wait_is_the_notification(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clock, folder = _pinned(monkeypatch, tmp_path, flip=12)
    assert _cgroup.empties("v2", folder, 1.0)
    # Doubling up to 4 ms while a notification may be held back (20 ms) ...
    assert clock.sleeps[:6] == [0.00025, 0.0005, 0.001, 0.002, 0.004, 0.004]
    assert max(clock.sleeps) == _cgroup.SHORT_PAUSE_CAP
    assert sum(clock.sleeps[:-1]) < _cgroup.NOTIFY_INTERVAL <= sum(clock.sleeps)
    # ... then poll() for the notification, its slice bounding a missed one.
    assert clock.polls and all(ms == 50 for ms in clock.polls)
    assert len(clock.sleeps) + len(clock.polls) == 12


def test_a_jail_that_stays_is_not_waited_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clock, folder = _pinned(monkeypatch, tmp_path, flip=-1)
    start = clock.now
    assert not _cgroup.empties("v2", folder, 0.3)
    # The last pause is cut to the deadline (poll() counts whole milliseconds).
    assert 0.3 <= clock.now - start < 0.301
    assert clock.polls[-1] < 50
