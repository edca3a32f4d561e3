"""The landlock launchers: the C one (``_jail``: vfork, confine, exec) and the
Python fallback (the helper forks itself) must start the same jail.

The escape suite runs against both (``landlock`` and ``landlock-python`` in
``conftest.backend``); these tests pin what the launchers themselves do: the
process state a jail starts with, how a failed stage is reported, and that a
jail dies with the helper that started it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from stockade.errors import InfraError
from stockade.sandbox import get_backend
from stockade.sandbox.landlock import LandlockBackend, choose_launcher, native_launcher
from tests.sandbox.conftest import World, available_backend, needs_c_launcher

pytestmark = pytest.mark.sandbox


@pytest.fixture(params=["landlock", "landlock-python"])
def backend(request: pytest.FixtureRequest) -> LandlockBackend:
    """Overrides conftest's: the ``world`` of every test here is a landlock one."""
    b = available_backend(request, request.param)
    assert isinstance(b, LandlockBackend)
    return b


def test_the_c_launcher_is_built() -> None:
    # Without it every landlock item pays a Python fork.
    needs_c_launcher()
    assert get_backend("landlock").launcher == "native"  # type: ignore[attr-defined]


def test_launcher_choice() -> None:
    assert choose_launcher({"STOCKADE_LANDLOCK_LAUNCHER": "python"}) == "python"
    expected = "native" if native_launcher() else "python"
    assert choose_launcher({}) == expected
    with pytest.raises(InfraError, match="STOCKADE_LANDLOCK_LAUNCHER='fast'"):
        choose_launcher({"STOCKADE_LANDLOCK_LAUNCHER": "fast"})


def test_doctor_names_the_launcher() -> None:
    from stockade.sandbox import doctor

    if not get_backend("landlock").availability().available:
        pytest.skip("landlock is not available here")
    entry = next(b for b in doctor({})["backends"] if b["name"] == "landlock")
    expected = "C launcher" if native_launcher() else "Python launcher"
    assert expected in entry["detail"], entry


def test_launchers_report_themselves(world: World) -> None:
    b = world.backend
    assert isinstance(b, LandlockBackend)
    reason = b.availability().reason
    assert ("C launcher" in reason) == (b.launcher == "native"), reason


def test_process_state_at_start(world: World) -> None:
    r = world.run(
        "grep -E '^(SigBlk|SigIgn|NoNewPrivs|Seccomp|CapEff|CapBnd):' /proc/self/status;"
        " echo sid=$(cut -d' ' -f6 /proc/self/stat) pid=$$; ulimit -c; ls -l /proc/self/fd"
    )
    assert r.status == 0, r.both
    status = dict(line.split(":\t") for line in r.out.splitlines() if ":\t" in line)
    # No signal blocked. Python ignores SIGPIPE and SIGXFSZ, and an ignored
    # signal stays ignored across exec: the jail must get them back, and
    # ignore nothing beyond what the engine inherited from its own parent.
    assert status["SigBlk"] == "0000000000000000"
    ignored = int(status["SigIgn"], 16)
    pipe_xfsz = (1 << (signal.SIGPIPE - 1)) | (1 << (signal.SIGXFSZ - 1))
    assert ignored & pipe_xfsz == 0, status["SigIgn"]
    assert ignored & ~_ignored_by_us() == 0, (status["SigIgn"], hex(_ignored_by_us()))
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
    assert status["CapEff"] == "0000000000000000"
    # Its own session, led by the item's first process (so a kill of the group reaches all).
    sid = next(line for line in r.out.splitlines() if line.startswith("sid="))
    assert sid.split()[0][4:] == sid.split()[1][4:]
    assert "\n0\n" in r.out  # no core dumps
    # Only stdin, stdout, stderr (and ls's own directory fd) are open.
    fds = [line.split()[-3] for line in r.out.splitlines() if " -> " in line]
    assert sorted(fds) == ["0", "1", "2", "3"], r.out


def test_stdin_is_devnull_and_outputs_are_the_given_files(world: World) -> None:
    r = world.run("readlink /proc/self/fd/0; read x && echo read-something; echo to-err >&2")
    assert r.status == 0
    assert r.out.splitlines() == ["/dev/null"]
    assert r.err == "to-err\n"


def test_a_failed_stage_is_reported_on_stderr(world: World) -> None:
    r = world.run_argv(["/nonexistent/program"])
    assert r.status == 127
    assert "stockade: cannot start the jail (exec)" in r.err, r.err
    assert "No such file or directory" in r.err


def test_a_missing_cwd_is_reported(world: World) -> None:
    policy = world.policy(["/bin/true"])
    gone = world.work
    os.rename(gone, world.base / "moved-away")
    try:
        with open(world.meta / "stderr", "wb") as err:
            running = world.backend.start(policy, stdout=err, stderr=err)
            assert running.wait(10) == 127
        assert "cannot start the jail (chdir)" in (world.meta / "stderr").read_text()
    finally:
        os.rename(world.base / "moved-away", gone)


def test_jail_dies_with_its_helper_which_is_replaced(world: World) -> None:
    backend = world.backend
    marker = f"launcher-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    policy = world.policy(["/bin/sh", "-c", f"exec sleep 1000 # {marker}"])
    with open(world.meta / "stdout", "wb") as out:
        running = backend.start(policy, stdout=out, stderr=out)
        jail = running.pid
        helper = _parent_of(jail)
        assert helper != os.getpid()
        os.kill(helper, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while Path(f"/proc/{jail}").exists() and _state(jail) != "Z":
            assert time.monotonic() < deadline, "the jail outlived its helper"
            time.sleep(0.02)
    # The pool's client notices its helper is gone and reports the job lost.
    assert running.wait(5) is not None
    # Every helper of the pool still starts jails: the dead one is replaced.
    for _ in range(4):
        assert world.run("echo again").out == "again\n"


def _parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_c_launcher_refuses_embedded_nul() -> None:
    # C strings would end at the NUL: the jail would run a shorter argument.
    needs_c_launcher()
    from stockade.sandbox import _jail

    for argv, env in (([b"/bin/true", b"a\x00b"], []), ([b"/bin/true"], [b"A=1\x00B=2"])):
        with pytest.raises(ValueError, match="embedded null byte"):
            _jail.spawn(b"/bin/true", argv, env, b"/", [0, 1, 2], -1, b"", -1, -1, [])


def _ignored_by_us() -> int:
    """The signals this test process ignores (inherited ones included)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigIgn in /proc/self/status")
