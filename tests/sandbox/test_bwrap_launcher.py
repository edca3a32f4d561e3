"""How bwrap is started: by the engine's launcher thread with the C launcher
(``direct``), or through an exec helper (``helper``, without the C launcher).

The escape suite runs against both (``bwrap`` and ``bwrap-helper`` in
``conftest.backend``); these tests pin what the direct path must do itself:
keep a jail alive when the thread that asked for it ends, kill it with the
engine, end the whole jail on ``kill``, and report a failed exec.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stockade.errors import InfraError
from stockade.sandbox import _direct, get_backend
from stockade.sandbox.bwrap import BwrapBackend, choose_launcher
from tests.sandbox.conftest import World, available_backend, needs_c_launcher

pytestmark = pytest.mark.sandbox

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["bwrap", "bwrap-helper"])
def backend(request: pytest.FixtureRequest) -> BwrapBackend:
    """Overrides conftest's: the ``world`` of every test here is a bwrap one."""
    b = available_backend(request, request.param)
    assert isinstance(b, BwrapBackend)
    return b


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"STOCKADE_BWRAP_LAUNCHER": "helper"}, "helper"),
        ({}, "direct" if _direct.available() else "helper"),
        ({"STOCKADE_BWRAP_LAUNCHER": "direct"}, "direct" if _direct.available() else "helper"),
    ],
)
def test_launcher_choice(env: dict[str, str], expected: str) -> None:
    assert choose_launcher(env) == expected


def test_an_unknown_launcher_is_refused() -> None:
    with pytest.raises(InfraError, match="STOCKADE_BWRAP_LAUNCHER='fast'"):
        choose_launcher({"STOCKADE_BWRAP_LAUNCHER": "fast"})


def test_the_default_is_direct_where_the_c_launcher_is_built() -> None:
    needs_c_launcher()
    b = get_backend("bwrap")
    assert isinstance(b, BwrapBackend)
    assert b.launcher == "direct"


def test_doctor_names_the_launcher(world: World) -> None:
    b = world.backend
    assert isinstance(b, BwrapBackend)
    reason = b.availability().reason
    assert ("C launcher" in reason) == (b.launcher == "direct"), reason


def test_a_jail_outlives_the_thread_that_started_it(world: World) -> None:
    # The parent-death signal fires when the forking *thread* ends: a jail
    # asked for by a short-lived thread must still run to its end.
    policy = world.policy(["/bin/sh", "-c", "sleep 0.5; echo done > out/x"])
    started = []
    with open(world.meta / "stdout", "wb") as out:
        t = threading.Thread(
            target=lambda: started.append(world.backend.start(policy, stdout=out, stderr=out))
        )
        t.start()
        t.join()
        assert started[0].wait(20) == 0, (world.meta / "stdout").read_text()
    assert (world.work / "out" / "x").read_text() == "done\n"


def test_kill_ends_the_whole_jail(world: World) -> None:
    marker = _marker()
    policy = world.policy(["/bin/sh", "-c", f"sleep 1000 & sleep 1000; # {marker}"])
    with open(world.meta / "stdout", "wb") as out:
        running = world.backend.start(policy, stdout=out, stderr=out)
        _await(lambda: len(_processes_with(marker)) >= 2, "the jail's processes to start")
        running.kill(grace=0.2)
        assert running.wait(5) is not None
    _await(lambda: not _processes_with(marker), "the jail's processes to end")


def test_a_failed_exec_is_exit_127_with_the_reason(world: World) -> None:
    b = world.backend
    assert isinstance(b, BwrapBackend)
    broken = BwrapBackend(bwrap=str(world.base / "no-such-bwrap"), launcher=b.launcher)
    try:
        with open(world.meta / "stderr", "wb") as err:
            running = broken.start(world.policy(["/bin/true"]), stdout=err, stderr=err)
            assert running.wait(10) == 127
        text = (world.meta / "stderr").read_text()
        assert "No such file or directory" in text or "no-such-bwrap" in text, text
    finally:
        broken.close()


