"""A run imports the sandbox backend it uses, not the others, and not the
parts only some steps need (images, the egress proxy): each is milliseconds
on the way to every run's first item. (What bwrap and landlock share is in
``sandbox._host`` and ``sandbox.policy``.)

Checked in a fresh interpreter that imports what ``stockade run`` imports and
makes the backend, then lists ``sys.modules``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
import stockade.cli.main, stockade.runner.early_probe, stockade.runner.session
from stockade import sandbox
sandbox.get_backend(sys.argv[1])
print("\\n".join(sorted(sys.modules)))
"""

IMAGES = ("stockade.sandbox.image", "tarfile", "gzip")
PROXY = ("stockade.sandbox.proxy", "stockade.sandbox._relay")


def modules_after(backend: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, backend], capture_output=True,
                         text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize(
    ("backend", "absent"),
    [
        ("none", ("stockade.sandbox.bwrap", "stockade.sandbox.landlock",
                  "stockade.sandbox.macos", *IMAGES, *PROXY)),
        ("bwrap", ("stockade.sandbox.landlock", "stockade.sandbox.macos", *IMAGES, *PROXY)),
        ("landlock", ("stockade.sandbox.bwrap", "stockade.sandbox.macos", *IMAGES, *PROXY)),
    ],
)
def test_a_run_imports_only_its_backend(backend: str, absent: tuple[str, ...]) -> None:
    loaded = modules_after(backend)
    assert f"stockade.sandbox.{backend}" in loaded
    assert sorted(m for m in absent if m in loaded) == []


def test_the_proxy_is_still_there_when_asked_for() -> None:
    import stockade.sandbox as sandbox
    from stockade.sandbox.proxy import EgressProxy

    assert sandbox.EgressProxy is EgressProxy
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = sandbox.Nope  # type: ignore[attr-defined]
