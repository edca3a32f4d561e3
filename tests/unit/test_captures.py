"""A jail's output: lazy files, masking across chunk boundaries, bounded by the
pipe, read while the jail is waited for; ``read_capture``."""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stockade.runner.captures import JailOutput, read_capture
from stockade.runner.env import Masker


class ProcessJail:
    """A real process as a ``Running``: its own session, so a test can end
    what it left behind."""

    def __init__(self, script: str, out: int, err: int) -> None:
        self.proc = subprocess.Popen(["sh", "-c", script], stdout=out, stderr=err,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self, grace: float = 2.0) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _start(output: JailOutput, tmp_path: Path, script: str,
           masker: Masker | None = None) -> ProcessJail:
    out = output.open(tmp_path / "1.out", masker)
    err = output.open(tmp_path / "1.err", masker)
    try:
        return ProcessJail(script, out, err)
    finally:
        os.close(out)
        os.close(err)


def test_no_file_without_output(tmp_path: Path) -> None:
    output = JailOutput()
    jail = _start(output, tmp_path, "exit 3")
    try:
        assert output.wait(jail, None) == 3
        assert output.drain(30)
    finally:
        output.close()
    assert not (tmp_path / "1.out").exists()
    assert not (tmp_path / "1.err").exists()


def test_output_lands_in_order_past_the_pipe_buffer(tmp_path: Path) -> None:
    # About 4 MiB on stdout and 0.6 MiB on stderr, interleaved: the process
    # blocks on a full pipe unless the wait reads both.
    (tmp_path / "talk.py").write_text(
        "import sys\n"
        "for i in range(65536):\n"
        "    sys.stdout.write('line %d %s\\n' % (i, 'x' * 50))\n"
        "    sys.stderr.write('err %d\\n' % i)\n"
    )
    output = JailOutput()
    jail = _start(output, tmp_path, f"exec {shlex.quote(sys.executable)} "
                                    f"{shlex.quote(str(tmp_path / 'talk.py'))}")
    try:
        assert output.wait(jail, 120) == 0
        assert output.drain(30)
    finally:
        output.close()
    out = (tmp_path / "1.out").read_text().splitlines()
    assert out == [f"line {i} {'x' * 50}" for i in range(65536)]
    assert (tmp_path / "1.err").read_text().splitlines() == [f"err {i}" for i in range(65536)]
    assert (tmp_path / "1.out").stat().st_mode & 0o077 == 0


def test_a_secret_split_across_writes_is_masked(tmp_path: Path) -> None:
    secret = "s3cr3t-value-42"
    output = JailOutput()
    w = output.open(tmp_path / "1.out", Masker([secret]))
    # Written a byte at a time from another thread, so reads see it in pieces.
    def writer() -> None:
        for b in f"before {secret} middle {secret}after\n".encode():
            os.write(w, bytes([b]))
        os.close(w)

    t = threading.Thread(target=writer)
    t.start()
    try:
        assert output.drain(30)
    finally:
        t.join()
        output.close()
    assert (tmp_path / "1.out").read_text() == "before ******** middle ********after\n"


def test_the_wait_ends_when_the_main_process_does_though_a_child_holds_the_pipes(
        tmp_path: Path) -> None:
    # The child keeps stdout and stderr open for a minute: the wait must not
    # wait for the pipes' end, only for the main process (whose own wait
    # ends the rest in a real jail).
    output = JailOutput()
    jail = _start(output, tmp_path, "sleep 60 & echo main; exit 4")
    try:
        assert output.wait(jail, 120) == 4
        assert not output.drain(0.05)  # the child still holds them
    finally:
        jail.kill()
        output.close()
    assert (tmp_path / "1.out").read_text() == "main\n"


def test_a_process_that_closed_its_output_is_still_waited_for(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    output = JailOutput()
    jail = _start(output, tmp_path, f"echo early; exec >&- 2>&-; "
                                    f"while [ ! -e '{gate}' ]; do sleep 0.01; done; exit 5")
    waited: list[int | None] = []
    t = threading.Thread(target=lambda: waited.append(output.wait(jail, 120)))
    t.start()
    try:
        # Both pipes have ended, the process runs on: the wait goes on too.
        t.join(0.5)
        assert t.is_alive() and not waited
        gate.touch()
        t.join(60)
        assert waited == [5]
    finally:
        gate.touch()
        t.join()
        output.close()
    assert (tmp_path / "1.out").read_text() == "early\n"


def test_the_timeout_ends_the_wait(tmp_path: Path) -> None:
    output = JailOutput()
    jail = _start(output, tmp_path, "echo started; exec sleep 60")
    try:
        assert output.wait(jail, 0.3) is None
        assert jail.wait(0) is None  # still running: ending it is the caller's part
    finally:
        jail.kill()
        output.close()
    assert (tmp_path / "1.out").read_text() == "started\n"


def test_close_ends_every_pipe_and_keeps_what_came(tmp_path: Path) -> None:
    before = _open_fds()
    output = JailOutput()
    w = output.open(tmp_path / "1.err", Masker(["hidden-value"]))
    os.write(w, b"partial hidden-value")
    assert not output.drain(0.05)
    output.close()
    os.close(w)
    assert (tmp_path / "1.err").read_text() == "partial ********"
    assert _open_fds() == before


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
