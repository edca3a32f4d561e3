"""Jails share their uid with no host process and no other jail (root engine).

A host process running as ``nobody`` (a daemon, or an unprivileged local
user's setuid-nobody helper) must not read a jail's ``/proc/PID/environ``,
where its secrets are. The positive controls pin the jails to the shared
``nobody`` of old (a test-only knob): then the same read succeeds.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

import pytest

from stockade.sandbox import Backend, Running, _lifetime, _uids
from tests.sandbox.conftest import World, available_backend, jail_ids, make_world, placed_world

pytestmark = pytest.mark.sandbox

WAIT = 'id -u; while [ ! -e "$1" ]; do sleep 0.05; done; echo done'


def poll(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@dataclass
class Held:
    """A jail that printed its uid and waits for its stop file."""

    running: Running
    out: Path
    stop: Path
    sink: IO[bytes]

    @property
    def uid(self) -> int:
        return int(self.out.read_text().split()[0])

    def release(self) -> str:
        self.stop.touch()
        status = self.running.wait(30)
        self.sink.close()
        assert status == 0, self.out.read_text()
        return self.out.read_text()


def hold(w: World, name: str, env: dict[str, str] | None = None) -> Held:
    work = w.item.parent / name / "work"
    work.mkdir(parents=True)
    work.chmod(0o777)
    policy = replace(
        w.policy(["/bin/sh", "-c", WAIT, "sh", "stop"], env=env),
        work_dir=work,
        scratch_dir=w.base / f"scratch-{name}",
    )
    out = w.meta / f"out-{name}"
    sink = open(out, "wb")  # noqa: SIM115 - closed by Held.release
    running = w.backend.start(policy, stdout=sink, stderr=sink)
    held = Held(running, out, work / "stop", sink)
    poll(lambda: out.read_text().strip() != "", f"jail {name} to start")
    return held


@pytest.fixture(params=("open", "private"))
def fresh(request: pytest.FixtureRequest, backend: Backend, tmp_path: Path) -> Iterator[World]:
    """A world whose jails lease their uids as in a real run (nothing pinned),
    in a world-readable folder or below a 0700 one (pytest's tmp_path)."""
    with placed_world(backend, request.param, tmp_path, "stockade-uids-") as w:
        yield w


def read_environs_as_nobody() -> str:
    """What a host process running as ``nobody`` reads of every environ."""
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to start the attacker"
    p = subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--",
         "/bin/sh", "-c", 'for f in /proc/[0-9]*/environ; do cat "$f"; echo; done 2>/dev/null'],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    return p.stdout.decode(errors="replace")


@pytest.mark.parametrize("pinned", [False, True], ids=["own-uid", "control-nobody"])
def test_host_nobody_cannot_read_a_jail_environ(
    fresh: World, monkeypatch: pytest.MonkeyPatch, pinned: bool
) -> None:
    if pinned:
        monkeypatch.setattr(jail_ids(fresh.backend), "pinned", (65534, 65534))
    secret = f"sk-{secrets.token_hex(16)}"
    jail = hold(fresh, "victim", env={"JAIL_SECRET": secret})
    try:
        uid = jail.uid
        stolen = read_environs_as_nobody()
    finally:
        jail.release()
    if pinned:
        assert uid == 65534
        assert secret in stolen  # the old shared nobody: the attack works
    else:
        assert uid != 65534 and uid != 0
        assert secret not in stolen


def test_concurrent_jails_get_distinct_uids_and_only_they_run_as_them(fresh: World) -> None:
    a = hold(fresh, "a")
    b = hold(fresh, "b")
    try:
        uids = {a.uid, b.uid}
        assert len(uids) == 2, uids
        pool = _uids.jail_uids()
        assert all(pool.first <= u <= pool.last for u in uids)
        # Every process with a jail's uid is that jail or below it: no
        # helper of the engine (which holds every item's secrets) runs as it.
        for held in (a, b):
            for pid in pids_with_uid(held.uid):
                assert descends_from(pid, held.running.pid) is not False, pid
            assert pids_with_uid(held.uid), held.uid
    finally:
        a.release()
        b.release()


def pids_with_uid(uid: int) -> list[int]:
    """Live processes with ``uid`` (a zombie holds neither memory nor environ)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                status = Path(f"/proc/{name}/status").read_text()
            except OSError:
                continue
            fields = dict(ln.split(":", 1) for ln in status.splitlines() if ":" in ln)
            if str(uid) in fields["Uid"].split() and not fields["State"].strip().startswith("Z"):
                found.append(int(name))
    return found


def descends_from(pid: int, ancestor: int) -> bool | None:
    """``None`` when a process on the way ended meanwhile (the jail's
    ``sleep`` loop makes and ends processes all the time)."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat_line = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        pid = int(stat_line.rsplit(")", 1)[1].split()[1])
    return False


def test_a_jail_cannot_read_another_jails_environ(fresh: World) -> None:
    secret = f"sk-{secrets.token_hex(16)}"
    victim = hold(fresh, "victim", env={"JAIL_SECRET": secret})
    try:
        r = fresh.run(
            'cat "/proc/$1/environ"; for f in /proc/[0-9]*/environ; do cat "$f"; done; echo end',
            str(victim.running.pid),
        )
    finally:
        victim.release()
    assert "end" in r.out, r.both
    assert secret not in r.both


