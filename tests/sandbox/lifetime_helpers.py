"""Shared by the jail-lifetime tests: find a jail's processes by a marker in
their environment, wait for a condition, pin a lifetime mechanism."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stockade.errors import InfraError
from stockade.sandbox import Backend, _lifetime, get_backend
from stockade.sandbox.none import NoneBackend
from tests.sandbox.conftest import available_backend

#: Every backend and launcher a jail can be started with.
ALL_BACKENDS = ("bwrap", "bwrap-helper", "landlock", "landlock-python", "none", "none-helper")
#: The environment variable that pins each one's launcher in a ``stockade run``.
LAUNCHER_ENV = {
    "bwrap": {"STOCKADE_BWRAP_LAUNCHER": "direct"},
    "bwrap-helper": {"STOCKADE_BWRAP_LAUNCHER": "helper"},
    "landlock": {"STOCKADE_LANDLOCK_LAUNCHER": "native"},
    "landlock-python": {"STOCKADE_LANDLOCK_LAUNCHER": "python"},
    "none": {"STOCKADE_NONE_LAUNCHER": "direct"},
    "none-helper": {"STOCKADE_NONE_LAUNCHER": "helper"},
}


def sandbox_of(name: str) -> str:
    """``--sandbox`` value of a backend/launcher name."""
    return name.split("-")[0]


def pick_backend(request: pytest.FixtureRequest, name: str) -> Backend:
    if name == "none":
        return get_backend("none")
    if name == "none-helper":
        return NoneBackend(launcher="helper")
    return available_backend(request, name)


def marked(marker: str, comm: str | None = None) -> list[int]:
    """Live (not zombie) processes whose environment holds ``MARK=marker``
    (optionally only those whose command name is ``comm``)."""
    needle = f"MARK={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        name, _, rest = stat.partition(b" (")[2].rpartition(b") ")
        live = rest[:1] not in (b"Z", b"X")
        if live and needle in environ.split(b"\0") and (comm is None or name == comm.encode()):
            found.append(int(entry))
    return found


def kill_marked(marker: str) -> None:
    """Clean up after a positive control that left processes running."""
    for pid in marked(marker):
        with contextlib.suppress(OSError):
            os.kill(pid, 9)


def cgroup_of(pid: int, controller: str = "") -> str:
    """``pid``'s cgroup path: in the v2 hierarchy, or with ``controller``
    the v1 hierarchy that has it ("" when there is none)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (controller in controllers.split(",")) if controller else controllers == "":
            return path
    return ""


def await_(condition: Callable[[], object], what: str, timeout: float = 30.0) -> float:
    """Poll until ``condition()`` holds; returns the seconds it took."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"timed out waiting for {what}"
        time.sleep(0.02)
    return time.monotonic() - start


def pinned_lifetime(mode: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[_lifetime.Lifetime]:
    """Run the test's jails under a ``Lifetime`` of ``mode`` (its own
    cgroup folder and watchdog), skipped where the machine has no such thing."""
    lt = _lifetime.Lifetime(mode)
    try:
        lt.open().discard()  # sets it up: cgroup folder, watchdog
    except InfraError as e:
        pytest.skip(f"{mode} is not available here: {e}")
    monkeypatch.setattr(_lifetime, "_current", lt)
    try:
        yield lt
    finally:
        lt.close()


def kill_engine_and_expect_jails_gone(engine: subprocess.Popen[str], marker: str,
                                      sleeps: int, what: str) -> None:
    """Wait until ``sleeps`` of the engine's jailed ``sleep`` processes run, SIGKILL
    the engine, and require every marked process gone within 10 s; clean up after."""
    try:
        await_(lambda: len(marked(marker, "sleep")) >= sleeps, what)
        engine.send_signal(signal.SIGKILL)
        engine.wait(10)
        await_(lambda: not marked(marker), "the jails to end with their engine", timeout=10)
    finally:
        end_all(engine, marker)


def end_all(engine: subprocess.Popen[str], marker: str) -> None:
    """After a test, whatever it left: the engine if it still runs, and every
    process that carries ``marker``."""
    if engine.poll() is None:
        engine.kill()
        engine.wait()
    kill_marked(marker)
