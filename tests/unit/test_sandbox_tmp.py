"""Host-side temp folders: kept while their owner lives, swept once it is killed."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from stockade.sandbox._tmp import OWNER, owned_tmpdir, sweep

ROOT = Path(__file__).resolve().parents[2]


def test_a_live_owners_folder_is_kept(tmp_path: Path) -> None:
    path, fd = owned_tmpdir("stockade-t-", str(tmp_path))
    try:
        assert (Path(path) / OWNER).exists()
        assert oct(os.stat(path).st_mode & 0o777) == "0o755"
        # Another open of the lock file, even in this process, cannot take it.
        assert sweep(str(tmp_path), "stockade-t-") == 0
        assert os.path.isdir(path)
    finally:
        shutil.rmtree(path)
        os.close(fd)


def test_a_killed_owners_folder_goes_with_the_next_one(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import time
        from stockade.sandbox._tmp import owned_tmpdir
        path, fd = owned_tmpdir("stockade-t-", {str(tmp_path)!r})
        print(path, flush=True)
        time.sleep(1000)
    """)
    owner = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    assert owner.stdout is not None
    theirs = owner.stdout.readline().strip()
    assert os.path.isdir(theirs)
    assert sweep(str(tmp_path), "stockade-t-") == 0  # alive: kept
    owner.send_signal(signal.SIGKILL)
    owner.wait(10)
    mine, fd = owned_tmpdir("stockade-t-", str(tmp_path))
    try:
        assert not os.path.exists(theirs)
        assert os.path.isdir(mine)
    finally:
        os.close(fd)


def test_folders_without_an_owner_file_are_left_alone(tmp_path: Path) -> None:
    # Being made right now, or left by an older version: not ours to judge.
    (tmp_path / "stockade-t-old").mkdir()
    (tmp_path / "unrelated").mkdir()
    assert sweep(str(tmp_path), "stockade-t-") == 0
    assert (tmp_path / "stockade-t-old").is_dir()
    assert (tmp_path / "unrelated").is_dir()


def test_another_hosts_folders_are_never_judged(tmp_path: Path) -> None:
    # A temp dir shared over the network: a lock held on another machine may
    # not show here, so its folders must not be swept from here.
    other = tmp_path / "stockade-t-some-other-host-abc123"
    other.mkdir()
    (other / OWNER).write_text("")
    path, fd = owned_tmpdir("stockade-t-", str(tmp_path))
    try:
        assert other.is_dir()
        assert os.path.basename(path).startswith(f"stockade-t-{socket.gethostname()}-")
    finally:
        shutil.rmtree(path)
        os.close(fd)
