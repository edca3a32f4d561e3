"""A jail ends whole: ``Running.kill`` and the end of its main process leave
no process of it, on every backend and launcher, under every mechanism
(cgroup v2, cgroup v1 freezer, process group). Stale cgroups of dead
engines are swept.

Jail processes are found by ``MARK=<token>`` in their environment, a token
composed here at run time; every test first waits until they run.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.errors import InfraError
from stockade.sandbox import Backend, Resources, Running, _cgroup, _direct, _lifetime
from stockade.sandbox.base import jail_left_nothing
from tests.nobody import AS_NOBODY, need_nobody, readable_package
from tests.sandbox.conftest import World, needs_c_launcher
from tests.sandbox.lifetime_helpers import (
    ALL_BACKENDS,
    await_,
    cgroup_of,
    kill_engine_and_expect_jails_gone,
    kill_marked,
    marked,
    pick_backend,
    pinned_lifetime,
)

pytestmark = pytest.mark.sandbox

MECHANISMS = ("cgroup2", "cgroup1", "pgroup")


@pytest.fixture(params=ALL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """Overrides conftest's: the ``none`` backend and its helper launcher too."""
    return pick_backend(request, request.param)


@pytest.fixture(params=MECHANISMS)
def lifetime(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[_lifetime.Lifetime]:
    yield from pinned_lifetime(request.param, monkeypatch)


def _start(world: World, script: str, marker: str) -> Running:
    out = open(world.meta / "stdout", "wb")  # noqa: SIM115 - closed by the caller's fixture
    world.extra_env["MARK"] = marker
    try:
        return world.backend.start(world.policy(["/bin/sh", "-c", script]), stdout=out, stderr=out)
    finally:
        out.close()


def test_kill_leaves_no_process(world: World, lifetime: _lifetime.Lifetime) -> None:
    # bwrap's processes, the pid namespace's init, a child of a child, and
    # the main process: none may be left once kill() returns.
    marker = secrets.token_hex(8)
    running = _start(world, "sleep 1000 & sh -c 'sleep 1000; :' & sleep 1000", marker)
    await_(lambda: len(marked(marker, "sleep")) >= 3, "the jail's three sleeps")
    running.kill(grace=0.2)
    assert marked(marker) == [], "kill() returned while jail processes still ran"
    assert running.wait(5) is not None


def test_the_end_of_the_main_process_ends_the_rest(
    world: World, lifetime: _lifetime.Lifetime
) -> None:
    marker = secrets.token_hex(8)
    running = _start(world, "sleep 1000 & sh -c 'sleep 1000; :' & sleep 0.5", marker)
    await_(lambda: len(marked(marker, "sleep")) >= 2, "the jail's background sleeps")
    assert running.wait(30) is not None
    # SIGKILLed as wait() returns; gone once the kernel has torn them down.
    await_(lambda: not marked(marker), "the rest of the jail to end", timeout=10)


@pytest.mark.parametrize("backend", ["none", "none-helper"], indirect=True)
@pytest.mark.parametrize("mode", ["cgroup2", "cgroup1", "off"])
def test_a_process_that_leaves_its_session_is_ended_by_its_cgroup(
    world: World, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under none nothing stops setsid: only the jail's cgroup still holds the
    # process. ``off`` is the positive control: the old path leaves it running.
    lifetimes = pinned_lifetime(mode, monkeypatch)
    next(lifetimes)
    marker = secrets.token_hex(8)
    try:
        running = _start(world, "setsid sleep 1000 & sleep 1000", marker)
        await_(lambda: len(marked(marker, "sleep")) >= 2, "the jail's sleeps")
        running.kill(grace=0.2)
        left = marked(marker)
        if mode == "off":
            assert left, "the positive control: the escaped sleep should have survived"
        else:
            assert left == []
    finally:
        kill_marked(marker)
        next(lifetimes, None)


def test_a_stale_engine_folder_is_swept(monkeypatch: pytest.MonkeyPatch) -> None:
    # What a dead engine (and its dead watchdog) left: a folder named after
    # a process that no longer exists, with a jail process still in it. A
    # folder of a live engine next to it is left alone.
    lt = _lifetime.Lifetime("cgroup2")
    try:
        lt.open().discard()
    except InfraError as e:
        pytest.skip(f"cgroup v2 is not available here: {e}")
    finally:
        lt.close()
    with open("/proc/self/mountinfo") as f, open("/proc/self/cgroup") as g:
        hs = _cgroup.find_hierarchies(f.read(), g.read())
    pidns = os.stat("/proc/self/ns/pid").st_ino
    start = _cgroup.process_start(os.getpid())
    assert start is not None
    dead = _cgroup.engine_name(pidns, os.getpid(), start + 1)  # no such process
    alive = _cgroup.engine_name(pidns, os.getpid(), start, 999)
    marker = secrets.token_hex(8)
    procs = []
    try:
        for name in (dead, alive):
            folder = Path(hs["v2"].own) / name
            (folder / "jail").mkdir(parents=True)
            p = subprocess.Popen(["sleep", "1000"], env={"MARK": marker, "PATH": "/usr/bin:/bin"})
            (folder / "jail" / "cgroup.procs").write_text(str(p.pid))
            procs.append(p)
        assert _cgroup.sweep(hs, pidns) == 1
        assert procs[0].wait(10) == -signal.SIGKILL
        assert not (Path(hs["v2"].own) / dead).exists()
        assert procs[1].poll() is None and (Path(hs["v2"].own) / alive).exists()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        _cgroup.remove([str(Path(hs["v2"].own) / n) for n in (dead, alive)])


def test_the_watchdog_ends_the_jails_of_a_killed_engine(world: World, tmp_path: Path) -> None:
    # A stand-in engine starts two jails, one sleeping in the background,
    # and is SIGKILLed: its watchdog ends both, and removes its cgroups.
    marker = secrets.token_hex(8)
    b = world.backend
    kind = type(b).__module__, type(b).__name__, getattr(b, "launcher", None)
    code = f"""
import importlib, sys, time
from pathlib import Path
from stockade.sandbox import Policy
module, cls, launcher = {kind!r}
backend = getattr(importlib.import_module(module), cls)(launcher=launcher)
for i in range(2):
    policy = Policy(argv=("/bin/sh", "-c", "sleep 1000 & sleep 1000"),
                    work_dir=Path({str(world.work)!r}), scratch_dir=Path({str(world.base)!r}) / f"s{{i}}",
                    env={{"PATH": "/usr/bin:/bin", "MARK": {marker!r}}})
    backend.start(policy, stdout=sys.stderr, stderr=sys.stderr)
print("started", flush=True)
time.sleep(1000)
"""
    root = Path(__file__).resolve().parents[2]
    engine = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(root / "src")}, start_new_session=True,
    )  # fmt: skip
    assert engine.stdout is not None
    started = engine.stdout.readline().strip()
    kill_engine_and_expect_jails_gone(engine, marker, 4, "both jails' sleeps")
    assert started == "started"


