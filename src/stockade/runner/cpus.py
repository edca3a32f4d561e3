"""How many CPUs this process may use: the default for ``--jobs``.

The affinity mask (taskset, a container's cpuset) and the cgroup CPU quota
(a container's ``--cpus``) both count; ``os.cpu_count()`` counts neither.
Must not import the rest of the package.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def available_cpus(proc: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = cgroup_quota(proc, root)
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)


def cgroup_quota(proc: Path, root: Path) -> float | None:
    """CPUs granted by the cgroup quota (v2 ``cpu.max`` or v1 ``cfs_quota_us``), None if unlimited."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":
            q = _v2(root / rel / "cpu.max")
        elif "cpu" in controllers.split(","):
            q = _v1(root / "cpu" / rel) or _v1(root / controllers / rel)
        else:
            continue
        if q is not None:
            return q
    return None


def _v2(path: Path) -> float | None:
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return int(quota) / int(period)


def _v1(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period
