"""The capture hub: lazy files, masking across chunk boundaries, bounded by the pipe."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from pathlib import Path

import pytest

from stockade.runner.captures import Captures, read_capture
from stockade.runner.env import Masker


def test_no_file_without_output(tmp_path: Path) -> None:
    hub = Captures()
    w, cap = hub.open(tmp_path / "1.err")
    os.close(w)
    assert cap.wait(10)
    assert not (tmp_path / "1.err").exists()
    hub.close()


def test_output_lands_in_order(tmp_path: Path) -> None:
    hub = Captures()
    w, cap = hub.open(tmp_path / "1.err")
    chunks = [f"line {i}\n".encode() for i in range(5000)]
    for c in chunks:
        os.write(w, c)
    os.close(w)
    assert cap.wait(30)
    assert (tmp_path / "1.err").read_bytes() == b"".join(chunks)
    assert (tmp_path / "1.err").stat().st_mode & 0o077 == 0
    hub.close()


def test_a_secret_split_across_writes_is_masked(tmp_path: Path) -> None:
    secret = "s3cr3t-value-42"
    hub = Captures()
    w, cap = hub.open(tmp_path / "1.out", Masker([secret]))
    # Written a byte at a time from another thread, so reads see it in pieces.
    def writer() -> None:
        for b in f"before {secret} middle {secret}after\n".encode():
            os.write(w, bytes([b]))
        os.close(w)

    t = threading.Thread(target=writer)
    t.start()
    t.join()
    assert cap.wait(30)
    assert (tmp_path / "1.out").read_text() == "before ******** middle ********after\n"
    hub.close()


def test_many_pipes_at_once(tmp_path: Path) -> None:
    hub = Captures()
    opened = [hub.open(tmp_path / f"{i}.out") for i in range(50)]
    for i, (w, _) in enumerate(opened):
        os.write(w, f"item {i}\n".encode())
        os.close(w)
    for i, (_, cap) in enumerate(opened):
        assert cap.wait(30)
        assert (tmp_path / f"{i}.out").read_text() == f"item {i}\n"
    hub.close()


def test_a_pipe_opened_while_the_hub_waits_is_read(tmp_path: Path) -> None:
    # Each capture is registered from the opening thread while the hub's
    # select() is under way (it is not woken to register it): every one completes.
    hub = Captures()
    try:
        for i in range(20):
            w, cap = hub.open(tmp_path / f"{i}.err")
            os.write(w, f"item {i}\n".encode())
            os.close(w)
            assert cap.wait(30)
            assert (tmp_path / f"{i}.err").read_text() == f"item {i}\n"
    finally:
        hub.close()


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 100_000, (1 << 20) + 3])
@pytest.mark.parametrize("limit", [8, 1 << 20, 1 << 40])
def test_read_capture_reads_at_most_limit_bytes(tmp_path: Path, size: int, limit: int) -> None:
    data = secrets.token_bytes(size)
    path = tmp_path / "capture"
    path.write_bytes(data)
    before = _open_fds()
    # 1 TiB as the limit: nothing is allocated for the bytes that are not there.
    assert read_capture(path, limit) == data[:limit]
    assert _open_fds() == before


def test_read_capture_reads_a_file_longer_than_its_stat_size() -> None:
    # procfs reports size 0 for files that have content.
    path = "/proc/self/mountinfo"
    assert os.stat(path).st_size == 0
    whole = read_capture(path, 1 << 30)
    assert len(whole) > 0 and whole.endswith(b"\n")
    assert read_capture(path, 5) == whole[:5]


def test_read_capture_goes_on_after_short_reads_to_the_end(tmp_path: Path) -> None:
    # A fifo reads short whenever its writer pauses: the first read gets the
    # first piece only. Nothing is timed: the writer waits for the reader.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    pieces = [b"a" * 10, b"b" * 70_000, b"c" * 5]
    pause = threading.Event()

    def writer() -> None:
        # The reader that stops at its limit closes early: a broken pipe.
        with contextlib.suppress(BrokenPipeError), open(fifo, "wb", buffering=0) as f:
            for piece in pieces:
                f.write(piece)
                pause.wait(0.05)  # not needed for the result, only to split the reads

    t = threading.Thread(target=writer)
    t.start()
    try:
        assert read_capture(fifo, 1 << 20) == b"".join(pieces)
    finally:
        t.join()
    t = threading.Thread(target=writer)
    t.start()
    try:
        assert read_capture(fifo, 50) == b"a" * 10 + b"b" * 40
    finally:
        t.join()


def test_read_capture_never_reads_through_a_link_at_its_name(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not a capture")
    (tmp_path / "1.out").symlink_to(target)
    assert (tmp_path / "1.out").read_bytes() == b"not a capture"  # the link is live
    with pytest.raises(OSError):
        read_capture(tmp_path / "1.out", 100)