def test_control_without_a_sandbox_one_item_reads_another(none_world: World) -> None:
    secret = f"sk-{secrets.token_hex(16)}"
    victim = hold(none_world, "victim", env={"JAIL_SECRET": secret})
    try:
        r = none_world.run('cat "/proc/$1/environ"; echo end', str(victim.running.pid))
    finally:
        victim.release()
    assert secret in r.out


ENGINE = """
import sys
from stockade.sandbox._uids import UidPool
first, last, count = (int(a) for a in sys.argv[1:4])
pool = UidPool(first, last, sys.argv[4])
sys.stdin.readline()  # go
try:
    print(" ".join(str(pool.acquire().uid) for _ in range(count)), flush=True)
except Exception as e:
    print("refused", e, flush=True)
sys.stdin.readline()  # leases held until then
"""

#: A few uids systemd's UIDS-GIDS leaves unused, below nobody: no test run's
#: jails use them, so the engines below compete only with each other.
TEST_RANGE = (65520, 65525)


def engines(n: int, count: int, lease_dirs: list[str]) -> list[subprocess.Popen[str]]:
    """``n`` engine processes, each to lease ``count`` uids once told to go."""
    first, last = TEST_RANGE
    return [
        subprocess.Popen(
            [sys.executable, "-c", ENGINE, str(first), str(last), str(count), lease_dirs[i]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]


def lease_all(procs: list[subprocess.Popen[str]]) -> list[str]:
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    lines = []
    for p in procs:
        assert p.stdout is not None
        lines.append(p.stdout.readline().strip())
    return lines


def finish(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(30)


def test_two_engines_leasing_together_never_share_a_uid() -> None:
    size = TEST_RANGE[1] - TEST_RANGE[0] + 1
    procs = engines(2, size // 2, [_uids.LEASE_DIR] * 2)
    try:
        lines = lease_all(procs)
    finally:
        finish(procs)
    got = [set(map(int, line.split())) for line in lines]
    assert all(len(g) == size // 2 for g in got), lines
    assert not got[0] & got[1], lines
    assert got[0] | got[1] == set(range(TEST_RANGE[0], TEST_RANGE[1] + 1))


@pytest.mark.parametrize("shared", [True, False], ids=["shared-leases", "control-apart"])
def test_an_engine_holding_every_uid_leaves_none(shared: bool, tmp_path: Path) -> None:
    size = TEST_RANGE[1] - TEST_RANGE[0] + 1
    apart = tmp_path / "leases"
    first = engines(1, size, [_uids.LEASE_DIR])
    try:
        held = lease_all(first)[0]
        assert len(held.split()) == size, held
        second = engines(1, 1, [_uids.LEASE_DIR if shared else str(apart)])
        try:
            answer = lease_all(second)[0]
        finally:
            finish(second)
    finally:
        finish(first)
    if shared:
        assert answer.startswith("refused") and "in use" in answer, answer
    else:  # without the shared lease files it would take a uid already in use
        assert int(answer) in set(map(int, held.split()))


def marked(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker``."""
    found = []
    for pid in pids_with_uid_any():
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def pids_with_uid_any() -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                pids.append(int(name))
    return pids


@pytest.mark.parametrize("name", ["landlock", "landlock-python"])
@pytest.mark.parametrize("pinned", [False, True], ids=["leased", "control-pinned"])
def test_no_process_of_a_jail_outlives_its_uid(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, name: str, pinned: bool
) -> None:
    """A helper that dies takes the jail's first process with it, not its
    grandchildren: the engine kills what is left before the uid moves on.
    The jail's cgroup (``_lifetime``) would end them too: switched off here,
    so the uid sweep alone is what is tested."""
    monkeypatch.setattr(_lifetime, "_current", _lifetime.Lifetime("off"))
    backend = available_backend(request, name)
    lease = _uids.jail_uids().acquire() if pinned else None
    if lease is not None:  # the uid is the test's: nothing ends it
        monkeypatch.setattr(jail_ids(backend), "pinned", (lease.uid, lease.gid))
    base = Path(tempfile.mkdtemp(prefix="stockade-leftover-"))
    w = make_world(backend, base)
    marker = f"{1000 + secrets.randbelow(1000)}.{secrets.randbelow(10**6)}"
    out = w.meta / "stdout"
    try:
        with open(out, "wb") as sink:
            running = backend.start(
                w.policy(["/bin/sh", "-c", f"sleep {marker} & echo started; wait"]),
                stdout=sink, stderr=sink,
            )  # fmt: skip
            poll(lambda: "started" in out.read_text(), "the jail to start")
            poll(lambda: bool(marked(marker)), "the grandchild to run")
            os.kill(int(Path(f"/proc/{running.pid}/stat").read_text().rsplit(")", 1)[1].split()[1]),
                    signal.SIGKILL)  # its helper  # fmt: skip
            assert running.wait(30) is not None
        if pinned:
            assert marked(marker), "control: the grandchild outlived its helper"
        else:
            poll(lambda: not marked(marker), "the leftover to be killed", timeout=10)
    finally:
        for pid in marked(marker):
            os.kill(pid, signal.SIGKILL)
        if lease is not None:
            lease.release()
        w.host_tmp.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)
