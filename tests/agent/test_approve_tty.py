"""``approve: ask`` on a real terminal: a pseudo-terminal as the controlling tty."""

from __future__ import annotations

import os
import select
import sys
import time

import pytest

from stockade.agent.session import ask_on_tty


def _ask_in_pty(answer: bytes, path: str = "out/report.md") -> tuple[bool, bytes]:
    pid, fd = os.forkpty()
    if pid == 0:  # child: /dev/tty is the pty
        try:
            os._exit(0 if ask_on_tty(path) else 1)
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkpty semantics checked on Linux")
def test_the_question_cannot_be_rewritten_by_the_name() -> None:
    """A CR and an erase-line sequence would leave only "Allow ... out/report.md?" on screen."""
    ok, shown = _ask_in_pty(b"n\n", "out/payload.sh\r\x1b[2KAllow the agent to write out/report.md")
    assert not ok
    question = shown.split(b"[y/N]")[0]
    assert b"\r" not in question and b"\x1b" not in question
    assert b"out/payload.sh\\r\\x1b[2KAllow the agent to write out/report.md?" in question


def test_no_terminal_means_no() -> None:
    pid = os.fork()
    if pid == 0:
        os.setsid()  # no controlling terminal at all
        os._exit(0 if ask_on_tty("out/x.md") else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1
