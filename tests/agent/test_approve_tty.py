"""``approve: ask`` on a real terminal: a pseudo-terminal as the controlling tty."""

from __future__ import annotations

import os
import select
import sys
import time

import pytest

from stockade.agent.session import ask_on_tty


def _ask_in_pty(answer: bytes) -> tuple[bool, bytes]:
    pid, fd = os.forkpty()
    if pid == 0:  # child: /dev/tty is the pty
        try:
            os._exit(0 if ask_on_tty("out/report.md") else 1)
        except BaseException:
            os._exit(2)
    shown = b""
    deadline = time.monotonic() + 10
    while b"[y/N]" not in shown and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            shown += os.read(fd, 1024)
    os.write(fd, answer)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status) == 0, shown


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkpty semantics checked on Linux")
@pytest.mark.parametrize(("answer", "approved"), [(b"y\n", True), (b"yes\n", True), (b"n\n", False), (b"\n", False), (b"sure\n", False)])
def test_operator_answers_on_the_terminal(answer: bytes, approved: bool) -> None:
    ok, shown = _ask_in_pty(answer)
    assert b"out/report.md" in shown
    assert ok is approved


def test_no_terminal_means_no() -> None:
    pid = os.fork()
    if pid == 0:
        os.setsid()  # no controlling terminal at all
        os._exit(0 if ask_on_tty("out/x.md") else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1
