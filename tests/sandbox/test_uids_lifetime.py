"""A root engine's jail has both: a uid of its own (``_uids``, with bridges
over root-only folders, ``_reach``) and a cgroup of its own (``_lifetime``).

The launcher's child is created in the cgroup (clone3) or joins it first,
makes the bridge mounts while it still has the engine's privileges, and
only then takes the jail's uid. Every launcher, from a world-readable and
from a private (0700) folder (bridged), under each cgroup mechanism.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.sandbox import Backend, _lifetime, _uids
from stockade.sandbox.none import NoneBackend
from tests.sandbox.conftest import World, make_world, placed_world
from tests.sandbox.lifetime_helpers import await_, cgroup_of, marked, pinned_lifetime

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jail uids are a root engine's")

#: Prints its uid and its input, then waits for the stop file.
HOLD = 'id -u; cat input.txt; while [ ! -e stop ]; do sleep 0.05; done'


@pytest.fixture(params=["cgroup2", "cgroup1"])
def lifetime(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[_lifetime.Lifetime]:
    yield from pinned_lifetime(request.param, monkeypatch)


@pytest.fixture(params=("open", "private"))
def place(request: pytest.FixtureRequest, backend: Backend, tmp_path: Path) -> Iterator[World]:
    """A world whose jails lease their uids as in a real run, in a
    world-readable folder or below a 0700 one (pytest's tmp_path)."""
    with placed_world(backend, request.param, tmp_path, "stockade-uids-lifetime-") as w:
        yield w


def _cgroup_line(pid: int, lifetime: _lifetime.Lifetime) -> str:
    """The path of ``pid``'s cgroup in the hierarchy that ends the jail."""
    return cgroup_of(pid, "" if lifetime.mode == "cgroup2" else "freezer")


def _status_ids(pid: int) -> tuple[list[int], list[int]]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return [int(x) for x in fields["Uid"].split()], [int(x) for x in fields["Gid"].split()]


def test_a_leased_jail_runs_in_its_cgroup_as_its_uid(
    place: World, lifetime: _lifetime.Lifetime
) -> None:
    w = place
    input_text = f"input {secrets.token_hex(8)}"
    (w.work / "input.txt").write_text(input_text + "\n")
    w.work.chmod(0o755)
    out = w.meta / "out"
    with open(out, "wb") as sink:
        running = w.backend.start(w.policy(["/bin/sh", "-c", HOLD]), stdout=sink, stderr=sink)
        try:
            await_(lambda: input_text in out.read_text(), "the jail to read its input")
            uid = int(out.read_text().split()[0])
            pool = _uids.jail_uids()
            assert pool.first <= uid <= pool.last, out.read_text()
            # Outside the jail: the launched process (the jail's first, or
            # bwrap) runs as the leased uid, in a cgroup of the engine's tree.
            uids, gids = _status_ids(running.pid)
            assert set(uids) == {uid} and set(gids) == {uid}, (uids, gids)
            tree = str(lifetime.report()["cgroup"])
            inside = _cgroup_line(running.pid, lifetime)
            assert inside != "/" and tree.endswith(os.path.dirname(inside)), (inside, tree)
            (w.work / "stop").touch()
            assert running.wait(30) == 0, out.read_text()
        finally:
            running.kill(0.1)
    # The uid went back: work/ is the engine's again.
    assert w.work.stat().st_uid == os.geteuid()


def test_kill_ends_a_leased_jails_escaped_children(
    place: World, lifetime: _lifetime.Lifetime
) -> None:
    """A child that leaves the jail's session (bwrap) or double-forks is
    still in the cgroup: kill() returns only once it is gone, and the uid
    is free of processes before it is reused."""
    w = place
    marker = secrets.token_hex(8)
    script = "(sleep 300 &) ; echo started; sleep 300"
    out = w.meta / "out"
    with open(out, "wb") as sink:
        running = w.backend.start(
            w.policy(["/bin/sh", "-c", script], env={"MARK": marker}), stdout=sink, stderr=sink
        )
        try:
            await_(lambda: "started" in out.read_text(), "the jail to start")
            await_(lambda: len(marked(marker, "sleep")) >= 2, "both sleeps")
            running.kill(0.5)
            assert not marked(marker), "kill() returned with a jail process left"
        finally:
            for pid in marked(marker):
                os.kill(pid, 9)


def test_the_none_backend_helper_places_pass_fds_at_3(tmp_path: Path) -> None:
    """isolate: false through the exec helper: the policy's fd lands on 3
    next to the jail's cgroup fds, which do not reach it."""
    base = tmp_path / "none"
    base.mkdir()
    backend = NoneBackend(launcher="helper")
    w = make_world(backend, base)
    here, there = socket.socketpair()
    token = secrets.token_hex(8)
    script = (
        "import os, socket, sys\n"
        "socket.socket(fileno=3).sendall(sys.argv[1].encode())\n"
        "extra = []\n"
        "for fd in range(4, 1024):\n"
        "    try:\n"
        "        os.fstat(fd)\n"
        "        extra.append(fd)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('extra', extra)\n"
    )
    try:
        with here, there:
            r = w.py(script, token, pass_fds=(there.fileno(),))
            here.settimeout(5)
            assert here.recv(100).decode() == token
        assert r.status == 0, r.both
        assert "extra []" in r.out, r.both
    finally:
        w.host_tmp.unlink(missing_ok=True)
