"""The manifest's ``host.platform``: platform.platform()'s answer, without its subprocess."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Any

import pytest

from stockade.runner.manifest import host_platform


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux form only")
def test_host_platform_is_platform_platform_without_starting_a_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    expected = platform.platform()
    # platform.platform() names the processor when `uname -p` knows it
    # (x86_64 on some distributions; "unknown", left out, on others).
    processor = platform.uname().processor
    if processor and processor != "unknown":
        expected = expected.replace(f"-{processor}-with-", "-with-", 1)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"host_platform started a process or asked platform: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)
    # platform caches its uname() answer, processor included: after the call
    # above, going back to platform.platform() would start nothing and pass
    # the two refusals. Refuse platform itself too.
    monkeypatch.setattr(platform, "platform", refuse)
    monkeypatch.setattr(platform, "uname", refuse)
    got = host_platform()
    assert got == expected
    u = os.uname()
    assert got.startswith(f"Linux-{u.release}-{u.machine}")