UNPRIVILEGED_ENGINE = """
import json, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from stockade.sandbox import Policy, _lifetime, get_backend
for name in ("bwrap", "landlock", "none"):
    base = Path(tempfile.mkdtemp(dir=sys.argv[2]))
    (base / "work").mkdir()
    policy = Policy(argv=("/bin/sh", "-c", "sleep 1000 & sleep 1000"), work_dir=base / "work",
                    scratch_dir=base / "scratch", env={"PATH": "/usr/bin:/bin", "MARK": sys.argv[3]})
    get_backend(name).start(policy, stdout=sys.stderr, stderr=sys.stderr)
print(json.dumps(_lifetime.get().report()), flush=True)
time.sleep(1000)
"""


def test_an_unprivileged_engines_jails_die_with_it(tmp_path: Path) -> None:
    # An ordinary user cannot make cgroups without delegation: process
    # groups and the watchdog must do. (As root, the engine runs as nobody.)
    need_nobody()
    marker = secrets.token_hex(8)
    scratch = Path(tempfile.mkdtemp(prefix="stockade-nonroot-"))
    scratch.chmod(0o777)
    # A copy nobody can import: the checkout may be in a private (0700) folder.
    with readable_package() as src:
        engine = subprocess.Popen(
            [*(AS_NOBODY if os.geteuid() == 0 else []), "/usr/bin/python3", "-I", "-c",
             UNPRIVILEGED_ENGINE, str(src), str(scratch), marker],
            env={"PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch)},
            cwd=scratch, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            assert engine.stdout is not None
            line = engine.stdout.readline()
            kill_engine_and_expect_jails_gone(engine, marker, 6, "three jails' sleeps")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    report = json.loads(line)
    if os.geteuid() == 0:
        assert report["mechanism"] == "pgroup", report  # nobody has no delegated cgroup


def test_the_c_launcher_creates_a_jail_inside_its_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # clone3(CLONE_INTO_CGROUP) puts the child in cgroup_dir's cgroup without
    # the migration a write to cgroup.procs costs; where the kernel refuses it
    # (here: a folder that is no cgroup), the child writes cgroups[0] instead.
    # Two different cgroups tell the two paths apart.
    needs_c_launcher()
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip(f"clone3 into a cgroup is built for x86_64 and aarch64, not {platform.machine()}")
    lifetimes = pinned_lifetime("cgroup2", monkeypatch)
    lt = next(lifetimes)
    into, written = lt.open(), lt.open()
    launcher = _direct.LauncherThread()
    not_a_cgroup = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with open(tmp_path / "out", "wb") as out:
            fds = [out.fileno()] * 2
            a = launcher.spawn("/bin/sleep", ["sleep", "30"], {}, fds,
                               cgroups=[written.join_fds[0]], cgroup_dir=into.join_dir)  # fmt: skip
            b = launcher.spawn("/bin/sleep", ["sleep", "30"], {}, fds,
                               cgroups=[written.join_fds[0]], cgroup_dir=not_a_cgroup)  # fmt: skip
        for running, group in ((a, into), (b, written)):
            inside = cgroup_of(running.pid)
            assert inside.count("/") == 2 and str(group.cgroup).endswith(inside), inside
        for r in (a, b):
            r.kill(0.1)
    finally:
        os.close(not_a_cgroup)
        launcher.close()
        into.discard()
        written.discard()
        next(lifetimes, None)


def _kind(lt: _lifetime.Lifetime) -> str:
    return "v2" if lt.mode == "cgroup2" else "freezer"


def _in(running: Running, lt: _lifetime.Lifetime) -> str:
    """The cgroup ``running``'s main process is in (as /proc names it)."""
    return cgroup_of(running.pid, "" if lt.mode == "cgroup2" else "freezer")


def _lent(lt: _lifetime.Lifetime) -> Path:
    """The one cgroup ``pinned_lifetime``'s setup lent (its first jail group)."""
    assert len(lt._spare) == 1
    return Path(lt._spare[0].kill[1])


#: Where a jail's cgroup is surely lent. Not bwrap: its pid namespace's init
#: is often still in the cgroup when bwrap exits; cgroup v2 waits for it
#: (``_cgroup.empties``), v1 only looks once and then kills the cgroup.
LENDING = pytest.mark.parametrize("backend", ["landlock", "landlock-python", "none",
                                              "none-helper"], indirect=True)
CGROUPS = pytest.mark.parametrize("lifetime", ["cgroup2", "cgroup1"], indirect=True)


@LENDING
@CGROUPS
def test_an_ended_jails_cgroup_holds_the_next_jail_unless_it_has_limits(
    world: World, lifetime: _lifetime.Lifetime
) -> None:
    marker = secrets.token_hex(8)
    used = _lent(lifetime).name
    first = _start(world, "exit 3", marker)
    assert first.wait(30) == 3
    assert [Path(leaf.kill[1]).name for leaf in lifetime._spare] == [used]  # lent back
    second = _start(world, "sleep 30", marker)
    await_(lambda: marked(marker, "sleep"), "the second jail")
    assert Path(_in(second, lifetime)).name == used  # lent, not made anew
    # Limits: a cgroup of its own, removed at the end (charges stay with a cgroup).
    out = open(world.meta / "stdout", "wb")  # noqa: SIM115
    limited = world.backend.start(
        world.policy(["/bin/sh", "-c", "sleep 30"], resources=Resources(processes=64)),
        stdout=out, stderr=out)
    out.close()
    await_(lambda: len(marked(marker, "sleep")) >= 2, "the limited jail")
    own = Path(_in(limited, lifetime)).name
    assert own != used
    limited.kill(grace=0.1)
    second.kill(grace=0.1)
    assert lifetime._tree is not None
    engine = Path(lifetime._tree.kill[1])
    assert not (engine / own).exists(), "a limited jail's cgroup was kept"


@pytest.mark.parametrize("backend", ["none", "none-helper"], indirect=True)
@pytest.mark.parametrize("lifetime", MECHANISMS, indirect=True)
def test_a_jail_is_seen_gone_only_when_its_cgroup_was_found_empty(
    world: World, lifetime: _lifetime.Lifetime
) -> None:
    # What the runner keeps an enforced jail's scratch folder on
    # (ItemDir.jail_gone): a process that left the session is still running
    # when the main one ends; a process group is never known to be empty.
    marker = secrets.token_hex(8)
    quiet = _start(world, "exit 0", marker)
    assert not jail_left_nothing(quiet)  # not before wait() saw it end
    assert quiet.wait(30) == 0
    assert jail_left_nothing(quiet) is (lifetime.mode != "pgroup")
    left = _start(world, "setsid sh -c 'touch started; exec sleep 1000' & "
                         "until [ -e started ]; do sleep 0.01; done; exit 3", marker)
    try:
        assert left.wait(30) == 3
        assert not jail_left_nothing(left)
    finally:
        kill_marked(marker)


@pytest.mark.parametrize("backend", ["none", "none-helper"], indirect=True)
@CGROUPS
def test_a_cgroup_the_engine_had_to_kill_is_removed_not_lent(
    world: World, lifetime: _lifetime.Lifetime
) -> None:
    # A process that left the jail's session outlives its main process, so
    # the engine kills it through the cgroup: that cgroup goes (a process
    # cloned into a killed cgroup was SIGKILLed at birth on Linux 6.18), and
    # the next jail runs. (It waits ``_lifetime.SETTLE`` for the cgroup to
    # empty by itself first: the sleep does not.)
    marker = secrets.token_hex(8)
    folder = _lent(lifetime)
    first = _start(world, "setsid sh -c 'touch started; exec sleep 1000' & "
                          "until [ -e started ]; do sleep 0.01; done; exit 3", marker)
    assert first.wait(30) == 3
    await_(lambda: not marked(marker), "the escaped sleep to be killed")
    await_(lambda: not folder.exists(), "the killed cgroup to be removed")
    assert not lifetime._spare
    after = _start(world, "exit 7", marker)
    assert after.wait(30) == 7


@LENDING
@CGROUPS
def test_a_lent_cgroup_with_a_cgroup_below_it_is_removed(
    world: World, lifetime: _lifetime.Lifetime
) -> None:
    marker = secrets.token_hex(8)
    folder = _lent(lifetime)
    running = _start(world, "sleep 30", marker)
    await_(lambda: marked(marker, "sleep"), "the jail in the lent cgroup")
    assert Path(_in(running, lifetime)).name == folder.name
    (folder / "below").mkdir()
    running.kill(grace=0.1)
    assert not lifetime._spare
    assert not folder.exists()


@pytest.mark.parametrize("mode", ["cgroup2", "cgroup1"])
def test_only_an_empty_thawed_leaf_cgroup_is_reusable(
    mode: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    needs_c_launcher()
    lifetimes = pinned_lifetime(mode, monkeypatch)
    lt = next(lifetimes)
    group = lt.open()
    kind, folder = _kind(lt), group.cgroup
    assert folder is not None
    launcher = _direct.LauncherThread()
    try:
        assert _cgroup.reusable(kind, folder)
        os.mkdir(os.path.join(folder, "below"))
        assert not _cgroup.reusable(kind, folder)
        os.rmdir(os.path.join(folder, "below"))
        freeze = ("cgroup.freeze", "1", "0") if kind == "v2" else ("freezer.state", "FROZEN",
                                                                   "THAWED")
        Path(folder, freeze[0]).write_text(freeze[1])
        assert not _cgroup.reusable(kind, folder)
        Path(folder, freeze[0]).write_text(freeze[2])
        assert _cgroup.reusable(kind, folder)
        with open(tmp_path / "out", "wb") as out:
            r = launcher.spawn("/bin/sleep", ["sleep", "30"], {}, [out.fileno()] * 2,
                               cgroups=list(group.join_fds))
        assert not _cgroup.reusable(kind, folder)
        r.kill(0.1)
        await_(lambda: _cgroup.reusable(kind, folder), "the cgroup to empty")
    finally:
        launcher.close()
        group.discard()
        next(lifetimes, None)


def test_a_cgroup_that_empties_by_itself_is_waited_for_not_killed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # What a bwrap jail's cgroup does after bwrap is reaped: its last
    # process is still there for a moment. ``empties`` waits for that (and
    # the group is then lent, its scratch kept); a process that stays is
    # not waited for past ``within``.
    needs_c_launcher()
    lifetimes = pinned_lifetime("cgroup2", monkeypatch)
    lt = next(lifetimes)
    group = lt.open()
    folder = group.cgroup
    assert folder is not None
    launcher = _direct.LauncherThread()
    try:
        assert _cgroup.empties("v2", folder, 0)  # nothing in it
        with open(tmp_path / "out", "wb") as out:
            r = launcher.spawn("/bin/sleep", ["sleep", "1000"], {}, [out.fileno()] * 2,
                               cgroups=list(group.join_fds))
        assert not _cgroup.empties("v2", folder, 0.05)  # it stays: not waited out
        ender = threading.Timer(0.2, r.kill, kwargs={"grace": 0.1})
        ender.start()
        # It ends by itself (for this test, by another thread) while we wait.
        assert _cgroup.empties("v2", folder, 60)
        ender.join()
        assert not _cgroup.populated("v2", folder)
    finally:
        launcher.close()
        group.discard()
        next(lifetimes, None)


def test_the_reaper_outlives_a_group_whose_folder_went() -> None:
    # A cgroup folder removed under it (the watchdog ends an engine's
    # folders whole) must not end the one thread every later jail needs.
    done = threading.Event()

    class Gone:
        def finish(self) -> None:
            raise FileNotFoundError(2, "No such file or directory", "freezer.state")

    class Next:
        def finish(self) -> None:
            done.set()

    _lifetime._reaper.put(Gone())  # type: ignore[arg-type]
    _lifetime._reaper.put(Next())  # type: ignore[arg-type]
    assert done.wait(30), "the reaper thread died with the first group"


def test_a_v1_kill_of_a_folder_removed_meanwhile_returns(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # The freeze was written, then the folder went before the state was read.
    lifetimes = pinned_lifetime("cgroup1", monkeypatch)
    lt = next(lifetimes)
    group = lt.open()
    folder = group.cgroup
    assert folder is not None
    real_read = _cgroup._read
    try:
        def gone(path: str) -> str:
            raise FileNotFoundError(2, "No such file or directory", path)

        monkeypatch.setattr(_cgroup, "_read", gone)
        _cgroup.kill("freezer", folder)  # must not raise
    finally:
        monkeypatch.setattr(_cgroup, "_read", real_read)
        Path(folder, "freezer.state").write_text("THAWED")
        group.discard()
        next(lifetimes, None)
