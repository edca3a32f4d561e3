"""``stockade run`` starts the sandbox's probe jail on a thread while it imports
the run path (``runner.early_probe``): the session then finds the probe done
(or waits for it) and never runs a second one; remote runs and unknown
backend names are left to the session."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from stockade import sandbox
from stockade.runner import early_probe

pytestmark = pytest.mark.sandbox


@pytest.mark.parametrize("name", ["none", "bwrap", "landlock", None])
def test_the_session_takes_the_early_probe_and_never_repeats_it(
    monkeypatch: pytest.MonkeyPatch, name: str | None,
) -> None:  # fmt: skip
    if name is not None:
        avail = sandbox.get_backend(name).availability()
        if not avail.available:
            pytest.skip(f"{name} is not available here: {avail.reason}")
    monkeypatch.setattr(sandbox, "_probe_cache", {})
    real = sandbox._run_probe
    probed: list[str] = []
    threads: list[str] = []

    def counting(backend: Any) -> sandbox.ProbeReport:
        probed.append(backend.name)
        threads.append(threading.current_thread().name)
        return real(backend)

    monkeypatch.setattr(sandbox, "_run_probe", counting)
    # As ``stockade run`` does: start, import meanwhile, join, then the session chooses.
    thread = early_probe.start(name, None, os.environ)
    assert thread is not None
    thread.join()
    assert threads and set(threads) == {"stockade-probe"}
    done = list(probed)
    chosen = sandbox.select_backend(name, os.environ)
    assert probed == done  # the session's choice ran no probe of its own
    assert chosen.backend.name == (name or done[-1])
    # A real probe jail ran (enforcement is what it proved).
    assert chosen.report.checks.get("jail_ran") is True
    assert chosen.report.enforced is (chosen.backend.name != "none")
    assert "STOCKADE_PROBE_HOST_ENV" not in os.environ
    # Without the join, the session waits on the probe's lock: still one probe each.
    monkeypatch.setattr(sandbox, "_probe_cache", {})
    probed.clear()
    thread = early_probe.start(name, None, os.environ)
    assert thread is not None
    again = sandbox.select_backend(name, os.environ)
    thread.join()
    assert len(probed) == len(set(probed)), probed
    assert again.backend.name == chosen.backend.name


def test_no_early_probe_for_a_remote_executor() -> None:
    assert early_probe.start(None, "dask://127.0.0.1:9", {}) is None
    assert early_probe.start(None, None, {"STOCKADE_EXECUTOR": "dask://127.0.0.1:9"}) is None


def test_an_unknown_backend_is_left_to_the_session() -> None:
    assert early_probe.start("chroot", None, {}) is None
