"""Landlock when the engine is root and a step needs a path only root can reach.

The helper then keeps uid 0 but drops every capability (bounding set, securebits
NOROOT, capset); Landlock and seccomp still confine it. Runs only as root.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.sandbox import ExtraMount, get_backend
from tests.sandbox.conftest import World, make_world

pytestmark = pytest.mark.sandbox


@pytest.fixture
def rooted(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[World, Path]]:
    backend = get_backend("landlock")
    if not backend.availability().available:
        pytest.skip(f"landlock is not available here: {backend.availability().reason}")
    if os.geteuid() != 0:
        pytest.skip("the uid-0 path exists only when the engine runs as root")
    base = Path(tempfile.mkdtemp(prefix="stockade-llroot-"))
    w = make_world(backend, base)
    private = Path(tempfile.mkdtemp(prefix="stockade-private-"))  # 0700, root only
    (private / "tool.sh").write_text("echo tool-ran\n")
    try:
        yield w, private
    finally:
        import shutil

        w.host_tmp.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def test_uid0_jail_has_no_capabilities_and_stays_confined(rooted: tuple[World, Path]) -> None:
    w, private = rooted
    r = w.run(
        f"sh {private}/tool.sh; id -u; grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; "
        f"cat {w.neighbour}/work/notes.md {w.host_tmp} ../meta/attempt-1.json; "
        f"echo x > {w.runs}/escape; mkdir m; mount -t tmpfs x m; echo rc=$?",
        mounts=(ExtraMount(private, str(private)),),
    )
    assert "tool-ran" in r.out, r.both
    assert "0" in r.out.split()
    caps = [ln.split()[1] for ln in r.out.splitlines() if ln.startswith("Cap")]
    assert caps and all(int(c, 16) == 0 for c in caps), r.out
    assert w.canary not in r.both
    assert not (w.runs / "escape").exists()
    assert "rc=0" not in r.out
