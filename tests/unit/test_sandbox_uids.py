"""The jail uid range and its leases (``stockade.sandbox._uids``)."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import pytest

from stockade.errors import InfraError
from stockade.sandbox._uids import UidPool, ids_in_use, is_mapped, parse_range


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("60706-61183", (60706, 61183)),
        (" 100000-100009 ", (100000, 100009)),
        ("7-7", (7, 7)),
    ],
)
def test_parse_range(text: str, expected: tuple[int, int]) -> None:
    assert parse_range(text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("60706", "FIRST-LAST"),
        ("a-b", "FIRST-LAST"),
        ("0-10", "FIRST-LAST"),
        ("10-5", "FIRST-LAST"),
        ("2147483000-2147483647", "FIRST-LAST"),
        ("65530-65540", "65534"),
        ("65535-65540", "65535"),
    ],
)
def test_parse_range_refuses(text: str, why: str) -> None:
    with pytest.raises(InfraError, match=why):
        parse_range(text)


@pytest.mark.parametrize(
    ("id_map", "expected"),
    [
        ("         0          0 4294967295\n", True),
        ("0 1000 1\n1 100000 65536\n", True),  # rootless podman: 0-65536 mapped
        ("0 1000 1\n1 100000 60000\n", False),  # 60706 is past 60000
        ("0 0 61000\n", False),  # covers only part of the range
        ("", False),
    ],
)
def test_is_mapped(id_map: str, expected: bool) -> None:
    assert is_mapped(60706, 61183, id_map) is expected


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="leases are a root engine's")
#: Ids systemd leaves unused below nobody: no jail of a test run has them.
FIRST, LAST = 65520, 65523


@needs_root
def test_pool_reuses_an_idle_uid_rather_than_fail(tmp_path: Path) -> None:
    pool = UidPool(FIRST, FIRST, str(tmp_path / "leases"))
    a = pool.acquire()
    a.release()
    assert pool.acquire().uid == a.uid  # the range is full: the spare is used


@needs_root
def test_pool_leases_distinct_uids_and_reuses_released_ones(tmp_path: Path) -> None:
    pool = UidPool(FIRST, LAST, str(tmp_path / "leases"))
    a, b = pool.acquire(), pool.acquire()
    assert a.uid != b.uid and a.uid == a.gid and FIRST <= a.uid <= LAST
    a.release()
    a.release()  # twice is once
    b.release()
    # Two idle: the one idle longest, with no new lease file and no /proc scan.
    c = pool.acquire()
    assert c.uid == a.uid
    d = pool.acquire()  # one idle only: a new lease keeps a spare
    assert d.uid not in (a.uid, b.uid)
    for lease in (c, d):
        lease.release()
    held = sorted(os.listdir(tmp_path / "leases"))
    assert held == sorted({str(a.uid), str(b.uid), str(d.uid)})
    # While leased, another engine cannot take the lock; after release_idle it can.
    fd = os.open(tmp_path / "leases" / str(a.uid), os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        pool.release_idle()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert os.stat(tmp_path / "leases").st_mode & 0o777 == 0o700


@needs_root
def test_pool_skips_a_uid_a_process_runs_with(tmp_path: Path) -> None:
    squatter = subprocess.Popen(["sleep", "60"], user=FIRST, group=FIRST, extra_groups=[])
    try:
        assert FIRST in ids_in_use()
        pool = UidPool(FIRST, FIRST + 1, str(tmp_path / "leases"))
        assert pool.acquire().uid == FIRST + 1
        with pytest.raises(InfraError, match="in use"):
            pool.acquire()
    finally:
        squatter.kill()
        squatter.wait()


@needs_root
def test_pool_skips_uids_an_account_has(tmp_path: Path) -> None:
    # uids 1 and 2 belong to system accounts on every Debian-like system.
    pool = UidPool(1, 2, str(tmp_path / "leases"))
    with pytest.raises(InfraError, match="STOCKADE_JAIL_UIDS"):
        pool.acquire()


@needs_root
def test_pool_refuses_a_lease_folder_others_can_write(tmp_path: Path) -> None:
    leases = tmp_path / "leases"
    leases.mkdir()
    leases.chmod(0o777)
    with pytest.raises(InfraError, match="only it can write"):
        UidPool(FIRST, LAST, str(leases)).acquire()