def test_a_jail_dies_with_the_engine(world: World, tmp_path: Path) -> None:
    # A stand-in engine starts a jail, reports its pid, and is SIGKILLed:
    # nothing of the jail may keep running.
    marker = _marker()
    b = world.backend
    assert isinstance(b, BwrapBackend)
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from stockade.sandbox import Policy
        from stockade.sandbox.bwrap import BwrapBackend
        b = BwrapBackend(launcher={b.launcher!r})
        policy = Policy(argv=("/bin/sh", "-c", "echo up > out/up; sleep 1000; # {marker}"),
                        work_dir=Path({str(world.work)!r}),
                        scratch_dir=Path({str(world.base / "scratch")!r}),
                        env={{"PATH": "/usr/bin:/bin"}})
        r = b.start(policy, stdout=sys.stderr, stderr=sys.stderr)
        print(r.pid, flush=True)
        time.sleep(1000)
    """)
    engine = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert engine.stdout is not None
        assert engine.stdout.readline().strip().isdigit()
        # Up means the command runs: bwrap's own setup has a window in which
        # its parent-death chain is not yet armed (bubblewrap sets it in
        # each of its processes, after their fork).
        _await((world.work / "out" / "up").exists, "the jail to start")
        engine.send_signal(signal.SIGKILL)
        engine.wait(10)
        _await(lambda: not _processes_with(marker), "the jail to die with its engine")
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()


def _marker() -> str:
    return f"bwrap-launcher-{os.getpid()}-{time.monotonic_ns()}"


def _processes_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


def _await(condition: object, what: str, timeout: float = 10.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_closed_backend_starts_jails_again(world: World) -> None:
    # close() ends the launcher thread (and the helpers); the next start
    # must bring up a new one rather than queue to the stopped thread.
    b = world.backend
    assert isinstance(b, BwrapBackend)
    fresh = BwrapBackend(launcher=b.launcher)
    try:
        for _ in range(2):
            with open(world.meta / "stdout", "wb") as out:
                running = fresh.start(world.policy(["/bin/sh", "-c", "echo ok"]), stdout=out, stderr=out)
                assert running.wait(20) == 0
            assert (world.meta / "stdout").read_text() == "ok\n"
            fresh.close()
    finally:
        fresh.close()


@pytest.fixture
def launcher_thread() -> Iterator[_direct.LauncherThread]:
    """The direct launcher on its own, without bwrap."""
    needs_c_launcher()
    launcher = _direct.LauncherThread()
    yield launcher
    launcher.close()


def test_direct_wait_times_out_and_takes_any_timeout(
    launcher_thread: _direct.LauncherThread, tmp_path: Path
) -> None:
    with open(tmp_path / "out", "wb") as out:
        running = launcher_thread.spawn("/bin/sleep", ["sleep", "0.3"], {}, [out.fileno()] * 2)
        assert running.wait(0.01) is None
        # Far beyond what poll()'s int of milliseconds holds.
        assert running.wait(1e9) == 0
        assert running.wait(0) == 0  # reaped once, answered again


def test_a_refused_start_is_an_error_and_the_launcher_goes_on(
    launcher_thread: _direct.LauncherThread, tmp_path: Path
) -> None:
    # A NUL byte would cut the C string short: refused, reported, and the
    # launcher thread keeps serving (a dead one would leave callers waiting).
    with open(tmp_path / "out", "wb") as out:
        with pytest.raises(OSError, match="embedded null byte"):
            launcher_thread.spawn("/bin/echo", ["echo", "a\x00b"], {}, [out.fileno()] * 2)
        running = launcher_thread.spawn("/bin/echo", ["echo", "fine"], {}, [out.fileno()] * 2)
        assert running.wait(10) == 0
    assert (tmp_path / "out").read_text() == "fine\n"


def _on_a_thread(fn: Callable[[], object]) -> object:
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(fn()))
    t.start()
    t.join()
    return got[0]


def test_a_thread_that_launches_here_starts_its_processes_itself(
    launcher_thread: _direct.LauncherThread, tmp_path: Path
) -> None:
    # The item threads' path: no hand-off, so the launcher thread never starts;
    # stdin is /dev/null as on the launcher thread.
    def spawn_here() -> int | None:
        _direct.launch_here()
        with open(tmp_path / "out", "wb") as out:
            running = launcher_thread.spawn("/bin/sh", ["sh", "-c", "cat; echo end"], {},
                                            [out.fileno()] * 2)
        return running.wait(10)

    assert _on_a_thread(spawn_here) == 0
    assert (tmp_path / "out").read_text() == "end\n"
    assert launcher_thread._thread is None


def test_a_process_started_here_dies_with_its_thread(
    launcher_thread: _direct.LauncherThread, tmp_path: Path
) -> None:
    # Why only threads that outlive their processes may declare launch_here:
    # the parent-death signal follows the thread that forked. (Without it the
    # process outlives its thread: test_a_jail_outlives_the_thread_that_started_it.)
    def spawn(here: bool) -> _direct.DirectRunning:
        if here:
            _direct.launch_here()
        with open(tmp_path / "out", "wb") as out:
            return launcher_thread.spawn("/bin/sleep", ["sleep", "30"], {}, [out.fileno()] * 2)

    here = _on_a_thread(lambda: spawn(True))
    there = _on_a_thread(lambda: spawn(False))
    assert isinstance(here, _direct.DirectRunning) and isinstance(there, _direct.DirectRunning)
    assert here.wait(20) == -signal.SIGKILL
    assert there.wait(0.5) is None
    there.kill(grace=0.1)


def test_the_local_executors_item_threads_launch_here() -> None:
    from stockade.runner.attempt import Outcome
    from stockade.runner.executor import LocalExecutor
    from stockade.runner.status import AttemptStatus

    seen: list[bool] = []

    def run(attempt: object) -> Outcome:
        seen.append(getattr(_direct._here, "on", False))
        return Outcome(AttemptStatus.SUCCEEDED, 1)

    ex = LocalExecutor(2, run=run)  # type: ignore[arg-type]
    try:
        ex.submit(object())  # type: ignore[arg-type]
        assert len(ex.completed(10)) == 1
        assert seen == [True]
    finally:
        ex.close()
    assert getattr(_direct._here, "on", False) is False  # this (test) thread did not
