"""The capture hub: lazy files, masking across chunk boundaries, bounded by the pipe."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from stockade.runner.captures import Captures
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
