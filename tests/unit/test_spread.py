"""Step folders ask ext4 to spread their item folders (``workspace.spread``).

On an ext2/3/4 test folder the flag must be set where the engine sets it and
nowhere else; on any other filesystem the engine must report it unset and go
on. Which case applies is read from the mount table, not guessed.
"""

from __future__ import annotations

import os
import struct
import tempfile
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from stockade.cli.main import cli
from stockade.sandbox._cgroup import _unescape
from stockade.workspace.layout import RunDir
from stockade.workspace.spread import (
    FS_IOC_GETFLAGS,
    FS_IOC_SETFLAGS,
    FS_TOPDIR_FL,
    _ioc,
    inode_flags,
    is_spread,
    make_spread_folder,
    spread_subfolders,
)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

pytestmark = pytest.mark.skipif(os.uname().sysname != "Linux", reason="Linux inode flags")


def fs_type(path: Path) -> str:
    """The filesystem type of the mount holding ``path`` (/proc/self/mountinfo)."""
    real = os.path.realpath(path)
    best, kind = "", ""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            point = _unescape(left.split()[4])
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
                best, kind = point, right.split()[0]
    return kind


def topdir(path: Path | str) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return bool(inode_flags(fd) & FS_TOPDIR_FL)
    finally:
        os.close(fd)


@pytest.fixture
def ext4(tmp_path: Path) -> bool:
    return fs_type(tmp_path) in ("ext2", "ext3", "ext4")


@pytest.mark.parametrize(("long_size", "get", "set_"), [
    (8, 0x80086601, 0x40086602),  # linux/fs.h's values for a 64-bit long
    (4, 0x80046601, 0x40046602),  # and for a 32-bit one
])
def test_the_ioctl_numbers_are_linux_fs_h_ones(long_size: int, get: int, set_: int) -> None:
    assert (_ioc(2, 1, long_size), _ioc(1, 2, long_size)) == (get, set_)
    if struct.calcsize("l") == long_size:
        assert (get, set_) == (FS_IOC_GETFLAGS, FS_IOC_SETFLAGS)


def test_a_folder_is_spread_by_the_call_that_makes_it_and_only_by_it(
    tmp_path: Path, ext4: bool
) -> None:
    made = tmp_path / "a" / "b" / "step"
    assert make_spread_folder(str(made), 0o700) is True
    assert made.is_dir() and made.stat().st_mode & 0o777 == 0o700 & ~_umask()
    assert not make_spread_folder(str(made))  # there already: nothing to do
    there = tmp_path / "there"
    there.mkdir()
    assert make_spread_folder(str(there)) is False
    if ext4:
        assert topdir(made)
        assert not topdir(there) and not topdir(made.parent)  # left as they were


def test_the_flag_is_set_where_ext4_takes_it_and_reported_unset_elsewhere(
    tmp_path: Path, ext4: bool
) -> None:
    folder = tmp_path / "step"
    folder.mkdir()
    assert spread_subfolders(str(folder)) is ext4
    assert spread_subfolders(str(folder)) is ext4  # again: no change, same answer
    if ext4:
        assert topdir(folder)
    # Never through a link, never on a file or a missing path.
    (tmp_path / "file").write_text("x")
    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "link2").symlink_to(other)
    assert spread_subfolders(str(tmp_path / "link2")) is False
    assert spread_subfolders(str(tmp_path / "file")) is False
    assert spread_subfolders(str(tmp_path / "missing")) is False
    if ext4:
        assert not topdir(other)


def test_make_step_reports_whether_the_items_will_be_spread(tmp_path: Path, ext4: bool) -> None:
    run = RunDir(tmp_path, "r1")
    run.create()
    assert run.make_step("fan") is ext4
    assert run.make_step("fan") is ext4  # there already: read, not made again
    if ext4:
        assert topdir(run.path / "fan")
    # A step folder made before, without the flag (a resumed run's, say):
    # reported as it is, left as it is.
    (run.path / "plain").mkdir()
    assert run.make_step("plain") is False
    if ext4:
        assert not topdir(run.path / "plain")
    assert is_spread(str(run.path / "fan")) is ext4
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(run.path / "fan")
    for bad in ("file", "link", "missing"):
        assert is_spread(str(tmp_path / bad)) is False


def test_make_step_on_tmpfs_reports_unspread() -> None:
    shm = Path("/dev/shm")
    assert fs_type(shm) == "tmpfs", "the test needs /dev/shm as tmpfs, as Linux mounts it"
    with tempfile.TemporaryDirectory(dir=shm) as d:
        run = RunDir(Path(d), "r1")
        run.create()
        assert run.make_step("fan") is False
        assert (run.path / "fan").is_dir()


def test_a_steps_first_item_spreads_the_step_folder_and_only_it(tmp_path: Path, ext4: bool) -> None:
    run = RunDir(tmp_path, "r1")
    run.create()
    first = run.item("fan", 0)
    first.premake()
    assert first.begin_attempt() == 1
    run.item("fan", 1).premake()
    step = run.path / "fan"
    assert sorted(os.listdir(step)) == ["0", "1"]
    if ext4:
        assert topdir(step)
        # Not inherited: an item's own folders stay near it.
        assert not topdir(first.path) and not topdir(first.work) and not topdir(run.path)


def test_items_of_a_new_step_made_at_once_all_get_their_folders(tmp_path: Path, ext4: bool) -> None:
    run = RunDir(tmp_path, "r1")
    run.create()
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def make(i: int) -> None:
        try:
            start.wait()
            run.item("wide", i).premake()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=make, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(os.listdir(run.path / "wide")) == [str(i) for i in range(8)]
    assert all(os.path.isdir(run.path / "wide" / str(i) / ".next" / "out") for i in range(8))
    if ext4:
        assert topdir(run.path / "wide")  # whichever thread made it spread it


def test_a_run_spreads_each_steps_item_folders(tmp_path: Path, ext4: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOCKADE_HOME", str(tmp_path / "home"))
    wf = tmp_path / "wf.yaml"
    wf.write_text(
        "name: spread\n"
        "steps:\n"
        "  - id: one\n"
        "    run: echo hi > out/x\n"
        "  - id: fan\n"
        "    needs: [one]\n"
        "    for_each: [1, 2, 3]\n"
        "    run: echo {{ item }} > out/x\n"
    )
    result = CliRunner().invoke(cli, ["run", str(wf), "--sandbox", "none", "--run-id", "r1"])
    assert result.exit_code == 0, result.output
    run = tmp_path / "home" / "runs" / "r1"
    assert (run / "fan" / "2" / "work" / "out" / "x").read_text() == "3\n"
    if ext4:
        assert topdir(run / "one") and topdir(run / "fan")
        assert not topdir(run / "fan" / "0")


def test_a_dask_workers_scratch_folder_spreads_its_job_folders(
    tmp_path: Path, ext4: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stockade.runner import worker

    base = tmp_path / "worker"
    monkeypatch.setenv(worker.SCRATCH_ENV, str(base))
    assert worker.scratch_base() == base
    assert base.stat().st_mode & 0o777 == 0o700 & ~_umask()
    assert worker.scratch_base() == base  # the next job finds it as it was
    if ext4:
        assert topdir(base)
