"""Finding the engine's cgroups from /proc text (pure), and their names."""

from __future__ import annotations

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
